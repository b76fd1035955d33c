#include "supervised_mount.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "ckptfs/fuse_channels.h"
#include "ckptfs/supervisor.h"
#include "ckptfs/systemd_fdstore.h"
#include "ckptfs/systemd_job.h"

namespace ckptfs::daemon {

namespace {

// Channels beyond this many are not worth their descriptors: more threads
// than that share them.
constexpr unsigned kMaxFuseChannels = 64;

// This binary's path, so that a restart runs whatever is installed there
// now (an upgraded package replaces the file).
std::string SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("/proc/self/exe");
}

// argv[1..] with SRC and MOUNTPOINT replaced by their canonical forms: the
// supervisor runs in "/".
std::vector<std::string> DaemonArgs(int argc, char** argv, const MountOptions& o) {
  std::vector<std::string> out;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-o") {
      out.push_back(a);
      if (i + 1 < argc) out.push_back(argv[++i]);
    } else if (!a.empty() && a[0] == '-') {
      out.push_back(a);
    } else {
      out.push_back(positional == 0 ? o.source : positional == 1 ? o.mountpoint : a);
      ++positional;
    }
  }
  return out;
}

// Like fuse_daemonize, but the parent waits for one byte on a pipe and exits
// with it as its status (1 if the pipe closes first); the standard streams
// stay open until the caller detaches them. Returns the pipe's write end.
Result<UniqueFd> DaemonizeWaitingForStart() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  UniqueFd read_end(p[0]), write_end(p[1]);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid > 0) {
    write_end.reset();
    uint8_t status = 1;
    ssize_t n;
    do {
      n = ::read(read_end.get(), &status, 1);
    } while (n < 0 && errno == EINTR);
    ::_exit(n == 1 ? status : 1);
  }
  read_end.reset();
  if (::setsid() < 0) return Status::FromErrno("setsid", errno);
  return write_end;
}

// The open-file record a supervisor stopped for a restart left in the fd
// store; an empty record if there is none or it does not parse.
nlohmann::json AdoptedOpenInodes(const std::string& text) {
  if (text.empty()) return nlohmann::json::array();
  nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (record.is_array()) return record;
  spdlog::warn("supervisor: the open-file record in systemd's fd store does not parse; new opens of files held "
               "open through passthrough may fail with EIO");
  return nlohmann::json::array();
}

// The connection's channels: those systemd kept with it, else new ones.
std::vector<UniqueFd> Channels(int fuse_fd, const MountOptions& o, std::optional<supervisor::StoredConnection>& stored) {
  if (stored && !stored->channels.empty()) return std::move(stored->channels);
  auto made = supervisor::CloneFuseChannels(fuse_fd, std::min(FuseLoopThreads(o), kMaxFuseChannels));
  if (!made.ok()) {  // the daemons then all read the shared descriptor: it works, only slower
    spdlog::warn("supervisor: {}; the daemon's threads share one descriptor", made.status().message());
    return {};
  }
  return std::move(*made);
}

void StoreChannels(const std::vector<int>& channels) {
  if (Status s = supervisor::StoreFuseChannels(channels); !s.ok()) {
    spdlog::warn("{}; a crash of the supervisor fails the reads its daemon had taken", s.message());
  }
}

