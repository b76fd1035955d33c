#include "ckptfs/catalog.h"

#include "ckptfs/fingerprint.h"
#include "source_acl.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <utility>

namespace ckptfs {

namespace {

using Chain = DirChain::Ptr;

// Bounds of one walk, so that no directory's content can make the walk of
// the rest of the tree cost more than the tree itself (issue 21): links may
// make a directory reachable by many paths (25 directories, each with two
// links to the next, are 2^24 paths), so each directory is walked by at most
// this many paths in one walk (a path beyond makes its checkpoint invalid);
// and a checkpoint has at most this many members.
constexpr int kMaxPathsPerDirectory = 256;
// Directories nested deeper than this below SRC are not walked (Walker),
// nor entries whose path of directories to search, links followed, is
// longer than kMaxChainLength.
constexpr size_t kMaxWalkDepth = 1024;
constexpr size_t kMaxChainLength = 4 * kMaxWalkDepth;
constexpr size_t kMaxMembersPerCheckpoint = 1'000'000;

// A problem met on the walk: the full text for the log and root, and the
// text shown to everyone else (see CheckpointSource::invalid_problems_shown).
struct Problem {
  std::string full;
  std::string shown;
  // The directory it was found in (set as a checkpoint gathers it): who may
  // list it may be told `shown`.
  AccessPath listing{};
};

// One directory of the walked tree, before it is cut into checkpoints.
struct DirNode {
  std::string rel;    // relative to the root ("" for the root)
  AccessPath access;  // how the directory itself is reached
  Chain inside;       // what must be searched to reach its entries (access.dirs + itself)
  // The directory's inode as walked: another one renamed into its place
  // (a trainer's rename of step-N into the name of the last) is walked
  // anew, never taken for it.
  dev_t dev = 0;
  ino_t ino = 0;
  bool has_weight_file = false;
  struct File {
    std::string rel;  // relative to the root
    std::string open_path;
    FileStamp stamp;
    Ownership owner;
    AccessPath access;
    bool linked = false;  // more than one link: it may change through a name outside every watched directory
  };
  std::vector<File> files;
  std::vector<std::unique_ptr<DirNode>> subdirs;  // ascending rel
  std::vector<Problem> problems;  // each names the path and the cause
  bool too_many_paths = false;    // a problem says so already (see kMaxPathsPerDirectory)
  bool too_deep = false;          // the same for kMaxWalkDepth and kMaxChainLength
  // Nothing in this subtree can change without an inotify event in it: no
  // symlink followed, no file with other links, no problem (see RewalkHint).
  bool self_contained = true;
};

}  // namespace

struct WalkTree {
  std::string real_root;
  DirNode top;
};

namespace {

std::string JoinRel(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

std::string ParentOf(const std::string& abs) {
  const size_t slash = abs.rfind('/');
  return slash == 0 || slash == std::string::npos ? std::string("/") : abs.substr(0, slash);
}

std::string Quote(const std::string& path) {
  // Paths may hold newlines (that is one of the problems we report); show them
  // escaped so a log line stays one line.
  std::string out = "'";
  for (char c : path) {
    if (c == '\n') out += "\\n";
    else if (c == '\\') out += "\\\\";
    else out += c;
  }
  return out + "'";
}

Problem Plain(std::string text) { return {text, text}; }

std::optional<std::string> RealPath(const std::string& path, int* err) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    *err = errno;
    return std::nullopt;
  }
  std::string out(resolved);
  std::free(resolved);
  return out;
}

std::optional<std::string> ReadLinkText(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  if (n < 0) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

// Where a symbolic link leads, resolved one component at a time as the
// kernel would, but refusing, before it is touched, any path inside the
// excluded ones (our own mount: realpath(3) would stat into it).
struct Resolved {
  std::string path;  // canonical
  struct stat st {};
  int err = 0;              // set on failure
  bool into_excluded = false;
};

class TreeWalker {
 public:
  TreeWalker(std::string real_root, Ownership root_owner, const CatalogOptions& options)
      : real_root_(std::move(real_root)), options_(options) {
    chains_[real_root_] = DirChain::Extend(nullptr, root_owner);
  }

  // `hint`: what an incremental rescan may reuse (null: walk everything).
  void set_hint(RewalkHint* hint) { hint_ = hint; }
  uint64_t dirs_reused() const { return dirs_reused_; }
  // The directories this walk read (the others were taken from the
  // previous tree), as CatalogScan::walked_dirs.
  std::unordered_set<uint64_t> TakeWalked() { return std::move(walked_); }

  // `previous`: the same directory in the previous tree, if any.
  void Walk(const std::string& abs, DirNode& node, std::set<std::pair<dev_t, ino_t>>& ancestors,
            DirNode* previous = nullptr) {
    if (options_.cancel != nullptr && options_.cancel->load()) return;
    walked_.insert(std::hash<std::string>{}(node.rel));
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(abs.c_str()), ::closedir);
    if (!dir) {
      node.problems.push_back(Plain("cannot read directory " + Quote(abs) + ": " + std::strerror(errno)));
      return;
    }
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = ::readdir(dir.get())) {
      if (e->d_name[0] == '.') continue;  // ".", ".." and every dot-path
      names.emplace_back(e->d_name);
    }
    if (errno != 0) {
      node.problems.push_back(Plain("cannot list directory " + Quote(abs) + ": " + std::strerror(errno)));
    }
    // Closed before the walk goes down: a chain of nested directories would
    // otherwise hold a descriptor a level, which the daemon's reads need.
    dir.reset();
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) VisitEntry(abs, name, node, ancestors, previous);
    if (!node.problems.empty()) node.self_contained = false;
    for (const auto& sub : node.subdirs) node.self_contained = node.self_contained && sub->self_contained;
  }

 private:
  // The subdirectory `rel` of `previous`, if it has one.
  static DirNode* PreviousChild(DirNode* previous, const std::string& rel) {
    if (previous == nullptr) return nullptr;
    auto it = std::lower_bound(previous->subdirs.begin(), previous->subdirs.end(), rel,
                               [](const std::unique_ptr<DirNode>& d, const std::string& r) { return d->rel < r; });
    return it != previous->subdirs.end() && (*it)->rel == rel ? it->get() : nullptr;
  }

  // Whether inotify reported a change in `rel` or below it.
  bool DirtyAtOrBelow(const std::string& rel) const {
    const auto& dirty = hint_->dirty_dirs;
    if (dirty.count(rel)) return true;
    const std::string prefix = rel + "/";
    auto it = dirty.lower_bound(prefix);
    return it != dirty.end() && it->compare(0, prefix.size(), prefix) == 0;
  }

  void VisitEntry(const std::string& abs, const std::string& name, DirNode& node,
                  std::set<std::pair<dev_t, ino_t>>& ancestors, DirNode* previous) {
    const std::string child = abs + "/" + name;
    const std::string rel = JoinRel(node.rel, name);
    if (IsExcluded(child)) return;
    struct stat st;
    if (::lstat(child.c_str(), &st) != 0) {
      node.problems.push_back(Plain("cannot stat " + Quote(child) + ": " + std::strerror(errno)));
      return;
    }
    if (IsExcludedDevice(st.st_dev)) return;
    std::string target = child;
    // What must be searched to reach the entry: this directory's chain, and
    // for a link also the chain down to its target's parent.
    Chain reach = node.inside;
    const bool via_link = S_ISLNK(st.st_mode);
    if (via_link) {
      node.self_contained = false;  // its target changes raise no event here
      if (IsWeightFileName(name)) node.has_weight_file = true;  // a bad weight link still marks it
      auto resolved = FollowLink(child, &node);
      if (!resolved) return;
      target = resolved->path;
      st = resolved->st;
      reach = DirChain::Join(node.inside, ChainInto(ParentOf(target)));
      // Each level entered through a link adds the target's whole chain,
      // and every request and scan walks the chain: bounded, as the depth is.
      if (reach->size() > kMaxChainLength) {
        if (!std::exchange(node.too_deep, true)) {
          node.problems.push_back(Plain("entries in " + Quote(abs) + " are reached through more than " +
                                        std::to_string(kMaxChainLength) +
                                        " directories (links within links); they are not walked"));
        }
        return;
      }
    }
    if (S_ISDIR(st.st_mode)) {
      // Every directory's path, kept in several tables, grows with its
      // depth, so a chain of nested directories costs its depth squared:
      // a SRC writer's could take the daemon's memory. No model store
      // nests this deep; a checkpoint that does is invalid, with why.
      // (`ancestors` holds the root and every directory down to this one:
      // its size is the depth of `child`.)
      if (ancestors.size() > kMaxWalkDepth) {
        if (!std::exchange(node.too_deep, true)) {  // once per directory, as the paths of the tree are many
          node.problems.push_back(Plain("directories in " + Quote(abs) + " are more than " +
                                        std::to_string(kMaxWalkDepth) + " levels below the source root; they are not walked"));
        }
        return;
      }
      auto key = std::make_pair(st.st_dev, st.st_ino);
      if (ancestors.count(key) != 0) {
        node.problems.push_back(Plain("symlink loop: " + Quote(child) + " leads back to its own ancestor " +
                                      Quote(target)));
        return;
      }
      if (++paths_to_[key] > kMaxPathsPerDirectory) {
        // Told once per directory listing it, so the problems too stay
        // bounded by the tree, not by the paths through it.
        if (!std::exchange(node.too_many_paths, true)) {
          // Where the links lead is for those who may see it (FollowLink).
          const std::string bound = " is reached by more than " + std::to_string(kMaxPathsPerDirectory) +
                                    " paths through symlinks";
          node.problems.push_back({"directory " + Quote(target) + bound + " (one is " + Quote(child) +
                                       "); it is not walked again",
                                   "a directory" + bound + " (one is " + Quote(child) + "); it is not walked again"});
        }
        return;
      }
      const AccessPath access{reach, ReadOwnership(target, st)};
      DirNode* before = via_link ? nullptr : PreviousChild(previous, rel);
      if (hint_ != nullptr && before != nullptr && before->self_contained && before->access == access &&
          before->dev == st.st_dev && before->ino == st.st_ino && !DirtyAtOrBelow(rel)) {
        // Taken whole; the emptied node keeps its name so that the previous
        // tree stays sorted for the lookups of the entries still to come.
        node.subdirs.push_back(std::make_unique<DirNode>(std::move(*before)));
        before->rel = rel;
        before->self_contained = false;
        ++dirs_reused_;
        return;
      }
      auto sub = std::make_unique<DirNode>();
      sub->rel = rel;
      sub->access = access;
      sub->dev = st.st_dev;
      sub->ino = st.st_ino;
      sub->inside = DirChain::Extend(reach, sub->access.self);
      ancestors.insert(key);
      Walk(target, *sub, ancestors, hint_ != nullptr ? before : nullptr);
      ancestors.erase(key);
      node.subdirs.push_back(std::move(sub));
    } else if (S_ISREG(st.st_mode)) {
      if (IsWeightFileName(name)) node.has_weight_file = true;
      if (st.st_nlink > 1) node.self_contained = false;  // written through another name, no event here
      const Ownership owner = ReadOwnership(target, st);
      node.files.push_back({rel, target, FileStamp::FromStat(st), owner, {reach, owner}, st.st_nlink > 1});
    }
    // Sockets, fifos and devices are not members.
  }

  bool IsExcluded(const std::string& path) const {
    for (const std::string& ex : options_.excluded_paths) {
      if (path == ex || (path.size() > ex.size() && path.compare(0, ex.size(), ex) == 0 &&
                         (ex == "/" || path[ex.size()] == '/'))) {
        return true;
      }
    }
    return false;
  }

  bool IsExcludedDevice(dev_t dev) const {
    return std::find(options_.excluded_devices.begin(), options_.excluded_devices.end(), dev) !=
           options_.excluded_devices.end();
  }

  bool Contained(const std::string& path) const {
    if (real_root_ == "/") return true;
    return path == real_root_ ||
           (path.size() > real_root_.size() && path.compare(0, real_root_.size(), real_root_) == 0 &&
            path[real_root_.size()] == '/');
  }

  // The directories to search to reach the entries of canonical directory
  // `dir`: from the root down when `dir` is inside it, else from "/".
  Chain ChainInto(const std::string& dir) {
    if (auto it = chains_.find(dir); it != chains_.end()) return it->second;
    const Chain above = dir == "/" ? nullptr : ChainInto(ParentOf(dir));
    struct stat st;
    Ownership o{0, 0, 0};  // unreadable: nobody but root passes
    if (::stat(dir.c_str(), &st) == 0) o = ReadOwnership(dir, st);
    Chain out = DirChain::Extend(above, o);
    chains_[dir] = out;
    return out;
  }

  Resolved Resolve(const std::string& link) const {
    Resolved r;
    std::vector<std::string> todo;  // components still to walk, last first
    auto push = [&todo](const std::string& text) {
      std::vector<std::string> parts;
      size_t pos = 0;
      while (pos <= text.size()) {
        size_t slash = text.find('/', pos);
        if (slash == std::string::npos) slash = text.size();
        if (slash > pos) parts.push_back(text.substr(pos, slash - pos));
        pos = slash + 1;
      }
      todo.insert(todo.end(), parts.rbegin(), parts.rend());
    };
    std::string cur = ParentOf(link);
    todo.push_back(link.substr(link.rfind('/') + 1));
    int links = 0;
    while (!todo.empty()) {
      const std::string comp = todo.back();
      todo.pop_back();
      if (comp == ".") continue;
      if (comp == "..") {
        cur = ParentOf(cur);
        continue;
      }
      const std::string next = cur == "/" ? "/" + comp : cur + "/" + comp;
      if (IsExcluded(next)) {
        r.into_excluded = true;
        return r;
      }
      if (::lstat(next.c_str(), &r.st) != 0) {
        r.err = errno;
        return r;
      }
      if (IsExcludedDevice(r.st.st_dev)) {
        r.into_excluded = true;
        return r;
      }
      if (S_ISLNK(r.st.st_mode)) {
        auto text = ReadLinkText(next);
        if (!text) {
          r.err = errno;
          return r;
        }
        if (++links > 40) {
          r.err = ELOOP;
          return r;
        }
        if (!text->empty() && (*text)[0] == '/') cur = "/";
        push(*text);
        continue;
      }
      if (!todo.empty() && !S_ISDIR(r.st.st_mode)) {
        r.err = ENOTDIR;
        return r;
      }
      cur = next;
    }
    // The last step may have been "..": describe where we ended, not the
    // link we followed to get there.
    if (IsExcluded(cur)) {
      r.into_excluded = true;
      return r;
    }
    if (::lstat(cur.c_str(), &r.st) != 0) r.err = errno;
    r.path = cur;
    return r;
  }

  std::optional<Resolved> FollowLink(const std::string& link, DirNode* node) const {
    Resolved r = Resolve(link);
    const std::string text = ReadLinkText(link).value_or("?");
    // Unprivileged callers learn only that the link cannot be used: whether
    // its target is missing or elsewhere is for those who can see it.
    const std::string shown = "symlink " + Quote(link) + " cannot be followed";
    if (r.into_excluded) {
      node->problems.push_back(
          {"symlink " + Quote(link) + " -> " + Quote(text) + " leads into the ckptfs mount itself", shown});
      return std::nullopt;
    }
    if (r.err == ENOENT || r.err == ENOTDIR) {
      node->problems.push_back({"dangling symlink " + Quote(link) + " -> " + Quote(text), shown});
      return std::nullopt;
    }
    if (r.err == ELOOP) {
      node->problems.push_back({"symlink loop at " + Quote(link) + " -> " + Quote(text), shown});
      return std::nullopt;
    }
    if (r.err != 0) {
      node->problems.push_back({"cannot resolve symlink " + Quote(link) + " -> " + Quote(text) + ": " +
                                    std::strerror(r.err),
                                shown});
      return std::nullopt;
    }
    if (options_.symlinks == SymlinkPolicy::kContained && !Contained(r.path)) {
      node->problems.push_back({"symlink " + Quote(link) + " resolves outside the source root to " + Quote(r.path) +
                                    " (mount with symlinks=follow to allow it)",
                                shown});
      return std::nullopt;
    }
    return r;
  }

  std::string real_root_;
  const CatalogOptions& options_;
  std::map<std::string, Chain> chains_;  // canonical directory -> ChainInto(it)
  std::map<std::pair<dev_t, ino_t>, int> paths_to_;  // directory -> paths it was walked by, this walk
  RewalkHint* hint_ = nullptr;
  uint64_t dirs_reused_ = 0;
  std::unordered_set<uint64_t> walked_;
};

