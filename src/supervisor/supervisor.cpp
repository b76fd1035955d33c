#include "ckptfs/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "ckptfs/handover_protocol.h"
#include "eio_responder.h"

namespace ckptfs::supervisor {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kStopGrace = std::chrono::seconds(10);  // then SIGKILL

sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// In the forked child, before exec: only async-signal-safe work is needed in
// a multi-threaded parent, but the supervisor has one thread, so setenv is
// safe here.
[[noreturn]] void ExecDaemon(const std::string& binary, const std::vector<std::string>& args, int fuse_fd,
                             const std::vector<UniqueFd>& channels, int link_fd,
                             const std::vector<std::pair<std::string, std::string>>& env) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // A supervisor that dies takes its daemon along: the mount is then broken,
  // as without supervision (surviving the supervisor is not attempted).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int fuse = ::dup(fuse_fd), link = ::dup(link_fd);  // dup: without close-on-exec
  if (fuse < 0 || link < 0) ::_exit(126);
  ::setenv(handover::kEnvFuseFd, std::to_string(fuse).c_str(), 1);
  ::setenv(handover::kEnvLinkFd, std::to_string(link).c_str(), 1);
  if (!channels.empty()) {
    std::string list;
    for (const UniqueFd& c : channels) {
      const int inherited = ::dup(c.get());
      if (inherited < 0) ::_exit(126);
      list += (list.empty() ? "" : ",") + std::to_string(inherited);
    }
    ::setenv(handover::kEnvFuseChannels, list.c_str(), 1);
  }
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  std::string arg0 = binary;
  argv.push_back(arg0.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(binary.c_str(), argv.data());
  const std::string msg = "ckptfs supervisor: cannot run " + binary + ": " + std::strerror(errno) + "\n";
  if (::write(STDERR_FILENO, msg.data(), msg.size()) < 0) {
  }
  ::_exit(127);
}

}  // namespace

Supervisor::Supervisor(SupervisorConfig config)
    : config_(std::move(config)), policy_(config_.limits), init_request_(config_.adopted_init) {
  const sigset_t set = HandledSignals();
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signals_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  channels_ = std::move(config_.channels);
}

const char* Supervisor::RoleName(Role role) {
  switch (role) {
    case Role::kSuccessor:
      return handover::kStartedSuccessor;
    case Role::kReplacement:
      return handover::kStartedReplacement;
    case Role::kFirst:
      break;
  }
  return handover::kStartedFirst;
}

bool Supervisor::Spawn(const std::string& binary, const std::string& why, Role role, pid_t predecessor) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    spdlog::error("supervisor: cannot start the serving daemon ({}): socketpair: {}", why, std::strerror(errno));
    return false;
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  std::vector<std::pair<std::string, std::string>> env = {
      {handover::kEnvRestarts, std::to_string(restarts_)},
      {handover::kEnvLastExit, last_exit_},
      {handover::kEnvMountedAt, std::to_string(mounted_at_)},
      {handover::kEnvSupervisorPid, std::to_string(::getpid())},
      {handover::kEnvStartedAs, RoleName(role)},
      {handover::kEnvPredecessorPid, std::to_string(predecessor)}};
  if ((started_ || !config_.adopted_init.empty()) && !init_request_.empty()) env.emplace_back(handover::kEnvInit, handover::ToHex(init_request_));
  const pid_t pid = ::fork();
  if (pid < 0) {
    spdlog::error("supervisor: cannot start the serving daemon ({}): fork: {}", why, std::strerror(errno));
    return false;
  }
  if (pid == 0) ExecDaemon(binary, config_.args, config_.fuse_fd, channels_, theirs.get(), env);
  Child child;
  child.pid = pid;
  child.link = std::move(ours);
  child.binary = binary;
  child.role = role;
  child.started = Clock::now();
  child.ready_by = child.started + config_.handover_timeout;
  children_.push_back(std::move(child));
  spdlog::info("supervisor: started {} daemon pid {} ({}; {})", RoleName(role), pid, binary, why);
  return true;
}

void Supervisor::Send(Child& child, const nlohmann::json& message) {
  if (!child.link.valid()) return;
  if (Status s = handover::Send(child.link.get(), message); !s.ok()) {
    spdlog::warn("supervisor: daemon pid {}: {}", child.pid, s.message());
  }
}

Supervisor::ChildIt Supervisor::Serving() {
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    if (it->ready && !it->draining && it->abandoned.empty()) return it;
  }
  return children_.end();
}

Supervisor::ChildIt Supervisor::PendingSuccessor() {
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    if (it->role == Role::kSuccessor && !it->ready && it->abandoned.empty()) return it;
  }
  return children_.end();
}

