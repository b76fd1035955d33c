// OpenInodeReporter never makes the opening thread wait for the supervisor:
// with a link nobody reads, Changed() returns at once however many inodes
// change; what waits is counted, and once the other end reads again it gets
// every inode's latest record, each once.
#include "open_inode_reporter.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "ckptfs/handover_protocol.h"
#include "ckptfs/mutex.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs::daemon {
namespace {

using namespace std::chrono_literals;

template <class Pred>
bool WaitUntil(Pred pred) {
  for (auto end = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < end;) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

TEST(OpenInodeReporterTest, ASupervisorThatStopsReadingStallsNoOpenAndMissesNoRecord) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd daemon_end(sv[0]), supervisor_end(sv[1]);
  Mutex mu;
  std::map<uint64_t, uint64_t> opens;  // the daemon's records: inode -> open files
  OpenInodeReporter reporter(daemon_end.get(), [&](uint64_t ino) {
    MutexLock lock(mu);
    auto it = opens.find(ino);
    return fuse::InheritedInode{ino, it == opens.end() ? 0 : it->second, 0};
  });
  // More changes than the link queues (a couple of hundred messages), with
  // nobody reading: each Changed() must return without waiting.
  constexpr uint64_t kInodes = 2000;
  for (int pass = 1; pass <= 3; ++pass) {
    for (uint64_t ino = 1; ino <= kInodes; ++ino) {
      {
        MutexLock lock(mu);
        opens[ino] = static_cast<uint64_t>(pass);
      }
      reporter.Changed(ino);
    }
  }
  EXPECT_TRUE(WaitUntil([&] { return reporter.waiting() > 0; }));
  EXPECT_GT(reporter.waiting(), 0u) << "nothing waits although nobody reads the link";
  EXPECT_LE(reporter.waiting(), kInodes);  // one record an inode, however often it changed
  // The supervisor reads again: the last record it holds for each inode is
  // the one in force.
  std::map<uint64_t, uint64_t> told;
  auto all_told = [&] {
    if (told.size() < kInodes || reporter.waiting() > 0) return false;
    for (const auto& [ino, open_files] : told) {
      if (open_files != 3) return false;  // a correction may still be on its way
    }
    return true;
  };
  ASSERT_TRUE(WaitUntil([&] {
    pollfd p{supervisor_end.get(), POLLIN, 0};
    while (::poll(&p, 1, 10) > 0) {
      auto m = handover::Receive(supervisor_end.get());
      if (!m.ok()) return false;
      const auto& i = (*m)["inode"];
      told[i[0].get<uint64_t>()] = i[1].get<uint64_t>();
    }
    return all_told();
  })) << told.size() << " of " << kInodes << " inodes told, " << reporter.waiting() << " waiting";
  for (uint64_t ino = 1; ino <= kInodes; ++ino) EXPECT_EQ(told[ino], 3u) << "inode " << ino;
  EXPECT_EQ(reporter.waiting(), 0u);
}

TEST(OpenInodeReporterTest, StopEndsAThreadThatWaitsForRoom) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd daemon_end(sv[0]), supervisor_end(sv[1]);
  OpenInodeReporter reporter(daemon_end.get(), [](uint64_t ino) { return fuse::InheritedInode{ino, 1, 0}; });
  constexpr uint64_t kInodes = 5000;  // more than the link queues
  for (uint64_t ino = 1; ino <= kInodes; ++ino) reporter.Changed(ino);
  ASSERT_TRUE(WaitUntil([&] { return reporter.waiting() > 0 && reporter.waiting() < kInodes; }));
  reporter.Stop();  // returns although the link stays full
  EXPECT_GT(reporter.waiting(), 0u);
}

}  // namespace
}  // namespace ckptfs::daemon
