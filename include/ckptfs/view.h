// View: the inode table of the mounted filesystem (DESIGN.md section 2).
//
//   /                      root: "by-name" and one sha256-<hex> per digest
//   /by-name/...           directories mirroring the source tree; a leaf
//                          checkpoint is a relative symlink to ../sha256-<hex>;
//                          a hub repository's refs/ files are small files
//   /sha256-<hex>/...      the members, byte-identical to the source
//
// The catalog publishes the full set of exposed checkpoints; the view builds
// an immutable Snapshot of Nodes from it without any lock and swaps it in
// (LevelDB's Version), so lookups never wait for a publish. A node's inode
// and generation numbers are a hash of what it is (a digest path, a by-name
// path plus its target), not a counter: the same tree gives the same numbers
// in every snapshot and in every process, so a kernel holding an inode
// across a publish, or across a restart of the daemon, still finds it. An
// open file of a withdrawn digest keeps its node while the kernel holds it,
// while the digest leaves the root's listing.
//
// A by-name path that is a checkpoint and also holds nested checkpoints
// (run7/ with run7/checkpoint-500/) cannot be one symlink; it becomes a
// directory whose entries are links to the parent digest's top-level entries
// plus the nested checkpoints' own entries, so it still mirrors the source.
// That directory carries the xattrs of its own digest directory
// (user.ckptfs.digest, .sources, .size) and names the digest in own_digest.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/hub_refs.h"
#include "ckptfs/mutex.h"
#include "ckptfs/ownership.h"

namespace ckptfs {

// A node's number as the kernel sees it; the same width as fuse_ino_t, kept
// free of libfuse so that the view does not depend on the FUSE layer.
using InodeId = uint64_t;
constexpr InodeId kRootInode = 1;  // FUSE_ROOT_ID

// One place in the source that holds a file's bytes, and what reads of it
// check: its stamp as hashed and its chunk table.
struct SourceCopy {
  std::string path;  // resolved path of the bytes
  FileStamp stamp;
  std::shared_ptr<const std::vector<ChunkHash>> chunks;
  // Only root, the mount's owner and the trusted_writers= users can change
  // what this copy holds: they own the file and every directory from SRC
  // down to it, none of which has a group or other write bit (nor an ACL
  // entry that writes: its mask is the group bits), and the file is on
  // SRC's own filesystem (a filesystem a user mounted inside SRC says
  // whatever it likes of owners and modes). Whoever else can write the
  // file can change its bytes behind an intact stamp (a second write into
  // a dirty shared mapping changes no time) and could craft chunks that
  // pass their XXH3-128, so under verify=auto such a copy's bytes are
  // served only once checked against the file's SHA-256.
  bool trusted = false;
};

// A checkpoint ready to be shown: indexed, valid, settled.
struct ExposedCheckpoint {
  struct File {
    std::string rel_path;
    std::string source_path;  // resolved path of the bytes
    FileStamp stamp;          // as hashed; reads check it
    Sha256Digest sha256{};
    std::shared_ptr<const std::vector<ChunkHash>> chunks;  // XXH3-128 per 4 MiB chunk
    std::optional<uint64_t> stamped_size;  // *.safetensors: size as served under stamp_headers
    Ownership owner;
    AccessPath access;  // how this copy is reached in the source
    std::shared_ptr<const ChunkChain> chain;  // null: not known (see FileHashes::chain)
  };
  std::string rel_path;  // relative to the source root ("" = the root)
  std::string abs_path;
  std::string name;      // sha256-<hex>
  uint64_t total_size = 0;
  int64_t indexed_at = 0;  // seconds since the epoch
  AccessPath dir_access;
  // A hash of every field above and below (View::InputsOf), kept by the
  // catalog with the checkpoint so that a publish that reuses its nodes
  // does not hash 100,000 files again; computed by the view when unset.
  std::optional<Sha256Digest> inputs;
  std::map<std::string, AccessPath> subdirs;
  std::vector<File> files;  // ascending rel_path
};

class View {
 public:
  enum class Kind { kDir, kFile, kSymlink };

