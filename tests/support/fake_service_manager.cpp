#include "fake_service_manager.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "file_reads.h"
#include "notify_datagram.h"

namespace ckptfs::testing {

namespace {

constexpr const char* kUnitPath = "/org/freedesktop/systemd1/unit/ckptfs_40test_2eservice";
constexpr const char* kJobPath = "/org/freedesktop/systemd1/job/7";

int BoundUnixSocket(const std::string& path, int type) {
  const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      (type == SOCK_STREAM && ::listen(fd, 4) != 0)) {
    throw std::runtime_error("fake service manager: cannot bind " + path + ": " + std::strerror(errno));
  }
  return fd;
}

// As systemd's same_fd(): the same open file, not merely the same inode;
// the connection's channels are all /dev/fuse, and each is kept.
bool SameFile(int a, int b) { return SameOpenFile(::getpid(), a, ::getpid(), b); }

std::string Field(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

}  // namespace

// The bus side: one connection at a time (the supervisor asks once per SIGTERM).
struct FakeServiceManager::BusServer {
  std::string path;
  int listen_fd = -1;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::string job_type;
  std::thread thread;

  static BusServer* Self(void* userdata) { return static_cast<BusServer*>(userdata); }

  static int Hello(sd_bus_message* m, void*, sd_bus_error*) { return sd_bus_reply_method_return(m, "s", ":1.1"); }
  static int GetUnitByPid(sd_bus_message* m, void*, sd_bus_error*) {
    return sd_bus_reply_method_return(m, "o", kUnitPath);
  }
  static int Job(sd_bus*, const char*, const char*, const char*, sd_bus_message* reply, void* userdata,
                 sd_bus_error*) {
    std::lock_guard lock(Self(userdata)->mu);
    const bool none = Self(userdata)->job_type.empty();
    return sd_bus_message_append(reply, "(uo)", none ? 0u : 7u, none ? "/" : kJobPath);
  }
  static int JobType(sd_bus*, const char*, const char*, const char*, sd_bus_message* reply, void* userdata,
                     sd_bus_error*) {
    std::lock_guard lock(Self(userdata)->mu);
    return sd_bus_message_append(reply, "s", Self(userdata)->job_type.c_str());
  }

  void Serve(int fd) {
    static const sd_bus_vtable kDbus[] = {SD_BUS_VTABLE_START(0),
                                          SD_BUS_METHOD("Hello", "", "s", Hello, 0), SD_BUS_VTABLE_END};
    static const sd_bus_vtable kManager[] = {SD_BUS_VTABLE_START(0),
                                             SD_BUS_METHOD("GetUnitByPID", "u", "o", GetUnitByPid, 0),
                                             SD_BUS_VTABLE_END};
    static const sd_bus_vtable kUnit[] = {SD_BUS_VTABLE_START(0), SD_BUS_PROPERTY("Job", "(uo)", Job, 0, 0),
                                          SD_BUS_VTABLE_END};
    static const sd_bus_vtable kJob[] = {SD_BUS_VTABLE_START(0), SD_BUS_PROPERTY("JobType", "s", JobType, 0, 0),
                                         SD_BUS_VTABLE_END};
    sd_bus* bus = nullptr;
    sd_id128_t id{};
    sd_id128_randomize(&id);
    if (sd_bus_new(&bus) < 0) {
      ::close(fd);
      return;
    }
    sd_bus_set_fd(bus, fd, fd);
    sd_bus_set_server(bus, 1, id);
    sd_bus_add_object_vtable(bus, nullptr, "/org/freedesktop/DBus", "org.freedesktop.DBus", kDbus, this);
    sd_bus_add_object_vtable(bus, nullptr, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager", kManager,
                             this);
    sd_bus_add_object_vtable(bus, nullptr, kUnitPath, "org.freedesktop.systemd1.Unit", kUnit, this);
    sd_bus_add_object_vtable(bus, nullptr, kJobPath, "org.freedesktop.systemd1.Job", kJob, this);
    if (sd_bus_start(bus) >= 0) {
      while (!stop) {
        const int r = sd_bus_process(bus, nullptr);
        if (r < 0) break;  // the client went away
        if (r == 0 && sd_bus_wait(bus, 100'000) < 0) break;
      }
    }
    sd_bus_flush_close_unref(bus);  // closes fd
  }

  void Run() {
    while (!stop) {
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 100) != 1) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) Serve(fd);
    }
  }
};

