// Checkpoint discovery and the member rules of DESIGN.md section 1.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

const CheckpointSource* FindSource(const CatalogScan& scan, const std::string& rel) {
  for (const auto& cp : scan.checkpoints) {
    if (cp.rel_path == rel) return &cp;
  }
  return nullptr;
}

std::vector<std::string> MemberNames(const CheckpointSource& cp) {
  std::vector<std::string> names;
  for (const auto& m : cp.members) names.push_back(m.rel_path);
  return names;
}

class CatalogTest : public ::testing::Test {
 protected:
  TempDir src_{"ckptfs-src"};
  TempDir outside_{"ckptfs-outside"};
};

TEST_F(CatalogTest, MissingRootFailsWithPathAndCause) {
  auto scan = ScanSourceTree(src_ / "nope", {});
  ASSERT_FALSE(scan.ok());
  EXPECT_NE(scan.status().message().find(src_ / "nope"), std::string::npos);
  EXPECT_NE(scan.status().message().find("No such file or directory"), std::string::npos);
}

TEST_F(CatalogTest, RootThatIsAFileFails) {
  WriteFile(src_ / "file", "x");
  auto scan = ScanSourceTree(src_ / "file", {});
  ASSERT_FALSE(scan.ok());
  EXPECT_NE(scan.status().message().find("Not a directory"), std::string::npos);
}

TEST_F(CatalogTest, EmptyTreeHasNoCheckpoints) {
  WriteFile(src_ / "notes/readme.txt", "no weights here");
  EXPECT_TRUE(ScanOk(src_.path()).checkpoints.empty());
}

TEST_F(CatalogTest, MembersAreSortedByBytesAndSkipDotPathsAndSpecialFiles) {
  WriteFile(src_ / "m/model.safetensors", "w");
  WriteFile(src_ / "m/B", "b");
  WriteFile(src_ / "m/a0", "a");
  WriteFile(src_ / "m/a-b/c", "c");
  WriteFile(src_ / "m/a/b", "ab");
  WriteFile(src_ / "m/.git/config", "x");
  WriteFile(src_ / "m/x/.secret", "x");
  ASSERT_EQ(::mkfifo((src_ / "m/pipe").c_str(), 0600), 0);
  auto scan = ScanOk(src_.path());
  ASSERT_EQ(scan.checkpoints.size(), 1u);
  // "a-b/c" < "a/b" < "a0" in byte order ('-' is 0x2d, '/' 0x2f, '0' 0x30).
  EXPECT_EQ(MemberNames(scan.checkpoints[0]),
            (std::vector<std::string>{"B", "a-b/c", "a/b", "a0", "model.safetensors"}));
  EXPECT_TRUE(scan.checkpoints[0].valid());
}

TEST_F(CatalogTest, LinkInsideRootIsFollowed) {
  WriteFile(src_ / "store/weights", "w");
  Symlink("../store/weights", src_ / "m/model.safetensors");
  Symlink("../store", src_ / "m/linked-dir");
  auto scan = ScanOk(src_.path());
  const auto* m = FindSource(scan, "m");
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->valid()) << *m->invalid_reason;
  EXPECT_EQ(MemberNames(*m), (std::vector<std::string>{"linked-dir/weights", "model.safetensors"}));
}

TEST_F(CatalogTest, LinkEscapingRootMakesCheckpointInvalidUnlessFollow) {
  WriteFile(outside_ / "secret", "s");
  WriteFile(src_ / "m/model.safetensors", "w");
  Symlink(outside_ / "secret", src_ / "m/extra.json");
  WriteFile(src_ / "ok/model.bin", "fine");

  auto scan = ScanOk(src_.path());
  const auto* m = FindSource(scan, "m");
  ASSERT_NE(m, nullptr);
  ASSERT_FALSE(m->valid());
  EXPECT_NE(m->invalid_reason->find("resolves outside the source root"), std::string::npos);
  EXPECT_NE(m->invalid_reason->find("extra.json"), std::string::npos);
  EXPECT_TRUE(FindSource(scan, "ok")->valid());  // the rest go on

  auto followed = ScanOk(src_.path(), SymlinkPolicy::kFollow);
  ASSERT_TRUE(FindSource(followed, "m")->valid());
  EXPECT_EQ(MemberNames(*FindSource(followed, "m")), (std::vector<std::string>{"extra.json", "model.safetensors"}));
}

