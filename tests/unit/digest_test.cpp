// The digest contract (DESIGN.md section 1) checked against coreutils.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "ckptfs/checkpoint_digest.h"
#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

class DigestTest : public ::testing::Test {
 protected:
  IndexReport IndexTree(const std::string& root, SymlinkPolicy policy = SymlinkPolicy::kContained) {
    auto index = OpenIndex(state_.path());
    return Indexer(index.get(), {}).Run(ScanOk(root, policy));
  }
  TempDir src_{"ckptfs-src"};
  TempDir state_{"ckptfs-state"};
};

TEST_F(DigestTest, ManifestLineFormatIsSha256sumFormat) {
  ManifestEntry e{"a/b.txt", Sha256Of("x"), 1};
  EXPECT_EQ(CanonicalManifest({e}), ToHex(Sha256Of("x")) + "  a/b.txt\n");
  EXPECT_TRUE(IsCheckpointName(CheckpointName("")));
  EXPECT_EQ(CheckpointName(""), "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_FALSE(IsCheckpointName("sha256-E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"));
  EXPECT_FALSE(IsCheckpointName("sha256-abc"));
}

TEST_F(DigestTest, EqualsCoreutilsCommand) {
  const std::string ck = src_ / "model";
  WriteModel(ck, {});
  WriteFile(ck + "/empty.txt", "");
  WriteFile(ck + "/sub/dir/nested.json", "{}\n");
  WriteFile(ck + "/sub/z", "z");
  WriteFile(ck + "/Upper-and-lower.txt", "sorting is by bytes");
  WriteFile(ck + "/big.bin", RandomBytes(5 * kChunkSize + 12345, 99));  // spans six chunks
  WriteFile(ck + "/.gitattributes", "*.safetensors filter=lfs\n");
  WriteFile(ck + "/.cache/huggingface/x", "ignored");
  WriteFile(ck + "/sub/.hidden", "ignored");

  IndexReport report = IndexTree(src_.path());
  ASSERT_EQ(report.checkpoints.size(), 1u);
  const auto& cp = report.checkpoints[0];
  ASSERT_FALSE(cp.error) << *cp.error;
  EXPECT_EQ(cp.name, CoreutilsDigest(ck));
  EXPECT_EQ(cp.files.size(), 10u);  // 2 shards, index.json, config, tokenizer, empty, nested, z, Upper, big
  for (const auto& f : cp.files) {
    EXPECT_NE(f.member.rel_path.front(), '.');
    EXPECT_EQ(f.member.rel_path.find("/."), std::string::npos) << f.member.rel_path;
  }
  // The big file's chunk table has one XXH3-128 per 4 MiB chunk.
  for (const auto& f : cp.files) {
    if (f.member.rel_path == "big.bin") {
      ASSERT_EQ(f.hashes.chunks.size(), 6u);
      std::string bytes = ReadFile(ck + "/big.bin");
      EXPECT_EQ(f.hashes.chunks[5], HashChunk(bytes.data() + 5 * kChunkSize, 12345));
    }
  }
}

TEST_F(DigestTest, FineTuneWithSameHeadersDiffersAndCopiesAgree) {
  WriteModel(src_ / "base", {});
  CopyTree(src_ / "base", src_ / "finetune");
  CopyTree(src_ / "base", src_ / "elsewhere/copy");
  const std::string shard = "model-00001-of-00002.safetensors";
  ZeroTensor(src_ / "finetune/" + shard, 0);
  ASSERT_EQ(SafetensorsHeader(ReadFile(src_ / "base/" + shard)), SafetensorsHeader(ReadFile(src_ / "finetune/" + shard)));
  ASSERT_NE(ReadFile(src_ / "base/" + shard), ReadFile(src_ / "finetune/" + shard));

  IndexReport report = IndexTree(src_.path());
  ASSERT_EQ(report.checkpoints.size(), 3u);
  const auto& base = Find(report, "base");
  const auto& finetune = Find(report, "finetune");
  const auto& copy = Find(report, "elsewhere/copy");
  EXPECT_NE(base.name, finetune.name);
  EXPECT_EQ(base.name, copy.name);
  EXPECT_EQ(base.name, CoreutilsDigest(src_ / "base"));
  EXPECT_EQ(finetune.name, CoreutilsDigest(src_ / "finetune"));
}

TEST_F(DigestTest, HuggingFaceCacheLayoutIsHashedAsItsContent) {
  // models--org--name/{blobs/<sha>, snapshots/<commit>/<file> -> ../../blobs/<sha>, refs/main}
  const std::string repo = src_ / "hub/models--org--name";
  const std::string plain = src_ / "plain";
  WriteModel(plain, {});
  for (const auto& entry : std::filesystem::directory_iterator(plain)) {
    const std::string bytes = ReadFile(entry.path());
    const std::string blob = ToHex(Sha256Of(bytes));
    WriteFile(repo + "/blobs/" + blob, bytes);
    Symlink("../../blobs/" + blob, repo + "/snapshots/0123abcd/" + entry.path().filename().string());
  }
  WriteFile(repo + "/refs/main", "0123abcd");

  IndexReport report = IndexTree(src_.path());
  ASSERT_EQ(report.checkpoints.size(), 2u);
  const auto& snapshot = Find(report, "hub/models--org--name/snapshots/0123abcd");
  ASSERT_FALSE(snapshot.error) << *snapshot.error;
  EXPECT_EQ(snapshot.name, Find(report, "plain").name);
  EXPECT_EQ(snapshot.name, CoreutilsDigest(repo + "/snapshots/0123abcd"));
}

TEST_F(DigestTest, NestedCheckpointsEachGetTheirOwnDigest) {
  WriteModel(src_ / "run", {.seed = 7});
  WriteModel(src_ / "run/checkpoint-500", {.seed = 500});
  WriteModel(src_ / "run/checkpoint-500/deeper", {.seed = 501});
  WriteFile(src_ / "run/logs/train.log", "step 500\n");

  IndexReport report = IndexTree(src_.path());
  ASSERT_EQ(report.checkpoints.size(), 3u);
  const auto& run = Find(report, "run");
  const auto& step = Find(report, "run/checkpoint-500");
  const auto& deeper = Find(report, "run/checkpoint-500/deeper");
  EXPECT_NE(run.name, step.name);
  EXPECT_NE(step.name, deeper.name);
  // The parent's manifest keeps its own files (logs/ included) and leaves the nested one out.
  EXPECT_NE(run.manifest.find("  logs/train.log\n"), std::string::npos);
  EXPECT_EQ(run.manifest.find("checkpoint-500"), std::string::npos);
  EXPECT_EQ(step.manifest.find("deeper"), std::string::npos);
  // The plain coreutils command only holds for a checkpoint without nested
  // ones; checkpoint-500 has one, so it must differ there.
  EXPECT_NE(step.name, CoreutilsDigest(src_ / "run/checkpoint-500"));
  EXPECT_EQ(deeper.name, CoreutilsDigest(src_ / "run/checkpoint-500/deeper"));
}

TEST_F(DigestTest, SourceRootItselfCanBeTheCheckpoint) {
  WriteModel(src_.path(), {});
  IndexReport report = IndexTree(src_.path());
  ASSERT_EQ(report.checkpoints.size(), 1u);
  EXPECT_EQ(report.checkpoints[0].rel_path, "");
  EXPECT_EQ(report.checkpoints[0].name, CoreutilsDigest(src_.path()));
}

TEST_F(DigestTest, EveryWeightSuffixMakesACheckpoint) {
  for (const char* name : {"a.safetensors", "b.bin", "c.pt", "d.pth", "e.ckpt", "f.gguf"}) {
    WriteFile(src_ / std::string("dir-") + name + "/" + name, name);
  }
  WriteFile(src_ / "not/weights.txt", "x");
  WriteFile(src_ / "not/safetensors", "x");
  WriteFile(src_ / "not/.bin", "x");
  IndexReport report = IndexTree(src_.path());
  EXPECT_EQ(report.checkpoints.size(), 6u);
}

}  // namespace
}  // namespace ckptfs::testing
