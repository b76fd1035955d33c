// The control socket of a real mount against issue 11 items 2 and 4: a
// checkpoint under a directory name that is not UTF-8 (it used to abort the
// daemon on the first `status`), and one uid flooding the socket with idle
// connections (it used to take every descriptor, so that reads through the
// mount failed with EIO for everyone); and against issue 21 item 3: one uid
// whose connections read a big reply slowly (it used to hold every query
// thread, so that root's `status` waited minutes).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "ckptfs/json_path.h"
#include "ckptfs/unique_fd.h"
#include "control_flood.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

// The whole file, or "<open: strerror>" / "<read: strerror>".
std::string ReadOrError(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return "<open: " + std::string(std::strerror(errno)) + ">";
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n == 0) return out;
    if (n < 0) return "<read: " + std::string(std::strerror(errno)) + ">";
    out.append(buf, static_cast<size_t>(n));
  }
}

// `ckptfsctl ARGS` with --json: the reply with its paths decoded to bytes.
nlohmann::json CtlJson(const std::string& args) {
  CommandResult r = RunCommand(kCtl + " " + args);
  auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << args << ": " << r.out;
  if (j.is_discarded()) return nlohmann::json::object();
  Status s = DecodeJsonPaths(j);
  EXPECT_TRUE(s.ok()) << s.message();
  return j;
}

class ControlRobustnessTest : public MountFixture {
 protected:
  ControlRobustnessTest() : MountFixture("ckptfs-ctlrobust") {
    src_ = tmp_ / "src-\xff";  // the source root itself is not UTF-8 either
  }
  void SetUp() override { ::chmod(tmp_.path().c_str(), 0755); }  // so that uid 65534 reaches what it needs

  void Mount(const std::string& extra = "") {
    mount_ = MountFixture::Mount(extra);
    ASSERT_TRUE(mount_->ok()) << mount_->Log();
  }
  bool DaemonAlive() { return ::kill(mount_->pid(), 0) == 0 && IsMounted(mnt_); }
  std::string Q(const std::string& path) { return ShellQuote(path); }

  std::unique_ptr<MountedCkptfs> mount_;
};

TEST_F(ControlRobustnessTest, NonUtf8PathsArePrintedExactlyAndTheDaemonStaysUp) {
  const std::string cafe = "caf\xe9";
  WriteModel(src_ + "/" + cafe, {});
  WriteFile(src_ + "/" + cafe + "/tok\xe9/vocab.txt", "vocabulary");
  WriteModel(src_ + "/bad\xe9", {});
  Symlink("missing.bin", src_ + "/bad\xe9/extra.json");  // dangling: invalid, with a reason naming the path
  Mount();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/" + cafe); })) << mount_->Log();
  ASSERT_TRUE(WaitFor([&] { return CtlJson("status --json " + mnt_)["counts"].value("invalid", 0) == 1; }));

  CommandResult status = RunCommand(kCtl + " status " + mnt_, true);
  EXPECT_EQ(status.exit_code, 0) << status.out;
  EXPECT_NE(status.out.find("source       " + src_ + "\n"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("invalid   " + src_ + "/bad\xe9\n"), std::string::npos) << status.out;
  nlohmann::json j = CtlJson("status --json " + mnt_);
  EXPECT_EQ(j["source"].get<std::string>(), src_);
  std::set<std::string> paths;
  for (const auto& cp : j["checkpoints"]) paths.insert(cp["path"].get<std::string>());
  EXPECT_EQ(paths, (std::set<std::string>{src_ + "/" + cafe, src_ + "/bad\xe9"}));

  CommandResult ls = RunCommand(kCtl + " ls " + mnt_, true);
  EXPECT_EQ(ls.exit_code, 0) << ls.out;
  EXPECT_NE(ls.out.find("  by-name/" + cafe + "\n"), std::string::npos) << ls.out;
  // Compared as strings: gtest would print a mismatch with dump(), which
  // throws on the very bytes under test.
  nlohmann::json rows = CtlJson("ls --json " + mnt_);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["by_name"].at(0).get<std::string>(), "by-name/" + cafe);
  EXPECT_EQ(rows[0]["sources"].at(0).get<std::string>(), src_ + "/" + cafe);

  // A request that names a non-UTF-8 path travels exactly too.
  const std::string digest = fs::read_symlink(mnt_ + "/by-name/" + cafe).filename();
  CommandResult preload = RunCommand(kCtl + " preload " + Q(mnt_ + "/" + digest + "/tok\xe9/vocab.txt"), true);
  EXPECT_EQ(preload.exit_code, 0) << preload.out;
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/" + cafe + "/tok\xe9/vocab.txt"), "vocabulary");
  EXPECT_TRUE(DaemonAlive()) << mount_->Log();
}