TEST_F(CatalogTest, DanglingLinkMakesCheckpointInvalid) {
  WriteFile(src_ / "m/model.safetensors", "w");
  Symlink("no-such-target", src_ / "m/tokenizer.json");
  auto scan = ScanOk(src_.path());
  ASSERT_FALSE(scan.checkpoints[0].valid());
  EXPECT_NE(scan.checkpoints[0].invalid_reason->find("dangling symlink"), std::string::npos);
  EXPECT_NE(scan.checkpoints[0].invalid_reason->find("tokenizer.json"), std::string::npos);
}

TEST_F(CatalogTest, DanglingWeightLinkStillMarksTheCheckpoint) {
  Symlink("../blobs/gone", src_ / "m/model.safetensors");
  auto scan = ScanOk(src_.path());
  ASSERT_EQ(scan.checkpoints.size(), 1u);  // reported invalid, not silently absent
  EXPECT_FALSE(scan.checkpoints[0].valid());
}

TEST_F(CatalogTest, LinkLoopsMakeCheckpointInvalid) {
  WriteFile(src_ / "self/model.safetensors", "w");
  Symlink("loop", src_ / "self/loop");  // ELOOP
  WriteFile(src_ / "up/model.safetensors", "w");
  Symlink("..", src_ / "up/sub/parent");  // a directory link back to an ancestor
  auto scan = ScanOk(src_.path());
  const auto* self = FindSource(scan, "self");
  const auto* up = FindSource(scan, "up");
  ASSERT_TRUE(self && up);
  ASSERT_FALSE(self->valid());
  EXPECT_NE(self->invalid_reason->find("symlink loop"), std::string::npos);
  ASSERT_FALSE(up->valid());
  EXPECT_NE(up->invalid_reason->find("symlink loop"), std::string::npos);
}

TEST_F(CatalogTest, NewlineOrBackslashInMemberNameMakesCheckpointInvalid) {
  WriteFile(src_ / "nl/model.safetensors", "w");
  WriteFile(src_ / "nl/bad\nname", "x");
  WriteFile(src_ / "bs/model.safetensors", "w");
  WriteFile(src_ / "bs/sub\\dir/x", "x");
  auto scan = ScanOk(src_.path());
  ASSERT_FALSE(FindSource(scan, "nl")->valid());
  EXPECT_NE(FindSource(scan, "nl")->invalid_reason->find("newline"), std::string::npos);
  // Escaped so the message stays on one line.
  EXPECT_EQ(FindSource(scan, "nl")->invalid_reason->find('\n'), std::string::npos);
  ASSERT_FALSE(FindSource(scan, "bs")->valid());
  EXPECT_NE(FindSource(scan, "bs")->invalid_reason->find("backslash"), std::string::npos);
}

TEST_F(CatalogTest, ProblemsOutsideCheckpointsAreWarningsOnly) {
  WriteFile(src_ / "m/model.safetensors", "w");
  Symlink("nowhere", src_ / "loose-link");
  auto scan = ScanOk(src_.path());
  ASSERT_EQ(scan.checkpoints.size(), 1u);
  EXPECT_TRUE(scan.checkpoints[0].valid());
  ASSERT_EQ(scan.warnings.size(), 1u);
  EXPECT_NE(scan.warnings[0].find("loose-link"), std::string::npos);
}

TEST_F(CatalogTest, ExcludedPathIsNeverEntered) {
  WriteFile(src_ / "m/model.safetensors", "w");
  WriteFile(src_ / "mnt/other/model.safetensors", "w");
  CatalogOptions options;
  char* real = ::realpath((src_ / "mnt").c_str(), nullptr);
  options.excluded_paths.push_back(real);
  std::free(real);
  auto scan = ScanSourceTree(src_.path(), options);
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->checkpoints.size(), 1u);
  EXPECT_EQ(scan->checkpoints[0].rel_path, "m");
}

