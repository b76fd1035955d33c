#include "ckptfs/catalog.h"

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

// One directory of the walked tree, before it is cut into checkpoints.
struct DirNode {
  std::string rel;  // relative to the root ("" for the root)
  Ownership owner;
  bool has_weight_file = false;
  struct File {
    std::string rel;  // relative to the root
    std::string open_path;
    FileStamp stamp;
    Ownership owner;
  };
  std::vector<File> files;
  std::vector<std::unique_ptr<DirNode>> subdirs;
  std::vector<std::string> problems;  // each names the path and the cause
};

std::string JoinRel(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
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

std::string ReadLinkText(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n < 0 ? std::string("?") : std::string(buf, static_cast<size_t>(n));
}

class TreeWalker {
 public:
  TreeWalker(std::string real_root, const CatalogOptions& options)
      : real_root_(std::move(real_root)), options_(options) {}

  // `abs` is a canonical path; `ancestors` holds the directories on the way
  // down (as dev/ino), so a link back up is caught as a loop.
  void Walk(const std::string& abs, DirNode& node, std::set<std::pair<dev_t, ino_t>>& ancestors) {
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(abs.c_str()), ::closedir);
    if (!dir) {
      node.problems.push_back("cannot read directory " + Quote(abs) + ": " + std::strerror(errno));
      return;
    }
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = ::readdir(dir.get())) {
      if (e->d_name[0] == '.') continue;  // ".", ".." and every dot-path
      names.emplace_back(e->d_name);
    }
    if (errno != 0) {
      node.problems.push_back("cannot list directory " + Quote(abs) + ": " + std::strerror(errno));
    }
    std::sort(names.begin(), names.end());

    for (const std::string& name : names) {
      const std::string child = abs + "/" + name;
      const std::string rel = JoinRel(node.rel, name);
      if (IsExcluded(child)) continue;
      struct stat st;
      if (::lstat(child.c_str(), &st) != 0) {
        node.problems.push_back("cannot stat " + Quote(child) + ": " + std::strerror(errno));
        continue;
      }
      std::string target = child;
      if (S_ISLNK(st.st_mode)) {
        if (IsWeightFileName(name)) node.has_weight_file = true;  // a bad weight link still marks it
        auto resolved = ResolveLink(child, &node);
        if (!resolved) continue;
        target = *resolved;
        if (IsExcluded(target)) continue;
        if (::stat(target.c_str(), &st) != 0) {
          node.problems.push_back("cannot stat " + Quote(target) + " (target of " + Quote(child) +
                                  "): " + std::strerror(errno));
          continue;
        }
      }
      if (S_ISDIR(st.st_mode)) {
        auto key = std::make_pair(st.st_dev, st.st_ino);
        if (ancestors.count(key) != 0) {
          node.problems.push_back("symlink loop: " + Quote(child) + " leads back to its own ancestor " +
                                  Quote(target));
          continue;
        }
        auto sub = std::make_unique<DirNode>();
        sub->rel = rel;
        sub->owner = Ownership::FromStat(st);
        ancestors.insert(key);
        Walk(target, *sub, ancestors);
        ancestors.erase(key);
        node.subdirs.push_back(std::move(sub));
      } else if (S_ISREG(st.st_mode)) {
        if (IsWeightFileName(name)) node.has_weight_file = true;
        node.files.push_back({rel, target, FileStamp::FromStat(st), Ownership::FromStat(st)});
      }
      // Sockets, fifos and devices are not members.
    }
  }

 private:
  bool IsExcluded(const std::string& path) const {
    return std::find(options_.excluded_paths.begin(), options_.excluded_paths.end(), path) !=
           options_.excluded_paths.end();
  }

  bool Contained(const std::string& path) const {
    if (real_root_ == "/") return true;
    return path == real_root_ ||
           (path.size() > real_root_.size() && path.compare(0, real_root_.size(), real_root_) == 0 &&
            path[real_root_.size()] == '/');
  }

  std::optional<std::string> ResolveLink(const std::string& link, DirNode* node) const {
    int err = 0;
    auto resolved = RealPath(link, &err);
    if (!resolved) {
      const std::string text = ReadLinkText(link);
      if (err == ENOENT || err == ENOTDIR) {
        node->problems.push_back("dangling symlink " + Quote(link) + " -> " + Quote(text));
      } else if (err == ELOOP) {
        node->problems.push_back("symlink loop at " + Quote(link) + " -> " + Quote(text));
      } else {
        node->problems.push_back("cannot resolve symlink " + Quote(link) + " -> " + Quote(text) + ": " +
                                 std::strerror(err));
      }
      return std::nullopt;
    }
    if (options_.symlinks == SymlinkPolicy::kContained && !Contained(*resolved)) {
      node->problems.push_back("symlink " + Quote(link) + " resolves outside the source root to " +
                               Quote(*resolved) + " (mount with symlinks=follow to allow it)");
      return std::nullopt;
    }
    return resolved;
  }

  std::string real_root_;
  const CatalogOptions& options_;
};

