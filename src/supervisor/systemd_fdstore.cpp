#include "ckptfs/systemd_fdstore.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ckptfs::supervisor {

namespace {

constexpr const char* kFuseName = "fuse";
constexpr const char* kInitName = "fuse-init";
constexpr const char* kOpenInodesName = "fuse-open-inodes";
constexpr const char* kChannelName = "fuse-channel";
constexpr size_t kMaxInit = 4096;  // a fuse_in_header and fuse_init_in are ~100 bytes

std::vector<uint8_t> ReadAll(int fd, size_t limit) {
  std::vector<uint8_t> out(limit);
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

size_t FileSize(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<size_t>(st.st_size) : 0;
}

// A sealed memfd holding `bytes`: nobody changes it while systemd keeps it.
Result<UniqueFd> SealedMemfd(const char* name, const void* bytes, size_t size) {
  UniqueFd memfd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd.valid()) return Status::FromErrno(std::string("memfd_create for ") + name, errno);
  if (::pwrite(memfd.get(), bytes, size, 0) != static_cast<ssize_t>(size) ||
      ::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno(std::string("writing ") + name + " to a memfd", errno);
  }
  return memfd;
}

Status Store(int fd, const char* name) {
  const std::string state = std::string("FDSTORE=1\nFDNAME=") + name;
  const int rc = sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1);
  if (rc < 0) return Status::FromErrno(std::string("systemd fd store (") + name + ")", -rc);
  if (rc == 0) return Status::Error(std::string("systemd fd store (") + name + "): not run by systemd");
  return Status::Ok();
}

}  // namespace

std::optional<StoredConnection> TakeStoredConnection() {
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  if (n <= 0) return std::nullopt;
  StoredConnection c;
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    const std::string name = names != nullptr && names[i] != nullptr ? names[i] : "";
    if (name == kFuseName && !c.fuse.valid()) {
      c.fuse.reset(fd);
    } else if (name == kChannelName) {
      c.channels.emplace_back(fd);
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    } else if (name == kInitName && c.init_request.empty()) {
      c.init_request = ReadAll(fd, kMaxInit);
      ::close(fd);
    } else if (name == kOpenInodesName && c.open_inodes.empty()) {
      const std::vector<uint8_t> json = ReadAll(fd, FileSize(fd));
      c.open_inodes.assign(json.begin(), json.end());
      ::close(fd);
    } else {
      ::close(fd);  // nothing of ours
    }
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  if (!c.fuse.valid()) return std::nullopt;
  ::fcntl(c.fuse.get(), F_SETFD, FD_CLOEXEC);
  return c;
}

bool StoredConnectionWaiting() {
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/0, &names);
  bool found = false;
  for (int i = 0; i < n && names != nullptr; ++i) {
    found = found || (names[i] != nullptr && std::strcmp(names[i], kFuseName) == 0);
    std::free(names[i]);
  }
  std::free(names);
  return found;
}

bool UnderSystemd() {
  const char* s = std::getenv("NOTIFY_SOCKET");
  return s != nullptr && s[0] != '\0';
}

Status StoreFuseFd(int fd) { return Store(fd, kFuseName); }

Status StoreFuseChannels(const std::vector<int>& channels) {
  if (channels.empty()) return Status::Ok();
  const std::string state = std::string("FDSTORE=1\nFDNAME=") + kChannelName;
  const int rc = sd_pid_notify_with_fds(0, 0, state.c_str(), channels.data(), static_cast<unsigned>(channels.size()));
  if (rc < 0) return Status::FromErrno(std::string("systemd fd store (") + kChannelName + ")", -rc);
  if (rc == 0) return Status::Error(std::string("systemd fd store (") + kChannelName + "): not run by systemd");
  return Status::Ok();
}

Status StoreInitRequest(const std::vector<uint8_t>& request) {
  auto memfd = SealedMemfd("ckptfs-fuse-init", request.data(), request.size());
  return memfd.ok() ? Store(memfd->get(), kInitName) : memfd.status();
}

Status StoreOpenInodes(const std::string& json) {
  ForgetOpenInodes();
  auto memfd = SealedMemfd("ckptfs-open-inodes", json.data(), json.size());
  return memfd.ok() ? Store(memfd->get(), kOpenInodesName) : memfd.status();
}

void ForgetOpenInodes() {
  sd_notify(0, (std::string("FDSTOREREMOVE=1\nFDNAME=") + kOpenInodesName).c_str());
}

void NotifyReady(const std::string& status) {
  sd_notify(0, ("READY=1\nSTATUS=" + status).c_str());
}

}  // namespace ckptfs::supervisor