// Hub caches: the refs/ files of a repository directory are read with the
// walk (the view mirrors them); they belong to no checkpoint.
TEST_F(CatalogTest, HubRefsAreReadAndAreNotMembers) {
  const std::string repo = src_ / "hub/models--org--name";
  WriteFile(repo + "/blobs/aaaa", "weights");
  Symlink("../../blobs/aaaa", repo + "/snapshots/c0ffee/model.safetensors");
  WriteFile(repo + "/refs/main", "c0ffee");
  WriteFile(repo + "/refs/pr/1", "beef");
  WriteFile(src_ / "hub/not-a-repo/refs/main", "ignored: not in a models--/datasets--/spaces-- directory");
  WriteFile(src_ / "hub/datasets--org--big/refs/main", std::string(kMaxHubRefBytes + 1, 'x'));
  auto scan = ScanOk(src_.path());
  ASSERT_EQ(scan.checkpoints.size(), 1u);
  EXPECT_EQ(MemberNames(scan.checkpoints[0]), std::vector<std::string>{"model.safetensors"});
  ASSERT_EQ(scan.hub_refs.size(), 2u);
  EXPECT_EQ(scan.hub_refs[0].rel_path, "hub/models--org--name/refs/main");
  EXPECT_EQ(scan.hub_refs[0].repo_rel_path, "hub/models--org--name");
  EXPECT_EQ(scan.hub_refs[0].content, "c0ffee");
  EXPECT_EQ(scan.hub_refs[1].rel_path, "hub/models--org--name/refs/pr/1");
  EXPECT_EQ(scan.hub_refs[1].content, "beef");
  EXPECT_LT(scan.hub_refs[0].content.capacity(), 64u);  // held at its size, not the read's buffer
  bool warned = false;
  for (const auto& w : scan.warnings) warned = warned || w.find("datasets--org--big/refs/main") != std::string::npos;
  EXPECT_TRUE(warned) << "an oversized ref is left out with a warning";
}

// A SRC writer's repository of refs costs a bounded view: the first
// kMaxHubRefsPerRepository are mirrored, the rest left out with a warning;
// another repository keeps its own.
TEST_F(CatalogTest, ARepositoryMirrorsAtMostItsBoundOfRefs) {
  const std::string repo = src_ / "hub/models--org--many";
  for (size_t i = 0; i < kMaxHubRefsPerRepository + 10; ++i) WriteFile(repo + "/refs/r" + std::to_string(i), "c0ffee");
  for (int i = 0; i < 3; ++i) WriteFile(repo + "/refs/pr/" + std::to_string(i), "c0ffee");  // another directory past it
  WriteFile(src_ / "hub/models--org--other/refs/main", "beef");
  auto scan = ScanOk(src_.path());
  size_t many = 0, other = 0;
  for (const auto& r : scan.hub_refs) (r.repo_rel_path == "hub/models--org--many" ? many : other) += 1;
  EXPECT_EQ(many, kMaxHubRefsPerRepository);
  EXPECT_EQ(other, 1u);
  size_t warned = 0;
  for (const auto& w : scan.warnings) warned += w.find("models--org--many' has more than") != std::string::npos;
  EXPECT_EQ(warned, 1u);
}

// A repository directory inside a checkpoint: its refs are members there
// (mirrored as links into the digest), not hub refs of their own.
TEST_F(CatalogTest, HubRefsInsideACheckpointStayMembers) {
  WriteFile(src_ / "m/model.safetensors", "w");
  WriteFile(src_ / "m/models--a--b/refs/main", "c0ffee");
  auto scan = ScanOk(src_.path());
  ASSERT_EQ(scan.checkpoints.size(), 1u);
  EXPECT_EQ(MemberNames(scan.checkpoints[0]),
            (std::vector<std::string>{"model.safetensors", "models--a--b/refs/main"}));
  EXPECT_TRUE(scan.hub_refs.empty());
}

}  // namespace
}  // namespace ckptfs::testing
