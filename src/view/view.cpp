#include "ckptfs/view.h"

#include <algorithm>
#include <set>

namespace ckptfs {

namespace {

struct timespec Now() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts;
}

struct timespec FromNanos(int64_t ns) {
  return {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

std::string Parent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string Join(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }

size_t Components(const std::string& path) {
  return path.empty() ? 0 : static_cast<size_t>(std::count(path.begin(), path.end(), '/')) + 1;
}

std::string Dots(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += "../";
  return s;
}

Ownership ReadOnly(Ownership o) {
  o.mode = ReadOnlyMode(o.mode);
  return o;
}

}  // namespace

// Builds one publish's nodes; View::Publish swaps them in.
class View::Builder {
 public:
  Builder(View& view, const std::vector<ExposedCheckpoint>& checkpoints,
          const std::map<std::string, AccessPath>& source_dirs, const std::vector<HubRef>& hub_refs)
      : view_(view), source_dirs_(source_dirs), now_(Now()) {
    for (const auto& cp : checkpoints) by_digest_[cp.name].push_back(&cp);
    base_ = BaseName(view_.source_root_);
    root_is_checkpoint_ = std::any_of(checkpoints.begin(), checkpoints.end(),
                                      [](const ExposedCheckpoint& cp) { return cp.rel_path.empty(); });
    for (const auto& cp : checkpoints) by_name_[ByNamePath(cp.rel_path)] = cp.name;
    // A repository without a checkpoint below it is not in by-name, and its
    // refs would lead nowhere: leave them out too.
    for (const auto& ref : hub_refs) {
      const std::string p = ByNamePath(ref.rel_path);
      if (HasKeyBelow(by_name_, ByNamePath(ref.repo_rel_path)) && !by_name_.count(p)) refs_[p] = &ref;
    }
  }

  void Build() {
    auto root = NewNode(kRootInode, Kind::kDir, ReadOnly(view_.root_owner_));
    root->mtime = view_.mount_time_;
    root->xattrs = view_.root_xattrs_;
    for (const auto& [name, copies] : by_digest_) root->children[name] = BuildDigest(name, copies);
    root->children["by-name"] = BuildByNameDir("", "", "", /*has_digest=*/false);
    Add(root, /*is_mutable=*/true);
    root->parent = kRootInode;
    for (const auto& [ino, n] : nodes) {
      for (const auto& [name, child] : n->children) {
        if (auto c = nodes.find(child); c != nodes.end()) c->second->parent = ino;
      }
    }
  }

  std::unordered_map<InodeId, std::shared_ptr<Node>> nodes;
  std::set<InodeId> mutable_dirs;
  std::map<std::string, std::string> by_name_digest;  // "by-name/<p>" -> digest

 private:
  // by-name/<this> for a path relative to the source root.
  std::string ByNamePath(const std::string& rel) const {
    return rel.empty() ? base_ : (root_is_checkpoint_ ? base_ + "/" + rel : rel);
  }

  // Some key of `m` lies strictly below by-name path `p` ("" is by-name/).
  template <typename T>
  static bool HasKeyBelow(const std::map<std::string, T>& m, const std::string& p) {
    const std::string prefix = p.empty() ? "" : p + "/";
    auto it = m.lower_bound(prefix);
    if (p.empty()) return it != m.end();
    return it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0;
  }

  static std::string BaseName(const std::string& path) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    auto slash = p.rfind('/');
    std::string b = slash == std::string::npos ? p : p.substr(slash + 1);
    return b.empty() ? std::string("root") : b;
  }

  std::shared_ptr<Node> NewNode(InodeId ino, Kind kind, Ownership owner) {
    auto n = std::make_shared<Node>();
    n->ino = ino;
    n->kind = kind;
    n->owner = owner;
    n->mtime = now_;
    return n;
  }

  void Add(const std::shared_ptr<Node>& n, bool is_mutable) {
    nodes[n->ino] = n;
    if (is_mutable) mutable_dirs.insert(n->ino);
  }