  struct Node {
    InodeId ino = 0;
    // With `ino`, a hash of the node's identity: a different node that ever
    // got the same inode number has another generation, so the kernel
    // cannot take it for the node it cached (fuse_iget marks that one bad).
    uint64_t generation = 0;
    Kind kind = Kind::kDir;
    Ownership owner;  // shown by stat: the first source copy's, write bits removed
    // Who may reach and use the node: one path per source copy; empty means
    // everyone (the root and what the daemon makes up itself).
    std::vector<AccessPath> access;
    uint64_t size = 0;
    struct timespec mtime {};
    // Inside a digest directory: content can never change, so the kernel may
    // cache entries and attributes for a long time.
    bool immutable = false;
    std::map<std::string, InodeId> children;  // directories
    // Directories: the directory that lists this one (the root: itself), so
    // that a listing's ".." carries a real inode number (readdir(3) hides
    // entries numbered 0).
    InodeId parent = 0;
    std::string link_target;                     // symlinks
    std::string source_path;                     // files: copies.front()'s
    // Files the daemon serves from memory (hub refs): their bytes. Fixed for
    // the node's life: a ref that changes becomes a new node.
    std::optional<std::string> content;
    FileStamp stamp;                             // files
    Sha256Digest sha256{};                       // files
    std::shared_ptr<const std::vector<ChunkHash>> chunks;  // files
    // Files: the SHA-256 chain of their bytes, from any copy's index row that
    // has one (a function of the bytes, like the SHA-256); null when none
    // does. It proves a chunk read from a copy a user may write without a
    // pass over the whole file (FileServer::ChainOf).
    std::shared_ptr<const ChunkChain> chain;
    // Files: every source copy of the node's digest that holds these bytes,
    // most trusted first (a copy whose owner, or the owner of a directory
    // on its way from SRC, is root; then the mount's owner; then anyone
    // else; path order within each), so that reads try a copy its owner
    // cannot change before one that a user can truncate or rewrite, and go
    // on to the next copy when one fails its checks. source_path, stamp and
    // chunks are those of the first.
    std::vector<SourceCopy> copies;
    bool safetensors = false;                    // files named *.safetensors
    // Files named *.safetensors: their size as served under stamp_headers,
    // stored at indexing so that stat reads nothing (unset: not known yet).
    std::optional<uint64_t> stamped_size;
    std::string digest;                          // the sha256-<hex> this node belongs to, if any
    // A by-name directory that is itself a checkpoint holding nested ones
    // (by-name/run7 beside by-name/run7/checkpoint-500): its own sha256-<hex>,
    // so that every command that takes a checkpoint can act on it.
    std::string own_digest;
    std::vector<std::pair<std::string, std::string>> xattrs;
    // With a user.ckptfs.sources xattr: how each of its lines (a source
    // copy) is reached, in the same order. Each caller is told only the
    // copies whose path they could learn in SRC (see MayLearnPath).
    std::vector<AccessPath> source_access;
  };
  using NodePtr = std::shared_ptr<const Node>;

  // `trusted_writers`: users besides root and the daemon's own uid whose
  // copies are trusted (SourceCopy::trusted; mount option trusted_writers=);
  // `source_dev`: SRC's device, the only one whose copies may be.
  View(std::string source_root, Ownership root_owner, std::vector<uid_t> trusted_writers = {}, uint64_t source_dev = 0);

  // What a publish changed, for the kernel's caches: directory entries that
  // appeared, vanished or now lead elsewhere, as (parent, name), and nodes
  // whose owner, mode or access changed (a chmod in SRC must not stay
  // granted by attributes the kernel cached).
  struct Changes {
    std::vector<std::pair<InodeId, std::string>> entries;
    std::vector<InodeId> inodes;
    bool empty() const { return entries.empty() && inodes.empty(); }
  };

  // Replaces what is exposed. `source_dirs` maps paths relative to the
  // source root to how they are reached (for by-name directories);
  // `hub_refs` are mirrored under by-name in every hub repository directory
  // that by-name shows (one with a checkpoint below it).
  Changes Publish(const std::vector<ExposedCheckpoint>& checkpoints,
                  const std::map<std::string, AccessPath>& source_dirs, const std::vector<HubRef>& hub_refs);

  NodePtr Get(InodeId ino) const;

  // Nodes the last publish built, and those it took unchanged from the
  // snapshot before (digest directories whose inputs had not changed).
  struct PublishStats {
    uint64_t built = 0;
    uint64_t reused = 0;
  };
  PublishStats LastPublish() const { return {last_built_.load(), last_reused_.load()}; }
  // Publishes that have begun building their snapshot (a publish in progress
  // counts), for whoever must know that one is under way.
  uint64_t PublishesBegun() const { return publishes_begun_.load(); }

  // The fingerprint of everything a publish reads from `checkpoint`.
  static Sha256Digest InputsOf(const ExposedCheckpoint& checkpoint);

