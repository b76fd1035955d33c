#include "daemon_log.h"

#include <fcntl.h>
#include <syslog.h>
#include <unistd.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/spdlog.h>

#include "ckptfs/printable.h"

namespace ckptfs::daemon {

namespace {

// Passes each line on with its control characters escaped (Printable): the
// log names paths that a SRC writer chose, and a newline in one would
// forge a whole line ("... info: checkpoint trusted verified"), an escape
// sequence would drive the terminal of whoever reads the log.
class PrintableSink final : public spdlog::sinks::sink {
 public:
  explicit PrintableSink(spdlog::sink_ptr inner) : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    const std::string safe = Printable(std::string_view(msg.payload.data(), msg.payload.size()));
    spdlog::details::log_msg escaped = msg;
    escaped.payload = spdlog::string_view_t(safe.data(), safe.size());
    inner_->log(escaped);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  const spdlog::sink_ptr inner_;
};

spdlog::sink_ptr StderrSink() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  sink->set_pattern("ckptfs: %Y-%m-%d %H:%M:%S.%e %l: %v");
  return std::make_shared<PrintableSink>(std::move(sink));
}

spdlog::sink_ptr SyslogSink() {
  // The ident must outlive the sink; a literal does.
  return std::make_shared<PrintableSink>(
      std::make_shared<spdlog::sinks::syslog_sink_mt>("ckptfs", LOG_PID, LOG_DAEMON, false));
}

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

Result<std::unique_ptr<DaemonLog>> DaemonLog::Start(const MountOptions& o) {
  const LogTo to = o.log_to != LogTo::kDefault ? o.log_to : (o.foreground ? LogTo::kStderr : LogTo::kSyslog);
  const std::string& path = o.log_file;
  spdlog::sink_ptr chosen;
  if (to == LogTo::kSyslog) {
    chosen = SyslogSink();
  } else if (to == LogTo::kFile) {
    // Opened here first for a plain errno (spdlog's message repeats the
    // path) and so that a missing directory is an error, not made; created
    // 0640, as the log names source paths.
    UniqueFd probe(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640));
    if (!probe.valid()) {
      return Status::FromErrno("option log_file=" + path + ": cannot open it for appending", errno);
    }
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
      // Several mounts may share one file: each line names its daemon.
      file->set_pattern("%Y-%m-%d %H:%M:%S.%e ckptfs[%P] %l: %v");
      chosen = std::make_shared<PrintableSink>(std::move(file));
    } catch (const spdlog::spdlog_ex& e) {
      return Status::Error("option log_file=" + path + ": " + e.what());
    }
  }
  std::unique_ptr<DaemonLog> log(new DaemonLog(o, to, chosen));
  std::vector<spdlog::sink_ptr> sinks{StderrSink()};
  // Until the mount is up, an explicit choice gets every line too; the
  // default syslog does not (systemd already keeps a mount's stderr).
  if (chosen && o.log_to != LogTo::kDefault) sinks.push_back(chosen);
  log->Install(std::move(sinks));
  return log;
}

DaemonLog::DaemonLog(const MountOptions& o, LogTo to, spdlog::sink_ptr chosen)
    : level_(o.log_level),
      foreground_(o.foreground),
      to_(to),
      destination_(to == LogTo::kFile ? o.log_file : WordOf(kLogToWords, to)),
      chosen_(std::move(chosen)) {}

void DaemonLog::Install(std::vector<spdlog::sink_ptr> sinks) {
  auto logger = std::make_shared<spdlog::logger>("ckptfs", sinks.begin(), sinks.end());
  logger->set_level(SpdlogLevel(level_));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

void DaemonLog::BeforeDaemonize() {
  if (to_ == LogTo::kStderr && !foreground_) saved_stderr_.reset(::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3));
}

void DaemonLog::AfterMount() {
  if (to_ != LogTo::kStderr) {
    Install({chosen_});
    return;
  }
  if (saved_stderr_.valid()) {
    // Standard error back where the daemon was started; fuse_daemonize had
    // pointed it at /dev/null.
    ::dup2(saved_stderr_.get(), STDERR_FILENO);
    saved_stderr_.reset();
  }
  Install({StderrSink()});
}

}  // namespace ckptfs::daemon
