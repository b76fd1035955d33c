#include "ckptfs/file_stamp.h"

namespace ckptfs {

namespace {
int64_t Nanos(const struct timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
}  // namespace

FileStamp FileStamp::FromStat(const struct stat& st) {
  FileStamp s;
  s.dev = static_cast<uint64_t>(st.st_dev);
  s.ino = static_cast<uint64_t>(st.st_ino);
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = Nanos(st.st_mtim);
  s.ctime_ns = Nanos(st.st_ctim);
  return s;
}

std::string FileStamp::ToString() const {
  return "dev=" + std::to_string(dev) + " ino=" + std::to_string(ino) + " size=" + std::to_string(size) +
         " mtime_ns=" + std::to_string(mtime_ns) + " ctime_ns=" + std::to_string(ctime_ns);
}

}  // namespace ckptfs