// A daemon serves, or one is on its way that is not a successor (a
// replacement starting, or a restart waiting for its back-off).
bool Supervisor::ServerPresentOrComing() const {
  if (restart_pending_) return true;
  for (const auto& c : children_) {
    if (c.abandoned.empty() && !c.draining && (c.ready || c.role != Role::kSuccessor)) return true;
  }
  return false;
}

// Kills `child` (it exits through OnExit like any other), remembering why.
void Supervisor::Abandon(Child& child, const std::string& why) {
  if (!child.abandoned.empty()) return;
  child.abandoned = why;
  spdlog::error("supervisor: stopping daemon pid {} ({}): {}", child.pid, child.binary, why);
  ::kill(child.pid, SIGKILL);
}

// A successor that did not report ready within handover_timeout.
void Supervisor::AbandonLateSuccessors() {
  const auto now = Clock::now();
  for (auto& c : children_) {
    if (c.role != Role::kSuccessor || c.ready || !c.abandoned.empty() || now < c.ready_by) continue;
    Abandon(c, "it did not report ready within " +
                   std::to_string(std::chrono::duration_cast<std::chrono::seconds>(config_.handover_timeout).count()) +
                   " s of the hand-over");
  }
}

void Supervisor::ReportStart(uint8_t status) {
  if (!config_.ready_pipe.valid()) return;
  if (::write(config_.ready_pipe.get(), &status, 1) != 1) {
    // The parent is gone (killed while waiting): nobody to tell.
  }
  config_.ready_pipe.reset();
}

void Supervisor::OnMessage(ChildIt child, const nlohmann::json& message) {
  if (!child->abandoned.empty()) return;  // being killed: nothing it says counts
  const std::string type = message.value("type", std::string());
  if (type == "init") {
    if (init_request_.empty()) {
      init_request_ = handover::FromHex(message.value("request", std::string()));
      if (config_.on_init_request) config_.on_init_request(init_request_);
    }
  } else if (type == "open-inode") {
    const auto& i = message.value("inode", nlohmann::json());
    if (i.is_array() && i.size() == 3 && i[0].is_number_unsigned() && i[1].is_number_unsigned() &&
        i[2].is_number_integer()) {
      if (i[1].get<uint64_t>() == 0) child->open_inodes.erase(i[0].get<uint64_t>());
      else child->open_inodes[i[0].get<uint64_t>()] = {i[1].get<uint64_t>(), i[2].get<int>()};
    }
  } else if (type == "inherit") {
    if (message.contains("inodes") && message["inodes"].is_array()) inherited_ = message["inodes"];
  } else if (type == "ready") {
    OnReady(child);
  } else if (type == "restart") {
    OnRestartAsked(child, message);
  } else {
    spdlog::warn("supervisor: daemon pid {} sent an unknown message: {}", child->pid, type);
  }
}

void Supervisor::OnRestartAsked(ChildIt child, const nlohmann::json& message) {
  std::string binary = message.value("binary", std::string());
  if (binary.empty()) binary = config_.binary;
  if (stopping_ || child != Serving() || PendingSuccessor() != children_.end() || restart_pending_) {
    spdlog::warn("supervisor: restart asked by pid {} ignored: a start or hand-over is under way", child->pid);
    Send(*child, {{"type", "handover-failed"}, {"error", "a start or hand-over is under way already"}});
    return;
  }
  ++restarts_;
  last_exit_ = "pid " + std::to_string(child->pid) + " handed over (ckptfsctl restart)";
  if (!Spawn(binary, "hand-over asked by pid " + std::to_string(child->pid) + " (ckptfsctl restart)", Role::kSuccessor,
             child->pid)) {
    Send(*child, {{"type", "handover-failed"}, {"error", "the supervisor could not start " + binary}});
  }
}

void Supervisor::OnReady(ChildIt child) {
  child->ready = true;
  policy_.OnReady();
  if (crash_loop_) spdlog::info("supervisor: daemon pid {} started; the crash loop is over", child->pid);
  crash_loop_ = false;
  config_.binary = child->binary;  // restarts from now on run what serves now
  if (!started_) {
    started_ = true;
    ReportStart(0);
    if (config_.on_started) config_.on_started();
    // A connection adopted from the fd store: its last daemon died with us.
    if (!config_.adopted_init.empty()) Send(*child, {{"type", "resend"}, {"inodes", config_.adopted_open_inodes}});
    return;
  }
  bool predecessor_alive = false;
  for (auto& other : children_) {
    if (other.pid == child->pid || other.draining || !other.abandoned.empty()) continue;
    if (!other.ready) {  // one start too many: a single daemon serves
      Abandon(other, "daemon pid " + std::to_string(child->pid) + " serves already");
      continue;
    }
    other.draining = true;
    predecessor_alive = true;
    Send(other, {{"type", "drain"}});
    spdlog::info("supervisor: daemon pid {} serves now; pid {} drains and exits", child->pid, other.pid);
  }
  // What the dead predecessor had read but not answered is queued again.
  if (!predecessor_alive) {
    Send(*child, {{"type", "resend"}, {"inodes", inherited_}});
    inherited_ = nlohmann::json::array();
  }
}

