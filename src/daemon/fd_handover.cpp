#include "fd_handover.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <set>

#include <spdlog/spdlog.h>

#include "ckptfs/build_info.h"
#include "ckptfs/control_protocol.h"
#include "ckptfs/handover_protocol.h"
#include "ckptfs/mutex.h"

namespace ckptfs::daemon {

namespace {

// The variable's value, removed from the environment.
std::string TakeEnv(const char* name) {
  const char* v = std::getenv(name);
  std::string value = v != nullptr ? v : "";
  ::unsetenv(name);
  return value;
}

int64_t ToInt(const std::string& s) { return s.empty() ? 0 : std::strtoll(s.c_str(), nullptr, 10); }

// The channel descriptors the supervisor named ("7,8,9"), each checked to be
// an open /dev/fuse (character device 10:229), named once, and none of
// `taken`; then made close-on-exec. Any fault refuses them all: owning a
// descriptor twice, or one that is not a channel, would close or write
// what is not ours.
Result<std::vector<int>> ParseChannels(const std::string& list, std::set<int> taken) {
  std::vector<int> fds;
  for (size_t at = 0; at < list.size();) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(at, comma - at);
    char* end = nullptr;
    errno = 0;
    const long fd = std::strtol(item.c_str(), &end, 10);
    struct stat st {};
    if (item.empty() || *end != '\0' || errno != 0 || fd <= STDERR_FILENO || fd > INT_MAX ||
        !taken.insert(static_cast<int>(fd)).second || ::fstat(static_cast<int>(fd), &st) != 0 ||
        !S_ISCHR(st.st_mode) || st.st_rdev != makedev(10, 229)) {
      return Status::Error("the channel descriptor '" + item + "' of " + handover::kEnvFuseChannels +
                           " is not an open /dev/fuse named once");
    }
    fds.push_back(static_cast<int>(fd));
    at = comma + 1;
  }
  for (int fd : fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fds;
}

}  // namespace

std::unique_ptr<FdHandover> FdHandover::FromEnvironment() {
  const std::string fuse = TakeEnv(handover::kEnvFuseFd), link = TakeEnv(handover::kEnvLinkFd);
  const std::string init = TakeEnv(handover::kEnvInit), restarts = TakeEnv(handover::kEnvRestarts);
  const std::string last_exit = TakeEnv(handover::kEnvLastExit), mounted_at = TakeEnv(handover::kEnvMountedAt);
  const std::string supervisor = TakeEnv(handover::kEnvSupervisorPid);
  const std::string started_as = TakeEnv(handover::kEnvStartedAs);
  const std::string predecessor = TakeEnv(handover::kEnvPredecessorPid);
  const std::string channels = TakeEnv(handover::kEnvFuseChannels);
  if (fuse.empty() || link.empty()) return nullptr;
  std::unique_ptr<FdHandover> h(new FdHandover());
  h->fuse_fd_ = static_cast<int>(ToInt(fuse));
  h->link_.reset(static_cast<int>(ToInt(link)));
  // Neither may leak into what this daemon runs (CUDA probes, fusermount3).
  ::fcntl(h->fuse_fd_, F_SETFD, FD_CLOEXEC);
  ::fcntl(h->link_.get(), F_SETFD, FD_CLOEXEC);
  if (auto fds = ParseChannels(channels, {h->fuse_fd_, h->link_.get()}); fds.ok()) {
    for (int fd : *fds) h->channels_.emplace_back(fd);
  } else if (!channels.empty()) {
    spdlog::warn("supervisor: {}; the FUSE threads share one descriptor", fds.status().message());
  }
  h->adopted_init_ = handover::FromHex(init);
  h->restarts_ = static_cast<uint64_t>(ToInt(restarts));
  h->last_exit_ = last_exit.empty() ? "none" : last_exit;
  h->mounted_at_ = ToInt(mounted_at);
  h->started_at_ = static_cast<int64_t>(std::time(nullptr));
  h->supervisor_pid_ = static_cast<int>(ToInt(supervisor));
  h->started_as_ = started_as.empty() ? handover::kStartedFirst : started_as;
  h->predecessor_pid_ = static_cast<int>(ToInt(predecessor));
  return h;
}

FdHandover::~FdHandover() {
  if (!listener_.joinable()) return;
  ::shutdown(link_.get(), SHUT_RDWR);
  listener_.join();
}

void FdHandover::Send(const nlohmann::json& message) {
  MutexLock lock(send_mu_);
  if (Status s = handover::Send(link_.get(), message); !s.ok()) spdlog::warn("{}", s.message());
}

void FdHandover::SendInit(const std::vector<uint8_t>& request) {
  Send({{"type", "init"}, {"request", handover::ToHex(request)}});
}

void FdHandover::SendReady() { Send({{"type", "ready"}}); }

void FdHandover::Listen(fuse::FsContext& ctx) {
  // Every change of an inode's open files, for the successor should this
  // daemon crash; an open only notes its inode, and never waits for a
  // lagging supervisor (open_inode_reporter.h).
  auto reporter = std::make_unique<OpenInodeReporter>(link_.get(), [&ctx](uint64_t ino) { return fuse::OpenInodeRecord(ctx, ino); });
  fuse::WatchOpenInodes(ctx, [r = reporter.get()](uint64_t ino) { r->Changed(ino); });
  {
    MutexLock lock(reporter_mu_);
    reporter_ = std::move(reporter);
  }
  listener_ = std::thread([this, &ctx] {
    for (;;) {
      auto msg = handover::Receive(link_.get());
      if (!msg.ok()) return;  // Stop, or the supervisor is gone (and kills us)
      const std::string type = (*msg)["type"];
      if (type == "drain") {
        spdlog::info("asked to drain (a hand-over, or a restart under systemd): finishing the requests in hand and exiting");
        drained_ = true;
        fuse::DrainConnection(ctx);
      } else if (type == "handover-failed") {
        const std::string why = msg->value("error", std::string("?"));
        spdlog::error("restart failed, this daemon goes on serving: {}", why);
        MutexLock lock(failures_mu_);
        ++handover_failures_;
        last_handover_error_ = why;
      } else if (type == "resend") {
        std::vector<fuse::InheritedInode> inodes;
        for (const auto& i : msg->value("inodes", nlohmann::json::array())) {
          if (i.is_array() && i.size() == 3 && i[0].is_number_unsigned() && i[1].is_number_unsigned() &&
              i[2].is_number_integer()) {
            inodes.push_back({i[0].get<uint64_t>(), i[1].get<uint64_t>(), i[2].get<int>()});
          }
        }
        fuse::InheritOpenInodes(ctx, inodes);
        if (!inodes.empty()) spdlog::info("took over {} inode(s) with open files from the previous daemon", inodes.size());
        if (Status s = fuse::ResendRequests(ctx); s.ok()) {
          spdlog::info("asked the kernel to resend the requests the previous daemon left unanswered");
        } else {
          spdlog::warn("{}: requests the previous daemon read but did not answer stay unanswered until the "
                       "mount is aborted or unmounted",
                       s.message());
        }
      }
    }
  });
}

void FdHandover::Stop(fuse::FsContext& ctx) {
  // The reporter goes first, as it reads `ctx`; a drained daemon's "inherit"
  // below carries every record anyway.
  fuse::WatchOpenInodes(ctx, nullptr);
  {
    MutexLock lock(reporter_mu_);
    // A daemon that hands over sends every record in "inherit" below; one
    // that just exits leaves the supervisor what it was told, so it tells
    // what waits first, for a moment.
    if (reporter_) reporter_->Stop(drained_ ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
  }
  if (drained_) {
    nlohmann::json inodes = nlohmann::json::array();
    for (const auto& i : fuse::HandOverOpenInodes(ctx)) inodes.push_back({i.ino, i.opens, i.backing_id});
    Send({{"type", "inherit"}, {"inodes", inodes}});
  }
  if (!listener_.joinable()) return;
  ::shutdown(link_.get(), SHUT_RDWR);  // wakes the listener's recv
  listener_.join();
}

nlohmann::json FdHandover::HandleRestart(const ControlServer::Request& r) {
  if (!r.privileged) {
    return protocol::ErrorReply("restart is for root or the mount's owner (uid " + std::to_string(::geteuid()) +
                                "); you are uid " + std::to_string(r.peer_uid));
  }
  const std::string binary = r.body.value(protocol::kBinary, std::string());
  if (!binary.empty() && (binary[0] != '/' || ::access(binary.c_str(), X_OK) != 0)) {
    return protocol::ErrorReply("binary " + binary + ": not an absolute path to an executable file");
  }
  Send({{"type", "restart"}, {"binary", binary}});
  return {{protocol::kOk, true}, {protocol::kPid, ::getpid()}};
}

nlohmann::json FdHandover::StatusJson() const {
  size_t reports_waiting = 0;
  {
    MutexLock lock(reporter_mu_);
    if (reporter_) reports_waiting = reporter_->waiting();
  }
  MutexLock lock(failures_mu_);
  using namespace protocol;
  return {{kVersion, BuildDescription()},
          {kSupervised, true},
          {kSupervisorPid, supervisor_pid_},
          {kStartedAt, started_at_},
          {"mounted_at", mounted_at_},
          {kRestarts, restarts_},
          {kLastExit, last_exit_},
          {kHandoverFailures, handover_failures_},
          {kLastHandoverError, last_handover_error_},
          {kStartedAs, started_as_},
          {kPredecessorPid, predecessor_pid_},
          {kOpenInodeReportsWaiting, reports_waiting}};
}

bool FailStartForTest() {
  const char* file = std::getenv("CKPTFS_TEST_FAIL_START");
  if (file == nullptr || ::access(file, F_OK) != 0) return false;
  spdlog::critical("failing at start on purpose: {} exists (CKPTFS_TEST_FAIL_START)", file);
  return true;
}

nlohmann::json UnsupervisedStatusJson(int64_t started_at) {
  using namespace protocol;
  return {{kVersion, BuildDescription()}, {kSupervised, false}, {kStartedAt, started_at},
          {"mounted_at", started_at},     {kRestarts, 0},       {kLastExit, "none"},
          {kStartedAs, handover::kStartedFirst}};
}

}  // namespace ckptfs::daemon
