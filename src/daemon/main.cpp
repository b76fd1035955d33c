// ckptfs: the daemon. Mounts SRC at MOUNTPOINT as a read-only,
// content-addressed view (DESIGN.md section 2) and keeps it in step with SRC.
// The parts and their order are the Daemon's (daemon.h); main parses the
// command line, starts the log, and turns SIGHUP into a rescan.
#include <signal.h>

#include <cstdio>

#include <spdlog/spdlog.h>

#include "ckptfs/build_info.h"
#include "ckptfs/control.h"
#include "mount_options.h"
#include "daemon.h"
#include "daemon_log.h"

namespace {

ckptfs::daemon::Daemon* g_daemon_for_sighup = nullptr;  // set while serving, read by the signal handler

void OnSighup(int) {
  if (g_daemon_for_sighup) g_daemon_for_sighup->RequestRescan();  // an eventfd write: signal-safe
}

// After libfuse's handlers: HUP means rescan, not exit.
void RescanOnSighup(ckptfs::daemon::Daemon* daemon) {
  g_daemon_for_sighup = daemon;
  struct sigaction sa {};
  sa.sa_handler = OnSighup;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGHUP, &sa, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckptfs;
  auto parsed = ParseMountOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "ckptfs: %s\n", parsed.status().message().c_str());
    return 2;
  }
  if (parsed->show_help || parsed->show_version) {
    std::fputs(parsed->show_help ? MountUsage().c_str() : (BuildDescription() + "\n").c_str(), stdout);
    return 0;
  }
  // The host tier takes file leases for an instant to learn whether the
  // kernel still holds an evicted copy (SealedCopy::OpenElsewhere); a
  // passthrough open in that instant breaks the lease, which signals the
  // holder with SIGIO, whose default is to end the process.
  ::signal(SIGIO, SIG_IGN);
  auto log = daemon::DaemonLog::Start(*parsed);
  if (!log.ok()) {
    std::fprintf(stderr, "ckptfs: %s\n", log.status().message().c_str());
    return 1;
  }
  // Descriptors for every reader and control client: the soft limit of 1024
  // is a relic of select(), and running out would turn reads into EIO.
  if (auto limit = RaiseOpenFileLimit(); !limit.ok()) spdlog::warn("{}", limit.status().message());

  // Set when a supervisor started this process to serve its mount.
  auto handover = daemon::FdHandover::FromEnvironment();
  auto daemon = daemon::Daemon::Create(std::move(*parsed), log->get(), argv[0], std::move(handover));
  if (daemon.ok() && (*daemon)->supervising()) return (*daemon)->RunSupervisor(argc, argv);
  Status started = daemon.ok() ? (*daemon)->Mount() : daemon.status();
  if (!started.ok()) {
    spdlog::critical("{}", started.message());
    return 1;
  }
  RescanOnSighup(daemon->get());
  const bool served = (*daemon)->Serve();
  g_daemon_for_sighup = nullptr;
  (*daemon)->Shutdown();
  return served ? 0 : 1;
}