// Adds the files of `node`'s subtree to `cp`, stopping at nested checkpoints,
// and gathers the problems met on the way.
void CollectMembers(const DirNode& node, size_t prefix_len, CheckpointSource& cp, std::vector<Problem>& problems) {
  for (Problem p : node.problems) {
    p.listing = node.access;
    problems.push_back(std::move(p));
  }
  for (const auto& f : node.files) {
    cp.members.push_back({f.rel.substr(prefix_len), f.open_path, f.stamp, f.owner, f.access});
  }
  for (const auto& sub : node.subdirs) {
    if (sub->has_weight_file) continue;
    cp.subdirs[sub->rel.substr(prefix_len)] = sub->access;
    CollectMembers(*sub, prefix_len, cp, problems);
  }
}

// The problem `text`, told to whoever may list `listing`.
Problem FoundIn(std::string text, AccessPath listing) {
  Problem p = Plain(std::move(text));
  p.listing = std::move(listing);
  return p;
}

// Problems that make a checkpoint invalid because of its members' names,
// each told to whoever may list the directory the member is in (which a
// link may have led into another user's home).
void CheckNames(const CheckpointSource& cp, std::vector<Problem>& problems) {
  // Fails closed: a directory not found is one only root may list.
  const AccessPath root_only{DirChain::Extend(nullptr, Ownership{0, 0, 0}), Ownership{0, 0, 0}};
  auto listing_of = [&](const std::string& rel) {
    const size_t slash = rel.rfind('/');
    if (slash == std::string::npos) return cp.dir_access;
    auto it = cp.subdirs.find(rel.substr(0, slash));
    return it != cp.subdirs.end() ? it->second : root_only;
  };
  for (const auto& m : cp.members) {
    // sha256sum escapes these names, so the coreutils recomputation of the
    // digest would disagree with ours: refuse them (DESIGN.md section 1).
    if (m.rel_path.find('\n') != std::string::npos) {
      problems.push_back(FoundIn("member name contains a newline: " + Quote(cp.abs_path + "/" + m.rel_path),
                                 listing_of(m.rel_path)));
    } else if (m.rel_path.find('\\') != std::string::npos) {
      problems.push_back(FoundIn("member name contains a backslash: " + Quote(cp.abs_path + "/" + m.rel_path),
                                 listing_of(m.rel_path)));
    }
  }
  if (cp.rel_path.find('\n') != std::string::npos) {
    problems.push_back(FoundIn("checkpoint path contains a newline: " + Quote(cp.abs_path), cp.dir_access));
  }
  // Its by-name link climbs "../" once a level (DESIGN.md section 2), and a
  // symlink's target is at most 4,095 bytes: 1,000 levels (3,003 bytes),
  // one more for a link in a by-name directory, the digest's name and a
  // member's fit. (A longer target still, through long names inside a
  // by-name directory, is answered ENAMETOOLONG: fuse_ops.cpp ReadLink.)
  constexpr size_t kMaxDepth = 1000;
  const size_t depth = cp.rel_path.empty() ? 0 : std::count(cp.rel_path.begin(), cp.rel_path.end(), '/') + 1;
  if (depth > kMaxDepth) {
    problems.push_back(FoundIn("checkpoint " + Quote(cp.abs_path) + " is " + std::to_string(depth) +
                                   " directories below the source root, more than " + std::to_string(kMaxDepth) +
                                   ": its by-name link would be longer than a symlink may be",
                               cp.dir_access));
  }
}