  // sha256-<hex>/ and its members, from the copies that share the digest.
  // Each node keeps one access path per copy (DESIGN.md section 2: a user
  // may use it when any copy lets them); stat shows the first copy's owner.
  InodeId BuildDigest(const std::string& name, const std::vector<const ExposedCheckpoint*>& copies) {
    const ExposedCheckpoint& first = *copies.front();
    std::string sources;
    std::vector<AccessPath> dir_access;
    for (const auto* c : copies) {
      dir_access.push_back(c->dir_access);
      sources += c->abs_path + "\n";
    }
    auto dir = NewNode(view_.InoFor("D:" + name), Kind::kDir, ReadOnly(first.dir_access.self));
    dir->access = std::move(dir_access);
    dir->immutable = true;
    dir->digest = name;
    dir->mtime = {static_cast<time_t>(first.indexed_at), 0};
    dir->xattrs = {{"user.ckptfs.digest", name},
                   {"user.ckptfs.sources", sources},
                   {"user.ckptfs.size", std::to_string(first.total_size)}};
    digest_xattrs_[name] = dir->xattrs;

    std::map<std::string, std::shared_ptr<Node>> subdirs{{"", dir}};
    auto subdir = [&](const std::string& rel, auto& self) -> std::shared_ptr<Node> {
      if (auto it = subdirs.find(rel); it != subdirs.end()) return it->second;
      auto parent = self(Parent(rel), self);
      std::vector<AccessPath> access;
      for (const auto* c : copies) {
        if (auto it = c->subdirs.find(rel); it != c->subdirs.end()) access.push_back(it->second);
      }
      const Ownership shown = access.empty() ? first.dir_access.self : access.front().self;
      auto n = NewNode(view_.InoFor("D:" + name + "/" + rel), Kind::kDir, ReadOnly(shown));
      // A directory no copy describes (it cannot happen for a valid scan)
      // is closed to all but root rather than open to everyone.
      n->access = access.empty() ? std::vector<AccessPath>{{nullptr, {0, 0, 0}}} : std::move(access);
      n->immutable = true;
      n->digest = name;
      n->mtime = dir->mtime;
      parent->children[rel.substr(rel.rfind('/') + 1)] = n->ino;
      subdirs[rel] = n;
      return n;
    };

    for (size_t i = 0; i < first.files.size(); ++i) {
      const auto& f = first.files[i];
      auto parent = subdir(Parent(f.rel_path), subdir);
      auto n = NewNode(view_.InoFor("D:" + name + "/" + f.rel_path), Kind::kFile, ReadOnly(f.owner));
      for (const auto* c : copies) {
        if (i < c->files.size() && c->files[i].rel_path == f.rel_path) n->access.push_back(c->files[i].access);
      }
      n->immutable = true;
      n->digest = name;
      n->size = f.stamp.size;
      n->mtime = FromNanos(f.stamp.mtime_ns);
      n->source_path = f.source_path;
      n->stamp = f.stamp;
      n->sha256 = f.sha256;
      n->chunks = f.chunks;
      n->safetensors = f.rel_path.size() > 12 && f.rel_path.compare(f.rel_path.size() - 12, 12, ".safetensors") == 0;
      n->xattrs = {{"user.ckptfs.sha256", ToHex(f.sha256)}};
      const auto slash = f.rel_path.rfind('/');
      parent->children[slash == std::string::npos ? f.rel_path : f.rel_path.substr(slash + 1)] = n->ino;
      Add(n, false);
      // Remember the tree shape for by-name mirror directories.
      entries_[name][Parent(f.rel_path)].insert(slash == std::string::npos ? f.rel_path : f.rel_path.substr(slash + 1));
    }
    for (const auto& [rel, n] : subdirs) {
      Add(n, false);
      if (!rel.empty()) entries_[name][Parent(rel)].insert(rel.substr(rel.rfind('/') + 1));
    }
    return dir->ino;
  }

  bool HasCheckpointBelow(const std::string& p) const { return HasKeyBelow(by_name_, p); }

  // How the source directory that by-name/<p> mirrors is reached.
  AccessPath SourceDirAccess(const std::string& by_name_path) const {
    std::string rel = by_name_path;
    if (root_is_checkpoint_) rel = rel == base_ ? "" : rel.substr(std::min(rel.size(), base_.size() + 1));
    auto it = source_dirs_.find(rel);
    return it != source_dirs_.end() ? it->second : AccessPath{nullptr, view_.root_owner_};
  }

