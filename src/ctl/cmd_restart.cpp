// ckptfsctl restart: hands a supervised mount to a new daemon (the same
// binary, or --binary PATH) without unmounting: the supervisor starts it,
// it takes the FUSE connection over, and the old one drains and exits.
#include <chrono>
#include <cstdio>
#include <thread>

#include "ckptfs/control_protocol.h"
#include "ctl.h"

namespace ckptfs::ctl {

namespace {

constexpr auto kTakeoverTimeout = std::chrono::seconds(120);

// The mount's status, or null when no daemon answers (mid hand-over).
nlohmann::json StatusOf(const std::string& mountpoint) {
  auto r = CallMount(mountpoint, protocol::Request(protocol::kStatus));
  return r.ok() ? *r : nlohmann::json();
}

uint64_t HandoverFailures(const nlohmann::json& status) {
  return status.value(protocol::kDaemon, nlohmann::json::object()).value(protocol::kHandoverFailures, uint64_t{0});
}

}  // namespace

int RunRestart(const RestartArgs& args) {
  auto where = LocateInMount(args.path);
  if (!where.ok()) {
    PrintError(where.status().message());
    return kExitFatal;
  }
  const std::string mountpoint = where->first;
  const nlohmann::json before = StatusOf(mountpoint);
  if (!before.is_object() || !before.contains(protocol::kPid)) {
    PrintError(mountpoint + ": no daemon answers on its control socket");
    return kExitFailure;
  }
  const int old_pid = before[protocol::kPid];
  const uint64_t old_failures = HandoverFailures(before);
  auto r = CallMount(mountpoint, {{protocol::kCmd, protocol::kRestart}, {protocol::kBinary, args.binary}});
  if (!r.ok()) {
    PrintError(mountpoint + ": " + r.status().message());
    return kExitFailure;
  }
  // The new daemon answers on the same socket once it serves.
  const auto deadline = std::chrono::steady_clock::now() + kTakeoverTimeout;
  nlohmann::json after;
  while (std::chrono::steady_clock::now() < deadline) {
    after = StatusOf(mountpoint);
    if (after.is_object() && after.contains(protocol::kPid) && after[protocol::kPid] != old_pid) break;
    if (after.is_object() && HandoverFailures(after) > old_failures) {
      PrintError(mountpoint + ": the restart failed, daemon pid " + std::to_string(old_pid) +
                 " goes on serving: " + after[protocol::kDaemon].value(protocol::kLastHandoverError, std::string("?")));
      return kExitFailure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!after.is_object() || !after.contains(protocol::kPid) || after[protocol::kPid] == old_pid) {
    PrintError(mountpoint + ": no new daemon took over within 120 s (pid " + std::to_string(old_pid) +
               " still serves if it answers; the supervisor's log says why)");
    return kExitFailure;
  }
  const nlohmann::json& d = after[protocol::kDaemon];
  if (args.json) {
    std::printf("%s\n", nlohmann::json{{"ok", true}, {"old_pid", old_pid}, {"pid", after[protocol::kPid]}, {"daemon", d}}
                            .dump()
                            .c_str());
  } else {
    std::printf("%s: daemon pid %d handed over to pid %d (%s)\n", mountpoint.c_str(), old_pid,
                after[protocol::kPid].get<int>(), d.value(protocol::kVersion, std::string("?")).c_str());
  }
  return kExitOk;
}

}  // namespace ckptfs::ctl
