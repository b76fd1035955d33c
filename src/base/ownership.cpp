#include "ckptfs/ownership.h"

#include <algorithm>

namespace ckptfs {

bool AccessPath::operator==(const AccessPath& other) const {
  if (!(self == other.self)) return false;
  if (dirs == other.dirs) return true;
  static const std::vector<Ownership> kNone;
  return (dirs ? *dirs : kNone) == (other.dirs ? *other.dirs : kNone);
}

std::shared_ptr<const std::vector<Ownership>> ExtendChain(const std::shared_ptr<const std::vector<Ownership>>& chain,
                                                          const Ownership& next) {
  auto out = std::make_shared<std::vector<Ownership>>(chain ? *chain : std::vector<Ownership>{});
  out->push_back(next);
  return out;
}

std::shared_ptr<const std::vector<Ownership>> JoinChains(const std::shared_ptr<const std::vector<Ownership>>& a,
                                                         const std::shared_ptr<const std::vector<Ownership>>& b) {
  if (!b || b->empty()) return a;
  if (!a || a->empty()) return b;
  auto out = std::make_shared<std::vector<Ownership>>(*a);
  out->insert(out->end(), b->begin(), b->end());
  return out;
}

bool Caller::InGroup(gid_t gid) {
  if (gid == gid_) return true;
  if (!groups_) groups_ = load_groups_ ? load_groups_() : std::vector<gid_t>{};
  return std::find(groups_->begin(), groups_->end(), gid) != groups_->end();
}

bool Permits(const Ownership& o, Caller& caller, int want) {
  if (caller.uid() == 0) return true;
  const unsigned need = static_cast<unsigned>(want) & 7u;
  if (caller.uid() == o.uid) return ((o.mode >> 6) & need) == need;
  const unsigned group = (o.mode >> 3) & need, other = o.mode & need;
  // Only when the group's bits differ from everyone else's does membership
  // matter; skip the (costly) lookup of supplementary groups otherwise.
  if (group == other) return other == need;
  return (caller.InGroup(o.gid) ? group : other) == need;
}

bool MayReach(const AccessPath& path, Caller& caller) {
  if (!path.dirs) return true;
  for (const Ownership& dir : *path.dirs) {
    if (!Permits(dir, caller, kWantSearch)) return false;
  }
  return true;
}

bool MayAccess(const std::vector<AccessPath>& copies, Caller& caller, int want) {
  if (copies.empty()) return true;
  for (const AccessPath& copy : copies) {
    if (MayReach(copy, caller) && (want == 0 || Permits(copy.self, caller, want))) return true;
  }
  return false;
}

bool OpenToEveryone(const std::vector<AccessPath>& copies, int want) {
  if (copies.empty()) return true;
  auto all = [](const Ownership& o, unsigned need) {
    const unsigned bits = need * 0111u;  // the same bits for owner, group and others
    return (o.mode & bits) == bits;
  };
  for (const AccessPath& copy : copies) {
    bool ok = all(copy.self, static_cast<unsigned>(want) & 7u);
    if (ok && copy.dirs) {
      ok = std::all_of(copy.dirs->begin(), copy.dirs->end(), [&](const Ownership& d) { return all(d, 1); });
    }
    if (ok) return true;
  }
  return false;
}

}  // namespace ckptfs