bool Supervisor::MountGone() const {
  pollfd p{config_.fuse_fd, 0, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0;
}

void Supervisor::ReapChildren() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto it = children_.begin(); it != children_.end(); ++it) {
      if (it->pid == pid) {
        OnExit(it, status);
        break;
      }
    }
  }
}

void Supervisor::OnExit(ChildIt child, int wait_status) {
  const Child dead = std::move(*child);
  children_.erase(child);
  const std::string cause = DescribeExit(wait_status);
  const double ran = Seconds(Clock::now() - dead.started);
  if (stopping_) {
    // Handing back: what a daemon that died before its final record reported as it went.
    if (handing_back_ && dead.ready && inherited_.empty()) {
      for (const auto& [ino, held] : dead.open_inodes) inherited_.push_back({ino, held.first, held.second});
    }
    return;
  }
  if (dead.draining) {
    const ChildIt serving = Serving();
    last_exit_ = "handed over (" + cause + ")";
    spdlog::info("supervisor: daemon pid {} handed the mount over and {}", dead.pid, cause);
    if (inherited_.empty()) {  // it died before it could say: what it reported as it went
      for (const auto& [ino, held] : dead.open_inodes) inherited_.push_back({ino, held.first, held.second});
    }
    if (serving != children_.end()) Send(*serving, {{"type", "resend"}, {"inodes", inherited_}});
    inherited_ = nlohmann::json::array();
    return;
  }
  if (!started_) {
    spdlog::error("supervisor: the serving daemon pid {} {} before it was ready; unmounting", dead.pid, cause);
    ReportStart(1);
    exit_status_ = 1;
    Stop("the first daemon failed");
    return;
  }
  if (dead.role == Role::kSuccessor && !dead.ready) {
    OnSuccessorGone(dead, cause);
  } else if (!dead.abandoned.empty()) {
    spdlog::info("supervisor: daemon pid {} {}", dead.pid, cause);
  }
  if (ServerPresentOrComing()) return;
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0 && MountGone()) {
    spdlog::info("supervisor: {} was unmounted; exiting", config_.mountpoint);
    Stop("unmounted");
    return;
  }
  // Nobody serves. A successor still starting was to take over from the
  // daemon that just died: it is stopped, and a replacement started at once.
  if (auto pending = PendingSuccessor(); pending != children_.end()) {
    Abandon(*pending, "daemon pid " + std::to_string(dead.pid) + ", which it was to take over from, " + cause +
                          "; a replacement is started instead");
  }
  last_exit_ = cause;
  // Its successor inherits the files it had open (the kernel holds them).
  if (dead.ready) {
    inherited_ = nlohmann::json::array();
    for (const auto& [ino, held] : dead.open_inodes) inherited_.push_back({ino, held.first, held.second});
  }
  const RestartPolicy::Decision d = policy_.OnDeath(dead.ready, Clock::now() - dead.started);
  spdlog::warn("supervisor: serving daemon pid {} {} after {:.1f} s{}; restarting it in {} ms (restart {})",
               dead.pid, cause, ran, dead.ready ? "" : " (before it was ready)", d.delay.count(), restarts_ + 1);
  if (d.crash_loop && !crash_loop_) {
    spdlog::error("supervisor: crash loop: the serving daemon failed to start {} times in a row; requests to {} "
                  "are answered with EIO until a start succeeds",
                  config_.limits.failed_starts_for_loop, config_.mountpoint);
  }
  crash_loop_ = d.crash_loop;
  restart_pending_ = true;
  restart_at_ = Clock::now() + d.delay;
}

// A successor ended before it served: the hand-over failed, and the
// serving daemon, if one still serves, goes on and is told why.
void Supervisor::OnSuccessorGone(const Child& dead, const std::string& cause) {
  const std::string how =
      dead.abandoned.empty() ? cause + " before taking over" : "was stopped before taking over: " + dead.abandoned;
  const ChildIt serving = Serving();
  if (serving == children_.end()) {
    spdlog::error("supervisor: new daemon pid {} ({}) {}", dead.pid, dead.binary, how);
    return;
  }
  last_exit_ = "new daemon pid " + std::to_string(dead.pid) + " " + how;
  spdlog::error("supervisor: new daemon pid {} ({}) {}; pid {} keeps serving", dead.pid, dead.binary, how,
                serving->pid);
  Send(*serving, {{"type", "handover-failed"},
                  {"error", "new daemon " + dead.binary + " (pid " + std::to_string(dead.pid) + ") " + how}});
}