  // by-name/<p>/: entries are the next components of checkpoint paths below
  // p and, when p lies inside checkpoint `digest` at `offset`, that digest's
  // entries there (as links into it).
  InodeId BuildByNameDir(const std::string& p, const std::string& digest, const std::string& offset,
                            bool has_digest) {
    const AccessPath source = SourceDirAccess(p);
    auto dir = NewNode(view_.InoFor("N:" + p), Kind::kDir, ReadOnly(source.self));
    dir->access = {source};
    if (has_digest && offset.empty() && by_name_.count(p)) {
      // A checkpoint with nested ones: it answers for its own digest.
      dir->own_digest = digest;
      dir->xattrs = digest_xattrs_[digest];
    }
    // What its entries need: search on every directory down to this one.
    const AccessPath inside{ExtendChain(source.dirs, source.self), {view_.root_owner_.uid, view_.root_owner_.gid, 0777}};
    std::set<std::string> names;
    NextComponents(by_name_, p, names);
    NextComponents(refs_, p, names);
    if (has_digest) {
      if (auto d = entries_.find(digest); d != entries_.end()) {
        if (auto e = d->second.find(offset); e != d->second.end()) names.insert(e->second.begin(), e->second.end());
      }
    }
    const size_t depth = 1 + Components(p);  // of this directory below the mount root
    for (const auto& c : names) {
      const std::string q = Join(p, c);
      if (auto cp = by_name_.find(q); cp != by_name_.end()) {
        by_name_digest["by-name/" + q] = cp->second;
        dir->children[c] = HasCheckpointBelow(q) ? BuildByNameDir(q, cp->second, "", true)
                                                 : Link(q, Dots(depth) + cp->second, inside);
      } else if (HasCheckpointBelow(q)) {
        dir->children[c] = BuildByNameDir(q, digest, Join(offset, c), has_digest);
      } else if (auto ref = refs_.find(q); ref != refs_.end()) {
        dir->children[c] = RefFile(q, *ref->second);
      } else if (HasKeyBelow(refs_, q)) {
        dir->children[c] = BuildByNameDir(q, digest, Join(offset, c), has_digest);
      } else {
        dir->children[c] = Link(q, Dots(depth) + digest + "/" + Join(offset, c), inside);
      }
    }
    Add(dir, true);
    return dir->ino;
  }

  // The next component of every key of `m` below by-name path `p`.
  template <typename T>
  static void NextComponents(const std::map<std::string, T>& m, const std::string& p, std::set<std::string>& out) {
    const std::string prefix = p.empty() ? "" : p + "/";
    for (auto it = m.lower_bound(prefix); it != m.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      const std::string rest = it->first.substr(prefix.size());
      out.insert(rest.substr(0, rest.find('/')));
    }
  }

  // A hub ref, served from memory. Reaching it takes what reaching its
  // source file takes: search on every directory down to it, read on it.
  InodeId RefFile(const std::string& by_name_path, const HubRef& ref) {
    // The content is part of the key: a ref that moves to another commit is
    // a new inode, so the kernel cannot keep serving the old one's pages.
    auto n = NewNode(view_.InoFor("R:" + by_name_path + '\0' + ref.content), Kind::kFile, ReadOnly(ref.owner));
    n->access = {ref.access};
    n->size = ref.content.size();
    n->mtime = FromNanos(ref.stamp.mtime_ns);
    n->content = ref.content;
    Add(n, false);
    return n->ino;
  }

  InodeId Link(const std::string& by_name_path, const std::string& target, const AccessPath& access) {
    // The target is part of the key: a link that moves is a new inode, so a
    // kernel that cached the old one cannot mix them up.
    auto n = NewNode(view_.InoFor("L:" + by_name_path + '\0' + target), Kind::kSymlink,
                     {view_.root_owner_.uid, view_.root_owner_.gid, 0777});
    n->access = {access};
    n->link_target = target;
    n->size = target.size();
    Add(n, false);
    return n->ino;
  }

