// CatalogWatcher: keeps the view in step with the source tree.
//
// One thread scans the tree (a stat walk, cheap thanks to the index), shows at
// once every checkpoint whose files the index already knows, and hands the
// others to an IndexScheduler, which indexes them concurrently, each with a
// fair share of the workers (a 15 TB sparse file holds back nothing else),
// and shows each as it completes; the scanning thread goes back to watching
// meanwhile, so a long re-hash never holds up the scans (an owner, mode or
// ACL change in SRC is applied by the next scan, whatever is being hashed).
// It rescans when inotify reports a change (debounced), every `rescan`
// seconds (inotify misses changes on network filesystems), and on request
// (control socket, SIGHUP). A checkpoint is indexed only once none of its
// files has changed (ctime) for `settle` seconds. A shown checkpoint that
// changed keeps its last verified digest in the view, reached as the new
// walk says, until its new digest is known; then one publish moves its
// by-name entry there.
//
// A rescan is three steps: the pure ScanPlanner (scan_planner.h) decides
// from the walk and what was shown; Apply() changes the watcher's state and
// publishes the view under one lock acquisition; IndexQueued() has what the
// plan queued hashed, taking withdrawn digests out of the view between files.
#pragma once

#include <sys/inotify.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/index.h"
#include "ckptfs/index_scheduler.h"
#include "ckptfs/manifest_store.h"
#include "ckptfs/mutex.h"
#include "ckptfs/scan_planner.h"
#include "ckptfs/unique_fd.h"
#include "ckptfs/view.h"

namespace ckptfs {

// What the watcher knows of one checkpoint path, for `ckptfsctl status`.
struct CheckpointState {
  enum class Phase { kExposed, kIndexing, kPending, kInvalid };
  std::string path;  // absolute source path
  Phase phase = Phase::kPending;
  std::string name;    // when exposed, or while revalidating
  // Changed since it was shown and being verified again (pending or
  // indexing): `name` is the digest it still serves meanwhile.
  bool revalidating = false;
  std::string reason;  // when invalid or pending
  // Its problems as told to users who are not root nor the mount's owner,
  // each to those who may list where it was found (see CheckpointSource).
  std::vector<ShownProblem> problems_shown;
  // How the checkpoint directory is reached in SRC; control queries answer a
  // caller only about checkpoints that caller could see there.
  AccessPath access;
  uint64_t files = 0;
  uint64_t size = 0;
  uint64_t bytes_done = 0;  // when indexing
  uint64_t bytes_total = 0;
  // When indexing: the files begun and not done, largest first.
  struct HashingFile {
    std::string path;  // relative to the checkpoint
    uint64_t done = 0, size = 0;
  };
  std::vector<HashingFile> hashing;
  int64_t indexed_at = 0;
  // Whether the view serves a digest for this path now.
  bool Serves() const { return phase == Phase::kExposed || revalidating; }
};
const char* PhaseName(CheckpointState::Phase phase);

class CatalogWatcher {
 public:
  struct Options {
    std::string source;
    CatalogOptions catalog;
    double rescan_s = 600;
    double settle_s = 5;
    unsigned threads = 0;
    std::function<void(const std::string& path)> before_hash;  // test seam, see IndexerOptions
    std::function<void()> before_publish;  // test seam: called under the watcher's lock before each publish
    ManifestStore* manifests = nullptr;  // manifests=DIR, see IndexerOptions
    HashCopyMaker* copies = nullptr;     // fill_on_index, see IndexerOptions
    // At most this many directories watched (max_watches=); 0: half of
    // fs.inotify.max_user_watches, a limit the daemon's user shares with
    // every other program of that user that watches files.
    size_t max_watches = 0;
  };
  // Told which directory entries changed after each publish.
  using ChangeCallback = std::function<void(const View::Changes&)>;

