// ScanPlanner: what one rescan changes in the view, decided from what the walk
// found and what the watcher showed before. It does no I/O, takes no lock
// and reads no clock: CatalogWatcher walks, asks the index, applies the plan
// under one lock and indexes what the plan queues, and the unit tests
// (tests/unit/scan_planner_test.cpp) drive the decisions directly.
//
// Two steps, because whether a changed checkpoint waits or is hashed depends
// on whether the index already knows its files, and asking costs I/O:
//   Triage(scan)             which checkpoints to keep as shown, which to
//                            look up in the index, which are invalid or gone;
//   Plan(triage, lookups, t) what to show at once, what to withdraw, what to
//                            hash, what to wait for (not settled yet), and
//                            which shown digests stay while re-verified.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/hashes.h"
#include "ckptfs/indexer.h"

namespace ckptfs {

// What the watcher knows of one checkpoint path from earlier scans.
struct KnownCheckpoint {
  std::optional<std::string> shown_name;          // in the view now under this digest
  std::optional<Sha256Digest> shown_fingerprint;  // the walk it was last shown from
  std::string reason;                             // of its last state (invalid, pending)
};
using KnownCheckpoints = std::map<std::string, KnownCheckpoint>;  // by absolute source path

struct ScanTriage {
  // Invalid checkpoints, with whether to tell the log (new, or a new reason).
  std::vector<std::pair<const CheckpointSource*, bool>> invalid;
  // Shown, and walked exactly as when they were shown: no index lookup per
  // file, nothing rebuilt (a change elsewhere in a tree with a 100,000-file
  // checkpoint must not cost seconds). A withdrawn one is not shown, so it is
  // always looked up again.
  std::vector<const CheckpointSource*> keep;
  std::vector<const CheckpointSource*> look_up;  // ask the index about these, in this order
  std::vector<std::string> vanished;             // known paths the walk no longer found
  std::map<std::string, Sha256Digest> fingerprints;  // of every valid checkpoint, by path
  uint64_t valid = 0;
  uint64_t files_to_look_up = 0;
};

struct ScanPlan {
  // Known to the index: shown at once (`announce`: under a digest the path
  // did not show before).
  struct Show {
    const CheckpointSource* source;
    const IndexedCheckpoint* indexed;
    bool announce;
  };
  // Changed less than `settle` ago: shown nowhere until it is quiet.
  struct Wait {
    const CheckpointSource* source;
    int64_t quiet_ns;  // since its newest file change
    int64_t left_ns;   // until it has settled
  };
  // Shown, changed since (its stamps or how it is reached), and not known
  // to the index as it is now: its last verified digest stays in the view,
  // with who may reach it taken from this walk at once, until the new
  // digest is known (DESIGN.md section 2: never dark while re-verified).
  struct Revalidate {
    const CheckpointSource* source;
    std::string shown_name;
  };
  // A shown digest that leaves the view.
  enum class Why { kRemoved, kInvalid };
  struct Withdrawal {
    std::string path;
    std::string name;
    Why why;
  };

  std::vector<std::pair<const CheckpointSource*, bool>> invalid;  // as in ScanTriage
  std::vector<const CheckpointSource*> keep;
  std::vector<Show> show;
  std::vector<Wait> wait;
  std::vector<const CheckpointSource*> index;  // settled, unknown to the index: hash them
  std::vector<Revalidate> revalidate;          // each also in `wait` or `index`
  std::vector<std::string> vanished;           // forget these paths
  std::vector<Withdrawal> withdraw;
  int64_t settle_wait_ns = 0;  // until the first waiting checkpoint settles; 0 when none waits
  std::map<std::string, Sha256Digest> fingerprints;  // as in ScanTriage
  uint64_t valid = 0;
  uint64_t files_looked_up = 0;
};

class ScanPlanner {
 public:
  ScanPlanner(const KnownCheckpoints& known, int64_t settle_ns) : known_(known), settle_ns_(settle_ns) {}

  // The pointers in the result point into `scan`, which must outlive it.
  ScanTriage Triage(const CatalogScan& scan) const;
  // `lookups` answers triage.look_up in the same order (the checkpoints of a
  // lookup-only Indexer run over them); `now_ns` is wall-clock time, as the
  // members' ctime and mtime are.
  ScanPlan Plan(const ScanTriage& triage, const std::vector<IndexedCheckpoint>& lookups, int64_t now_ns) const;

 private:
  std::optional<std::string> ShownName(const std::string& path) const;

  const KnownCheckpoints& known_;
  int64_t settle_ns_;
};

// Why the next rescan runs, and what the last one left.
struct WalkTriggers {
  bool asked = false;           // SIGHUP, ckptfsctl rescan, a withdrawal
  bool periodic = false;        // rescan=SECONDS came round
  bool read_triggered = false;  // a read found a source changed
  bool events_lost = false;     // inotify overflowed or named an unknown watch
  bool have_previous_walk = false;
  bool inotify = false;
};
// A rescan that only inotify or settling started re-reads the directories
// inotify named; any other reads everything, as the changes that raise no
// inotify event are found only that way.
bool NeedsFullWalk(const WalkTriggers& why);

}  // namespace ckptfs