std::string LastComponent(const std::string& rel) { return rel.substr(rel.rfind('/') + 1); }

// A checkpoint's problems as one reason: each distinct text once, the first
// few in full, so that a tree with 100,000 bad links (or one directory
// reached by too many paths, told by every walk of its parent) still has a
// reason of a few lines.
std::string JoinProblems(const std::vector<Problem>& problems) {
  std::set<std::string> seen;
  std::string out;
  for (const auto& p : problems) {
    if (!seen.insert(p.full).second || seen.size() > kShownProblems) continue;
    out += (out.empty() ? "" : "; ") + p.full;
  }
  if (seen.size() > kShownProblems) out += "; and " + std::to_string(seen.size() - kShownProblems) + " more problems";
  return out;
}

// The same for unprivileged callers, each distinct text once with where it
// was found (CheckpointSource::invalid_problems_shown).
std::vector<ShownProblem> ShownProblems(const std::vector<Problem>& problems) {
  std::set<std::string> seen;
  std::vector<ShownProblem> out;
  for (const auto& p : problems) {
    if (seen.insert(p.shown).second && out.size() < kShownProblems) out.push_back({p.shown, p.listing});
  }
  // How many more there are is told to everyone (it names nothing).
  if (seen.size() > kShownProblems) {
    out.push_back({"and " + std::to_string(seen.size() - kShownProblems) + " more problems", {}});
  }
  return out;
}