  CatalogWatcher(Options options, Index* index, View* view, ChangeCallback on_change);
  ~CatalogWatcher();  // stops the thread
  CatalogWatcher(const CatalogWatcher&) = delete;
  CatalogWatcher& operator=(const CatalogWatcher&) = delete;

  // Scans SRC once and shows every checkpoint the index already knows,
  // reading no file content, on the calling thread. The daemon runs it before
  // it mounts, so that when `mount` returns every checkpoint whose index
  // entry still matches its source is visible (DESIGN.md section 2). Start()
  // then indexes the rest.
  void ShowIndexed();
  // Never walk into this device (the daemon's own mount); before Start().
  void ExcludeDevice(dev_t dev) { options_.catalog.excluded_devices.push_back(dev); }
  // Where the files it hashes are copied as they are hashed (fill_on_index;
  // the host tier exists only once mounted); before Start().
  void SetCopies(HashCopyMaker* copies) { options_.copies = copies; }
  void Start();
  void Stop();
  void RequestRescan();
  // A rescan asked for by the read path (a source found changed): coalesced
  // and started at most once a second, so that readers of a changed file
  // cannot keep the watcher walking SRC back to back.
  void RequestRescanSoon();
  // Takes a digest out of the view at once (from any thread, a FUSE
  // handler's too: it only notes the name, under a lock no scan or publish
  // holds; the watcher's thread, or an indexer's between files, takes it
  // out), e.g. when its content failed a check; and keeps it out of every
  // publish until as many EndWithdrawal(name) as Withdraw(name) came. The caller calls that once the index
  // no longer vouches for the bytes, which then asks for the rescan that
  // hashes them again: a scan before that would find the files known and
  // show the digest again.
  void Withdraw(const std::string& name, const std::string& reason);
  void EndWithdrawal(const std::string& name);
  // The index forgot file (dev, ino): nothing hashed of it lately is taken
  // again (IndexScheduler::ForgetRecent).
  void ForgetHashed(uint64_t dev, uint64_t ino);
  // Runs `task` on the watcher's thread, before its next scan: for work a
  // FUSE handler must not wait for, such as a report of a damaged file
  // (an index write; the index and the view are busy while a scan
  // publishes). False, and nothing done, when kMaxPosted tasks wait.
  bool Post(std::function<void()> task);
  static constexpr size_t kMaxPosted = 4096;

  std::vector<CheckpointState> States() const;
  uint64_t scans_completed() const { return scans_.load(); }
  // A scan is asked for, waits out its debounce or settle time, or runs, or
  // a publish, a withdrawal or a posted report waits: once false, every
  // change the watcher was told of has been walked and published, and what
  // needs hashing is queued (a checkpoint being hashed shows as indexing;
  // status: scan_pending, which tests wait for instead of sleeping). The
  // periodic rescan does not count until it starts.
  bool scan_pending() const;

  // What the last scan cost: a change in one checkpoint should cost that
  // checkpoint, not the tree (status shows this).
  struct ScanStats {
    double seconds = 0;                // walk, index lookups and publish; not hashing
    bool incremental = false;          // only the directories inotify named were read
    uint64_t dirs_reused = 0;          // directories taken unread from the walk before
    uint64_t checkpoints = 0;          // valid checkpoints walked
    uint64_t checkpoints_kept = 0;     // unchanged since shown: not looked up again
    uint64_t files_looked_up = 0;      // index lookups of member files
    uint64_t directories = 0;          // directories walked
    uint64_t watched_directories = 0;  // of them, watched (max_watches= bounds it)
    View::PublishStats nodes;          // of the publish that ended it
  };
  ScanStats LastScan() const;

