#include "ckptfs/view.h"

#include "view_builder.h"

namespace ckptfs {

View::View(std::string source_root, Ownership root_owner, std::vector<uid_t> trusted_writers, uint64_t source_dev)
    : source_root_(std::move(source_root)),
      root_owner_(root_owner),
      trusted_writers_(std::move(trusted_writers)),
      source_dev_(source_dev),
      mount_time_(RealtimeNow()) {
  Publish({}, {}, {});
}

View::SnapshotPtr View::Build(const std::vector<ExposedCheckpoint>& checkpoints,
                              const std::map<std::string, AccessPath>& source_dirs,
                              const std::vector<HubRef>& hub_refs) {
  SnapshotPtr previous = Current();  // publish_mu_ held: nothing replaces it meanwhile
  ViewBuilder::Inputs in{source_root_, root_owner_, mount_time_, root_xattrs_, previous.get()};
  in.trusted_writers = trusted_writers_;
  in.source_dev = source_dev_;
  ViewBuilder builder(in, checkpoints, source_dirs, hub_refs);
  SnapshotPtr next = builder.Build();
  last_reused_ = builder.reused();
  last_built_ = next->nodes.size() - builder.reused();
  return next;
}

View::Changes View::Publish(const std::vector<ExposedCheckpoint>& checkpoints,
                            const std::map<std::string, AccessPath>& source_dirs,
                            const std::vector<HubRef>& hub_refs) {
  // Only publishes wait here; lookups go on reading the current snapshot
  // while the next one is built.
  MutexLock publishing(publish_mu_);
  ++publishes_begun_;
  SnapshotPtr next = Build(checkpoints, source_dirs, hub_refs);
  SnapshotPtr before = Current();
  Changes changes = before ? Diff(*before, *next) : Changes{};
  SetCurrent(std::move(next));
  return changes;
}

// What the kernel must drop from its caches when `after` replaces `before`.
View::Changes View::Diff(const Snapshot& before, const Snapshot& after) {
  Changes changes;
  for (const auto& [ino, fresh_node] : after.nodes) {
    if (fresh_node->kind != Kind::kDir) continue;
    const auto& fresh = fresh_node->children;
    auto old_it = before.nodes.find(ino);
    // A directory reused from the previous snapshot, children and all.
    if (old_it != before.nodes.end() && old_it->second == fresh_node) continue;
    if (old_it != before.nodes.end() && after.mutable_dirs.count(ino)) {
      const auto& old = old_it->second->children;
      for (const auto& [name, child] : old) {
        auto f = fresh.find(name);
        if (f == fresh.end() || f->second != child) changes.entries.emplace_back(ino, name);
      }
      for (const auto& [name, child] : fresh) {
        if (!old.count(name)) changes.entries.emplace_back(ino, name);
      }
    }
    // Same inode, other owner, mode or access: a chmod or chown in SRC.
    for (const auto& [name, child] : fresh) {
      auto was = before.nodes.find(child);
      if (was == before.nodes.end()) continue;
      const Node& now = *after.nodes.at(child);
      if (was->second->owner != now.owner || was->second->access != now.access) {
        changes.entries.emplace_back(ino, name);
        changes.inodes.push_back(child);
      }
    }
  }
  return changes;
}

View::NodePtr View::Get(InodeId ino) const {
  SnapshotPtr snap = Current();
  if (auto it = snap->nodes.find(ino); it != snap->nodes.end()) return it->second;
  // Withdrawn from the listing, but the kernel may still hold it.
  HeldStripe& stripe = StripeOf(ino);
  MutexLock lock(stripe.mu);
  auto it = stripe.nodes.find(ino);
  return it == stripe.nodes.end() ? nullptr : it->second.first;
}

void View::Remember(const NodePtr& node) {
  HeldStripe& stripe = StripeOf(node->ino);
  MutexLock lock(stripe.mu);
  auto& [held, count] = stripe.nodes[node->ino];
  held = node;  // the version the kernel was last told about
  ++count;
}

void View::Forget(InodeId ino, uint64_t count) {
  HeldStripe& stripe = StripeOf(ino);
  MutexLock lock(stripe.mu);
  // A count this process never gave (a forget meant for an earlier daemon
  // of the same mount) finds nothing, or less, and is harmless.
  auto it = stripe.nodes.find(ino);
  if (it == stripe.nodes.end()) return;
  if (it->second.second > count) {
    it->second.second -= count;
    return;
  }
  stripe.nodes.erase(it);
}

size_t View::KernelHeldNodes() const {
  size_t count = 0;
  for (auto& stripe : held_) {
    MutexLock lock(stripe.mu);
    count += stripe.nodes.size();
  }
  return count;
}

size_t View::NodeCount() const {
  SnapshotPtr snap = Current();
  size_t count = snap->nodes.size();
  for (auto& stripe : held_) {
    MutexLock lock(stripe.mu);
    for (const auto& [ino, held] : stripe.nodes) count += snap->nodes.count(ino) == 0;
  }
  return count;
}

View::NodePtr View::LookupIn(const Snapshot& snap, InodeId parent, const std::string& name) {
  auto p = snap.nodes.find(parent);
  if (p == snap.nodes.end() || p->second->kind != Kind::kDir) return nullptr;
  auto c = p->second->children.find(name);
  if (c == p->second->children.end()) return nullptr;
  auto it = snap.nodes.find(c->second);
  return it == snap.nodes.end() ? nullptr : it->second;
}

View::NodePtr View::Lookup(InodeId parent, const std::string& name) const {
  SnapshotPtr snap = Current();
  if (snap->nodes.count(parent)) return LookupIn(*snap, parent, name);
  // A directory of a withdrawn digest that the kernel still holds: its
  // children are gone with its snapshot, except those the kernel holds too.
  NodePtr dir = Get(parent);
  if (!dir || dir->kind != Kind::kDir) return nullptr;
  auto c = dir->children.find(name);
  return c == dir->children.end() ? nullptr : Get(c->second);
}

void View::SetRootXattr(const std::string& name, const std::string& value) {
  MutexLock publishing(publish_mu_);
  root_xattrs_.emplace_back(name, value);
  auto next = std::make_shared<Snapshot>(*Current());
  auto root = std::make_shared<Node>(*next->nodes.at(kRootInode));
  root->xattrs = root_xattrs_;
  next->nodes[kRootInode] = std::move(root);
  SetCurrent(std::move(next));
}

std::optional<std::string> View::DigestOfByName(const std::string& by_name_path) const {
  SnapshotPtr snap = Current();
  auto it = snap->by_name_digest.find(by_name_path);
  if (it == snap->by_name_digest.end()) return std::nullopt;
  return it->second;
}

View::NodePtr View::Resolve(const std::string& rel_path) const {
  SnapshotPtr snap = Current();  // one snapshot for the whole walk
  NodePtr n = snap->nodes.at(kRootInode);
  size_t pos = 0;
  while (n && pos < rel_path.size()) {
    size_t slash = rel_path.find('/', pos);
    std::string part = rel_path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    pos = slash == std::string::npos ? rel_path.size() : slash + 1;
    if (part.empty() || part == ".") continue;
    n = LookupIn(*snap, n->ino, part);
  }
  return n;
}

std::vector<View::NodePtr> View::FilesUnder(const NodePtr& node) const {
  std::vector<NodePtr> out;
  std::vector<NodePtr> stack{node};
  while (!stack.empty()) {
    NodePtr n = stack.back();
    stack.pop_back();
    if (!n) continue;
    if (n->kind == Kind::kFile) out.push_back(n);
    if (n->kind != Kind::kDir) continue;
    for (const auto& [name, ino] : n->children) stack.push_back(Get(ino));
  }
  return out;
}

void View::SetCurrent(SnapshotPtr next) {
  {
    MutexLock lock(current_mu_);
    current_.swap(next);
  }
  // `next` now holds the old snapshot: freed here, outside the lock.
}

std::map<std::string, std::string> View::ByNameLinks() const { return Current()->by_name_digest; }

}  // namespace ckptfs
