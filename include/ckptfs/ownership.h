// Owner, group and permission bits as the view presents them, and the rule
// that keeps the view from granting more than the source does.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

namespace ckptfs {

struct Ownership {
  uid_t uid = 0;
  gid_t gid = 0;
  mode_t mode = 0;  // permission bits only (07777 mask)

  static Ownership FromStat(const struct stat& st) { return {st.st_uid, st.st_gid, st.st_mode & 07777}; }
  bool operator==(const Ownership&) const = default;
};

// Access granted by both `a` and `b`, conservatively: where the owners (or
// groups) differ, ownership falls to root (group 0) and the owner (group)
// bits are cleared, so nobody gets through the view what either source would
// have refused them. Set-id and sticky bits never survive.
Ownership Intersect(const Ownership& a, const Ownership& b);

// What a directory on the path to `dir` lets through: its search (x) bits as
// read-and-search (r-x), so that intersecting it with a checkpoint directory
// keeps out whoever could not reach that checkpoint in the source tree.
Ownership TraversalOnly(const Ownership& dir);

// The bits the view shows: write bits removed.
inline mode_t ReadOnlyMode(mode_t mode) { return mode & 0555; }

}  // namespace ckptfs
