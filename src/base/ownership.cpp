#include "ckptfs/ownership.h"

#include <algorithm>

namespace ckptfs {

bool Ownership::operator==(const Ownership& other) const {
  if (!SameModeAs(other)) return false;
  if (acl == other.acl) return true;
  return acl && other.acl && *acl == *other.acl;
}

bool AccessPath::operator==(const AccessPath& other) const {
  if (!(self == other.self)) return false;
  if (dirs == other.dirs) return true;
  const size_t n = dirs ? dirs->size() : 0, m = other.dirs ? other.dirs->size() : 0;
  if (n != m) return false;
  return n == 0 || dirs->Flatten() == other.dirs->Flatten();
}

DirChain::DirChain(Ptr first, Ptr second, std::optional<Ownership> dir, size_t size)
    : first_(std::move(first)), second_(std::move(second)), dir_(std::move(dir)), size_(size) {
  last_ = dir_ ? &*dir_ : second_->last_;
}

DirChain::Ptr DirChain::Extend(Ptr chain, const Ownership& dir) {
  const size_t size = (chain ? chain->size_ : 0) + 1;
  return std::make_shared<const DirChain>(std::move(chain), nullptr, dir, size);
}

DirChain::Ptr DirChain::Join(Ptr a, Ptr b) {
  if (!b || b->size_ == 0) return a;
  if (!a || a->size_ == 0) return b;
  const size_t size = a->size_ + b->size_;
  return std::make_shared<const DirChain>(std::move(a), std::move(b), std::nullopt, size);
}

// Along the chain of parents in a loop (as deep as the tree); into a join's
// second chain by recursion (as deep as links within links).
bool DirChain::AllOf(const std::function<bool(const Ownership&)>& pred) const {
  for (const DirChain* node = this; node != nullptr; node = node->first_.get()) {
    if (node->dir_) {
      if (!pred(*node->dir_)) return false;
    } else if (!node->second_->AllOf(pred)) {
      return false;
    }
  }
  return true;
}

std::vector<Ownership> DirChain::Flatten() const {
  std::vector<Ownership> out;
  out.reserve(size_);
  AppendTo(out);
  return out;
}

void DirChain::AppendTo(std::vector<Ownership>& out) const {
  // This node and those above it, last first; then appended first first.
  std::vector<const DirChain*> up;
  for (const DirChain* node = this; node != nullptr; node = node->first_.get()) up.push_back(node);
  for (auto it = up.rbegin(); it != up.rend(); ++it) {
    if ((*it)->dir_) {
      out.push_back(*(*it)->dir_);
    } else {
      (*it)->second_->AppendTo(out);
    }
  }
}

std::optional<bool> Caller::InGroup(gid_t gid) {
  if (gid == gid_) return true;
  if (!loaded_) {
    if (load_groups_) groups_ = load_groups_();
    loaded_ = true;
  }
  if (!groups_) return std::nullopt;
  return std::find(groups_->begin(), groups_->end(), gid) != groups_->end();
}

namespace {

// acl(5)'s access check algorithm for a caller who is not the owner: a named
// user entry decides alone (through the mask); else, if the caller is in the
// owning group or a named group, they pass when one of those entries grants
// everything asked (through the mask) and are refused otherwise, whatever
// "other" says; else "other" decides. `in_group(gid)` says who is in what.
template <typename InGroup>
bool AclPermitsAs(const Ownership& o, const ExtendedAcl& acl, uid_t uid, unsigned need, const InGroup& in_group) {
  const unsigned mask = (o.mode >> 3) & 7u;
  for (const auto& e : acl.named) {
    if (e.tag == ExtendedAcl::Entry::Tag::kUser && e.id == uid) return (e.perm & mask & need) == need;
  }
  bool in_group_class = false;
  auto passes = [&](unsigned perm) { return (perm & need) == need; };
  if (in_group(o.gid)) {
    in_group_class = true;
    if (passes(acl.group_obj)) return (mask & need) == need;
  }
  for (const auto& e : acl.named) {
    if (e.tag != ExtendedAcl::Entry::Tag::kGroup || !in_group(e.id)) continue;
    in_group_class = true;
    if (passes(e.perm)) return (mask & need) == need;
  }
  if (in_group_class) return false;
  return (o.mode & need) == need;
}

bool AclPermits(const Ownership& o, const ExtendedAcl& acl, Caller& caller, unsigned need) {
  bool unknown = false;
  auto in_no_other_group = [&](gid_t g) {
    const std::optional<bool> in = caller.InGroup(g);
    if (!in) unknown = true;
    return in.value_or(false);
  };
  const bool allowed = AclPermitsAs(o, acl, caller.uid(), need, in_no_other_group);
  if (!allowed || !unknown) return allowed;
  // The caller's groups cannot be known: allowed only if allowed whatever
  // they are. In no group of the ACL (above) and in each one alone cover
  // every case: an entry of the group class that refuses refuses when it
  // is the only one the caller matches, and when every entry grants (the
  // mask too), any membership is granted.
  auto in_only = [&caller](gid_t extra) {
    return [&caller, extra](gid_t g) { return caller.InGroup(g).value_or(g == extra); };
  };
  if (!AclPermitsAs(o, acl, caller.uid(), need, in_only(o.gid))) return false;
  for (const auto& e : acl.named) {
    if (e.tag == ExtendedAcl::Entry::Tag::kGroup && !AclPermitsAs(o, acl, caller.uid(), need, in_only(e.id))) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool Permits(const Ownership& o, Caller& caller, int want) {
  if (caller.uid() == 0) return true;
  const unsigned need = static_cast<unsigned>(want) & 7u;
  if (caller.uid() == o.uid) return ((o.mode >> 6) & need) == need;
  if (o.acl) return AclPermits(o, *o.acl, caller, need);
  const unsigned group = (o.mode >> 3) & need, other = o.mode & need;
  // Only when the group's bits differ from everyone else's does membership
  // matter; skip the (costly) lookup of supplementary groups otherwise.
  if (group == other) return other == need;
  const std::optional<bool> in = caller.InGroup(o.gid);
  // Groups unknown: the caller may be in either class, and one of them refuses.
  if (!in) return false;
  return (*in ? group : other) == need;
}

bool MayReach(const AccessPath& path, Caller& caller) {
  if (!path.dirs) return true;
  return path.dirs->AllOf([&](const Ownership& dir) { return Permits(dir, caller, kWantSearch); });
}

bool MayLearnPath(const AccessPath& path, Caller& caller) {
  if (!path.dirs) return true;
  if (path.dirs->AllOf([&](const Ownership& dir) { return Permits(dir, caller, kWantRead | kWantSearch); })) {
    return true;
  }
  // The entry's owner named it: in a directory they may only search (a
  // 0711 /srv/models), their own checkpoint is still theirs to be told of.
  return caller.uid() == path.self.uid && MayReach(path, caller);
}

bool MayKnowCopy(const AccessPath& path, Caller& caller) {
  return MayLearnPath(path, caller) && Permits(path.self, caller, kWantSearch);
}

bool MayAccess(const std::vector<AccessPath>& copies, Caller& caller, int want) {
  if (copies.empty()) return true;
  for (const AccessPath& copy : copies) {
    if (MayReach(copy, caller) && (want == 0 || Permits(copy.self, caller, want))) return true;
  }
  return false;
}

namespace {

// Every user, whatever their uid and groups, may do `need` (rwx as 4, 2, 1)
// on `o`.
bool EveryonePermits(const Ownership& o, unsigned need) {
  const unsigned bits = need * 0111u;  // the same bits for owner, group and others
  if ((o.mode & bits) != bits) return false;
  if (!o.acl) return true;
  // Every entry of the group class, through the mask, must grant it too
  // (the mask itself is the mode's group bits, checked above).
  if ((o.acl->group_obj & need) != need) return false;
  return std::all_of(o.acl->named.begin(), o.acl->named.end(),
                     [&](const ExtendedAcl::Entry& e) { return (e.perm & need) == need; });
}

}  // namespace

bool EveryoneMayLearnPath(const AccessPath& path) {
  if (!path.dirs) return true;
  return path.dirs->AllOf([](const Ownership& dir) { return EveryonePermits(dir, kWantRead | kWantSearch); });
}

bool OpenToEveryone(const std::vector<AccessPath>& copies, int want) {
  if (copies.empty()) return true;
  for (const AccessPath& copy : copies) {
    bool ok = EveryonePermits(copy.self, static_cast<unsigned>(want) & 7u);
    if (ok && copy.dirs) {
      ok = copy.dirs->AllOf([](const Ownership& d) { return EveryonePermits(d, kWantSearch); });
    }
    if (ok) return true;
  }
  return false;
}

}  // namespace ckptfs
