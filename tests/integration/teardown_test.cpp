// Teardown: an unmounted daemon exits promptly, whatever it was doing. The
// kernel does not wait for a FUSE daemon when `umount` returns (it sends no
// DESTROY to a non-block FUSE mount), so the promise is that the daemon ends
// right after: each piece of background work gives up at its next step.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "faulty_fs_mount.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

using namespace std::chrono_literals;

// A rescan walking a source of 3,000 directories, each listed in 20 ms or
// more (a slow network filesystem): the walk would take over a minute; the
// daemon must not finish it after an unmount.
TEST(TeardownTest, UnmountDuringAWalkEndsTheDaemonAtItsNextDirectory) {
  TempDir tmp("ckptfs-teardown");
  WriteFile(tmp / "backing", RandomBytes(1 << 20, 5));
  const std::string trigger = tmp / "trigger";
  FaultyFsMount source(FAULTYFS_PATH, tmp / "backing", tmp / "src", trigger, "wide");
  ASSERT_TRUE(source.ok());
  const std::string mnt = tmp / "mnt";
  MakeDirs(mnt);
  MountedCkptfs m(CKPTFS_PATH, tmp / "src", mnt, "state=" + (tmp / "state") + ",rescan=0", tmp / "log");
  ASSERT_TRUE(m.ok()) << m.Log();
  ASSERT_TRUE(WaitFor([&] { return ::access((mnt + "/by-name/m").c_str(), F_OK) == 0; })) << m.Log();

  WriteFile(trigger, "slow\n");
  ASSERT_EQ(::kill(m.pid(), SIGHUP), 0);  // a rescan, walking slowly
  ASSERT_TRUE(WaitFor([&] { return ::access((trigger + ".slowed").c_str(), F_OK) == 0; })) << m.Log();

  ASSERT_EQ(RunCommand("umount " + ShellQuote(mnt)).exit_code, 0);
  const auto unmounted = std::chrono::steady_clock::now();
  // Generous: the walk left would take a minute; stopping takes one listing.
  EXPECT_TRUE(m.WaitForExit(5s)) << "the daemon went on walking after the unmount\n" << m.Log();
  const double exit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - unmounted).count();
  RecordProperty("exit_after_umount_ms", static_cast<int>(exit_s * 1000));
  std::printf("daemon exited %.3f s after umount returned\n", exit_s);
}

}  // namespace
}  // namespace ckptfs::testing