void Supervisor::Stop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  spdlog::info("supervisor: {}: unmounting {}", why, config_.mountpoint);
  if (config_.unmount) config_.unmount();
  for (auto& c : children_) ::kill(c.pid, SIGTERM);
  restart_at_ = Clock::now() + kStopGrace;  // the deadline for the children
}

void Supervisor::HandBack(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  handing_back_ = true;
  inherited_ = nlohmann::json::array();
  spdlog::info("supervisor: {}: leaving {} mounted for the next supervisor; the serving daemon drains", why,
               config_.mountpoint);
  for (auto& c : children_) {
    if (c.ready && !c.draining) {
      c.draining = true;
      Send(c, {{"type", "drain"}});
    } else if (!c.draining) {
      ::kill(c.pid, SIGTERM);  // a start not yet serving has nothing to hand over
    }
  }
  restart_at_ = Clock::now() + kStopGrace;  // the deadline for the children
}

void Supervisor::OnSignal(int signo) {
  const std::string name = std::string("signal ") + sigabbrev_np(signo);
  if (signo == SIGCHLD) {
    ReapChildren();
  } else if (signo == SIGHUP) {
    if (auto s = Serving(); s != children_.end()) ::kill(s->pid, SIGHUP);
  } else if (signo == SIGTERM && !stopping_ && started_ && config_.keep_mount_on_term &&
             config_.keep_mount_on_term()) {
    HandBack(name + " for a restart");
  } else {
    Stop(name);
  }
}

int Supervisor::PollTimeoutMs() const {
  std::optional<Clock::time_point> next;
  if (restart_pending_ || stopping_) next = restart_at_;
  for (const auto& c : children_) {
    if (c.role == Role::kSuccessor && !c.ready && c.abandoned.empty() && (!next || c.ready_by < *next)) {
      next = c.ready_by;
    }
  }
  if (!next) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60'000));
}

void Supervisor::PollOnce() {
  std::vector<pollfd> fds{{signals_.get(), POLLIN, 0}};
  std::vector<ChildIt> linked;
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    if (!it->link.valid()) continue;
    fds.push_back({it->link.get(), POLLIN, 0});
    linked.push_back(it);
  }
  const bool answer_eio = crash_loop_ && children_.empty() && !stopping_;
  if (answer_eio) fds.push_back({config_.fuse_fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), PollTimeoutMs()) < 0 && errno != EINTR) {
    spdlog::error("supervisor: poll: {}", std::strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (size_t i = 0; i < linked.size(); ++i) {
    if (fds[i + 1].revents == 0) continue;
    auto msg = handover::Receive(linked[i]->link.get());
    if (msg.ok()) OnMessage(linked[i], *msg);
    else linked[i]->link.reset();  // it closed its end (it is exiting); SIGCHLD follows
  }
  if (answer_eio && fds.back().revents != 0) AnswerQueuedWithEio(config_.fuse_fd);
  signalfd_siginfo si;
  while (::read(signals_.get(), &si, sizeof si) == sizeof si) OnSignal(static_cast<int>(si.ssi_signo));
  ReapChildren();  // a SIGCHLD merged with one read above is not lost
  if (!stopping_) AbandonLateSuccessors();
  const auto now = Clock::now();
  if (stopping_ && now >= restart_at_) {
    for (auto& c : children_) ::kill(c.pid, SIGKILL);
  } else if (restart_pending_ && !stopping_ && now >= restart_at_) {
    restart_pending_ = false;
    ++restarts_;
    if (!Spawn(config_.binary, "restart after: " + last_exit_, Role::kReplacement)) {
      restart_pending_ = true;
      restart_at_ = now + config_.limits.max_backoff;
    }
  }
}

int Supervisor::Run() {
  if (!signals_.valid()) {
    spdlog::critical("supervisor: signalfd: {}", std::strerror(errno));
    ReportStart(1);
    if (config_.unmount) config_.unmount();
    return 1;
  }
  mounted_at_ = static_cast<int64_t>(std::time(nullptr));
  if (!Spawn(config_.binary, "first start", Role::kFirst)) {
    ReportStart(1);
    if (config_.unmount) config_.unmount();
    return 1;
  }
  while (!(stopping_ && children_.empty())) PollOnce();
  if (handing_back_ && config_.on_hand_back) config_.on_hand_back(inherited_);
  return exit_status_;
}

}  // namespace ckptfs::supervisor