// Marks `rel` (a directory relative to the root) and every directory above
// it as serving (CatalogScan::serving_dirs).
void MarkServing(std::string_view rel, CatalogScan& scan) {
  for (;;) {
    if (!scan.serving_dirs.emplace(rel).second) return;  // marked before, with all above it
    if (rel.empty()) return;
    const size_t slash = rel.rfind('/');
    rel = slash == std::string_view::npos ? std::string_view() : rel.substr(0, slash);
  }
}

// The files of a directory under a hub repository's refs/, with their bytes.
// A ref that cannot be read is left out with a warning; it never touches a
// checkpoint.
void CollectHubRefs(const DirNode& node, const std::string& hub_repo, CatalogScan& scan) {
  // The repository's refs so far: they come together, in walk order.
  size_t taken = 0;
  for (auto it = scan.hub_refs.rbegin(); it != scan.hub_refs.rend() && it->repo_rel_path == hub_repo; ++it) ++taken;
  for (const auto& f : node.files) {
    if (taken >= kMaxHubRefsPerRepository) {
      // Once a scan, whichever directory of refs/ went past the bound.
      if (scan.hub_repos_past_bound.insert(hub_repo).second) {
        scan.warnings.push_back("hub repository " + Quote(scan.real_root + "/" + hub_repo) + " has more than " +
                                std::to_string(kMaxHubRefsPerRepository) + " refs; the rest are not mirrored");
      }
      continue;
    }
    auto content = ReadHubRef(scan.real_root, f.open_path);
    if (!content.ok()) {
      scan.warnings.push_back(content.status().message());
      continue;
    }
    scan.hub_refs.push_back({f.rel, hub_repo, std::move(*content), f.stamp, f.owner, f.access});
    ++taken;
  }
}

