// A Hugging Face hub cache through the mount, resolved the way an offline
// hub client does it: read by-name/hub/models--org--name/refs/main for the
// commit, enter snapshots/<commit>, and follow it to the digest directory
// (issue 13, item 3). The refs files are mirrored, follow their source's
// changes, obey the access rule, and belong to no digest.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;
const std::string kCommitA = "0123456789abcdef0123456789abcdef01234567";
const std::string kCommitB = "89abcdef0123456789abcdef0123456789abcdef";

class HubCacheTest : public MountFixture {
 protected:
  HubCacheTest() : MountFixture("ckptfs-hub") {}
  void SetUp() override {
    ::chmod(tmp_.path().c_str(), 0755);
    WriteHubSnapshot(repo_, kCommitA, {{"model.safetensors", RandomBytes(64 << 10, 1)}, {"config.json", "{}\n"}});
    WriteHubRef(repo_, "main", kCommitA);
    // A dataset repository holds no weight file: no checkpoint, so by-name
    // does not show it, refs included.
    WriteHubSnapshot(src_ + "/hub/datasets--org--data", kCommitA, {{"train.parquet", "rows"}});
    WriteHubRef(src_ + "/hub/datasets--org--data", "main", kCommitA);
    RunCommand("chmod -R a+rX " + src_);
  }

  std::unique_ptr<MountedCkptfs> Mount() {
    auto m = MountFixture::Mount("allow_other");
    EXPECT_TRUE(WaitFor([&] { return fs::exists(hub_ + "/models--org--tiny/refs/main"); })) << m->Log();
    return m;
  }

  // What an offline hub client does for (repo, revision): the snapshot path.
  std::string ClientSnapshot(const std::string& revision) {
    const std::string commit = ReadFile(hub_ + "/models--org--tiny/refs/" + revision);
    return hub_ + "/models--org--tiny/snapshots/" + commit;
  }

  std::string repo_ = src_ + "/hub/models--org--tiny";
  std::string hub_ = mnt_ + "/by-name/hub";  // what HF_HUB_CACHE points at
};

TEST_F(HubCacheTest, RefsMainResolvesToTheSnapshotAndItsDigest) {
  auto m = Mount();
  EXPECT_EQ(ReadFile(hub_ + "/models--org--tiny/refs/main"), kCommitA);
  const std::string snapshot = ClientSnapshot("main");
  ASSERT_TRUE(fs::is_symlink(snapshot));
  const std::string digest = CoreutilsDigest(repo_ + "/snapshots/" + kCommitA);
  EXPECT_EQ(fs::canonical(snapshot).string(), mnt_ + "/" + digest);
  EXPECT_EQ(ReadFile(snapshot + "/model.safetensors"), ReadFile(repo_ + "/snapshots/" + kCommitA + "/model.safetensors"));
  EXPECT_EQ(RunCommand(kCtl + " resolve " + snapshot).out, mnt_ + "/" + digest + "\n");

  // The refs are not members of anything: the digest is the snapshot's
  // alone, and the offline digest of the source agrees.
  EXPECT_FALSE(fs::exists(mnt_ + "/" + digest + "/refs"));
  EXPECT_EQ(RunCommand(kCtl + " --state " + tmp_ / "ctl-state" + " digest " + src_).out,
            digest + "  " + repo_ + "/snapshots/" + kCommitA + "\n");
  EXPECT_FALSE(fs::exists(hub_ + "/datasets--org--data"));
  // A plain read-only file: sized exactly, not writable.
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(hub_ + "/models--org--tiny/refs/main")));
  EXPECT_EQ(fs::file_size(hub_ + "/models--org--tiny/refs/main"), kCommitA.size());
  errno = 0;
  EXPECT_EQ(::open((hub_ + "/models--org--tiny/refs/main").c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
}

TEST_F(HubCacheTest, RefsFollowTheirSourceAndNestedRevisions) {
  auto m = Mount();
  const std::string old_digest = fs::canonical(ClientSnapshot("main")).filename();
  // A new revision arrives as huggingface_hub writes it: a new snapshot,
  // then refs/main rewritten in place; and a pull-request ref beside it.
  WriteHubSnapshot(repo_, kCommitB, {{"model.safetensors", RandomBytes(64 << 10, 2)}, {"config.json", "{}\n"}});
  WriteHubRef(repo_, "main", kCommitB);
  WriteHubRef(repo_, "pr/7", kCommitA);
  // (No chmod -R here: it would change the ctime of snapshot A's files, and
  // a changed checkpoint leaves the view while it is indexed again, its
  // repository's refs with it. New files are world-readable already.)
  ASSERT_TRUE(WaitFor([&] {
    return ReadFile(hub_ + "/models--org--tiny/refs/main") == kCommitB && fs::exists(ClientSnapshot("main"));
  })) << m->Log();
  const std::string new_digest = CoreutilsDigest(repo_ + "/snapshots/" + kCommitB);
  EXPECT_NE(new_digest, old_digest);
  EXPECT_EQ(fs::canonical(ClientSnapshot("main")).filename(), new_digest);
  EXPECT_EQ(fs::canonical(ClientSnapshot("pr/7")).filename(), old_digest);
}

TEST_F(HubCacheTest, RefsObeyTheAccessRule) {
  ASSERT_EQ(::chown((repo_ + "/refs/main").c_str(), 2001, 2001), 0);
  ASSERT_EQ(::chmod((repo_ + "/refs/main").c_str(), 0600), 0);
  auto m = Mount();
  const std::string ref = hub_ + "/models--org--tiny/refs/main";
  struct stat st;
  ASSERT_EQ(::stat(ref.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 2001u);
  EXPECT_EQ(st.st_mode & 07777, 0400u);  // the source's bits, write bits removed
  CommandResult owner = RunCommand("setpriv --reuid=2001 --regid=2001 --clear-groups cat " + ref, true);
  EXPECT_EQ(owner.exit_code, 0) << owner.out;
  EXPECT_EQ(owner.out, kCommitA);
  CommandResult other = RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups cat " + ref, true);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.out.find("Permission denied"), std::string::npos) << other.out;
  // Search on every directory down to it: refs/ closed to others closes
  // the ref to them even when the file itself is open.
  ASSERT_EQ(::chmod((repo_ + "/refs/main").c_str(), 0644), 0);
  ASSERT_EQ(::chmod((repo_ + "/refs").c_str(), 0700), 0);
  RunCommand(kCtl + " rescan " + mnt_);
  EXPECT_TRUE(WaitFor([&] {
    return RunCommand("setpriv --reuid=2001 --regid=2001 --clear-groups cat " + ref).exit_code != 0;
  })) << m->Log();
  EXPECT_EQ(RunCommand("cat " + ref).out, kCommitA);  // root still can
}

}  // namespace
}  // namespace ckptfs::testing