  View& view_;
  const std::map<std::string, AccessPath>& source_dirs_;
  const struct timespec now_;
  std::map<std::string, std::vector<const ExposedCheckpoint*>> by_digest_;
  std::map<std::string, std::string> by_name_;  // by-name path (without "by-name/") -> digest
  std::map<std::string, const HubRef*> refs_;   // by-name path (without "by-name/") -> hub ref
  bool root_is_checkpoint_ = false;
  std::string base_;
  // digest -> directory inside it -> entry names
  std::map<std::string, std::map<std::string, std::set<std::string>>> entries_;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> digest_xattrs_;  // digest -> its xattrs
};

View::View(std::string source_root, Ownership root_owner)
    : source_root_(std::move(source_root)), root_owner_(root_owner), mount_time_(Now()) {
  Publish({}, {}, {});
}

InodeId View::InoFor(const std::string& key) {
  auto [it, inserted] = ino_by_key_.emplace(key, next_ino_);
  if (inserted) key_by_ino_.emplace(next_ino_++, key);
  return it->second;
}

void View::DropIfUnused(InodeId ino) {
  if (ino == kRootInode || current_.count(ino) != 0 || lookups_.count(ino) != 0) return;
  nodes_.erase(ino);
  if (auto k = key_by_ino_.find(ino); k != key_by_ino_.end()) {
    ino_by_key_.erase(k->second);
    key_by_ino_.erase(k);
  }
}

void View::Remember(const NodePtr& node) {
  std::unique_lock lock(mu_);
  ++lookups_[node->ino];
  // A publish may have dropped it between the lookup and this reply.
  nodes_.emplace(node->ino, node);
}

void View::Forget(InodeId ino, uint64_t count) {
  std::unique_lock lock(mu_);
  auto it = lookups_.find(ino);
  if (it == lookups_.end()) return;
  it->second = it->second > count ? it->second - count : 0;
  if (it->second != 0) return;
  lookups_.erase(it);
  DropIfUnused(ino);
}

size_t View::NodeCount() const {
  std::shared_lock lock(mu_);
  return nodes_.size();
}

View::Changes View::Publish(const std::vector<ExposedCheckpoint>& checkpoints,
                            const std::map<std::string, AccessPath>& source_dirs,
                            const std::vector<HubRef>& hub_refs) {
  std::unique_lock lock(mu_);
  Builder b(*this, checkpoints, source_dirs, hub_refs);
  b.Build();

  Changes changes;
  for (const auto& [ino, fresh_node] : b.nodes) {
    if (fresh_node->kind != Kind::kDir) continue;
    const auto& fresh = fresh_node->children;
    auto old_it = nodes_.find(ino);
    const bool was_published = old_it != nodes_.end();
    if (was_published && b.mutable_dirs.count(ino)) {
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
      auto before = nodes_.find(child);
      if (before == nodes_.end()) continue;
      const Node& now = *b.nodes.at(child);
      if (before->second->owner != now.owner || before->second->access != now.access) {
        changes.entries.emplace_back(ino, name);
        changes.inodes.push_back(child);
      }
    }
  }
  current_.clear();
  for (auto& [ino, node] : b.nodes) {
    current_.insert(ino);
    nodes_[ino] = std::move(node);
  }
  // What this publish left out goes now, unless the kernel still holds it.
  std::vector<InodeId> stale;
  for (const auto& [ino, node] : nodes_) {
    if (!current_.count(ino) && !lookups_.count(ino)) stale.push_back(ino);
  }
  for (InodeId ino : stale) DropIfUnused(ino);
  by_name_digest_ = std::move(b.by_name_digest);
  return changes;
}

View::NodePtr View::Get(InodeId ino) const {
  std::shared_lock lock(mu_);
  auto it = nodes_.find(ino);
  return it == nodes_.end() ? nullptr : it->second;
}

View::NodePtr View::Lookup(InodeId parent, const std::string& name) const {
  std::shared_lock lock(mu_);
  auto p = nodes_.find(parent);
  if (p == nodes_.end() || p->second->kind != Kind::kDir) return nullptr;
  auto c = p->second->children.find(name);
  if (c == p->second->children.end()) return nullptr;
  auto it = nodes_.find(c->second);
  return it == nodes_.end() ? nullptr : it->second;
}

void View::SetRootXattr(const std::string& name, const std::string& value) {
  std::unique_lock lock(mu_);
  root_xattrs_.emplace_back(name, value);
  auto root = std::make_shared<Node>(*nodes_.at(kRootInode));
  root->xattrs = root_xattrs_;
  nodes_[kRootInode] = root;
}

std::optional<std::string> View::DigestOfByName(const std::string& by_name_path) const {
  std::shared_lock lock(mu_);
  auto it = by_name_digest_.find(by_name_path);
  if (it == by_name_digest_.end()) return std::nullopt;
  return it->second;
}

View::NodePtr View::Resolve(const std::string& rel_path) const {
  NodePtr n = Get(kRootInode);
  size_t pos = 0;
  while (n && pos < rel_path.size()) {
    size_t slash = rel_path.find('/', pos);
    std::string part = rel_path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    pos = slash == std::string::npos ? rel_path.size() : slash + 1;
    if (part.empty() || part == ".") continue;
    n = Lookup(n->ino, part);
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

std::map<std::string, std::string> View::ByNameLinks() const {
  std::shared_lock lock(mu_);
  return by_name_digest_;
}

}  // namespace ckptfs
