#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>

namespace ckptfs {

namespace {
// Work shorter than this finishes before a bar would help.
constexpr auto kFirstDrawAfter = std::chrono::milliseconds(500);
constexpr auto kRedrawEvery = std::chrono::milliseconds(200);

int TerminalWidth() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) return ws.ws_col;
  return 80;
}
}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string FormatProgressLine(const std::string& label, uint64_t done, uint64_t total, double elapsed_s,
                               int width) {
  const double fraction = total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  const double rate = elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0;
  std::string eta = "--:--";
  if (rate > 0 && total >= done) {
    long secs = static_cast<long>(static_cast<double>(total - done) / rate + 0.5);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%ld:%02ld", secs / 60, secs % 60);
    eta = buf;
  }
  char pct[8];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(fraction * 100));
  const std::string head = label + "  " + FormatBytes(done) + " / " + FormatBytes(total) + " ";
  const std::string tail = " " + std::string(pct) + "  " + FormatBytes(static_cast<uint64_t>(rate)) + "/s  ETA " + eta;
  int bar_width = width - static_cast<int>(head.size() + tail.size()) - 3;
  std::string bar;
  if (bar_width >= 10) {
    bar_width = std::min(bar_width, 40);
    const int filled = static_cast<int>(fraction * bar_width);
    bar = "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(bar_width - filled), '.') + "]";
  }
  return head + bar + tail;
}

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), start_(std::chrono::steady_clock::now()), enabled_(enabled) {
  if (enabled_) thread_ = std::thread([this] { Run(); });
}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
  MutexLock lock(mu_);
  if (drawn_) {
    std::fputs("\r\033[K", stderr);  // leave the terminal as we found it
    std::fflush(stderr);
  }
}

void ProgressBar::Run() {
  MutexLock lock(mu_);
  auto next_draw = std::chrono::steady_clock::now() + kFirstDrawAfter;
  for (;;) {
    while (!stop_ && cv_.WaitUntil(mu_, next_draw)) {
    }
    if (stop_) return;
    Draw();
    next_draw = std::chrono::steady_clock::now() + kRedrawEvery;
  }
}

void ProgressBar::Draw() {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = FormatProgressLine(label_, done_.load(), total_.load(), elapsed, TerminalWidth() - 1);
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace ckptfs