// Adds the files of `node`'s subtree to `cp`, stopping at nested checkpoints,
// and gathers the problems met on the way.
void CollectMembers(const DirNode& node, size_t prefix_len, CheckpointSource& cp,
                    std::vector<std::string>& problems) {
  problems.insert(problems.end(), node.problems.begin(), node.problems.end());
  for (const auto& f : node.files) {
    cp.members.push_back({f.rel.substr(prefix_len), f.open_path, f.stamp, f.owner});
  }
  for (const auto& sub : node.subdirs) {
    if (sub->has_weight_file) continue;
    cp.subdirs[sub->rel.substr(prefix_len)] = sub->owner;
    CollectMembers(*sub, prefix_len, cp, problems);
  }
}

// `reach` is what the directories above `node` let through.
void CutIntoCheckpoints(const DirNode& node, const std::string& root, CatalogScan& scan, bool inside_checkpoint,
                        const std::optional<Ownership>& reach) {
  scan.dirs[node.rel] = node.owner;
  if (node.has_weight_file) {
    CheckpointSource cp;
    cp.dir_owner = reach ? Intersect(node.owner, *reach) : node.owner;
    cp.rel_path = node.rel;
    cp.abs_path = node.rel.empty() ? root : root + "/" + node.rel;
    const size_t prefix_len = node.rel.empty() ? 0 : node.rel.size() + 1;
    std::vector<std::string> problems;
    CollectMembers(node, prefix_len, cp, problems);
    std::sort(cp.members.begin(), cp.members.end(),
              [](const MemberFile& a, const MemberFile& b) { return a.rel_path < b.rel_path; });
    for (const auto& m : cp.members) {
      // sha256sum escapes these names, so the coreutils recomputation of the
      // digest would disagree with ours: refuse them (DESIGN.md section 1).
      if (m.rel_path.find('\n') != std::string::npos) {
        problems.push_back("member name contains a newline: " + Quote(cp.abs_path + "/" + m.rel_path));
      } else if (m.rel_path.find('\\') != std::string::npos) {
        problems.push_back("member name contains a backslash: " + Quote(cp.abs_path + "/" + m.rel_path));
      }
    }
    if (cp.rel_path.find('\n') != std::string::npos) {
      problems.push_back("checkpoint path contains a newline: " + Quote(cp.abs_path));
    }
    if (!problems.empty()) {
      std::string reason;
      for (const auto& p : problems) reason += (reason.empty() ? "" : "; ") + p;
      cp.invalid_reason = std::move(reason);
    }
    scan.checkpoints.push_back(std::move(cp));
    inside_checkpoint = true;
  } else if (!inside_checkpoint) {
    scan.warnings.insert(scan.warnings.end(), node.problems.begin(), node.problems.end());
  }
  const Ownership through = TraversalOnly(node.owner);
  const Ownership next_reach = reach ? Intersect(through, *reach) : through;
  for (const auto& sub : node.subdirs) CutIntoCheckpoints(*sub, root, scan, inside_checkpoint, next_reach);
}

}  // namespace

std::optional<SymlinkPolicy> ParseSymlinkPolicy(std::string_view text) {
  if (text == "contained") return SymlinkPolicy::kContained;
  if (text == "follow") return SymlinkPolicy::kFollow;
  return std::nullopt;
}

bool IsWeightFileName(std::string_view name) {
  static constexpr std::string_view kSuffixes[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf"};
  for (std::string_view s : kSuffixes) {
    if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) return true;
  }
  return false;
}

uint64_t CheckpointSource::TotalSize() const {
  uint64_t total = 0;
  for (const auto& m : members) total += m.stamp.size;
  return total;
}

Result<CatalogScan> ScanSourceTree(const std::string& root, const CatalogOptions& options) {
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

  DirNode top;
  top.owner = Ownership::FromStat(st);
  std::set<std::pair<dev_t, ino_t>> ancestors{{st.st_dev, st.st_ino}};
  TreeWalker(*real_root, options).Walk(*real_root, top, ancestors);
  CutIntoCheckpoints(top, scan.root, scan, /*inside_checkpoint=*/false, std::nullopt);
  return scan;
}

}  // namespace ckptfs