// Under systemd: the descriptor, the INIT request once known and the
// channels go to the fd store; a SIGTERM that is part of `systemctl restart`
// then leaves the mount up, with the open-file record stored for the next
// supervisor. The store's order matters should FileDescriptorStoreMax= be set lower than
// the unit's: the connection first, its INIT request next (without which
// the mount cannot be taken over at all), the channels after it. They stay
// there at a restart's hand-back too: a request a draining daemon read as
// its loop ended is dropped by libfuse and left on its channel, for the next
// daemon's resend; closed with the last supervisor, the kernel would fail it.
void KeepConnectionInFdStore(int fuse_fd, const std::vector<UniqueFd>& channel_fds, bool adopted,
                             supervisor::SupervisorConfig& c) {
  if (Status s = supervisor::StoreFuseFd(fuse_fd); !s.ok()) {
    spdlog::warn("{}; systemctl restart will unmount", s.message());
    return;
  }
  std::vector<int> channels;
  for (const UniqueFd& fd : channel_fds) channels.push_back(fd.get());  // held by the supervisor for good
  if (adopted) StoreChannels(channels);  // its INIT request is in the store already
  c.on_init_request = [channels](const std::vector<uint8_t>& init) {
    if (Status s = supervisor::StoreInitRequest(init); !s.ok()) spdlog::warn("{}", s.message());
    StoreChannels(channels);
  };
  c.keep_mount_on_term = [] {
    std::string why;
    const bool restart = supervisor::StoppingForRestart(&why);
    spdlog::info("supervisor: SIGTERM: {}; {}", why, restart ? "keeping the mount" : "unmounting");
    return restart;
  };
  c.on_hand_back = [](const nlohmann::json& open_inodes) {
    if (Status s = supervisor::StoreOpenInodes(open_inodes.dump()); !s.ok()) {
      spdlog::warn("{}: the next daemon will not know which files are open", s.message());
    }
  };
}

}  // namespace

void DetachStandardStreams() {
  UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null.valid()) return;
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) ::dup2(null.get(), fd);
}

int RunSupervisor(fuse_session* se, const MountOptions& o, int argc, char** argv, DaemonLog& log) {
  supervisor::SupervisorConfig c;
  // Restarted by systemd after a crash: the mount is still up, its
  // descriptor in the fd store.
  std::optional<supervisor::StoredConnection> stored = supervisor::TakeStoredConnection();
  if (stored) {
    spdlog::info("supervisor: took the FUSE connection of {} back from systemd's fd store", o.mountpoint);
    c.adopted_init = stored->init_request;
    c.adopted_open_inodes = AdoptedOpenInodes(stored->open_inodes);
  } else if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    spdlog::critical("cannot mount {} at {} (is /dev/fuse there, and fusermount3 installed?)", o.source, o.mountpoint);
    fuse_session_destroy(se);
    return 1;
  }
  // Shared by the supervisor and its daemons: nobody may block in read(),
  // or a draining daemon could not stop without taking a request.
  const int fd = stored ? stored->fuse.get() : fuse_session_fd(se);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  c.channels = Channels(fd, o, stored);
  if (supervisor::UnderSystemd()) KeepConnectionInFdStore(fd, c.channels, stored.has_value(), c);
  log.BeforeDaemonize();
  if (!o.foreground) {
    auto ready = DaemonizeWaitingForStart();
    if (!ready.ok()) {
      spdlog::critical("cannot daemonize: {}", ready.status().message());
      fuse_session_unmount(se);
      fuse_session_destroy(se);
      return 1;
    }
    c.ready_pipe = std::move(*ready);
  }
  if (::chdir("/") != 0) spdlog::warn("chdir /: {}", std::strerror(errno));
  c.binary = SelfPath();
  c.args = DaemonArgs(argc, argv, o);
  c.fuse_fd = fd;
  c.mountpoint = o.mountpoint;
  c.handover_timeout = std::chrono::seconds(o.handover_timeout_s);
  c.unmount = [se, &stored, &o] {
    if (!stored) {
      fuse_session_unmount(se);
      return;
    }
    stored->fuse.reset();
    if (::umount2(o.mountpoint.c_str(), MNT_DETACH) != 0) {
      spdlog::error("cannot unmount {}: {}", o.mountpoint, std::strerror(errno));
    }
  };
  const bool detach = !o.foreground;
  c.on_started = [&log, detach, &o, adopted = stored.has_value()] {
    if (detach) DetachStandardStreams();
    log.AfterMount();
    if (adopted) supervisor::ForgetOpenInodes();  // the first daemon has it; stale from now on
    supervisor::NotifyReady("serving " + o.mountpoint);
  };
  supervisor::Supervisor supervisor(std::move(c));
  const int rc = supervisor.Run();
  fuse_session_destroy(se);
  return rc;
}

}  // namespace ckptfs::daemon
