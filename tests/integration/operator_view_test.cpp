// The smaller things an operator noticed (issue 13, item 5), each seen
// through a real mount: what listings, ckptfsctl, status and the log show.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

// Every entry readdir(3) returns, with its d_ino.
std::map<std::string, ino_t> Listing(const std::string& dir) {
  std::map<std::string, ino_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) out[e->d_name] = e->d_ino;
  ::closedir(d);
  return out;
}

ino_t InodeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

class OperatorViewTest : public MountFixture {
 protected:
  OperatorViewTest() : MountFixture("ckptfs-ops") {}
  void SetUp() override {
    ::chmod(tmp_.path().c_str(), 0755);
    WriteModel(src_ + "/m", {});
    WriteFile(src_ + "/m/tok/vocab.txt", "a b c\n");
    WriteModel(src_ + "/other", {.seed = 2});
  }
  // Without settle=0: some tests here set their own.
  std::unique_ptr<MountedCkptfs> Mount(const std::string& extra = "") {
    return MountWith(src_, mnt_, "state=" + state_ + ",rescan=0" + (extra.empty() ? "" : "," + extra));
  }
  bool WaitForBoth() {
    return WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m") && fs::is_symlink(mnt_ + "/by-name/other"); });
  }
  std::string DigestOf(const std::string& name) { return fs::read_symlink(mnt_ + "/by-name/" + name).filename(); }
};

TEST_F(OperatorViewTest, ListingsHaveDotAndDotDotWithTheParentsInode) {
  auto m = Mount("settle=0");
  ASSERT_TRUE(WaitForBoth()) << m->Log();
  const std::string digest = mnt_ + "/" + DigestOf("m");
  for (const std::string& dir : {mnt_ + "/by-name", digest, digest + "/tok"}) {
    const auto entries = Listing(dir);
    ASSERT_TRUE(entries.count(".")) << dir;
    ASSERT_TRUE(entries.count("..")) << dir;
    EXPECT_EQ(entries.at("."), InodeOf(dir)) << dir;
    EXPECT_EQ(entries.at(".."), InodeOf(dir + "/..")) << dir;
  }
  // The mount root's parent lies outside the filesystem: its ".." is itself.
  const auto root = Listing(mnt_);
  ASSERT_TRUE(root.count("..")) << "the mount root lists no ..";
  EXPECT_EQ(root.at(".."), InodeOf(mnt_));
  EXPECT_NE(RunCommand("ls -a " + mnt_ + "/by-name").out.find("\n..\n"), std::string::npos);
}

TEST_F(OperatorViewTest, LsStatsAndStatusAcceptAnyPathInsideTheMount) {
  auto m = Mount("settle=0");
  ASSERT_TRUE(WaitForBoth()) << m->Log();
  const std::string digest = DigestOf("m");
  auto ls = [&](const std::string& path) {
    auto j = nlohmann::json::parse(RunCommand(kCtl + " ls --json " + path).out, nullptr, false);
    std::vector<std::string> names;
    if (j.is_array()) {
      for (const auto& row : j) names.push_back(row["name"]);
    }
    return names;
  };
  EXPECT_EQ(ls(mnt_).size(), 2u);
  EXPECT_EQ(ls(mnt_ + "/" + digest), std::vector<std::string>{digest});
  EXPECT_EQ(ls(mnt_ + "/" + digest + "/tok/vocab.txt"), std::vector<std::string>{digest});
  EXPECT_EQ(ls(mnt_ + "/by-name/m"), std::vector<std::string>{digest});  // the link leads into the digest
  CommandResult text = RunCommand(kCtl + " ls " + mnt_ + "/" + digest, true);
  EXPECT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("by-name/m"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("by-name/other"), std::string::npos) << text.out;

  // stats: rows name their by-name paths, and a path filters them.
  auto stats = nlohmann::json::parse(RunCommand(kCtl + " stats --json " + mnt_ + "/by-name/m").out, nullptr, false);
  ASSERT_TRUE(stats.is_object()) << stats;
  ASSERT_EQ(stats["checkpoints"].size(), 1u) << stats;
  EXPECT_EQ(stats["checkpoints"][0]["by_name"], nlohmann::json::array({"by-name/m"}));
  CommandResult table = RunCommand(kCtl + " stats " + mnt_, true);
  EXPECT_NE(table.out.find(digest), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("by-name/other"), std::string::npos) << table.out;

  EXPECT_EQ(RunCommand(kCtl + " status " + mnt_ + "/by-name/m/config.json").exit_code, 0);
  CommandResult outside = RunCommand(kCtl + " ls " + src_, true);
  EXPECT_EQ(outside.exit_code, 3);
  EXPECT_NE(outside.out.find(src_ + " is not a ckptfs mount nor inside one"), std::string::npos) << outside.out;
}

