// The indexer: dedup across checkpoints, retries on change, bad members.
#include "ckptfs/indexer.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

class IndexerTest : public ::testing::Test {
 protected:
  TempDir src_{"ckptfs-src"};
  TempDir state_{"ckptfs-state"};
};

TEST_F(IndexerTest, FileSharedByLinksIsHashedOnce) {
  WriteFile(src_ / "blobs/w", RandomBytes(1000, 1));
  Symlink("../blobs/w", src_ / "a/model.safetensors");
  Symlink("../blobs/w", src_ / "b/model.safetensors");
  auto index = OpenIndex(state_.path());
  IndexReport r = Indexer(index.get(), {}).Run(ScanOk(src_.path()));
  EXPECT_EQ(r.files_hashed, 1u);
  EXPECT_EQ(Find(r, "a").name, Find(r, "b").name);
}

TEST_F(IndexerTest, FileChangedOnceWhileHashedIsRetriedAndRecordedAsItIsNow) {
  WriteModel(src_ / "a", {});
  const std::string victim = src_ / "a/model-00001-of-00002.safetensors";
  std::atomic<int> changes{0};
  IndexerOptions options;
  options.chunk_read_hook = [&](const std::string& path, uint64_t) {
    if (path.find("model-00001") != std::string::npos && changes++ == 0) ZeroTensor(victim, 0);
  };
  auto index = OpenIndex(state_.path());
  IndexReport r = Indexer(index.get(), options).Run(ScanOk(src_.path()));
  ASSERT_FALSE(Find(r, "a").error) << *Find(r, "a").error;
  EXPECT_EQ(changes.load(), 2);  // read twice
  EXPECT_EQ(Find(r, "a").name, CoreutilsDigest(src_ / "a"));  // the bytes as they are now
}

TEST_F(IndexerTest, FileThatKeepsChangingLeavesCheckpointUnsettledAndUnrecorded) {
  WriteModel(src_ / "a", {});
  WriteModel(src_ / "b", {.seed = 2});
  IndexerOptions options;
  options.chunk_read_hook = [&](const std::string& path, uint64_t) {
    if (path.find("/a/config.json") != std::string::npos) WriteFile(path, RandomBytes(100, 5));
  };
  auto index = OpenIndex(state_.path());
  IndexReport r = Indexer(index.get(), options).Run(ScanOk(src_.path()));
  const auto& a = Find(r, "a");
  ASSERT_TRUE(a.error);
  EXPECT_TRUE(a.unsettled);
  EXPECT_NE(a.error->find("config.json"), std::string::npos) << *a.error;
  EXPECT_FALSE(Find(r, "b").error);  // the rest go on
  struct stat st;
  ASSERT_EQ(::stat((src_ / "a/config.json").c_str(), &st), 0);
  EXPECT_FALSE(index->LookupInode(st.st_dev, st.st_ino)->has_value());  // nothing recorded for it
}

TEST_F(IndexerTest, IgnoreIndexReadsEverythingAndRecordsNothing) {
  WriteModel(src_ / "a", {});
  auto index = OpenIndex(state_.path());
  IndexerOptions options;
  options.ignore_index = true;
  IndexReport r = Indexer(index.get(), options).Run(ScanOk(src_.path()));
  EXPECT_EQ(r.files_hashed, 5u);
  EXPECT_FALSE(index->LookupSource(ScanOk(src_.path()).real_root, "a")->has_value());
}

// An index that fails under a running indexer (its files table dropped by
// another connection to the same SQLite file): a lookup fails with SQLite's
// reason and the index's path, and the indexer reports that per checkpoint
// instead of taking the index for empty and hashing everything again.
TEST_F(IndexerTest, AnIndexThatCannotBeReadIsAnErrorNotAnEmptyIndex) {
  WriteModel(src_ / "a", {});
  auto index = OpenIndex(state_.path());
  ASSERT_FALSE(Find(Indexer(index.get(), {}).Run(ScanOk(src_.path())), "a").error);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(index->path().c_str(), &other), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(other, "DROP TABLE files", nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(other);
  sqlite3_close(other);

  struct stat st;
  ASSERT_EQ(::stat((src_ / "a/config.json").c_str(), &st), 0);
  auto looked_up = index->LookupFile(FileStamp::FromStat(st));
  ASSERT_FALSE(looked_up.ok()) << "a failed query read as \"not indexed\"";
  EXPECT_NE(looked_up.status().message().find("no such table: files"), std::string::npos)
      << looked_up.status().message();
  EXPECT_NE(looked_up.status().message().find(index->path()), std::string::npos) << looked_up.status().message();

  IndexReport r = Indexer(index.get(), {}).Run(ScanOk(src_.path()));
  EXPECT_EQ(r.files_hashed, 0u) << "hashed again in silence, as if the index were empty";
  const auto& a = Find(r, "a");
  ASSERT_TRUE(a.error);
  EXPECT_NE(a.error->find("no such table: files"), std::string::npos) << *a.error;
}

TEST_F(IndexerTest, ProgressIsPlannedAndReported) {
  WriteModel(src_ / "a", {});
  uint64_t planned = 0;
  std::atomic<uint64_t> seen{0};
  IndexerOptions options;
  options.on_plan = [&](uint64_t total) { planned = total; };
  options.on_bytes = [&](uint64_t n) { seen += n; };
  auto index = OpenIndex(state_.path());
  IndexReport r = Indexer(index.get(), options).Run(ScanOk(src_.path()));
  EXPECT_EQ(planned, Find(r, "a").total_size);
  EXPECT_EQ(seen.load(), planned);
}

TEST_F(IndexerTest, LookupOnlyReadsNothingAndFlagsWhatTheIndexLacks) {
  WriteModel(src_ / "known", {.seed = 1});
  auto index = OpenIndex(state_.path());
  Indexer(index.get(), {}).Run(ScanOk(src_.path()));
  WriteModel(src_ / "new", {.seed = 2});
  IndexerOptions options;
  options.lookup_only = true;
  const uint64_t opened = FileHasher::files_opened();
  IndexReport r = Indexer(index.get(), options).Run(ScanOk(src_.path()));
  EXPECT_EQ(FileHasher::files_opened(), opened);
  EXPECT_FALSE(Find(r, "known").error);
  EXPECT_EQ(Find(r, "known").name, CoreutilsDigest(src_ / "known"));
  ASSERT_TRUE(Find(r, "new").error);
  EXPECT_TRUE(Find(r, "new").unindexed);
  EXPECT_FALSE(Find(r, "new").unsettled);
}

// A checkpoint whose files are all unknown to the index (a lookup before
// anything was hashed) names the first 8 files' errors and counts the rest:
// joined a file at a time, the reason of a checkpoint of 50,000 files took
// the scan minutes, while every other checkpoint waited behind it.
TEST_F(IndexerTest, ACheckpointsErrorNamesEightFilesAndCountsTheRest) {
  WriteFile(src_ / "many/model.bin", "w");
  for (int i = 0; i < 2000; ++i) WriteFile(src_ / ("many/f" + std::to_string(i) + ".json"), "{}");
  auto index = OpenIndex(state_.path());
  IndexerOptions options;
  options.lookup_only = true;
  IndexReport r = Indexer(index.get(), options).Run(ScanOk(src_.path()));
  ASSERT_TRUE(Find(r, "many").error);
  const std::string& error = *Find(r, "many").error;
  EXPECT_NE(error.find("; and 1993 more files"), std::string::npos) << error.substr(0, 2000);
  EXPECT_LT(error.size(), 8 * 1024u) << error.substr(0, 2000);
}

}  // namespace
}  // namespace ckptfs::testing
