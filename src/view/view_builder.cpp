#include "view_builder.h"

#include <algorithm>
#include <cstring>

#include <sys/stat.h>

#include "ckptfs/fingerprint.h"
#include "ckptfs/safetensors_name.h"

namespace ckptfs {

namespace {

struct timespec FromNanos(int64_t ns) {
  return {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

std::string Parent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string LastComponent(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
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

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::string b = LastComponent(p);
  return b.empty() ? std::string("root") : b;
}

// Some key of `m` lies strictly below by-name path `p` ("" is by-name/).
template <typename T>
bool HasKeyBelow(const std::map<std::string, T>& m, const std::string& p) {
  const std::string prefix = p.empty() ? "" : p + "/";
  auto it = m.lower_bound(prefix);
  if (p.empty()) return it != m.end();
  return it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0;
}

// The next component of every key of `m` below by-name path `p`.
template <typename T>
void NextComponents(const std::map<std::string, T>& m, const std::string& p, std::set<std::string>& out) {
  const std::string prefix = p.empty() ? "" : p + "/";
  for (auto it = m.lower_bound(prefix); it != m.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    const std::string rest = it->first.substr(prefix.size());
    out.insert(rest.substr(0, rest.find('/')));
  }
}

// Everything BuildDigest reads from the copies of a digest.
Sha256Digest DigestInputs(const std::string& name, const std::vector<const ExposedCheckpoint*>& copies) {
  Fingerprint fp;
  fp.Add(name).Add(static_cast<uint64_t>(copies.size()));
  for (const auto* c : copies) fp.Add(c->inputs ? *c->inputs : View::InputsOf(*c));
  return fp.Finish();
}

}  // namespace

ViewBuilder::ViewBuilder(const Inputs& in, const std::vector<ExposedCheckpoint>& checkpoints,
                         const std::map<std::string, AccessPath>& source_dirs, const std::vector<HubRef>& hub_refs)
    : in_(in), source_dirs_(source_dirs), now_(RealtimeNow()), snap_(std::make_unique<View::Snapshot>()) {
  for (const auto& cp : checkpoints) by_digest_[cp.name].push_back(&cp);
  base_ = BaseName(in_.source_root);
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

std::shared_ptr<const View::Snapshot> ViewBuilder::Build() {
  auto root = std::make_shared<Node>();
  root->ino = kRootInode;
  root->kind = Kind::kDir;
  root->owner = ReadOnly(in_.root_owner);
  root->mtime = in_.mount_time;
  root->xattrs = in_.root_xattrs;
  used_inodes_.insert(kRootInode);
  for (const auto& [name, copies] : by_digest_) root->children[name] = BuildDigest(name, copies);
  root->children["by-name"] = BuildByNameDir("", "", "", /*has_digest=*/false);
  Add(root, /*is_mutable=*/true);
  root->parent = kRootInode;
  for (const auto& [ino, n] : nodes_) {
    for (const auto& [name, child] : n->children) {
      if (auto c = nodes_.find(child); c != nodes_.end()) c->second->parent = ino;
    }
  }
  snap_->nodes.reserve(snap_->nodes.size() + nodes_.size());
  for (auto& [ino, n] : nodes_) snap_->nodes.emplace(ino, std::move(n));
  nodes_.clear();
  return std::move(snap_);
}

std::string ViewBuilder::ByNamePath(const std::string& rel) const {
  return rel.empty() ? base_ : (root_is_checkpoint_ ? base_ + "/" + rel : rel);
}

bool ViewBuilder::HasCheckpointBelow(const std::string& p) const { return HasKeyBelow(by_name_, p); }

// How the source directory that by-name/<p> mirrors is reached.
// How the source directory of `by_name_path` is reached; null if it was
// not walked.
const AccessPath* ViewBuilder::FindSourceDir(const std::string& by_name_path) const {
  std::string rel = by_name_path;
  if (root_is_checkpoint_) rel = rel == base_ ? "" : rel.substr(std::min(rel.size(), base_.size() + 1));
  auto it = source_dirs_.find(rel);
  return it != source_dirs_.end() ? &it->second : nullptr;
}

AccessPath ViewBuilder::SourceDirAccess(const std::string& by_name_path) const {
  const AccessPath* found = FindSourceDir(by_name_path);
  return found != nullptr ? *found : AccessPath{nullptr, in_.root_owner};
}

// What entering the source directory of `by_name_path` asks: search on
// every directory down to it, through the targets of links on the way, and
// on the directory itself (the digest a link names is drawn from the bytes
// inside: see WantToSee in fuse_ops.cpp).
AccessPath ViewBuilder::ReachOf(const std::string& by_name_path) const {
  const Ownership anyone{in_.root_owner.uid, in_.root_owner.gid, 0777};
  const AccessPath* found = FindSourceDir(by_name_path);
  // Not walked (never so for a checkpoint shown): root only, not open.
  if (found == nullptr) return {DirChain::Extend(nullptr, Ownership{0, 0, 0}), anyone};
  return {DirChain::Extend(found->dirs, found->self), anyone};
}

std::shared_ptr<View::Node> ViewBuilder::NewNode(const std::string& key, Kind kind, Ownership owner) {
  auto n = std::make_shared<Node>();
  // See the header: inode and generation from the key's SHA-256, salted in
  // the (deterministic) build order on the rare collision.
  for (uint32_t salt = 0;; ++salt) {
    const Sha256Digest h = Sha256Of(salt == 0 ? key : key + '\0' + std::to_string(salt));
    std::memcpy(&n->ino, h.data(), sizeof n->ino);
    std::memcpy(&n->generation, h.data() + 8, sizeof n->generation);
    if (n->ino > kRootInode && used_inodes_.insert(n->ino).second) break;
  }
  n->kind = kind;
  n->owner = owner;
  n->mtime = now_;
  return n;
}

void ViewBuilder::Add(const std::shared_ptr<Node>& n, bool is_mutable) {
  nodes_[n->ino] = n;
  if (is_mutable) snap_->mutable_dirs.insert(n->ino);
}

// sha256-<hex>/ and its members, from the copies that share the digest.
// Each node keeps one access path per copy (DESIGN.md section 2: a user may
// use it when any copy lets them); stat shows the first copy's owner.
InodeId ViewBuilder::BuildDigest(const std::string& name, const std::vector<const ExposedCheckpoint*>& copies) {
  const Sha256Digest inputs = DigestInputs(name, copies);
  if (in_.previous != nullptr) {
    auto it = in_.previous->digests.find(name);
    if (it != in_.previous->digests.end() && it->second->inputs == inputs) return ReuseDigest(name, it->second);
  }
  const ExposedCheckpoint& first = *copies.front();
  std::string sources;
  std::vector<AccessPath> dir_access;
  for (const auto* c : copies) {
    dir_access.push_back(c->dir_access);
    sources += c->abs_path + "\n";
  }
  auto dir = NewNode("D:" + name, Kind::kDir, ReadOnly(first.dir_access.self));
  dir->access = std::move(dir_access);
  dir->immutable = true;
  dir->digest = name;
  dir->mtime = {static_cast<time_t>(first.indexed_at), 0};
  dir->xattrs = {{"user.ckptfs.digest", name},
                 {"user.ckptfs.sources", sources},
                 {"user.ckptfs.size", std::to_string(first.total_size)}};
  dir->source_access = dir->access;  // one per copy, in the order of `sources`
  digest_xattrs_[name] = {dir->xattrs, dir->source_access};

  digest_subdirs_ = {{"", dir}};
  digest_nodes_.clear();
  for (size_t i = 0; i < first.files.size(); ++i) AddDigestFile(name, i, copies);
  for (const auto& [rel, n] : digest_subdirs_) {
    Add(n, false);
    digest_nodes_.push_back(n);
    if (!rel.empty()) entries_[name][Parent(rel)].insert(LastComponent(rel));
  }
  digest_subdirs_.clear();
  auto part = std::make_shared<View::DigestPart>();
  part->inputs = inputs;
  part->dir = dir->ino;
  part->nodes = std::move(digest_nodes_);
  part->entries = entries_[name];
  part->xattrs = dir->xattrs;
  part->source_access = dir->source_access;
  snap_->digests[name] = std::move(part);
  return dir->ino;
}

// The digest directory of the previous snapshot, node for node. Its parent
// links are already right: the root, and nodes of its own.
InodeId ViewBuilder::ReuseDigest(const std::string& name, const std::shared_ptr<const View::DigestPart>& part) {
  for (const auto& n : part->nodes) {
    used_inodes_.insert(n->ino);
    snap_->nodes.emplace(n->ino, n);
  }
  reused_ += part->nodes.size();
  entries_[name] = part->entries;
  digest_xattrs_[name] = {part->xattrs, part->source_access};
  snap_->digests[name] = part;
  return part->dir;
}

// The directory `rel` inside digest `name`, made (with its parents) on first use.
std::shared_ptr<View::Node> ViewBuilder::DigestSubdir(const std::string& name, const std::string& rel,
                                                      const std::vector<const ExposedCheckpoint*>& copies) {
  if (auto it = digest_subdirs_.find(rel); it != digest_subdirs_.end()) return it->second;
  auto parent = DigestSubdir(name, Parent(rel), copies);
  std::vector<AccessPath> access;
  for (const auto* c : copies) {
    if (auto it = c->subdirs.find(rel); it != c->subdirs.end()) access.push_back(it->second);
  }
  const ExposedCheckpoint& first = *copies.front();
  const Ownership shown = access.empty() ? first.dir_access.self : access.front().self;
  auto n = NewNode("D:" + name + "/" + rel, Kind::kDir, ReadOnly(shown));
  // A directory no copy describes (it cannot happen for a valid scan) is
  // closed to all but root rather than open to everyone.
  n->access = access.empty() ? std::vector<AccessPath>{{nullptr, {0, 0, 0}}} : std::move(access);
  n->immutable = true;
  n->digest = name;
  n->mtime = digest_subdirs_.at("")->mtime;
  parent->children[LastComponent(rel)] = n->ino;
  digest_subdirs_[rel] = n;
  return n;
}

// Every copy of file `index` among the digest's copies, most trusted first:
// by the least trusted owner among the file and the directories from SRC
// down to it (whoever owns any of them can replace what the path leads
// to), root before the mount's owner (and the trusted_writers= users)
// before anyone else, and a file or directory that its group or others may
// write (a mode bit, or an ACL's mask) as anyone else's; path order within
// each, as the copies come. Copies of root and those users alone are `trusted` (see
// SourceCopy), and only on SRC's own filesystem.
std::vector<SourceCopy> ViewBuilder::CopiesByTrust(size_t index,
                                                   const std::vector<const ExposedCheckpoint*>& copies) const {
  constexpr int kAnyone = 2;
  const auto rank = [&](uid_t uid) {
    if (uid == 0) return 0;
    const bool trusted =
        uid == in_.mount_owner || std::ranges::find(in_.trusted_writers, uid) != in_.trusted_writers.end();
    return trusted ? 1 : kAnyone;
  };
  const std::string& rel = copies.front()->files[index].rel_path;
  std::vector<std::pair<int, SourceCopy>> ranked;
  for (const auto* c : copies) {
    if (index >= c->files.size() || c->files[index].rel_path != rel) continue;
    const auto& f = c->files[index];
    int worst = std::max(rank(f.owner.uid), rank(f.access.self.uid));
    if (((f.owner.mode | f.access.self.mode) & (S_IWGRP | S_IWOTH)) != 0) worst = kAnyone;
    if (f.stamp.dev != in_.source_dev) worst = kAnyone;
    if (f.access.dirs) {
      f.access.dirs->AllOf([&](const Ownership& d) {
        worst = std::max(worst, rank(d.uid));
        // Whoever may add an entry can mount a filesystem of their own
        // there, which can say that root owns what it serves.
        if ((d.mode & (S_IWGRP | S_IWOTH)) != 0) worst = kAnyone;
        return true;
      });
    }
    ranked.push_back({worst, SourceCopy{f.source_path, f.stamp, f.chunks, /*trusted=*/worst < kAnyone}});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<SourceCopy> out;
  out.reserve(ranked.size());
  for (auto& [r, copy] : ranked) out.push_back(std::move(copy));
  return out;
}

void ViewBuilder::AddDigestFile(const std::string& name, size_t index,
                                const std::vector<const ExposedCheckpoint*>& copies) {
  const auto& f = copies.front()->files[index];
  auto parent = DigestSubdir(name, Parent(f.rel_path), copies);
  auto n = NewNode("D:" + name + "/" + f.rel_path, Kind::kFile, ReadOnly(f.owner));
  for (const auto* c : copies) {
    if (index < c->files.size() && c->files[index].rel_path == f.rel_path) n->access.push_back(c->files[index].access);
  }
  n->immutable = true;
  n->digest = name;
  n->size = f.stamp.size;
  n->mtime = FromNanos(f.stamp.mtime_ns);
  n->copies = CopiesByTrust(index, copies);
  n->source_path = n->copies.front().path;
  n->stamp = n->copies.front().stamp;
  n->sha256 = f.sha256;
  n->chunks = n->copies.front().chunks;
  for (const auto* c : copies) {
    if (index < c->files.size() && c->files[index].rel_path == f.rel_path && c->files[index].chain &&
        c->files[index].sha256 == f.sha256) {
      n->chain = c->files[index].chain;
      break;
    }
  }
  n->safetensors = IsSafetensorsName(f.rel_path);
  if (n->safetensors) n->stamped_size = f.stamped_size;
  n->xattrs = {{"user.ckptfs.sha256", ToHex(f.sha256)}};
  parent->children[LastComponent(f.rel_path)] = n->ino;
  Add(n, false);
  digest_nodes_.push_back(n);
  // Remember the tree shape for by-name mirror directories.
  entries_[name][Parent(f.rel_path)].insert(LastComponent(f.rel_path));
}

// by-name/<p>/: entries are the next components of checkpoint paths below p
// and, when p lies inside checkpoint `digest` at `offset`, that digest's
// entries there (as links into it).
InodeId ViewBuilder::BuildByNameDir(const std::string& p, const std::string& digest, const std::string& offset,
                                    bool has_digest) {
  const AccessPath source = SourceDirAccess(p);
  auto dir = NewNode("N:" + p, Kind::kDir, ReadOnly(source.self));
  dir->access = {source};
  if (has_digest && offset.empty() && by_name_.count(p)) {
    // A checkpoint with nested ones: it answers for its own digest.
    dir->own_digest = digest;
    const DigestXattrs& own = digest_xattrs_[digest];
    dir->xattrs = own.xattrs;
    dir->source_access = own.source_access;
  }
  // What its entries need: search on every directory down to this one.
  const AccessPath inside{DirChain::Extend(source.dirs, source.self), {in_.root_owner.uid, in_.root_owner.gid, 0777}};
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
      snap_->by_name_digest["by-name/" + q] = cp->second;
      // The link names the checkpoint's digest: it is there for those who
      // reach the checkpoint's directory, through its link's target too
      // (a user's link to another's private checkpoint must not tell them
      // its digest).
      dir->children[c] = HasCheckpointBelow(q) ? BuildByNameDir(q, cp->second, "", true)
                                               : Link(q, Dots(depth) + cp->second, ReachOf(q));
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

// A hub ref, served from memory. Reaching it takes what reaching its source
// file takes: search on every directory down to it, read on it.
InodeId ViewBuilder::RefFile(const std::string& by_name_path, const HubRef& ref) {
  // The content is part of the key: a ref that moves to another commit is a
  // new inode, so the kernel cannot keep serving the old one's pages.
  auto n = NewNode("R:" + by_name_path + '\0' + ref.content, Kind::kFile, ReadOnly(ref.owner));
  n->access = {ref.access};
  n->size = ref.content.size();
  n->mtime = FromNanos(ref.stamp.mtime_ns);
  n->content = ref.content;
  Add(n, false);
  return n->ino;
}

InodeId ViewBuilder::Link(const std::string& by_name_path, const std::string& target, const AccessPath& access) {
  // The target is part of the key: a link that moves is a new inode, so a
  // kernel that cached the old one cannot mix them up.
  auto n = NewNode("L:" + by_name_path + '\0' + target, Kind::kSymlink,
                   {in_.root_owner.uid, in_.root_owner.gid, 0777});
  n->access = {access};
  n->link_target = target;
  n->size = target.size();
  Add(n, false);
  return n->ino;
}

Sha256Digest View::InputsOf(const ExposedCheckpoint& c) {
  Fingerprint fp;
  fp.Add(c.rel_path).Add(c.abs_path).Add(c.name).Add(c.total_size).Add(static_cast<uint64_t>(c.indexed_at));
  fp.Add(c.dir_access).Add(static_cast<uint64_t>(c.subdirs.size()));
  for (const auto& [rel, access] : c.subdirs) fp.Add(rel).Add(access);
  fp.Add(static_cast<uint64_t>(c.files.size()));
  for (const auto& f : c.files) {
    // The chunk table is not added: it is a function of the bytes, which
    // the SHA-256 names.
    fp.Add(f.rel_path).Add(f.source_path).Add(f.stamp).Add(f.sha256).Add(f.owner).Add(f.access);
    fp.Add(f.stamped_size ? *f.stamped_size + 1 : 0);
    fp.Add(static_cast<uint64_t>(f.chain != nullptr));  // nor the chain, only whether it is known
  }
  return fp.Finish();
}

}  // namespace ckptfs