TEST_F(OperatorViewTest, PreloadIsCountedApartFromReadAhead) {
  // fill=off: preload fills the chunk tier, whose fills are what is counted
  // here (with the host tier on, preload copies whole files instead).
  auto m = Mount("settle=0,fill=off");
  ASSERT_TRUE(WaitForBoth()) << m->Log();
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  auto stats = nlohmann::json::parse(RunCommand(kCtl + " stats --json " + mnt_).out, nullptr, false);
  ASSERT_TRUE(stats.is_object());
  EXPECT_EQ(stats["preload_fills"].get<uint64_t>(), 6u);  // one chunk per small file, tok/vocab.txt's included
  EXPECT_EQ(stats["readahead_fills"].get<uint64_t>(), 0u);
  EXPECT_NE(RunCommand(kCtl + " stats " + mnt_).out.find("read-ahead fills 0, hits 0   preload fills 6"),
            std::string::npos);
  EXPECT_NE(RunCommand(kCtl + " stats --prometheus " + mnt_).out.find("ckptfs_preload_fills_total{mountpoint=\"" +
                                                                        mnt_ + "\"} 6"),
            std::string::npos);
}

TEST_F(OperatorViewTest, PendingReasonShowsSettleAsWritten) {
  auto m = Mount("settle=60");
  ASSERT_TRUE(WaitFor([&] { return RunCommand(kCtl + " status " + mnt_).out.find("pending") != std::string::npos; }));
  CommandResult status = RunCommand(kCtl + " status " + mnt_, true);
  EXPECT_NE(status.out.find("ms ago; waiting for settle=60s"), std::string::npos) << status.out;
  EXPECT_EQ(status.out.find("60.000000"), std::string::npos) << status.out;
}

TEST_F(OperatorViewTest, ErrorsNameThePathOnce) {
  RunCommand("chmod -R a+rX " + src_);
  auto m = Mount("settle=0,allow_other");
  ASSERT_TRUE(WaitForBoth()) << m->Log();
  const std::string by_name = mnt_ + "/by-name";
  CommandResult preload = RunCommand(kCtl + " preload " + by_name, true);
  EXPECT_EQ(preload.exit_code, 1);
  EXPECT_EQ(Count(preload.out, mnt_), 1u) << preload.out;
  CommandResult resolve = RunCommand(kCtl + " resolve " + by_name, true);
  EXPECT_EQ(resolve.exit_code, 1);
  EXPECT_EQ(Count(resolve.out, mnt_), 1u) << resolve.out;
  CommandResult refused = RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups " + kCtl + " evict " +
                                         mnt_ + "/by-name/m",
                                     true);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(Count(refused.out, mnt_), 1u) << refused.out;
  EXPECT_NE(refused.out.find("evict is for root or the mount's owner"), std::string::npos) << refused.out;
}

// Without journald or syslog the default log is lost once daemonized:
// log_file= sends it to a file (or keeps standard error).
TEST_F(OperatorViewTest, LogFileReceivesTheLogOnceMounted) {
  const std::string log = tmp_ / "logs/ckptfs.log";
  MakeDirs(tmp_ / "logs");
  MakeDirs(mnt_);
  CommandResult r = RunCommand(kDaemon + " " + src_ + " " + mnt_ + " -o state=" + state_ + ",settle=0,log_file=" + log,
                               true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(IsMounted(mnt_));
  EXPECT_TRUE(WaitFor([&] { return ReadFile(log).find("checkpoint " + src_ + "/other is sha256-") != std::string::npos; }))
      << ReadFile(log);
  EXPECT_EQ(RunCommand("fusermount3 -u " + mnt_).exit_code, 0);
  EXPECT_TRUE(WaitFor([&] { return ReadFile(log).find("unmounting " + mnt_) != std::string::npos; })) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("mounted " + src_ + " at " + mnt_), std::string::npos) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find(" ckptfs["), std::string::npos) << "each line names its daemon";
  auto status = [&] { return RunCommand(kCtl + " status --json " + mnt_, true).out; };

  // log_file=stderr: kept even when daemonized (here a file stands for the
  // supervisor's pipe).
  const std::string err = tmp_ / "stderr.txt";
  r = RunCommand(kDaemon + " " + src_ + " " + mnt_ + " -o state=" + state_ + ",log_file=stderr 2>" + err, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(WaitFor([&] { return ReadFile(err).find("mounted " + src_) != std::string::npos; })) << ReadFile(err);
  EXPECT_NE(status().find("\"log_file\": \"stderr\""), std::string::npos) << status() << ReadFile(err);
  EXPECT_EQ(RunCommand("fusermount3 -u " + mnt_).exit_code, 0);
  EXPECT_TRUE(WaitFor([&] { return !IsMounted(mnt_); }));
}

TEST_F(OperatorViewTest, UnusableLogFileStopsTheStartBeforeMounting) {
  MakeDirs(mnt_);
  WriteFile(tmp_ / "plainfile", "not a directory");
  for (const auto& [option, message] : std::vector<std::pair<std::string, std::string>>{
           {"log_file=relative.log", "option log_file=relative.log: expected an absolute path, stderr or syslog"},
           {"log_file=" + tmp_ / "plainfile/ckptfs.log", "option log_file=" + tmp_ / "plainfile/ckptfs.log" +
                                                             ": cannot open it for appending"}}) {
    CommandResult r = RunCommand("timeout 20 " + kDaemon + " " + src_ + " " + mnt_ + " -f -o state=" + state_ + "," +
                                     option,
                                 true);
    EXPECT_NE(r.exit_code, 0) << option;
    EXPECT_NE(r.out.find(message), std::string::npos) << option << ": " << r.out;
    EXPECT_FALSE(IsMounted(mnt_)) << option;
  }
}

}  // namespace
}  // namespace ckptfs::testing