 private:
  void Run();
  WalkTriggers Triggers() const;  // what the watcher itself knows; Run() adds the rest
  void ScanOnce(const WalkTriggers& why, bool index_unknown = true);
  // The walk, incremental when `incremental`; nothing when it was cut short
  // or failed (then every checkpoint is withdrawn until SRC is back).
  std::optional<CatalogScan> Walk(bool incremental);
  void WithdrawEverything(const Status& why);
  KnownCheckpoints Known() const;
  IndexReport LookUp(const CatalogScan& scan, const std::vector<const CheckpointSource*>& which) const;
  // The plan's changes and the publish that shows them, under one lock.
  void Apply(const CatalogScan& scan, const ScanPlan& plan, std::vector<ExposedCheckpoint> shown, ScanStats stats,
             double started);
  // Has the plan's queue indexed concurrently (IndexScheduler), each
  // checkpoint shown when done; returns at once.
  void IndexQueued(const CatalogScan& scan, const ScanPlan& plan);
  // mu_ held: forgets the jobs the plan no longer wants as they run (not
  // queued now, or walked otherwise since); returns them, to be cancelled.
  std::vector<IndexScheduler::JobId> ForgetSupersededJobsLocked(const ScanPlan& plan) REQUIRES(mu_);
  // A shown exposure, reached as the latest walk says (see ScanPlan::Revalidate).
  static ExposedCheckpoint ReachedAsNow(const ExposedCheckpoint& shown, const CheckpointSource& now);
  IndexerOptions HashingOptions();
  // The rest run on the indexer's workers, for the job `token` of a path;
  // they do nothing when a newer job replaced it.
  void OnIndexed(const CheckpointSource& cp, const Sha256Digest& fingerprint, uint64_t token, IndexReport report);
  void RecordIndexingFailure(const CheckpointSource& cp, const IndexedCheckpoint& indexed, uint64_t token);
  // Shows a freshly indexed checkpoint (published now, or by the scanning
  // thread within kPublishEveryS). False if the job was replaced.
  bool Expose(const CheckpointSource& cp, ExposedCheckpoint e, const Sha256Digest& fingerprint, uint64_t token);
  // The job is current; forgets it.
  bool TakeJobLocked(const std::string& path, uint64_t token) REQUIRES(mu_);
  void PublishIfDue();          // a deferred publish, once due
  double NextPublishDue() const;  // monotonic seconds; infinity when none waits
  double TakeRetryRequest();    // when an unsettled checkpoint is to be walked again; 0: none
  void Wake();                  // interrupts the scanning thread's wait
  // Takes the digests Withdraw() named out of the view and publishes, at
  // once; true if any was waiting. Safe from any thread but a FUSE handler's.
  bool ApplyWithdrawals();
  bool WithdrawalsWaiting() const;
  void RunPosted();  // on the watcher's thread
  void Publish();                         // the exposed checkpoints, less any withdrawn meanwhile
  // Takes out of exposed_ what Withdraw() named and what is still held out;
  // true if a withdrawal was waiting or anything was taken out.
  bool TakeWithdrawalsLocked() REQUIRES(mu_);
  View::Changes PublishLocked() REQUIRES(mu_);
  void Notify(const View::Changes& changes);  // mu_ not held: it calls into the kernel
  // What the events read from inotify ask for.
  enum class Drained { kNothing, kChange, kArrival };
  Drained DrainInotify();
  void NoteDirty(const inotify_event& ev);
  void UpdateWatches(const CatalogScan& scan);
  void Unlabel(int wd, const std::string& path);
  void ForgetWatch(int wd);
  void UpdateFileWatches(const CatalogScan& scan);
  void SetState(CheckpointState state);
  // As SetState, mu_ held; a path whose digest is still shown keeps naming
  // it (revalidating) in every phase but invalid.
  void PutStateLocked(CheckpointState state) REQUIRES(mu_);

  Options options_;
  Index* index_;
  View* view_;
  ChangeCallback on_change_;

