// A trainer's output directory: run7/ holds the final model and the nested
// checkpoints run7/checkpoint-500/ and run7/checkpoint-1000/. by-name/run7 is
// then a directory, and it must still stand for run7's own digest: its
// xattrs, `ckptfsctl resolve`, preload, unpin, evict and ls (issue 13, item 1).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

std::string Xattr(const std::string& path, const std::string& name) {
  char buf[8192];
  ssize_t n = ::getxattr(path.c_str(), name.c_str(), buf, sizeof buf);
  return n < 0 ? "<" + std::string(std::strerror(errno)) + ">" : std::string(buf, static_cast<size_t>(n));
}

class NestedCheckpointTest : public MountFixture {
 protected:
  NestedCheckpointTest() : MountFixture("ckptfs-nested") {}
  void SetUp() override {
    ::chmod(tmp_.path().c_str(), 0755);
    ASSERT_EQ(RunCommand(std::string(MAKE_DEMO_TREE_PATH) + " " + src_).exit_code, 0);
    RunCommand("chmod -R a+rX " + src_);
    run7_ = CoreutilsDigest(src_ + "/run7", "checkpoint-*");
    step500_ = CoreutilsDigest(src_ + "/run7/checkpoint-500");
    step1000_ = CoreutilsDigest(src_ + "/run7/checkpoint-1000");
    // fill_on_index=off: the preload test counts what preload (not indexing)
    // made resident.
    m_ = Mount("allow_other,fill_on_index=off");
    ASSERT_TRUE(m_->ok()) << m_->Log();
    ASSERT_TRUE(WaitUntilIndexed()) << m_->Log();  // every test uses both steps and the run
    ASSERT_TRUE(fs::is_symlink(mnt_ + "/by-name/run7/checkpoint-1000")) << m_->Log();
  }

  nlohmann::json StatsRow(const std::string& digest) {
    auto j = nlohmann::json::parse(RunCommand(kCtl + " stats --json " + mnt_).out, nullptr, false);
    if (j.is_discarded()) return nullptr;
    for (const auto& row : j["checkpoints"]) {
      if (row["name"] == digest) return row;
    }
    return nullptr;
  }

  std::string run7_, step500_, step1000_;
  std::unique_ptr<MountedCkptfs> m_;
};

TEST_F(NestedCheckpointTest, ByNameDirectoryCarriesItsOwnDigestAndSources) {
  const std::string dir = mnt_ + "/by-name/run7";
  ASSERT_TRUE(fs::is_directory(fs::symlink_status(dir)));
  EXPECT_EQ(Xattr(dir, "user.ckptfs.digest"), run7_);
  EXPECT_EQ(Xattr(dir, "user.ckptfs.sources"), src_ + "/run7\n");
  EXPECT_EQ(Xattr(dir, "user.ckptfs.size"), Xattr(mnt_ + "/" + run7_, "user.ckptfs.size"));
  CommandResult getfattr = RunCommand("getfattr -d " + dir, true);
  EXPECT_NE(getfattr.out.find("user.ckptfs.digest=\"" + run7_ + "\""), std::string::npos) << getfattr.out;
  // Every FUSE operation checks its caller: a user who cannot read run7/ in
  // SRC cannot read its attributes through the mount either.
  ASSERT_EQ(::chmod((src_ + "/run7").c_str(), 0711), 0);
  RunCommand(kCtl + " rescan " + mnt_);
  EXPECT_TRUE(WaitFor([&] {
    return RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups getfattr -n user.ckptfs.digest " + dir)
               .exit_code != 0;
  })) << m_->Log();
  EXPECT_EQ(RunCommand("getfattr -n user.ckptfs.digest " + dir).exit_code, 0);  // root still can
}

TEST_F(NestedCheckpointTest, ResolveGivesItsOwnDigestPath) {
  CommandResult r = RunCommand(kCtl + " resolve " + mnt_ + "/by-name/run7", true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, mnt_ + "/" + run7_ + "\n");
  // What an engine then loads is run7's final model, not a nested step.
  EXPECT_EQ(ReadFile(mnt_ + "/" + run7_ + "/model-00001-of-00002.safetensors"),
            ReadFile(src_ + "/run7/model-00001-of-00002.safetensors"));
  EXPECT_EQ(RunCommand(kCtl + " resolve " + mnt_ + "/by-name/run7/checkpoint-500").out, mnt_ + "/" + step500_ + "\n");
}

