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
                             int link_fd, const std::vector<std::pair<std::string, std::string>>& env) {
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
}

bool Supervisor::Spawn(const std::string& binary, const std::string& why) {
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
      {handover::kEnvSupervisorPid, std::to_string(::getpid())}};
  if ((started_ || !config_.adopted_init.empty()) && !init_request_.empty()) env.emplace_back(handover::kEnvInit, handover::ToHex(init_request_));
  const pid_t pid = ::fork();
  if (pid < 0) {
    spdlog::error("supervisor: cannot start the serving daemon ({}): fork: {}", why, std::strerror(errno));
    return false;
  }
  if (pid == 0) ExecDaemon(binary, config_.args, config_.fuse_fd, theirs.get(), env);
  children_.push_back(Child{pid, std::move(ours), binary, Clock::now(), false, false, {}});
  spdlog::info("supervisor: started serving daemon pid {} ({}; {})", pid, binary, why);
  return true;
}

void Supervisor::Send(Child& child, const nlohmann::json& message) {
  if (!child.link.valid()) return;
  if (Status s = handover::Send(child.link.get(), message); !s.ok()) {
    spdlog::warn("supervisor: daemon pid {}: {}", child.pid, s.message());
  }
}

Supervisor::ChildIt Supervisor::Serving() {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (!it->draining) return std::prev(it.base());
  }
  return children_.end();
}

void Supervisor::ReportStart(uint8_t status) {
  if (!config_.ready_pipe.valid()) return;
  if (::write(config_.ready_pipe.get(), &status, 1) != 1) {
    // The parent is gone (killed while waiting): nobody to tell.
  }
  config_.ready_pipe.reset();
}

void Supervisor::OnMessage(ChildIt child, const nlohmann::json& message) {
  const std::string type = message["type"];
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
    std::string binary = message.value("binary", std::string());
    if (binary.empty()) binary = config_.binary;
    if (stopping_ || !child->ready || child->draining || std::prev(children_.end()) != child) {
      spdlog::warn("supervisor: restart asked by pid {} ignored: a start or hand-over is under way", child->pid);
      return;
    }
    ++restarts_;
    last_exit_ = "pid " + std::to_string(child->pid) + " handed over (ckptfsctl restart)";
    if (!Spawn(binary, "hand-over asked by pid " + std::to_string(child->pid) + " (ckptfsctl restart)")) {
      Send(*child, {{"type", "handover-failed"}, {"error", "the supervisor could not start " + binary}});
    }
  } else {
    spdlog::warn("supervisor: daemon pid {} sent an unknown message: {}", child->pid, type);
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
    if (other.pid == child->pid || other.draining) continue;
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
  const Child dead{child->pid, UniqueFd(), child->binary, child->started, child->ready, child->draining,
                   std::move(child->open_inodes)};
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
  const ChildIt serving = Serving();
  if (dead.draining) {
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
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0 && MountGone()) {
    spdlog::info("supervisor: {} was unmounted; exiting", config_.mountpoint);
    Stop("unmounted");
    return;
  }
  last_exit_ = cause;
  if (serving != children_.end()) {  // a hand-over whose new daemon died: the old one goes on
    spdlog::error("supervisor: new daemon pid {} ({}) {} before taking over; pid {} keeps serving", dead.pid,
                  dead.binary, cause, serving->pid);
    Send(*serving, {{"type", "handover-failed"}, {"error", "new daemon " + dead.binary + " " + cause}});
    return;
  }
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
  if (!restart_pending_ && !stopping_) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(restart_at_ - Clock::now()).count();
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
  const auto now = Clock::now();
  if (stopping_ && now >= restart_at_) {
    for (auto& c : children_) ::kill(c.pid, SIGKILL);
  } else if (restart_pending_ && !stopping_ && now >= restart_at_) {
    restart_pending_ = false;
    ++restarts_;
    if (!Spawn(config_.binary, "restart after: " + last_exit_)) {
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
  if (!Spawn(config_.binary, "first start")) {
    ReportStart(1);
    if (config_.unmount) config_.unmount();
    return 1;
  }
  while (!(stopping_ && children_.empty())) PollOnce();
  if (handing_back_ && config_.on_hand_back) config_.on_hand_back(inherited_);
  return exit_status_;
}

}  // namespace ckptfs::supervisor
