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

Result<OpenedSource> OpenSourceFile(const std::string& root, const std::string& path, int root_fd) {
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
  // O_NOATIME keeps indexing from dirtying every inode; it is refused for
  // files we do not own unless privileged, so fall back without it.
  const uint64_t flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  int fd = RetryOnEintr([&] { return OpenAt2(at, rel, flags | O_NOATIME, resolve); });
  if (fd < 0 && errno == EPERM) fd = RetryOnEintr([&] { return OpenAt2(at, rel, flags, resolve); });
  if (fd < 0) {
    const int err = errno;
    if (IsEscapeErrno(err)) {
      return Status::Changed(path + ": a symlink now stands on its path (the tree changed since it was walked)");
    }
    return Status::FromErrno("cannot open " + path, err);
  }
  OpenedSource out;
  out.fd.reset(fd);
  if (RetryOnEintr([&] { return ::fstat(fd, &out.st); }) != 0) return Status::FromErrno("cannot stat " + path, errno);
  if (!S_ISREG(out.st.st_mode)) return Status::Changed(path + ": no longer a regular file");
  return out;
}

}  // namespace ckptfs
