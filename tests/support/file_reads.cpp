#include "file_reads.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace ckptfs::testing {

namespace {

std::string Failed(const char* what) { return "<" + std::string(what) + ": " + std::strerror(errno) + ">"; }

}  // namespace

std::string ReadDirect(const std::string& path, uint64_t offset, size_t len) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return Failed("open");
  struct stat st;
  ::fstat(fd, &st);
  len = std::min<uint64_t>(len, static_cast<uint64_t>(st.st_size) - std::min<uint64_t>(offset, st.st_size));
  void* buf = nullptr;
  const size_t cap = (len + 4095) / 4096 * 4096 + 4096;
  if (::posix_memalign(&buf, 4096, cap) != 0) return "<memalign>";
  std::string out;
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, static_cast<char*>(buf), std::min<size_t>(cap, 1 << 20), static_cast<off_t>(offset + done));
    if (n < 0) {
      out = Failed("read");
      break;
    }
    if (n == 0) break;
    out.append(static_cast<char*>(buf), std::min<size_t>(static_cast<size_t>(n), len - done));
    done += static_cast<size_t>(n);
  }
  std::free(buf);
  ::close(fd);
  return out;
}

std::string ReadBuffered(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Failed("open");
  std::string out;
  std::string buf(1 << 20, '\0');
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      out = Failed("read");
      break;
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string ReadMapped(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Failed("open");
  struct stat st;
  ::fstat(fd, &st);
  std::string out;
  if (st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      out = Failed("mmap");
    } else {
      out.assign(static_cast<const char*>(p), static_cast<size_t>(st.st_size));
      ::munmap(p, static_cast<size_t>(st.st_size));
    }
  }
  ::close(fd);
  return out;
}

std::string CompareTree(const std::string& src, const std::string& mnt, size_t* files) {
  namespace fs = std::filesystem;
  std::string report;
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), src).string();
    if (rel.front() == '.' || rel.find("/.") != std::string::npos) continue;
    std::string want;
    {
      int fd = ::open(e.path().c_str(), O_RDONLY);
      want.resize(static_cast<size_t>(e.file_size()));
      if (fd < 0 || ::pread(fd, want.data(), want.size(), 0) != static_cast<ssize_t>(want.size())) {
        report += rel + ": cannot read the source\n";
      }
      if (fd >= 0) ::close(fd);
    }
    ++n;
    if (ReadBuffered(mnt + "/" + rel) != want) report += rel + ": read(2) differs\n";
    if (ReadMapped(mnt + "/" + rel) != want) report += rel + ": mmap differs\n";
  }
  if (files != nullptr) *files = n;
  return report;
}

std::vector<std::string> HostTierMemfds(pid_t pid) {
  std::vector<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(e.path(), link_ec).string();
    if (target.rfind("/memfd:ckptfs:", 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

bool SameOpenFile(pid_t pid, int fd, pid_t other, int other_fd) {
  constexpr int kKcmpFile = 0;
  return ::syscall(SYS_kcmp, pid, other, kKcmpFile, fd, other_fd) == 0;
}

}  // namespace ckptfs::testing