  UniqueFd inotify_;
  UniqueFd wake_;  // eventfd: Stop() and RequestRescan() interrupt the wait
  // wd -> the directories it watches: one directory may be reached by
  // several paths (through links), and an event in it concerns them all;
  // and each such path -> its wd.
  std::map<int, std::set<std::string>> watches_;
  std::map<std::string, int> watch_of_;
  size_t watchable_dirs_ = 0;  // the last scan's directories that want a watch, budget or not
  // wd -> the directories that list a file with more than one link
  // (CatalogScan::linked_files), watched on the file itself.
  std::map<int, std::set<std::string>> file_watches_;
  bool file_watch_limit_logged_ = false;
  // For incremental rescans (see RewalkHint); used only on the scanning thread.
  std::string watched_root_;                 // the root as the watches name it
  std::shared_ptr<WalkTree> last_tree_;      // of the last walk
  std::set<std::string> dirty_dirs_;         // relative to the root, since that walk
  bool full_walk_needed_ = true;
  bool followup_scan_ = false;  // new watches were added: read their directories once more
  bool watch_limit_logged_ = false;
  size_t watch_budget_ = 0;           // directories to watch at most (Options::max_watches, resolved)
  bool watch_budget_logged_ = false;  // said that some directories go unwatched

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> rescan_requested_{true};
  std::atomic<bool> soon_requested_{false};
  std::atomic<uint64_t> scans_{0};
  // See scan_pending(): the scanning thread is at work (not in its wait),
  // and it has a debounced or settle-time scan ahead.
  std::atomic<bool> busy_{true};
  std::atomic<bool> deadline_pending_{false};
  double next_settle_deadline_ = 0;  // monotonic seconds; 0 = none

  mutable Mutex mu_;
  std::map<std::string, CheckpointState> states_ GUARDED_BY(mu_);     // by source path
  std::map<std::string, ExposedCheckpoint> exposed_ GUARDED_BY(mu_);  // by source path
  // The walk each exposed checkpoint was last shown from (see
  // ScanTriage::keep), by source path.
  std::map<std::string, Sha256Digest> shown_fingerprints_ GUARDED_BY(mu_);
  ScanStats last_scan_ GUARDED_BY(mu_);
  std::string last_scan_error_;  // used only on the thread that scans
  // Of the last scan, published with every change (under mu_: the
  // indexer's workers publish withdrawals too).
  std::map<std::string, AccessPath> last_dirs_ GUARDED_BY(mu_);
  std::vector<HubRef> last_hub_refs_ GUARDED_BY(mu_);
  // What other threads ask of the watcher, under a lock held only to note
  // or take a request (taken under mu_, never the other way round).
  mutable Mutex requests_mu_ ACQUIRED_AFTER(mu_);
  std::map<std::string, std::string> withdrawals_ GUARDED_BY(requests_mu_);  // digest -> reason, not applied yet
  // Digest -> reason, and how many Withdraw()s have no EndWithdrawal yet
  // (two damaged copies of one digest: it is let back after the second).
  struct HeldOut {
    std::string reason;
    int withdrawals = 0;
  };
  std::map<std::string, HeldOut> held_out_ GUARDED_BY(requests_mu_);
  std::deque<std::function<void()>> posted_ GUARDED_BY(requests_mu_);
  // The indexer's job for each checkpoint path it works on.
  struct Indexing {
    Sha256Digest fingerprint;  // of the walk it indexes
    uint64_t token = 0;        // which submission: a replaced one's end is ignored
    IndexScheduler::JobId job = 0;
  };
  std::map<std::string, Indexing> indexing_ GUARDED_BY(mu_);
  uint64_t next_token_ GUARDED_BY(mu_) = 1;
  double last_publish_ GUARDED_BY(mu_) = 0;  // monotonic
  bool publish_deferred_ GUARDED_BY(mu_) = false;
  // Exposed since the last publish: their state becomes exposed with the
  // publish that shows them.
  std::map<std::string, CheckpointState> unpublished_states_ GUARDED_BY(mu_);
  double retry_at_ GUARDED_BY(mu_) = 0;  // see TakeRetryRequest
  // Made by the first IndexQueued (on the scanning thread); stopped by Stop().
  std::unique_ptr<IndexScheduler> scheduler_;
};

}  // namespace ckptfs
