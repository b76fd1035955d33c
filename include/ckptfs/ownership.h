// Owner, group and permission bits as the view presents them, and the access
// rule of DESIGN.md section 2: a user may open, list or read the xattrs of an
// entry exactly when they could do so for at least one source copy of it,
// counting search permission on every directory from SRC down to that copy
// (and, for an entry reached through a symlink, down to the link's target).
//
// POSIX access ACLs count as the kernel counts them (acl(5)): an inode with
// an extended ACL carries its named user and group entries, and the mode's
// group bits are then the ACL's mask. Default ACLs never decide an access
// themselves, only through the access ACLs they create, so they are not kept.
//
// The kernel's default_permissions cannot express that rule (it sees one
// owner and one mode per inode, not "any of these copies", and it cannot tell
// a group kept out by 0705 from everyone else once copies disagree), so the
// daemon evaluates it itself for each request, with the caller's uid and
// groups.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace ckptfs {

// The entries of an access ACL beyond what the mode bits already say: the
// owning group's own permissions (with an extended ACL the mode's group bits
// are the mask, not the group's entry) and the named users and groups.
struct ExtendedAcl {
  struct Entry {
    enum class Tag : uint8_t { kUser, kGroup };
    Tag tag = Tag::kUser;
    uint32_t id = 0;
    uint8_t perm = 0;  // rwx as 4, 2, 1
    bool operator==(const Entry&) const = default;
  };
  uint8_t group_obj = 0;
  std::vector<Entry> named;  // in the order the ACL lists them (users, then groups, ascending ids)
  bool operator==(const ExtendedAcl&) const = default;
};

struct Ownership {
  Ownership() = default;
  // Not an aggregate, so that {uid, gid, mode} stays a complete value.
  Ownership(uid_t u, gid_t g, mode_t m, std::shared_ptr<const ExtendedAcl> a = nullptr)
      : uid(u), gid(g), mode(m), acl(std::move(a)) {}

  uid_t uid = 0;
  gid_t gid = 0;
  mode_t mode = 0;  // permission bits only (07777 mask); with an ACL, the group bits are its mask
  // Set only for an inode with an extended access ACL (see ReadOwnership in
  // source_acl.h); shared because a tree often gives one ACL to many files.
  std::shared_ptr<const ExtendedAcl> acl;

  static Ownership FromStat(const struct stat& st) { return {st.st_uid, st.st_gid, st.st_mode & 07777, nullptr}; }
  bool operator==(const Ownership& other) const;
  // Owner, group and mode bits agree, whatever the ACLs say.
  bool SameModeAs(const Ownership& other) const {
    return uid == other.uid && gid == other.gid && mode == other.mode;
  }
};

// The bits the view shows: write bits removed.
inline mode_t ReadOnlyMode(mode_t mode) { return mode & 0555; }

// Directories to search, in order, as a persistent list: a directory's
// chain is its parent's plus itself and shares the parent's nodes, and the
// chain of an entry reached through a symlink joins two chains without
// copying either. So a tree costs a node per directory and per link however
// deep it is. (A copy per directory cost depth^2/2 entries: a SRC writer's
// three chains of 1,977 nested empty directories, with 500 links each, took
// the daemon to 1.47 GB.)
class DirChain {
 public:
  using Ptr = std::shared_ptr<const DirChain>;
  // `chain` (null: empty) followed by `dir`.
  static Ptr Extend(Ptr chain, const Ownership& dir);
  // `a` followed by `b` (either may be null: empty).
  static Ptr Join(Ptr a, Ptr b);

  size_t size() const { return size_; }
  // The last directory searched: the entry's parent (or its target's).
  const Ownership& back() const { return *last_; }
  // Whether `pred` holds for every directory; stops at the first that fails.
  bool AllOf(const std::function<bool(const Ownership&)>& pred) const;
  // The directories, the first searched first.
  std::vector<Ownership> Flatten() const;

