#include "source_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <unistd.h>

#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

UniqueFd ReopenDirect(int fd, const struct stat& st) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int flags = O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  int direct = RetryOnEintr([&] { return ::open(self.c_str(), flags | O_NOATIME); });
  if (direct < 0 && errno == EPERM) direct = RetryOnEintr([&] { return ::open(self.c_str(), flags); });
  if (direct < 0) return UniqueFd();
  UniqueFd out(direct);
  struct stat now {};
  if (::fstat(out.get(), &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    errno = ESTALE;
    return UniqueFd();
  }
  return out;
}

std::optional<size_t> ReadDirect(int direct_fd, uint64_t offset, uint8_t* dst, size_t len) {
  constexpr size_t kAlign = kDirectReadAlignment;
  if (reinterpret_cast<uintptr_t>(dst) % kAlign != 0 || offset % kAlign != 0) return std::nullopt;
  const size_t want = (len + kAlign - 1) / kAlign * kAlign;
  ssize_t n;
  do {
    n = ::pread(direct_fd, dst, want, static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  // The block holding the end of the file comes whole (also from a read
  // that failed part way); what lies past the end is not the file's, so it
  // must not stay where a mapping of the copy could show it.
  std::memset(dst + len, 0, want - len);
  if (n < 0) return std::nullopt;  // the buffered read then reports a real I/O error with its path
  // A read at the end of the file ends there; never count bytes past `len`.
  return std::min(static_cast<size_t>(n), len);
}

std::optional<double> CachedShare(int fd, uint64_t offset, size_t len) {
#ifdef SYS_cachestat
  constexpr long kCachestat = SYS_cachestat;
#else
  constexpr long kCachestat = 451;  // the same number on every architecture
#endif
  struct {
    uint64_t off, len;
  } range{offset, len};
  struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } stat{};
  if (len == 0 || ::syscall(kCachestat, fd, &range, &stat, 0) != 0) return std::nullopt;
  const uint64_t pages = (len + 4095) / 4096;
  return std::min(1.0, static_cast<double>(stat.nr_cache) / static_cast<double>(pages));
}

}  // namespace ckptfs