TEST_F(ControlRobustnessTest, IdleConnectionFloodLeavesReadsAndStatusWorking) {
  ModelSpec spec;
  spec.shards = 4;
  spec.tensor_bytes = 1 << 20;
  WriteModel(src_ + "/m", spec);
  {
    SoftFdLimit limit(1024);  // the usual default, which the flood used to exhaust
    Mount();
  }
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << mount_->Log();
  char socket[4096];
  const ssize_t n = ::getxattr(mnt_.c_str(), "user.ckptfs.control", socket, sizeof socket);
  ASSERT_GT(n, 0);
  const std::string proc_fd = "/proc/" + std::to_string(mount_->ServingPid()) + "/fd";
  const size_t fds_before = CountEntries(proc_fd);

  IdleConnectionFlood flood(std::string(socket, static_cast<size_t>(n)), 65534, 1100);
  EXPECT_GT(flood.opened(), 1000);
  for (const auto& e : fs::directory_iterator(src_ + "/m")) {
    const std::string name = e.path().filename();
    const std::string got = ReadOrError(mnt_ + "/by-name/m/" + name);
    EXPECT_TRUE(got == ReadFile(e.path())) << name << ": " << got.substr(0, 40) << " (" << got.size() << " bytes)";
  }
  CommandResult status = RunCommand(kCtl + " status " + mnt_, true);
  EXPECT_EQ(status.exit_code, 0) << status.out;
  EXPECT_LE(CountEntries(proc_fd), fds_before + 64) << "the daemon's descriptors grew with the flood";
  EXPECT_TRUE(DaemonAlive()) << mount_->Log();
}

// Issue 21 item 3: uid 65534 holds its 16 connections (the per-uid limit),
// each asking `ls` for a reply of more than a megabyte and reading it 64 KiB
// every 4 s: fast enough that no single write ever waits long, slow enough
// that a whole reply would take minutes. Root's `status` and another uid's
// are still answered (a generous timeout(1) around each, no timing
// assertion), and the server cuts the slow readers off once a reply has
// taken its whole-reply bound (10 s), instead of serving them for minutes.
TEST_F(ControlRobustnessTest, SlowReadersOfOneUidHoldNeitherRootNorOtherUidsOff) {
  // One digest with 200 copies under deep, long names: `ls` lists every
  // copy's by-name path and source path in that digest's row.
  const std::string component(250, 'd');
  std::string deep;
  for (int level = 0; level < 13; ++level) deep += "/" + component;
  for (int i = 0; i < 200; ++i) WriteFile(src_ + "/c" + std::to_string(i) + deep + "/model.bin", "same weights");
  Mount("allow_other");  // so that the other uid may ask too
  ASSERT_TRUE(WaitFor([&] { return CtlJson("status --json " + mnt_)["counts"].value("exposed", 0) == 200; },
                      std::chrono::seconds(120)))
      << mount_->Log();
  ASSERT_GT(RunCommand(kCtl + " ls --json " + mnt_).out.size(), size_t{1} << 20) << "the reply must fill the socket";
  char socket[4096];
  const ssize_t n = ::getxattr(mnt_.c_str(), "user.ckptfs.control", socket, sizeof socket);
  ASSERT_GT(n, 0);

  SlowReaderFlood flood(std::string(socket, static_cast<size_t>(n)), 65534, 16, "{\"cmd\":\"ls\"}\n", 64 << 10, 4000);
  ASSERT_EQ(flood.opened(), 16);
  CommandResult root = RunCommand("timeout 60 " + kCtl + " status " + mnt_, true);
  EXPECT_EQ(root.exit_code, 0) << root.out;
  CommandResult other =
      RunCommand("setpriv --reuid=65533 --regid=65533 --clear-groups timeout 60 " + kCtl + " status " + mnt_, true);
  EXPECT_EQ(other.exit_code, 0) << other.out;
  EXPECT_TRUE(flood.alive());
  EXPECT_TRUE(flood.WaitForACut(60000)) << "no slow reader was cut off within 60 s";
  EXPECT_TRUE(DaemonAlive()) << mount_->Log();
}

}  // namespace
}  // namespace ckptfs::testing
