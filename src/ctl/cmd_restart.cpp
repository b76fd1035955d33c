// ckptfsctl restart: hands a supervised mount to a new daemon (the same
// binary, or --binary PATH) without unmounting: the supervisor starts it,
// it takes the FUSE connection over, and the old one drains and exits.
//
// Nothing here waits without bound (issue 21 item 8): the control socket is
// found once, before the restart, and from then on only the socket is
// asked, each time with a short timeout; a mount with no daemon serving
// would hang any call into the filesystem. The whole wait ends at the
// hand-over's deadline (the mount's handover_timeout) and a margin.
#include <chrono>
#include <cstdio>
#include <thread>

#include "ckptfs/control_protocol.h"
#include "ckptfs/handover_protocol.h"
#include "ctl.h"

namespace ckptfs::ctl {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kStatusSilence = std::chrono::seconds(5);  // one status call; a daemon answers in milliseconds
constexpr auto kDeadlineMargin = std::chrono::seconds(30);
constexpr uint64_t kDefaultHandoverTimeoutS = 120;  // a daemon that does not report its own

// The mount's status; an error when no daemon answers (mid hand-over).
Result<nlohmann::json> StatusOf(const MountControl& control) {
  auto r = CallControl(control, protocol::Request(protocol::kStatus), nullptr, kStatusSilence);
  if (!r.ok()) return r.status();
  if (!r->contains(protocol::kPid) || !(*r)[protocol::kPid].is_number_integer()) {
    return Status::Error("malformed status reply (no pid)");
  }
  return r;
}

nlohmann::json DaemonOf(const nlohmann::json& status) {
  const auto it = status.find(protocol::kDaemon);
  return it != status.end() && it->is_object() ? *it : nlohmann::json::object();
}

uint64_t HandoverFailures(const nlohmann::json& status) {
  return DaemonOf(status).value(protocol::kHandoverFailures, uint64_t{0});
}

// How the restart ended, once a daemon other than `old_pid` answers: the
// successor it asked for, or a replacement the supervisor started because
// the old daemon died first.
int ReportNewDaemon(const RestartArgs& args, const std::string& mountpoint, int old_pid, const nlohmann::json& after) {
  const nlohmann::json d = DaemonOf(after);
  const int pid = after[protocol::kPid];
  const std::string started_as = d.value(protocol::kStartedAs, std::string(handover::kStartedSuccessor));
  if (started_as != handover::kStartedSuccessor || d.value(protocol::kPredecessorPid, old_pid) != old_pid) {
    PrintError(mountpoint + ": the restart did not happen: daemon pid " + std::to_string(old_pid) +
               " ended before the hand-over (" + d.value(protocol::kLastExit, std::string("?")) + "); pid " +
               std::to_string(pid) + " (" + started_as + ", " + d.value(protocol::kVersion, std::string("?")) +
               ") serves now");
    return kExitFailure;
  }
  if (args.json) {
    std::printf("%s\n", nlohmann::json{{"ok", true}, {"old_pid", old_pid}, {"pid", pid}, {"daemon", d}}.dump().c_str());
  } else {
    std::printf("%s: daemon pid %d handed over to pid %d (%s)\n", mountpoint.c_str(), old_pid, pid,
                d.value(protocol::kVersion, std::string("?")).c_str());
  }
  return kExitOk;
}

}  // namespace

int RunRestart(const RestartArgs& args) {
  auto where = LocateInMount(args.path);
  if (!where.ok()) {
    PrintError(where.status().message());
    return kExitFatal;
  }
  const std::string mountpoint = where->first;
  auto control = OpenMountControl(mountpoint);
  if (!control.ok()) {
    PrintError(mountpoint + ": " + control.status().message());
    return kExitFatal;
  }
  const auto status = StatusOf(*control);
  if (!status.ok()) {
    PrintError(mountpoint + ": no daemon answers on its control socket: " + status.status().message());
    return kExitFailure;
  }
  const nlohmann::json& before = *status;
  const int old_pid = before[protocol::kPid];
  const uint64_t old_failures = HandoverFailures(before);
  const auto options = before.value(protocol::kOptions, nlohmann::json::object());
  const uint64_t handover_s = options.is_object() ? options.value(protocol::kOptionHandoverTimeout,
                                                                  kDefaultHandoverTimeoutS)
                                                  : kDefaultHandoverTimeoutS;
  auto r = CallControl(*control, {{protocol::kCmd, protocol::kRestart}, {protocol::kBinary, args.binary}}, nullptr,
                       kStatusSilence);
  if (!r.ok()) {
    PrintError(mountpoint + ": " + r.status().message());
    return kExitFailure;
  }
  // The new daemon answers on the same socket once it serves.
  const auto wait = std::chrono::seconds(handover_s) + kDeadlineMargin;
  const auto deadline = Clock::now() + wait;
  while (Clock::now() < deadline) {
    const auto now = StatusOf(*control);
    const nlohmann::json after = now.ok() ? *now : nlohmann::json();
    if (!after.is_null() && after[protocol::kPid] != old_pid) return ReportNewDaemon(args, mountpoint, old_pid, after);
    if (!after.is_null() && HandoverFailures(after) > old_failures) {
      PrintError(mountpoint + ": the restart failed, daemon pid " + std::to_string(old_pid) + " goes on serving: " +
                 DaemonOf(after).value(protocol::kLastHandoverError, std::string("?")));
      return kExitFailure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  PrintError(mountpoint + ": no new daemon took over within " +
             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(wait).count()) + " s (pid " +
             std::to_string(old_pid) + " still serves if it answers; the supervisor's log says why)");
  return kExitFailure;
}

}  // namespace ckptfs::ctl
