// The SQLite index: reuse across runs, selective re-hashing, repair.
#include "ckptfs/index.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "ckptfs/file_hasher.h"
#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

class IndexTest : public ::testing::Test {
 protected:
  IndexReport Run() {
    auto index = OpenIndex(state_.path());
    return Indexer(index.get(), {}).Run(ScanOk(src_.path()));
  }
  TempDir src_{"ckptfs-src"};
  TempDir state_{"ckptfs-state"};
};

TEST_F(IndexTest, SecondRunOverUnchangedTreeOpensNoFile) {
  WriteModel(src_ / "a", {.seed = 1});
  WriteModel(src_ / "b", {.seed = 2});
  IndexReport first = Run();
  EXPECT_EQ(first.files_hashed, 10u);
  EXPECT_EQ(first.files_from_index, 0u);

  const uint64_t opened_before = FileHasher::files_opened();
  IndexReport second = Run();
  EXPECT_EQ(FileHasher::files_opened(), opened_before);  // not one member opened
  EXPECT_EQ(second.files_hashed, 0u);
  EXPECT_EQ(second.files_from_index, 10u);
  EXPECT_EQ(Find(second, "a").name, Find(first, "a").name);
  EXPECT_EQ(Find(second, "b").name, Find(first, "b").name);
}

TEST_F(IndexTest, TouchingOneFileRehashesOnlyThatFile) {
  WriteModel(src_ / "a", {});
  IndexReport first = Run();
  ASSERT_EQ(first.files_hashed, 5u);
  ASSERT_EQ(::utimensat(AT_FDCWD, (src_ / "a/config.json").c_str(), nullptr, 0), 0);  // touch
  IndexReport second = Run();
  EXPECT_EQ(second.files_hashed, 1u);
  EXPECT_EQ(second.files_from_index, 4u);
  EXPECT_EQ(Find(second, "a").name, Find(first, "a").name);  // same bytes, same name

  WriteFile(src_ / "a/config.json", "{\"changed\": true}\n");
  IndexReport third = Run();
  EXPECT_EQ(third.files_hashed, 1u);
  EXPECT_NE(Find(third, "a").name, Find(first, "a").name);
  EXPECT_EQ(Find(third, "a").name, CoreutilsDigest(src_ / "a"));
}

TEST_F(IndexTest, RecordsCheckpointManifestAndSource) {
  WriteModel(src_ / "a", {});
  IndexReport report = Run();
  auto index = OpenIndex(state_.path());
  const auto& a = Find(report, "a");
  EXPECT_EQ(*index->LookupManifest(a.name), a.manifest);
  EXPECT_EQ(*index->LookupSource(ScanOk(src_.path()).real_root, "a"), a.name);
}

TEST_F(IndexTest, CorruptIndexIsSetAsideAndRebuilt) {
  WriteModel(src_ / "a", {});
  const std::string name = Find(Run(), "a").name;
  // Overwrite the middle of the database with garbage.
  const std::string db = state_ / "index.db";
  {
    auto index = OpenIndex(state_.path());  // checkpoint the WAL into the main file first
  }
  std::string bytes = ReadFile(db);
  ASSERT_GT(bytes.size(), 4096u);
  for (size_t i = 100; i < bytes.size(); i += 7) bytes[i] = static_cast<char>(i * 31);
  WriteFile(db, bytes);

  std::vector<std::string> warnings;
  auto index = Index::Open(state_.path(), &warnings);
  ASSERT_TRUE(index.ok()) << index.status().message();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("moved it aside"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(db), std::string::npos);
  index->reset();
  // A rebuilt index answers correctly.
  IndexReport again = Run();
  EXPECT_EQ(again.files_hashed, 5u);
  EXPECT_EQ(Find(again, "a").name, name);
  size_t aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(state_.path())) {
    if (e.path().filename().string().rfind("index.db.bad-", 0) == 0) ++aside;
  }
  EXPECT_GE(aside, 1u);
}

TEST_F(IndexTest, NonDatabaseFileIsSetAside) {
  WriteFile(state_ / "index.db", std::string(8192, 'x'));
  std::vector<std::string> warnings;
  auto index = Index::Open(state_.path(), &warnings);
  ASSERT_TRUE(index.ok()) << index.status().message();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("not a database"), std::string::npos) << warnings[0];
}

TEST_F(IndexTest, ForeignSqliteDatabaseIsSetAside) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_ / "index.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE files(x); INSERT INTO files VALUES (1);", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  std::vector<std::string> warnings;
  auto index = Index::Open(state_.path(), &warnings);
  ASSERT_TRUE(index.ok()) << index.status().message();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("foreign"), std::string::npos) << warnings[0];
}

TEST_F(IndexTest, MalformedRowIsNotTrusted) {
  WriteModel(src_ / "a", {});
  Run();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_ / "index.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE files SET chunks = x'00'", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  IndexReport again = Run();
  EXPECT_EQ(again.files_hashed, 5u);  // every row refused and re-hashed
  EXPECT_EQ(Find(again, "a").name, CoreutilsDigest(src_ / "a"));
}