  // The kernel's references to nodes (FUSE lookup counts). A node that a
  // publish left out stays reachable by inode while the kernel still holds
  // it (an open file of a withdrawn digest keeps working), and is freed once
  // the kernel forgets it: nodes of withdrawn checkpoints must not
  // accumulate. Taken per lookup reply, so striped locks, not the snapshot's.
  void Remember(const NodePtr& node);
  void Forget(InodeId ino, uint64_t count);
  // Nodes held now (current or still remembered by the kernel).
  size_t NodeCount() const;
  // Nodes the kernel holds lookups on now (`stats`: kernel_held_nodes).
  size_t KernelHeldNodes() const;
  NodePtr Lookup(InodeId parent, const std::string& name) const;

  // Extended attribute on the root naming the control socket.
  void SetRootXattr(const std::string& name, const std::string& value);

  // The digest path a by-name path leads to ("by-name/a/b" -> "sha256-..."),
  // for ckptfsctl resolve and tests; nullopt if it is not a checkpoint link.
  std::optional<std::string> DigestOfByName(const std::string& by_name_path) const;
  // The node at `rel_path` below the root ("sha256-.../a/b"), following no links.
  NodePtr Resolve(const std::string& rel_path) const;
  // Every file node at or below `node`.
  std::vector<NodePtr> FilesUnder(const NodePtr& node) const;
  // Every by-name checkpoint path ("by-name/...") and the digest it leads to.
  std::map<std::string, std::string> ByNameLinks() const;

 private:
  // What one publish built; never changed once swapped in.
  // One digest directory's nodes as built, with a fingerprint of what they
  // were built from: the next publish reuses them when that is unchanged.
  struct DigestPart {
    Sha256Digest inputs{};
    InodeId dir = 0;
    std::vector<NodePtr> nodes;
    std::map<std::string, std::set<std::string>> entries;  // directory -> entry names
    std::vector<std::pair<std::string, std::string>> xattrs;
    std::vector<AccessPath> source_access;  // as Node::source_access
  };
  struct Snapshot {
    std::unordered_map<InodeId, NodePtr> nodes;
    std::unordered_set<InodeId> mutable_dirs;            // the root and by-name directories
    std::map<std::string, std::string> by_name_digest;  // "by-name/..." -> digest
    std::map<std::string, std::shared_ptr<const DigestPart>> digests;
  };
  using SnapshotPtr = std::shared_ptr<const Snapshot>;
  friend class ViewBuilder;

  // A node the kernel holds (its FUSE lookup count), kept alive here so that
  // it outlives the snapshots that no longer list it. Striped so that
  // concurrent lookups rarely share a lock.
  struct HeldStripe {
    Mutex mu;
    std::unordered_map<InodeId, std::pair<NodePtr, uint64_t>> nodes GUARDED_BY(mu);
  };
  static constexpr size_t kHeldStripes = 16;
  HeldStripe& StripeOf(InodeId ino) const { return held_[ino % kHeldStripes]; }

  SnapshotPtr Current() const {
    MutexLock lock(current_mu_);
    return current_;
  }
  void SetCurrent(SnapshotPtr next);
  SnapshotPtr Build(const std::vector<ExposedCheckpoint>& checkpoints,
                    const std::map<std::string, AccessPath>& source_dirs,
                    const std::vector<HubRef>& hub_refs) REQUIRES(publish_mu_);
  static Changes Diff(const Snapshot& before, const Snapshot& after);
  static NodePtr LookupIn(const Snapshot& snap, InodeId parent, const std::string& name);

  const std::string source_root_;
  const Ownership root_owner_;
  const std::vector<uid_t> trusted_writers_;  // trusted_writers= (SourceCopy::trusted)
  const uint64_t source_dev_;
  const struct timespec mount_time_;
  // Serialises publishes (and the root xattrs they copy); readers never take it.
  Mutex publish_mu_;
  std::vector<std::pair<std::string, std::string>> root_xattrs_ GUARDED_BY(publish_mu_);
  // The current snapshot, copied out under a short lock rather than held in
  // std::atomic<shared_ptr>: GCC 12's load() releases its internal lock with
  // memory_order_relaxed, so a publish's store races the last load in the
  // memory model (ThreadSanitizer reports it on every mount).
  mutable Mutex current_mu_;
  SnapshotPtr current_ GUARDED_BY(current_mu_);
  std::atomic<uint64_t> last_built_{0}, last_reused_{0};
  std::atomic<uint64_t> publishes_begun_{0};
  mutable std::array<HeldStripe, kHeldStripes> held_;
};

}  // namespace ckptfs
