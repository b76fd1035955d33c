#include "open_inode_reporter.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ckptfs/handover_protocol.h"

namespace ckptfs::daemon {

namespace {
// How often a thread waiting for room on the link looks whether it is to stop.
constexpr int kRoomPollMs = 200;
}  // namespace

OpenInodeReporter::OpenInodeReporter(int link, ReadRecord read) : link_(link), read_(std::move(read)) {
  thread_ = std::thread([this] { Run(); });
}

OpenInodeReporter::~OpenInodeReporter() { Stop(); }

void OpenInodeReporter::Stop(std::chrono::milliseconds flush_for) {
  for (auto end = std::chrono::steady_clock::now() + flush_for;
       waiting() > 0 && !stopping() && !ended_ && std::chrono::steady_clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  noted_cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void OpenInodeReporter::Changed(uint64_t ino) {
  bool first;
  {
    MutexLock lock(mu_);
    first = noted_.empty();
    noted_.insert(ino);
  }
  // The thread sleeps only when nothing was noted: one wake a batch.
  if (first) noted_cv_.NotifyOne();
}

size_t OpenInodeReporter::waiting() const {
  MutexLock lock(mu_);
  size_t noted_again = 0;  // an inode in hand may be noted again meanwhile: count it once
  for (uint64_t ino : noted_) noted_again += in_hand_.count(ino);
  return in_hand_.size() + noted_.size() - noted_again;
}

bool OpenInodeReporter::stopping() const {
  MutexLock lock(mu_);
  return stop_;
}

void OpenInodeReporter::Run() {
  struct Ended {
    std::atomic<bool>& ended;
    ~Ended() { ended = true; }
  } ended{ended_};
  bool stalled = false;  // logged that the supervisor is not reading
  for (;;) {
    std::vector<uint64_t> batch;
    {
      MutexLock lock(mu_);
      while (!stop_ && noted_.empty()) noted_cv_.Wait(mu_);
      if (stop_) return;
      batch.assign(noted_.begin(), noted_.end());
      in_hand_.swap(noted_);
      noted_.clear();
    }
    for (const uint64_t ino : batch) {
      // Read now, not when noted: the last record sent is the one in force.
      const fuse::InheritedInode record = read_(ino);
      if (Status s = SendWhenRoom(record, stalled); !s.ok()) {
        if (!stopping()) {
          spdlog::warn("{}: a daemon that replaces this one after a crash may not know every open file", s.message());
        }
        return;
      }
      MutexLock lock(mu_);
      in_hand_.erase(ino);
    }
    if (stalled) {
      stalled = false;
      spdlog::info("the supervisor reads its link again: the reports of open files that waited are sent");
    }
  }
}

Status OpenInodeReporter::SendWhenRoom(const fuse::InheritedInode& record, bool& stalled) {
  const nlohmann::json m{{"type", "open-inode"}, {"inode", {record.ino, record.opens, record.backing_id}}};
  for (;;) {
    Status s = handover::Send(link_, m, /*wait=*/false);
    if (s.ok()) return s;
    const int err = s.error_number();
    const bool no_room = err == EAGAIN || err == EWOULDBLOCK;
    const bool short_of_memory = err == ENOBUFS || err == ENOMEM;
    // Anything else (the supervisor gone: EPIPE; a message it cannot take)
    // will not pass by waiting.
    if (!no_room && !short_of_memory && err != EINTR) return s;
    if (short_of_memory) {
      // poll() would say there is room at once: wait, or this thread spins.
      std::this_thread::sleep_for(std::chrono::milliseconds(kRoomPollMs));
      if (stopping()) return Status::Error("stopped");
      continue;
    }
    if (!stalled) {
      stalled = true;
      spdlog::warn("the supervisor is not reading its link: reports of open files wait (opens go on); a "
                   "daemon that replaces this one after a crash learns them once it reads again");
    }
    pollfd p{link_, POLLOUT, 0};
    if (::poll(&p, 1, kRoomPollMs) < 0 && errno != EINTR) return Status::FromErrno("poll the supervisor link", errno);
    if (stopping()) return Status::Error("stopped");
  }
}

}  // namespace ckptfs::daemon
