// ViewBuilder: turns one publish (the exposed checkpoints, the source
// directories, the hub refs) into a View snapshot. A pure function of its
// inputs: it touches no shared state and takes no lock, so the view can
// build the next snapshot while lookups go on reading the current one.
//
// Inode numbers come from NumbersFor(key): the first 8 bytes of the SHA-256
// of the node's key are its inode, the next 8 its generation. Keys:
//   "D:<digest>[/<member path>]"          a digest directory and its members
//   "N:<by-name path>"                    a by-name directory
//   "L:<by-name path>\0<target>"          a by-name link (a moved link is a new node)
//   "R:<by-name path>\0<content>"         a hub ref file (a changed ref is a new node)
// Two keys of one snapshot that hash to the same inode (a 2^-64 event per
// pair) are told apart by salting the later one, in the builder's
// deterministic order, so the same tree still gives the same numbers.
#pragma once

#include <time.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "ckptfs/view.h"

namespace ckptfs {

// The wall-clock time shown as the mtime of what the view makes up itself.
inline struct timespec RealtimeNow() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts;
}

class ViewBuilder {
 public:
  struct Inputs {
    std::string source_root;
    Ownership root_owner;
    struct timespec mount_time {};
    std::vector<std::pair<std::string, std::string>> root_xattrs;
    // The snapshot this one replaces: digest directories built from the
    // same inputs are taken from it as they are (their nodes are immutable).
    const View::Snapshot* previous = nullptr;
    // The mount's owner (the uid the daemon runs as): its copies of a file
    // are trusted after root's and before everyone else's, as are those of
    // the trusted_writers= users.
    uid_t mount_owner = ::geteuid();
    std::vector<uid_t> trusted_writers = {};
    // SRC's device: a copy on another (a filesystem mounted inside SRC,
    // maybe by a user through FUSE, whose owners and modes are whatever
    // it says) is never trusted.
    uint64_t source_dev = 0;
  };

  ViewBuilder(const Inputs& in, const std::vector<ExposedCheckpoint>& checkpoints,
              const std::map<std::string, AccessPath>& source_dirs, const std::vector<HubRef>& hub_refs);

  std::shared_ptr<const View::Snapshot> Build();
  // After Build: nodes taken from the previous snapshot.
  uint64_t reused() const { return reused_; }

 private:
  using Kind = View::Kind;
  using Node = View::Node;

  std::string ByNamePath(const std::string& rel) const;
  bool HasCheckpointBelow(const std::string& p) const;
  const AccessPath* FindSourceDir(const std::string& by_name_path) const;
  AccessPath SourceDirAccess(const std::string& by_name_path) const;
  AccessPath ReachOf(const std::string& by_name_path) const;

  std::shared_ptr<Node> NewNode(const std::string& key, Kind kind, Ownership owner);
  void Add(const std::shared_ptr<Node>& n, bool is_mutable);

  InodeId BuildDigest(const std::string& name, const std::vector<const ExposedCheckpoint*>& copies);
  InodeId ReuseDigest(const std::string& name, const std::shared_ptr<const View::DigestPart>& part);
  std::shared_ptr<Node> DigestSubdir(const std::string& name, const std::string& rel,
                                     const std::vector<const ExposedCheckpoint*>& copies);
  void AddDigestFile(const std::string& name, size_t index, const std::vector<const ExposedCheckpoint*>& copies);
  std::vector<SourceCopy> CopiesByTrust(size_t index, const std::vector<const ExposedCheckpoint*>& copies) const;
  InodeId BuildByNameDir(const std::string& p, const std::string& digest, const std::string& offset, bool has_digest);
  InodeId RefFile(const std::string& by_name_path, const HubRef& ref);
  InodeId Link(const std::string& by_name_path, const std::string& target, const AccessPath& access);

  const Inputs& in_;
  const std::map<std::string, AccessPath>& source_dirs_;
  const struct timespec now_;
  std::unique_ptr<View::Snapshot> snap_;
  std::unordered_map<InodeId, std::shared_ptr<Node>> nodes_;  // still mutable while building
  std::unordered_set<InodeId> used_inodes_;
  std::map<std::string, std::vector<const ExposedCheckpoint*>> by_digest_;
  std::map<std::string, std::string> by_name_;  // by-name path (without "by-name/") -> digest
  std::map<std::string, const HubRef*> refs_;   // by-name path (without "by-name/") -> hub ref
  bool root_is_checkpoint_ = false;
  std::string base_;
  // The digest directory being built: its subdirectories by relative path,
  // and every node made for it.
  std::map<std::string, std::shared_ptr<Node>> digest_subdirs_;
  std::vector<View::NodePtr> digest_nodes_;
  uint64_t reused_ = 0;
  // digest -> directory inside it -> entry names
  std::map<std::string, std::map<std::string, std::set<std::string>>> entries_;
  // digest -> its directory's xattrs and Node::source_access
  struct DigestXattrs {
    std::vector<std::pair<std::string, std::string>> xattrs;
    std::vector<AccessPath> source_access;
  };
  std::map<std::string, DigestXattrs> digest_xattrs_;
};

}  // namespace ckptfs
