#include "atomic_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "ckptfs/open_beneath.h"

namespace ckptfs {

namespace {

// Removes the temporary file unless it was renamed into place.
class TempFile {
 public:
  TempFile(int dir, std::string name) : dir_(dir), name_(std::move(name)) {}
  ~TempFile() {
    if (!name_.empty()) ::unlinkat(dir_, name_.c_str(), 0);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void Keep() { name_.clear(); }

 private:
  int dir_;
  std::string name_;
};

Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot write " + path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// ".NAME.tmp-" and 12 random hex digits.
std::string TempName(const std::string& name) {
  uint8_t random[6] = {};
  if (::getrandom(random, sizeof random, 0) != sizeof random) {
    const auto pid = static_cast<unsigned>(::getpid());
    for (size_t i = 0; i < sizeof random; ++i) random[i] = static_cast<uint8_t>(pid >> (i * 5));
  }
  char hex[13];
  for (size_t i = 0; i < sizeof random; ++i) std::snprintf(hex + 2 * i, 3, "%02x", random[i]);
  return "." + name + ".tmp-" + hex;
}

}  // namespace

Result<UniqueFd> MakeAndOpenDirectory(int parent, const std::string& name, const std::string& path) {
  if (::mkdirat(parent, name.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::FromErrno("cannot create directory " + path, errno);
  }
  auto dir = OpenBeneath(parent, name, O_RDONLY | O_DIRECTORY, "manifest store directory " + path);
  if (!dir.ok() && dir.status().error_number() == ENOTDIR) {
    return Status::Error("cannot create directory " + path + ": a file of another type is in the way");
  }
  return dir;
}

Status WriteFileAtomically(int dir, const std::string& dir_name, const std::string& name, std::string_view bytes,
                           unsigned mode) {
  // The leading dot and the random suffix keep a writer's temporary file
  // apart from every other writer's and from the final names; O_EXCL with
  // O_NOFOLLOW never opens what someone else put at the name.
  std::string tmp;
  UniqueFd fd;
  for (int attempt = 0; attempt < 8 && !fd.valid(); ++attempt) {
    tmp = TempName(name);
    fd.reset(::openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid() && errno != EEXIST) break;
  }
  if (!fd.valid()) return Status::FromErrno("cannot create a temporary file in " + dir_name, errno);
  const std::string tmp_path = dir_name + "/" + tmp;
  TempFile guard(dir, tmp);
  if (Status s = WriteAll(fd.get(), bytes, tmp_path); !s.ok()) return s;
  if (::fchmod(fd.get(), mode) != 0) return Status::FromErrno("cannot chmod " + tmp_path, errno);
  if (::fsync(fd.get()) != 0) return Status::FromErrno("cannot fsync " + tmp_path, errno);
  fd.reset();
  if (::renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
    return Status::FromErrno("cannot rename " + tmp_path + " to " + dir_name + "/" + name, errno);
  }
  guard.Keep();
  // The rename itself is durable only once the directory is.
  if (::fsync(dir) != 0 && errno != EINVAL) return Status::FromErrno("cannot fsync directory " + dir_name, errno);
  return Status::Ok();
}

}  // namespace ckptfs
