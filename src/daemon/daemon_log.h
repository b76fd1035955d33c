// Where the daemon's log goes: mount options log=LEVEL and
// log_file=PATH|stderr|syslog.
//
// Until the mount is up, every line also goes to standard error, so that
// whoever ran `mount` sees why a start failed. From then on only the chosen
// destination gets it: by default syslog (journald) once daemonized and
// standard error with -f; log_file= chooses explicitly. Without journald or
// syslog (a container) the default loses everything after the start, hence
// log_file=PATH. A file is opened before mounting, so one that cannot be
// written stops the start with its cause.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/sink.h>

#include "mount_options.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs::daemon {

class DaemonLog {
 public:
  // Logs to standard error and, for log_file=PATH or syslog, there too.
  static Result<std::unique_ptr<DaemonLog>> Start(const MountOptions& o);

  // Call right before fuse_daemonize: log_file=stderr keeps a copy of
  // standard error, which fuse_daemonize points at /dev/null.
  void BeforeDaemonize();
  // Call once the mount is up (after fuse_daemonize): the chosen
  // destination alone from here on.
  void AfterMount();

  // "syslog", "stderr" or the file's path, for `ckptfsctl status`.
  const std::string& destination() const { return destination_; }

 private:
  DaemonLog(const MountOptions& o, LogTo to, spdlog::sink_ptr chosen);
  void Install(std::vector<spdlog::sink_ptr> sinks);

  const LogLevel level_;
  const bool foreground_;
  const LogTo to_;  // kStderr, kSyslog or kFile
  const std::string destination_;
  spdlog::sink_ptr chosen_;  // the file or syslog; null for stderr
  UniqueFd saved_stderr_;
};

}  // namespace ckptfs::daemon
