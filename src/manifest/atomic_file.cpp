#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "ckptfs/unique_fd.h"

namespace ckptfs {

namespace {

// Removes the temporary file unless it was renamed into place.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void Keep() { path_.clear(); }

 private:
  std::string path_;
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

}  // namespace

Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::Ok();
    return Status::Error("cannot create directory " + path + ": a file of another type is in the way");
  }
  return Status::FromErrno("cannot create directory " + path, errno);
}

Status WriteFileAtomically(const std::string& dir, const std::string& name, std::string_view bytes, unsigned mode) {
  // The leading dot and the random suffix keep a writer's temporary file
  // apart from every other writer's and from the final names.
  std::string tmp = dir + "/." + name + ".tmp-XXXXXX";
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno("cannot create a temporary file in " + dir, errno);
  TempFile guard(tmp);
  if (Status s = WriteAll(fd.get(), bytes, tmp); !s.ok()) return s;
  if (::fchmod(fd.get(), mode) != 0) return Status::FromErrno("cannot chmod " + tmp, errno);
  if (::fsync(fd.get()) != 0) return Status::FromErrno("cannot fsync " + tmp, errno);
  fd.reset();
  const std::string final_path = dir + "/" + name;
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return Status::FromErrno("cannot rename " + tmp + " to " + final_path, errno);
  }
  guard.Keep();
  // The rename itself is durable only once the directory is.
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.valid() && ::fsync(dfd.get()) != 0 && errno != EINVAL) {
    return Status::FromErrno("cannot fsync directory " + dir, errno);
  }
  return Status::Ok();
}

}  // namespace ckptfs
