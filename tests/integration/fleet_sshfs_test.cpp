// A source on a real network filesystem: sshfs over loopback to an OpenSSH
// server the test starts (tests/support/sshfs_loopback.sh). Changes made on
// the server raise no inotify event in the client, so ckptfs must say so in
// `status` and find them by rescanning.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "file_reads.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;
const std::string kLoopback = std::string(CKPTFS_SOURCE_DIR) + "/tests/support/sshfs_loopback.sh";

// sshd and sshfs, stopped by PID (and the mount unmounted) however the test ends.
class SshfsLoopback {
 public:
  SshfsLoopback(const std::string& work, const std::string& remote, const std::string& mnt, const std::string& opts)
      : work_(work) {
    start_ = RunCommand(kLoopback + " start " + ShellQuote(work) + " " + ShellQuote(remote) + " " + ShellQuote(mnt) +
                            " " + ShellQuote(opts),
                        true);
  }
  ~SshfsLoopback() { RunCommand(kLoopback + " stop " + ShellQuote(work_)); }
  bool ok() const { return start_.exit_code == 0; }
  const std::string& output() const { return start_.out; }

 private:
  std::string work_;
  CommandResult start_;
};

class SshfsSourceTest : public ::testing::Test {
 protected:
  std::string Link(const std::string& mnt, const std::string& rel) {
    std::error_code ec;
    return fs::read_symlink(mnt + "/by-name/" + rel, ec).filename();
  }

  TempDir tmp_{"ckptfs-sshfs"};
  std::string remote_ = tmp_ / "server-side";
  std::string sshfs_mnt_ = tmp_ / "sshfs";
};

TEST_F(SshfsSourceTest, ServerSideChangesAreFoundByTheRescanNotByInotify) {
  WriteFile(remote_ + "/m/w.bin", RandomBytes(3 << 20, 1));
  WriteFile(remote_ + "/n/model.safetensors", RandomBytes(1 << 20, 2));
  // Short sshfs caches keep the test quick; the defaults (20 s) only delay
  // when a rescan sees a change.
  SshfsLoopback sshfs(tmp_ / "ssh", remote_, sshfs_mnt_, "dcache_timeout=1");
  ASSERT_TRUE(sshfs.ok()) << sshfs.output();

  {
    MountedCkptfs m(kDaemon, sshfs_mnt_, tmp_ / "mnt1", "state=" + tmp_ / "state1" + ",settle=0", tmp_ / "d1.log");
    ASSERT_TRUE(m.ok()) << m.Log();
    ASSERT_TRUE(WaitFor([&] { return !Link(m.mountpoint(), "m").empty() && !Link(m.mountpoint(), "n").empty(); }))
        << m.Log();
    const auto status = QueryMount(kCtl, "status", m.mountpoint());
    EXPECT_EQ(status["source_filesystem"]["type"], "fuse.sshfs") << status.dump();
    EXPECT_EQ(status["source_filesystem"]["inotify"], false);
    EXPECT_EQ(status["source_filesystem"]["changes_found_by"], "the periodic rescan");
    EXPECT_EQ(status["options"]["rescan"], 60) << "the default for sources without inotify";
    EXPECT_NE(m.Log().find("raise no inotify event"), std::string::npos) << m.Log();
    const std::string shown = RunCommand(kCtl + " status " + m.mountpoint()).out;
    EXPECT_NE(shown.find("fuse.sshfs: changes found by the periodic rescan (rescan every 60 s)"), std::string::npos)
        << shown;
    EXPECT_EQ(Link(m.mountpoint(), "m"), CoreutilsDigest(remote_ + "/m"));
    EXPECT_EQ(CompareTree(remote_, m.mountpoint() + "/by-name"), "");

    // Quiet first: the reads above may have asked for a rescan (sshfs's
    // attribute cache can show a stamp moving), which would find the change
    // below by itself. Wait until none is pending.
    ASSERT_TRUE(WaitFor([&] {
      return QueryMount(kCtl, "status", m.mountpoint()).value("scan_pending", true) == false;
    })) << m.Log();
    // Changed on the server: on a local filesystem inotify would bring the
    // new digest within a second (settle=0); here nothing arrives.
    const std::string old_name = Link(m.mountpoint(), "m");
    WriteFile(remote_ + "/m/w.bin", RandomBytes((3 << 20) + 1, 3));
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    EXPECT_EQ(Link(m.mountpoint(), "m"), old_name) << "a change on the server raised an event after all";
    ASSERT_EQ(RunCommand(kCtl + " rescan " + m.mountpoint()).exit_code, 0);
    EXPECT_TRUE(WaitFor([&] { return Link(m.mountpoint(), "m") == CoreutilsDigest(remote_ + "/m"); })) << m.Log();
  }
  {
    // The periodic rescan alone finds the next change.
    MountedCkptfs m(kDaemon, sshfs_mnt_, tmp_ / "mnt2", "state=" + tmp_ / "state2" + ",settle=0,rescan=1",
                    tmp_ / "d2.log");
    ASSERT_TRUE(m.ok()) << m.Log();
    ASSERT_TRUE(WaitFor([&] { return Link(m.mountpoint(), "m") == CoreutilsDigest(remote_ + "/m"); })) << m.Log();
    EXPECT_EQ(QueryMount(kCtl, "status", m.mountpoint())["options"]["rescan"], 1);
    WriteFile(remote_ + "/m/w.bin", RandomBytes((3 << 20) + 2, 4));
    const std::string want = CoreutilsDigest(remote_ + "/m");
    EXPECT_TRUE(WaitFor([&] { return Link(m.mountpoint(), "m") == want; })) << m.Log();
    EXPECT_EQ(CompareTree(remote_, m.mountpoint() + "/by-name"), "");
  }
}

// Where this kernel may not see a change at once, nothing is kept open:
// each chunk read opens its file afresh (close-to-open), as an fstat of a
// kept descriptor could be answered from sshfs's cached attributes.
TEST_F(SshfsSourceTest, TheChunkPathKeepsNoSourceFileOpen) {
  const std::string bytes = RandomBytes(3 * (4 << 20), 5);  // three 4 MiB chunks
  WriteFile(remote_ + "/m/w.bin", bytes);
  SshfsLoopback sshfs(tmp_ / "ssh", remote_, sshfs_mnt_, "dcache_timeout=1");
  ASSERT_TRUE(sshfs.ok()) << sshfs.output();
  MountedCkptfs m(kDaemon, sshfs_mnt_, tmp_ / "mnt", "state=" + tmp_ / "state" + ",settle=0,fill=off,fill_on_index=off",
                  tmp_ / "d.log");
  ASSERT_TRUE(m.ok()) << m.Log();
  ASSERT_TRUE(WaitFor([&] { return !Link(m.mountpoint(), "m").empty(); })) << m.Log();
  EXPECT_TRUE(ReadFile(m.mountpoint() + "/by-name/m/w.bin") == bytes);
  const auto stats = QueryMount(kCtl, "stats", m.mountpoint());
  EXPECT_GE(stats["source_chunks_read"].get<uint64_t>(), 3u) << stats.dump();
  EXPECT_EQ(stats["source_opens"], stats["source_chunks_read"]) << stats.dump();
  EXPECT_EQ(stats["source_files_open"], 0) << stats.dump();
}

}  // namespace
}  // namespace ckptfs::testing
