// The smaller things an operator noticed (issue 13, item 5), each seen
// through a real mount: what listings, ckptfsctl, status and the log show.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;
const std::string kDaemon = CKPTFS_PATH;
const std::string kCtl = CKPTFSCTL_PATH;

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

class OperatorViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::chmod(tmp_.path().c_str(), 0755);
    WriteModel(src_ + "/m", {});
    WriteFile(src_ + "/m/tok/vocab.txt", "a b c\n");
    WriteModel(src_ + "/other", {.seed = 2});
  }
  std::unique_ptr<MountedCkptfs> Mount(const std::string& extra = "") {
    auto m = std::make_unique<MountedCkptfs>(kDaemon, src_, mnt_,
                                             "state=" + state_ + ",rescan=0" + (extra.empty() ? "" : "," + extra),
                                             tmp_ / ("daemon-" + std::to_string(++mounts_) + ".log"));
    EXPECT_TRUE(m->ok()) << m->Log();
    return m;
  }
  bool WaitForBoth() {
    return WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m") && fs::is_symlink(mnt_ + "/by-name/other"); });
  }
  std::string DigestOf(const std::string& name) { return fs::read_symlink(mnt_ + "/by-name/" + name).filename(); }

  TempDir tmp_{"ckptfs-ops"};
  std::string src_ = tmp_ / "src";
  std::string mnt_ = tmp_ / "mnt";
  std::string state_ = tmp_ / "state";
  int mounts_ = 0;
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

TEST_F(OperatorViewTest, PreloadIsCountedApartFromReadAhead) {
  auto m = Mount("settle=0");
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

}  // namespace
}  // namespace ckptfs::testing