  // Use Extend and Join.
  DirChain(Ptr first, Ptr second, std::optional<Ownership> dir, size_t size);
  DirChain(const DirChain&) = delete;  // last_ points into the object itself
  DirChain& operator=(const DirChain&) = delete;

 private:
  void AppendTo(std::vector<Ownership>& out) const;

  Ptr first_;                     // Extend: the chain above; Join: the first chain
  Ptr second_;                    // Join only: the chain that follows it
  std::optional<Ownership> dir_;  // Extend only: the directory appended
  size_t size_;
  const Ownership* last_;
};

// One way to reach an entry in the source tree.
struct AccessPath {
  // Directories the user must be able to search (x), from SRC down to the
  // entry's parent, followed, for an entry reached through a symlink, by
  // those from SRC down to the target's parent. Shared between the entries of
  // one directory. Null: none.
  DirChain::Ptr dirs;
  Ownership self;  // the entry itself (for a link: its target)

  bool operator==(const AccessPath& other) const;
};

// Who is asking: uid, primary gid and, loaded only when a decision needs
// them (reading them costs a /proc lookup per request), the supplementary
// groups. The loader answers nullopt when they cannot be known (a FUSE
// caller outside the daemon's PID namespace, whose /proc entry the daemon
// cannot read), and so does a null loader: a decision that depends on them
// is then allowed only if it would be allowed for every set of groups the
// caller could be in (so a group that the mode keeps out, 0604, keeps
// everyone out whose groups are unknown). Taking them as "none" instead
// would let a member of that group read as "other". Each decision is taken
// so on its own, per entry and per copy: with several copies this may
// refuse a caller whom some copy would let in whatever their groups.
class Caller {
 public:
  using GroupLoader = std::function<std::optional<std::vector<gid_t>>()>;
  Caller(uid_t uid, gid_t gid, GroupLoader load_groups)
      : uid_(uid), gid_(gid), load_groups_(std::move(load_groups)) {}

  uid_t uid() const { return uid_; }
  // Whether the caller is in `gid`; nullopt when their supplementary groups
  // cannot be known and `gid` is not their primary group.
  std::optional<bool> InGroup(gid_t gid);

 private:
  uid_t uid_;
  gid_t gid_;
  GroupLoader load_groups_;
  bool loaded_ = false;
  std::optional<std::vector<gid_t>> groups_;  // nullopt once loaded: unknown
};

// What a request wants of an entry, as in access(2).
enum AccessWant : int { kWantSearch = 1, kWantRead = 4 };

// POSIX permission check of `want` against one inode, ACL included, as the
// kernel's acl_permission_check decides. Root (uid 0) may read and search
// everything, as CAP_DAC_READ_SEARCH allows.
bool Permits(const Ownership& o, Caller& caller, int want);
// The caller can search every directory of `path`.
bool MayReach(const AccessPath& path, Caller& caller);
// Some copy lets the caller reach the entry and do `want` on it (`want` 0:
// reach it only). An empty list means the entry is open to everyone.
bool MayAccess(const std::vector<AccessPath>& copies, Caller& caller, int want);
// The caller could learn this entry's path in the source by listing: they
// may list and search every directory from SRC down to its parent (or they
// own the entry and may reach it). A name in a directory they can only
// search (0711: enter, not list) is not theirs to learn, though they could
// reach the entry if they knew it.
bool MayLearnPath(const AccessPath& path, Caller& caller);
// The caller may be told of this copy of a checkpoint (its path in
// user.ckptfs.sources, its row in ckptfsctl): they may learn its path and
// enter it; what is drawn from its bytes (that it holds the digest) is for
// no one who cannot.
bool MayKnowCopy(const AccessPath& path, Caller& caller);
// The same for every user, whatever their uid and groups (what a record in
// a shared manifest store, which names the path, may be written for).
bool EveryoneMayLearnPath(const AccessPath& path);
// True when every user, whatever their uid and groups, passes MayAccess with
// `want` (so the kernel may cache the answer for as long as it likes).
bool OpenToEveryone(const std::vector<AccessPath>& copies, int want);

}  // namespace ckptfs
