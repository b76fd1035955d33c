// OpenModes decides an inode's mode under that inode's lock only: an open
// whose decision waits (for the kernel's backing-file ioctl) holds up no
// open or release of another inode, the opens of one inode all get the
// decision of the first, and the observer is told of every change with no
// lock held, so it may read the record back.
#include "ckptfs/open_modes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace ckptfs::fuse {
namespace {

using namespace std::chrono_literals;

OpenModes::Choice Passthrough() {
  OpenModes::Choice c;
  c.passthrough = true;
  return c;
}
OpenModes::Choice ChunkPath(const char* why) {
  OpenModes::Choice c;
  c.why = why;
  return c;
}
FileCache::CopyPtr NoCopy() { return nullptr; }

TEST(OpenModesTest, ADecisionThatWaitsHoldsUpNoOtherInode) {
  OpenModes modes;
  std::promise<void> decide_may_end;
  std::shared_future<void> may_end = decide_may_end.get_future().share();
  std::promise<void> deciding;
  // Inode 1's first open decides slowly, as one waiting for the kernel.
  auto slow = std::async(std::launch::async, [&] {
    return modes.Open(1, [&] {
      deciding.set_value();
      may_end.wait();
      return Passthrough();
    }, NoCopy);
  });
  deciding.get_future().wait();
  // Meanwhile another inode opens, is read back, and is released; with a
  // lock for every inode this would wait for inode 1's decision.
  auto other = std::async(std::launch::async, [&] {
    const OpenModes::Choice c = modes.Open(2, [] { return ChunkPath("not resident"); }, NoCopy);
    const bool open = modes.IsOpen(2) && modes.inodes() == 2;
    const bool chunk_path_ended = modes.Release(2);
    return !c.passthrough && open && chunk_path_ended && !modes.IsOpen(2);
  });
  const bool other_went_on = other.wait_for(30s) == std::future_status::ready;
  decide_may_end.set_value();
  EXPECT_TRUE(other_went_on) << "an open of inode 2 waited for inode 1's decision";
  EXPECT_TRUE(other.get());
  EXPECT_TRUE(slow.get().passthrough);
  EXPECT_FALSE(modes.Release(1));  // a passthrough inode's last release
  EXPECT_EQ(modes.inodes(), 0u);
}

TEST(OpenModesTest, ConcurrentOpensOfAnInodeAllJoinOneDecision) {
  OpenModes modes;
  std::atomic<int> decisions{0};
  constexpr int kThreads = 8, kRounds = 200;
  std::atomic<int> disagreements{0};
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> threads;
    std::atomic<int> passthrough{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const OpenModes::Choice c = modes.Open(7, [&] {
          ++decisions;
          return t % 2 == 0 ? Passthrough() : ChunkPath("odd");
        }, NoCopy);
        if (c.passthrough) ++passthrough;
      });
    }
    for (auto& th : threads) th.join();
    if (passthrough != 0 && passthrough != kThreads) ++disagreements;
    auto held = modes.Find(7);
    ASSERT_TRUE(held.has_value());
    EXPECT_EQ(held->opens, static_cast<uint64_t>(kThreads));
    for (int t = 0; t < kThreads; ++t) modes.Release(7);
    ASSERT_FALSE(modes.Find(7).has_value());
  }
  EXPECT_EQ(disagreements, 0);
  EXPECT_EQ(decisions, kRounds);  // once for each time the inode was opened afresh
}

TEST(OpenModesTest, TheObserverIsToldOfEveryChangeAndCanReadTheRecordBack) {
  OpenModes modes;
  std::vector<std::pair<uint64_t, uint64_t>> seen;  // inode, opens as read back
  modes.SetObserver([&](uint64_t ino) {
    // Reading back from the observer would deadlock if it ran under a lock.
    auto held = modes.Find(ino);
    seen.emplace_back(ino, held ? held->opens : 0);
  });
  modes.Open(3, Passthrough, NoCopy);
  modes.Open(3, Passthrough, NoCopy);
  modes.Inherit(4, 2, ChunkPath("before a restart"));
  modes.Release(3);
  modes.Release(3);
  modes.ReleaseInherited(4);
  const std::vector<std::pair<uint64_t, uint64_t>> want{{3, 1}, {3, 2}, {4, 2}, {3, 1}, {3, 0}, {4, 1}};
  EXPECT_EQ(seen, want);
  modes.SetObserver(nullptr);  // detached: changes go on, told to nobody
  modes.ReleaseInherited(4);
  EXPECT_EQ(seen.size(), want.size());
  EXPECT_EQ(modes.inodes(), 0u);
}

// What tells a header read from a map (HeaderScans): an open alone on its
// inode from its first open to its release, against two that overlapped,
// released in either order.
TEST(OpenModesTest, OpensSinceIdleCountsEveryOpenUntilTheLastRelease) {
  OpenModes modes;
  EXPECT_EQ(modes.OpensSinceIdle(5), 0u);
  modes.Open(5, Passthrough, NoCopy);
  EXPECT_EQ(modes.OpensSinceIdle(5), 1u);  // alone
  modes.Release(5);
  EXPECT_EQ(modes.OpensSinceIdle(5), 0u);
  modes.Open(5, Passthrough, NoCopy);
  modes.Open(5, Passthrough, NoCopy);
  uint64_t seen = 0;
  modes.Release(5, &seen);
  EXPECT_EQ(seen, 2u);
  EXPECT_EQ(modes.OpensSinceIdle(5), 2u) << "the first open's release must see it was not alone";
  modes.Release(5, &seen);
  EXPECT_EQ(seen, 2u) << "the last release reads the count before it is forgotten";
  EXPECT_EQ(modes.OpensSinceIdle(5), 0u);
  modes.Open(5, Passthrough, NoCopy);
  EXPECT_EQ(modes.OpensSinceIdle(5), 1u) << "a new episode starts from its own first open";
  modes.Release(5);
}

}  // namespace
}  // namespace ckptfs::fuse
