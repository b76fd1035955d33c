// Catalog: finds the checkpoints in a source tree and their member files,
// applying the rules of DESIGN.md section 1 (the public digest contract).
// It also reads the refs/ files of Hugging Face hub repositories, which the
// view mirrors (DESIGN.md section 2).
//
// A checkpoint is a directory below the source root (or the root itself) that
// directly contains a weight file. Its members are the regular files of its
// subtree, minus dot-paths and minus nested checkpoints. Symbolic links are
// followed when they resolve inside the root (or anywhere, with
// SymlinkPolicy::kFollow); a link that escapes, dangles or loops makes the
// checkpoint that contains it invalid.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/hub_refs.h"
#include "ckptfs/option_words.h"
#include "ckptfs/ownership.h"
#include "ckptfs/status.h"

namespace ckptfs {

enum class SymlinkPolicy {
  kContained,  // follow links whose resolved target lies inside the root
  kFollow,     // follow every link (trusted trees)
};

// SymlinkPolicy as the symlinks= option spells it.
inline constexpr OptionWord<SymlinkPolicy> kSymlinkPolicyWords[] = {{SymlinkPolicy::kContained, "contained"},
                                                                    {SymlinkPolicy::kFollow, "follow"}};

// Parses "contained" or "follow".
std::optional<SymlinkPolicy> ParseSymlinkPolicy(std::string_view text);

struct CatalogOptions {
  SymlinkPolicy symlinks = SymlinkPolicy::kContained;
  // Canonical absolute paths the walk never enters or stats, nor anything
  // below them, however reached (the daemon's own mount point: indexing its
  // own view would grow it one level deeper per rescan, and stat'ing it
  // before it serves would block).
  std::vector<std::string> excluded_paths;
  // Devices the walk never enters (the daemon's own mount, should another
  // path such as a bind mount lead to it).
  std::vector<dev_t> excluded_devices;
  // When set and true, the walk stops at the next directory and the scan
  // fails: a daemon that is unmounted must not finish walking a large tree
  // first.
  const std::atomic<bool>* cancel = nullptr;
};

struct MemberFile {
  std::string rel_path;   // relative to the checkpoint, components joined by '/'
  std::string open_path;  // canonical absolute path of the bytes (links resolved)
  FileStamp stamp;        // of the resolved file, taken during the walk
  Ownership owner;        // of the resolved file
  AccessPath access;      // how this copy is reached in the source
};

// One problem of an invalid checkpoint as unprivileged callers may be told
// it: `text` names an entry of the directory `listing` leads to.
struct ShownProblem {
  std::string text;
  AccessPath listing;
};
inline constexpr size_t kShownProblems = 8;

struct CheckpointSource {
  std::string rel_path;  // relative to the root; "" when the root is the checkpoint
  std::string abs_path;  // root + "/" + rel_path, as the user named them
  std::vector<MemberFile> members;  // ascending byte order of rel_path
  // How the checkpoint directory is reached: the directories above it, from
  // the root, and its own ownership.
  AccessPath dir_access;
  // The same for each directory among the members, by path relative to the
  // checkpoint ("a", "a/b"); nested checkpoints excluded.
  std::map<std::string, AccessPath> subdirs;
  // Set when the checkpoint must not be exposed; says which path and why.
  std::optional<std::string> invalid_reason;
  // The same problems as told to unprivileged callers: what symlinks
  // resolve to is left out (resolving runs as the daemon, so "dangling" or
  // "outside" would tell any user whether a path they cannot reach exists),
  // and each is told only to callers who may list the directory it was
  // found in (it names an entry there; a link into another user's private
  // directory must not list it to its writer). Distinct, at most
  // kShownProblems of them.
  std::vector<ShownProblem> invalid_problems_shown;

  uint64_t TotalSize() const;
  bool valid() const { return !invalid_reason.has_value(); }
  // A hash of everything the walk saw of it (paths, stamps, owners, how
  // each is reached): equal fingerprints mean the index would be asked the
  // same questions and the view built from the same answers.
  Sha256Digest WalkFingerprint() const;
};

// The walked tree as a scan left it, kept by the caller for the next scan to
// take unchanged directories from (opaque; see RewalkHint).
struct WalkTree;

struct CatalogScan {
  std::string root;       // as given
  std::string real_root;  // canonical
  std::vector<CheckpointSource> checkpoints;  // ascending order of rel_path
  // Every directory walked, by path relative to the root ("" is the root).
  std::map<std::string, AccessPath> dirs;
  // Those of them whose changes change what is served or who may reach it:
  // the directories of checkpoints and those inside them, those holding a
  // member a link leads to, those holding hub refs, and every directory
  // above these. Their inotify watches come first (CatalogWatcher).
  std::set<std::string, std::less<>> serving_dirs;
  // Every file with more than one link (by its path as opened): the
  // directories that list it (relative to the root; for a symlink to it,
  // the link's directory) and its inode as walked. A chmod or a write
  // through a name outside SRC raises no event in those directories, only
  // on the file itself.
  struct LinkedFile {
    std::set<std::string> dirs;
    dev_t dev = 0;
    ino_t ino = 0;
  };
  std::map<std::string, LinkedFile> linked_files;
  // The refs/ files of hub repository directories outside every checkpoint
  // (see hub_refs.h), with their bytes; not members of anything.
  std::vector<HubRef> hub_refs;
  // Problems outside every checkpoint (they invalidate nothing).
  std::vector<std::string> warnings;
  std::shared_ptr<WalkTree> tree;
  uint64_t dirs_reused = 0;  // directories taken from the previous tree unread
  // The directories this scan read (the others, dirs_reused, came from the
  // previous tree), by a hash of their path (paths grow with depth, and a
  // chain of 1,000 nested directories must not cost its depth squared
  // again): a path among them may name another directory than last time
  // (one renamed into its place). A collision only takes a path for read.
  std::unordered_set<uint64_t> walked_dirs;
  bool Walked(const std::string& rel) const { return walked_dirs.count(std::hash<std::string>{}(rel)) != 0; }
  // Hub repositories whose refs went past kMaxHubRefsPerRepository in this
  // walk (warned of once each).
  std::set<std::string> hub_repos_past_bound;
};

// What a rescan may skip: the previous scan's tree, and the directories
// (relative to the root) that inotify reported a change in since. A
// directory that is not dirty, with nothing dirty below it, whose own owner
// and mode and whose path of search permissions are unchanged, is taken
// from `previous` as it is, provided its subtree was self-contained: no
// symlink followed, no file with more than one link (a write through a link
// elsewhere raises no event here), no problem met. Everything else is
// walked. The previous tree is consumed.
struct RewalkHint {
  std::shared_ptr<WalkTree> previous;
  std::set<std::string> dirty_dirs;
};

// True for the weight-file suffixes of DESIGN.md section 1.
bool IsWeightFileName(std::string_view name);

// Walks `root` and returns its checkpoints. Fails only when the root itself
// cannot be used (missing, not a directory, unreadable); problems below it are
// reported in the result.
Result<CatalogScan> ScanSourceTree(const std::string& root, const CatalogOptions& options,
                                   RewalkHint* hint = nullptr);

}  // namespace ckptfs