// A row keeps the chain taken with its SHA-256 (ChunkChain), under the
// row's sum: a chain changed on disk makes the row absent, and its file is
// hashed again rather than checked against it.
TEST_F(IndexTest, ARowKeepsItsChainUnderItsSum) {
  const std::string big = src_ / "a/model.bin";
  WriteFile(src_ / "a/config.json", "{}");
  WriteFile(big, RandomBytes(2 * kChunkSize + 9, 5));
  ASSERT_EQ(Run().files_hashed, 2u);
  struct stat st;
  ASSERT_EQ(::stat(big.c_str(), &st), 0);
  {
    auto index = OpenIndex(state_.path());
    auto row = index->LookupInode(st.st_dev, st.st_ino);
    ASSERT_TRUE(row.ok() && *row);
    auto hashed = FileHasher(nullptr).Hash(big, FileStamp::FromStat(st));
    ASSERT_TRUE(hashed.ok() && hashed->chain);
    ASSERT_EQ(hashed->chain->size(), 2u);
    EXPECT_EQ((*row)->hashes.chain, hashed->chain);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_ / "index.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "UPDATE files SET chain = zeroblob(64) WHERE length(chain) = 64", nullptr, nullptr, nullptr),
      SQLITE_OK);
  EXPECT_EQ(sqlite3_changes(db), 1);
  sqlite3_close(db);
  EXPECT_EQ(Run().files_hashed, 1u);
}

// An index written before the chain (no `chain` columns) gets the columns
// on open and keeps every row: an upgrade hashes nothing again, and a chain
// is unknown until its file is hashed again. The rows' sums are those that
// index wrote: a row's sum does not cover its chain, which has its own.
TEST_F(IndexTest, AnIndexFromBeforeTheChainKeepsEveryRow) {
  WriteModel(src_ / "a", {});
  WriteFile(src_ / "a/extra.bin", RandomBytes(kChunkSize + 3, 6));
  const IndexReport first = Run();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_ / "index.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE files DROP COLUMN chain; ALTER TABLE files DROP COLUMN chain_sum", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);

  const IndexReport again = Run();
  EXPECT_EQ(again.files_hashed, 0u);
  EXPECT_EQ(again.files_from_index, first.files_hashed);
  EXPECT_EQ(Find(again, "a").name, Find(first, "a").name);
  struct stat st;
  ASSERT_EQ(::stat((src_ / "a/extra.bin").c_str(), &st), 0);
  auto row = OpenIndex(state_.path())->LookupInode(st.st_dev, st.st_ino);
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_FALSE((*row)->hashes.chain.has_value());
}

// The other way: a daemon from before the chain reads a row written with
// one as its own (its sum is the same as without the chain), rather than
// taking it for damaged and hashing the file again after a downgrade.
TEST_F(IndexTest, ARowsSumIsTheSameWithOrWithoutItsChain) {
  const std::string path = src_ / "a/model.bin";
  WriteFile(path, RandomBytes(2 * kChunkSize + 1, 8));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  auto hashes = FileHasher(nullptr).Hash(path, FileStamp::FromStat(st));
  ASSERT_TRUE(hashes.ok() && hashes->chain);
  auto row_sum = [&](const FileHashes& h) {
    EXPECT_TRUE(OpenIndex(state_.path())->PutFile(FileStamp::FromStat(st), path, h).ok());
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open((state_ / "index.db").c_str(), &db), SQLITE_OK);
    sqlite3_stmt* q = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT hex(row_sum) FROM files", -1, &q, nullptr), SQLITE_OK);
    EXPECT_EQ(sqlite3_step(q), SQLITE_ROW);
    const std::string sum = reinterpret_cast<const char*>(sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(db);
    return sum;
  };
  FileHashes without = *hashes;
  without.chain.reset();
  EXPECT_EQ(row_sum(*hashes), row_sum(without));
}

// A chain proven by a pass over the whole file goes only into a row of
// that very stamp and SHA-256 that has none.
TEST_F(IndexTest, AChainIsAddedOnlyToItsOwnRowWithoutOne) {
  const std::string path = src_ / "a/model.bin";
  const std::string bytes = RandomBytes(2 * kChunkSize + 1, 9);
  WriteFile(path, bytes);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const FileStamp stamp = FileStamp::FromStat(st);
  auto hashes = FileHasher(nullptr).Hash(path, stamp);
  ASSERT_TRUE(hashes.ok() && hashes->chain);
  FileHashes without = *hashes;
  without.chain.reset();
  auto index = OpenIndex(state_.path());
  ASSERT_TRUE(index->PutFile(stamp, path, without).ok());
  auto chain_of_row = [&] { return (*index->LookupInode(st.st_dev, st.st_ino))->hashes.chain; };

  FileStamp other_stamp = stamp;
  other_stamp.mtime_ns += 1;
  ASSERT_TRUE(index->AddChain(other_stamp, hashes->sha256, *hashes->chain).ok());
  ASSERT_TRUE(index->AddChain(stamp, Sha256Of(std::string_view("other bytes")), *hashes->chain).ok());
  EXPECT_FALSE(chain_of_row().has_value());
  EXPECT_FALSE(index->AddChain(stamp, hashes->sha256, ChunkChain(1)).ok());  // a chain of another length
  EXPECT_FALSE(chain_of_row().has_value());

  ASSERT_TRUE(index->AddChain(stamp, hashes->sha256, *hashes->chain).ok());
  EXPECT_EQ(chain_of_row(), hashes->chain);
  ASSERT_TRUE(index->AddChain(stamp, hashes->sha256, ChunkChain(2)).ok());  // it has one: kept
  EXPECT_EQ(chain_of_row(), hashes->chain);
}

TEST_F(IndexTest, UnwritableStateDirectoryFailsClearly) {
  WriteFile(state_ / "file", "x");
  auto index = Index::Open(state_ / "file/sub", nullptr);
  ASSERT_FALSE(index.ok());
  EXPECT_NE(index.status().message().find(state_ / "file"), std::string::npos) << index.status().message();
}

}  // namespace
}  // namespace ckptfs::testing