// `hub_repo`: when `node` is a hub repository's refs/ directory or lies
// below it, that repository directory (relative to the root); else empty.
void CutIntoCheckpoints(const DirNode& node, const std::string& root, CatalogScan& scan, bool inside_checkpoint,
                        const std::string& hub_repo) {
  scan.dirs[node.rel] = node.access;
  for (const auto& f : node.files) {
    if (!f.linked) continue;
    auto& linked = scan.linked_files[f.open_path];
    linked.dirs.insert(node.rel);
    linked.dev = static_cast<dev_t>(f.stamp.dev);
    linked.ino = static_cast<ino_t>(f.stamp.ino);
  }
  if (node.has_weight_file) {
    CheckpointSource cp;
    cp.dir_access = node.access;
    cp.rel_path = node.rel;
    cp.abs_path = node.rel.empty() ? root : root + "/" + node.rel;
    const size_t prefix_len = node.rel.empty() ? 0 : node.rel.size() + 1;
    std::vector<Problem> problems;
    CollectMembers(node, prefix_len, cp, problems);
    std::sort(cp.members.begin(), cp.members.end(),
              [](const MemberFile& a, const MemberFile& b) { return a.rel_path < b.rel_path; });
    CheckNames(cp, problems);
    if (cp.members.size() > kMaxMembersPerCheckpoint) {
      problems.push_back(FoundIn("checkpoint " + Quote(cp.abs_path) + " has " + std::to_string(cp.members.size()) +
                                     " member files, more than the " + std::to_string(kMaxMembersPerCheckpoint) +
                                     " one checkpoint may have",
                                 cp.dir_access));
    }
    if (!problems.empty()) {
      cp.invalid_reason = JoinProblems(problems);
      cp.invalid_problems_shown = ShownProblems(problems);
    }
    scan.checkpoints.push_back(std::move(cp));
    MarkServing(node.rel, scan);
    inside_checkpoint = true;
  } else if (inside_checkpoint) {
    scan.serving_dirs.insert(node.rel);  // the directory above is marked already
  } else {
    for (const auto& p : node.problems) scan.warnings.push_back(p.full);
  }
  if (!hub_repo.empty() && !inside_checkpoint) CollectHubRefs(node, hub_repo, scan);
  const bool is_hub_repo = !node.rel.empty() && IsHubRepoDirName(LastComponent(node.rel));
  for (const auto& sub : node.subdirs) {
    const bool enters_refs = hub_repo.empty() && is_hub_repo && LastComponent(sub->rel) == "refs";
    CutIntoCheckpoints(*sub, root, scan, inside_checkpoint, enters_refs ? node.rel : hub_repo);
  }
}

