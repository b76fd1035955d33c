#include "source_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <unistd.h>

#include <cerrno>

#include "ckptfs/open_beneath.h"
#include "retry_eintr.h"

namespace ckptfs {

namespace {

bool Beneath(const std::string& root, const std::string& path) {
  return !root.empty() && root != "/" && path.size() > root.size() + 1 &&
         path.compare(0, root.size(), root) == 0 && path[root.size()] == '/';
}

}  // namespace

Result<OpenedSource> OpenSourceFile(const std::string& root, const std::string& path) {
  return OpenSourceFile(root, path, -1);
}

namespace {

// The walk both take: beneath an O_PATH descriptor of `root` (`root_fd`, or
// one opened for this call), no symlink followed. `flags` are open(2)'s; a
// refused O_NOATIME (a file we do not own, unprivileged) is dropped.
Result<UniqueFd> OpenOnPath(const std::string& root, const std::string& path, int root_fd, uint64_t flags) {
  UniqueFd dir;
  std::string rel = path;
  int at = AT_FDCWD;
  if (Beneath(root, path)) {
    if (root_fd < 0) {
      dir.reset(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!dir.valid()) return Status::FromErrno("cannot open source root " + root, errno);
      root_fd = dir.get();
    }
    at = root_fd;
    rel = path.substr(root.size() + 1);
  }
  uint64_t resolve = RESOLVE_NO_MAGICLINKS;
  if (!root.empty()) resolve |= RESOLVE_NO_SYMLINKS;
  if (at != AT_FDCWD) resolve |= RESOLVE_BENEATH;
  int fd = RetryOnEintr([&] { return OpenAt2(at, rel, flags, resolve); });
  if (fd < 0 && errno == EPERM && (flags & O_NOATIME) != 0) {
    fd = RetryOnEintr([&] { return OpenAt2(at, rel, flags & ~uint64_t{O_NOATIME}, resolve); });
  }
  if (fd < 0) {
    const int err = errno;
    if (IsEscapeErrno(err)) {
      return Status::Changed(path + ": a symlink now stands on its path (the tree changed since it was walked)");
    }
    return Status::FromErrno("cannot open " + path, err);
  }
  return UniqueFd(fd);
}

}  // namespace

Result<OpenedSource> OpenSourceFile(const std::string& root, const std::string& path, int root_fd) {
  // O_NOATIME keeps indexing from dirtying every inode.
  auto fd = OpenOnPath(root, path, root_fd, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOATIME);
  if (!fd.ok()) return fd.status();
  OpenedSource out;
  out.fd = std::move(*fd);
  if (RetryOnEintr([&] { return ::fstat(out.fd.get(), &out.st); }) != 0) {
    return Status::FromErrno("cannot stat " + path, errno);
  }
  if (!S_ISREG(out.st.st_mode)) return Status::Changed(path + ": no longer a regular file");
  return out;
}

Status CheckSourcePath(const std::string& root, const std::string& path, const struct stat& st) {
  auto fd = OpenOnPath(root, path, -1, O_PATH | O_CLOEXEC);
  if (!fd.ok()) {
    if (fd.status().error_number() == ENOENT) return Status::Changed(path + ": source file is gone");
    return fd.status();
  }
  struct stat now {};
  if (RetryOnEintr([&] { return ::fstat(fd->get(), &now); }) != 0) return Status::FromErrno("cannot stat " + path, errno);
  if (now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    return Status::Changed(path + ": the path leads to another file than the one open");
  }
  return Status::Ok();
}

}  // namespace ckptfs