TEST_F(NestedCheckpointTest, PreloadUnpinAndEvictActOnItsOwnDigest) {
  CommandResult pre = RunCommand(kCtl + " preload --pin " + mnt_ + "/by-name/run7", true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  EXPECT_NE(pre.out.find("preloaded " + mnt_ + "/by-name/run7 (5 file(s)"), std::string::npos) << pre.out;
  const uint64_t size = std::stoull(Xattr(mnt_ + "/" + run7_, "user.ckptfs.size"));
  EXPECT_EQ(StatsRow(run7_)["pinned"].get<uint64_t>(), size);
  // The nested checkpoints are not part of it; they show only the files they
  // share with run7 byte for byte (the cache is keyed by file content).
  auto shared_with = [&](const std::string& nested) {
    uint64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(src_ + "/run7")) {
      const std::string twin = src_ + "/run7/" + nested + "/" + e.path().filename().string();
      if (e.is_regular_file() && fs::exists(twin) && ReadFile(twin) == ReadFile(e.path())) bytes += e.file_size();
    }
    return bytes;
  };
  EXPECT_LT(shared_with("checkpoint-500"), size / 10);  // configs, not shards
  EXPECT_EQ(StatsRow(step500_)["pinned"].get<uint64_t>(), shared_with("checkpoint-500"));
  EXPECT_EQ(StatsRow(step1000_)["host"].get<uint64_t>(), shared_with("checkpoint-1000"));

  CommandResult unpin = RunCommand(kCtl + " unpin " + mnt_ + "/by-name/run7", true);
  EXPECT_EQ(unpin.exit_code, 0) << unpin.out;
  EXPECT_EQ(StatsRow(run7_)["pinned"].get<uint64_t>(), 0u);
  EXPECT_EQ(StatsRow(run7_)["host"].get<uint64_t>(), size);
  CommandResult evict = RunCommand(kCtl + " evict " + mnt_ + "/by-name/run7", true);
  EXPECT_EQ(evict.exit_code, 0) << evict.out;
  EXPECT_EQ(StatsRow(run7_)["host"].get<uint64_t>(), 0u);
}

TEST_F(NestedCheckpointTest, LsOfTheDirectoryListsItAndTheCheckpointsBelowIt) {
  auto rows = nlohmann::json::parse(RunCommand(kCtl + " ls --json " + mnt_ + "/by-name/run7").out, nullptr, false);
  ASSERT_TRUE(rows.is_array()) << rows;
  std::set<std::string> names;
  for (const auto& row : rows) names.insert(row["name"]);
  EXPECT_EQ(names, (std::set<std::string>{run7_, step500_, step1000_}));
  auto one = nlohmann::json::parse(RunCommand(kCtl + " ls --json " + mnt_ + "/" + run7_).out, nullptr, false);
  ASSERT_TRUE(one.is_array()) << one;
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["by_name"], nlohmann::json::array({"by-name/run7"}));
}

// The digest contract by hand, for a checkpoint with nested ones: the
// README's recipes give the name the mount shows.
TEST_F(NestedCheckpointTest, ManifestRecipeGivesItsDigest) {
  CommandResult manifest =
      RunCommand(kCtl + " --state " + tmp_ / "ctl-state" + " digest --manifest --no-nested " + src_ + "/run7 | sha256sum");
  ASSERT_EQ(manifest.exit_code, 0);
  EXPECT_EQ("sha256-" + manifest.out.substr(0, 64), run7_);
  // Without --no-nested the nested checkpoints' blocks are printed too: that
  // is a listing of three manifests, not one.
  CommandResult all = RunCommand(kCtl + " --state " + tmp_ / "ctl-state" + " digest --manifest " + src_ + "/run7");
  EXPECT_NE(all.out.find("# " + step500_ + "  " + src_ + "/run7/checkpoint-500\n"), std::string::npos) << all.out;
  CommandResult tree = RunCommand(kCtl + " --state " + tmp_ / "ctl-state" + " digest --no-nested " + src_, true);
  EXPECT_NE(tree.exit_code, 0);
  EXPECT_NE(tree.out.find(src_ + " is not itself a checkpoint"), std::string::npos) << tree.out;
}

}  // namespace
}  // namespace ckptfs::testing