// What CutIntoCheckpoints could not mark as it went: the directories that
// members reached through links lead to, and those holding hub refs.
void CollectServingDirs(CatalogScan& scan) {
  const std::string real_prefix = scan.real_root + "/";
  for (const auto& cp : scan.checkpoints) {
    for (const auto& m : cp.members) {
      // A member reached through a link: a change of its target's
      // directory (a chmod of the blob) changes who may read it.
      if (m.open_path.compare(0, real_prefix.size(), real_prefix) != 0) continue;
      const std::string_view rel = std::string_view(m.open_path).substr(real_prefix.size());
      const size_t slash = rel.rfind('/');
      MarkServing(slash == std::string_view::npos ? std::string_view() : rel.substr(0, slash), scan);
    }
  }
  for (const auto& ref : scan.hub_refs) {
    const size_t slash = ref.rel_path.rfind('/');
    MarkServing(slash == std::string::npos ? std::string_view() : std::string_view(ref.rel_path).substr(0, slash),
                scan);
  }
}

}  // namespace

std::optional<SymlinkPolicy> ParseSymlinkPolicy(std::string_view text) { return ValueOfWord(kSymlinkPolicyWords, text); }

bool IsWeightFileName(std::string_view name) {
  static constexpr std::string_view kSuffixes[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf"};
  for (std::string_view s : kSuffixes) {
    if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) return true;
  }
  return false;
}

