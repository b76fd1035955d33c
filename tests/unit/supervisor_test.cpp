// The supervisor's parts that need no mount: the restart back-off and crash
// loop, exit causes as logged, the hand-over messages, and the open-mode
// record a successor inherits.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "ckptfs/handover_protocol.h"
#include "ckptfs/open_modes.h"
#include "ckptfs/restart_policy.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {
namespace {

using namespace std::chrono_literals;
using supervisor::RestartPolicy;

TEST(RestartPolicyTest, TheFirstDeathRestartsAtOnceAndQuickOnesBackOffToTheCeiling) {
  RestartPolicy p;
  EXPECT_EQ(p.OnDeath(true, 3s).delay, 0ms);
  EXPECT_EQ(p.OnDeath(true, 3s).delay, 100ms);
  EXPECT_EQ(p.OnDeath(true, 3s).delay, 200ms);
  EXPECT_EQ(p.OnDeath(true, 3s).delay, 400ms);
  for (int i = 0; i < 30; ++i) p.OnDeath(true, 1s);
  EXPECT_EQ(p.OnDeath(true, 1s).delay, 10'000ms);
  // A stable run forgives what came before.
  EXPECT_EQ(p.OnDeath(true, 31s).delay, 0ms);
}

TEST(RestartPolicyTest, ThreeFailedStartsInARowAreACrashLoopThatEndsWhenOneStarts) {
  RestartPolicy p;
  EXPECT_FALSE(p.OnDeath(false, 0s).crash_loop);
  EXPECT_FALSE(p.OnDeath(false, 0s).crash_loop);
  EXPECT_TRUE(p.OnDeath(false, 0s).crash_loop);
  EXPECT_TRUE(p.OnDeath(false, 0s).crash_loop);
  p.OnReady();
  EXPECT_FALSE(p.OnDeath(true, 1s).crash_loop);
  // Deaths after ready are no loop, however quick.
  EXPECT_FALSE(p.OnDeath(true, 0s).crash_loop);
  EXPECT_FALSE(p.OnDeath(true, 0s).crash_loop);
}

int StatusOfChild(int how) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (how > 0) ::raise(how);
    ::_exit(-how);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(RestartPolicyTest, ExitCausesAreSaidPlainly) {
  EXPECT_EQ(supervisor::DescribeExit(StatusOfChild(-3)), "exited with status 3");
  EXPECT_EQ(supervisor::DescribeExit(StatusOfChild(SIGKILL)), "killed by signal 9 (SIGKILL)");
}

TEST(HandoverProtocolTest, MessagesCrossASocketPairWholeAndBadOnesAreRefused) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const std::vector<uint8_t> init = {0x68, 0, 0, 0, 26, 0, 0, 0, 0xff, 0x01};
  ASSERT_TRUE(handover::Send(a.get(), {{"type", "init"}, {"request", handover::ToHex(init)}}).ok());
  ASSERT_TRUE(handover::Send(a.get(), {{"type", "ready"}}).ok());
  auto first = handover::Receive(b.get());
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ((*first)["type"], "init");
  EXPECT_EQ(handover::FromHex((*first)["request"]), init);
  auto second = handover::Receive(b.get());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)["type"], "ready");
  for (const std::string bad : {"not json", "[1,2]", "{\"no\":\"type\"}", "{\"type\":7}"}) {
    ASSERT_EQ(::send(a.get(), bad.data(), bad.size(), 0), static_cast<ssize_t>(bad.size()));
    EXPECT_FALSE(handover::Receive(b.get()).ok()) << bad;
  }
  a.reset();
  EXPECT_FALSE(handover::Receive(b.get()).ok());  // the peer closed
}

TEST(HandoverProtocolTest, HexRoundTripsAndRejectsWhatIsNotHex) {
  std::vector<uint8_t> all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<uint8_t>(i));
  EXPECT_EQ(handover::FromHex(handover::ToHex(all)), all);
  EXPECT_TRUE(handover::FromHex("abc").empty());
  EXPECT_TRUE(handover::FromHex("zz").empty());
}

TEST(OpenModesTest, InheritedOpensHoldTheModeUntilTheirReleasesCome) {
  fuse::OpenModes modes;
  fuse::OpenModes::Choice passthrough;
  passthrough.passthrough = true;
  modes.Inherit(42, 2, passthrough);
  // An open in the successor joins the mode the kernel holds.
  auto never = [] { return fuse::OpenModes::Choice{}; };
  auto none = [] { return FileCache::CopyPtr(); };
  EXPECT_TRUE(modes.Open(42, never, none).passthrough);
  EXPECT_FALSE(modes.Release(42));
  modes.ReleaseInherited(42);
  EXPECT_EQ(modes.inodes(), 1u);
  modes.ReleaseInherited(42);
  EXPECT_EQ(modes.inodes(), 0u);
  // A release for a handle nobody handed over (after a crash) changes nothing.
  EXPECT_FALSE(modes.Open(7, never, none).passthrough);
  modes.ReleaseInherited(7);
  EXPECT_EQ(modes.inodes(), 1u);
}

}  // namespace
}  // namespace ckptfs