FakeServiceManager::FakeServiceManager(const std::string& dir)
    : notify_path_(dir + "/notify"), bus_(std::make_unique<BusServer>()) {
  notify_fd_ = BoundUnixSocket(notify_path_, SOCK_DGRAM);
  bus_->path = dir + "/bus";
  bus_->listen_fd = BoundUnixSocket(bus_->path, SOCK_STREAM);
  bus_->thread = std::thread([b = bus_.get()] { b->Run(); });
}

FakeServiceManager::~FakeServiceManager() {
  bus_->stop = true;
  bus_->thread.join();
  ::close(bus_->listen_fd);
  ::close(notify_fd_);
  for (auto& [name, fd] : store_) ::close(fd);
}

void FakeServiceManager::SetJobType(const std::string& type) {
  std::lock_guard lock(bus_->mu);
  bus_->job_type = type;
}

void FakeServiceManager::ReadNotifications() {
  for (;;) {
    auto datagram = ReceiveNotifyDatagram(notify_fd_);
    if (!datagram) return;
    const std::vector<int>& fds = datagram->fds;
    const std::string& s = datagram->text;
    const std::string name = Field(s, "FDNAME").empty() ? "stored" : Field(s, "FDNAME");
    if (Field(s, "READY") == "1") ++ready_;
    if (Field(s, "FDSTOREREMOVE") == "1") {
      for (auto it = store_.begin(); it != store_.end();) {
        if (it->first == name) {
          ::close(it->second);
          it = store_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (int fd : fds) {
      bool kept = false;
      for (const auto& stored : store_) kept = kept || SameFile(stored.second, fd);
      if (Field(s, "FDSTORE") == "1" && !kept) store_.emplace_back(name, fd);  // systemd drops duplicates too
      else ::close(fd);
    }
  }
}

std::vector<std::string> FakeServiceManager::StoredNames() {
  std::lock_guard lock(mu_);
  ReadNotifications();
  std::vector<std::string> names;
  for (const auto& stored : store_) names.push_back(stored.first);
  return names;
}

int FakeServiceManager::ReadyCount() {
  std::lock_guard lock(mu_);
  ReadNotifications();
  return ready_;
}

pid_t FakeServiceManager::Start(const std::vector<std::string>& argv, const std::string& log_path) {
  std::lock_guard lock(mu_);
  ReadNotifications();
  // Everything the child needs is built before fork: the test is threaded.
  std::vector<std::string> env_text = {"NOTIFY_SOCKET=" + notify_path_, "DBUS_SYSTEM_BUS_ADDRESS=unix:path=" + bus_->path,
                                       "PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  std::string names;
  for (const auto& stored : store_) names += (names.empty() ? "" : ":") + stored.first;
  if (!store_.empty()) {
    env_text.push_back("LISTEN_FDS=" + std::to_string(store_.size()));
    env_text.push_back("LISTEN_FDNAMES=" + names);
  }
  std::vector<char*> args, env;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_text) env.push_back(const_cast<char*>(e.c_str()));
  char listen_pid[32] = "LISTEN_PID=";
  env.push_back(listen_pid);
  env.push_back(nullptr);
  std::vector<int> fds;
  for (const auto& stored : store_) fds.push_back(stored.second);
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const pid_t pid = ::fork();
  if (pid != 0) {
    if (log >= 0) ::close(log);
    return pid;
  }
  if (log >= 0) {  // both: a process left behind must not hold the test's output open
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
  }
  // The child: descriptors to 3, 4, ... (through copies above them first),
  // and LISTEN_PID, which it learns only now.
  std::vector<int> high;
  for (int fd : fds) high.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 100));
  for (size_t i = 0; i < high.size(); ++i) ::dup2(high[i], 3 + static_cast<int>(i));  // dup2 clears CLOEXEC
  char digits[16];
  int n = 0;
  for (pid_t p = ::getpid(); p > 0; p /= 10) digits[n++] = static_cast<char>('0' + p % 10);
  for (int i = 0; i < n; ++i) listen_pid[11 + i] = digits[n - 1 - i];
  listen_pid[11 + n] = '\0';
  ::execve(args[0], args.data(), env.data());
  ::_exit(127);
}

}  // namespace ckptfs::testing