Sha256Digest CheckpointSource::WalkFingerprint() const {
  Fingerprint fp;
  fp.Add(rel_path).Add(abs_path).Add(dir_access).Add(static_cast<uint64_t>(subdirs.size()));
  for (const auto& [rel, access] : subdirs) fp.Add(rel).Add(access);
  fp.Add(static_cast<uint64_t>(members.size()));
  for (const auto& m : members) fp.Add(m.rel_path).Add(m.open_path).Add(m.stamp).Add(m.owner).Add(m.access);
  return fp.Finish();
}

uint64_t CheckpointSource::TotalSize() const {
  uint64_t total = 0;
  for (const auto& m : members) total += m.stamp.size;
  return total;
}

Result<CatalogScan> ScanSourceTree(const std::string& root, const CatalogOptions& options, RewalkHint* hint) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) return Status::FromErrno("source " + Quote(root), errno);
  if (!S_ISDIR(st.st_mode)) return Status::Error("source " + Quote(root) + ": Not a directory");
  int err = 0;
  auto real_root = RealPath(root, &err);
  if (!real_root) return Status::FromErrno("source " + Quote(root), err);
  if (::access(real_root->c_str(), R_OK | X_OK) != 0) {
    return Status::FromErrno("cannot read source " + Quote(root), errno);
  }

  CatalogScan scan;
  scan.root = root;
  while (scan.root.size() > 1 && scan.root.back() == '/') scan.root.pop_back();
  scan.real_root = *real_root;

  scan.tree = std::make_shared<WalkTree>();
  scan.tree->real_root = *real_root;
  DirNode& top = scan.tree->top;
  top.access = {nullptr, ReadOwnership(*real_root, st)};
  top.dev = st.st_dev;
  top.ino = st.st_ino;
  top.inside = DirChain::Extend(nullptr, top.access.self);
  std::set<std::pair<dev_t, ino_t>> ancestors{{st.st_dev, st.st_ino}};
  TreeWalker walker(*real_root, top.access.self, options);
  // The root itself is always listed; below it, unchanged directories may
  // come from the previous tree when it is of this same root and access.
  DirNode* previous = nullptr;
  if (hint != nullptr && hint->previous && hint->previous->real_root == *real_root &&
      hint->previous->top.access == top.access && hint->previous->top.dev == top.dev &&
      hint->previous->top.ino == top.ino) {
    walker.set_hint(hint);
    previous = &hint->previous->top;
  }
  walker.Walk(*real_root, top, ancestors, previous);
  scan.dirs_reused = walker.dirs_reused();
  scan.walked_dirs = walker.TakeWalked();
  if (options.cancel != nullptr && options.cancel->load()) {
    return Status::Error("scan of " + Quote(root) + " cancelled (the daemon is stopping)");
  }
  CutIntoCheckpoints(top, scan.root, scan, /*inside_checkpoint=*/false, /*hub_repo=*/"");
  CollectServingDirs(scan);
  return scan;
}

}  // namespace ckptfs
