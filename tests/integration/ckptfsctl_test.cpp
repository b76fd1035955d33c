// ckptfsctl as a user runs it: real binaries, real files, real exit codes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckptfs/file_hasher.h"
#include "ckptfs/file_stamp.h"
#include "ckptfs/index.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

const std::string kCtl = CKPTFSCTL_PATH;

FileStamp StampOf(const std::string& path) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  return FileStamp::FromStat(st);
}

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override { ::chmod(tmp_.path().c_str(), 0755); }  // so setpriv'd users can enter
  std::string Ctl(const std::string& args) { return kCtl + " --state " + ShellQuote(state_) + " " + args; }
  // Rows in the index's files table now, read as another process would
  // while an indexer writes (WAL: the committed rows); 0 before it exists.
  int64_t IndexedFiles() const {
    sqlite3* db = nullptr;
    int64_t rows = 0;
    if (sqlite3_open_v2((state_ + "/index.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      sqlite3_stmt* st = nullptr;
      if (sqlite3_prepare_v2(db, "SELECT count(*) FROM files", -1, &st, nullptr) == SQLITE_OK &&
          sqlite3_step(st) == SQLITE_ROW) {
        rows = sqlite3_column_int64(st, 0);
      }
      sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return rows;
  }
  // Bytes process `pid` has read so far (rchar of /proc/PID/io: page cache
  // included).
  static uint64_t BytesReadBy(pid_t pid) {
    std::ifstream io("/proc/" + std::to_string(pid) + "/io");
    std::string key;
    uint64_t value = 0;
    while (io >> key >> value) {
      if (key == "rchar:") return value;
    }
    return 0;
  }
  TempDir tmp_{"ckptfs-ctl"};
  std::string src_ = tmp_ / "src";
  std::string state_ = tmp_ / "state";
};

TEST_F(CtlTest, DigestOfDemoTreeMatchesCoreutilsForEveryCheckpoint) {
  ASSERT_EQ(RunCommand(std::string(MAKE_DEMO_TREE_PATH) + " " + src_).exit_code, 0);
  CommandResult r = RunCommand(Ctl("digest " + src_), /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::string expected;
  for (const char* rel : {"base", "base-copy", "finetune", "run7", "run7/checkpoint-1000", "run7/checkpoint-500"}) {
    const std::string nested = std::string(rel) == "run7" ? "checkpoint-*" : "";
    expected += CoreutilsDigest(src_ + "/" + rel, nested) + "  " + src_ + "/" + rel + "\n";
  }
  EXPECT_EQ(r.out, expected);
  EXPECT_NE(CoreutilsDigest(src_ + "/base"), CoreutilsDigest(src_ + "/finetune"));
}

TEST_F(CtlTest, ManifestPipedToSha256sumIsTheDigest) {
  WriteModel(src_, {});
  WriteFile(src_ + "/sub/extra.txt", "x");
  CommandResult manifest = RunCommand(Ctl("digest --manifest " + src_) + " | sha256sum");
  ASSERT_EQ(manifest.exit_code, 0);
  EXPECT_EQ("sha256-" + manifest.out.substr(0, 64), CoreutilsDigest(src_));
  CommandResult lines = RunCommand(Ctl("digest --manifest " + src_));
  EXPECT_NE(lines.out.find("  sub/extra.txt\n"), std::string::npos) << lines.out;
}

TEST_F(CtlTest, JsonListsFilesSizesAndHashes) {
  WriteModel(src_ + "/m", {});
  CommandResult r = RunCommand(Ctl("digest --json " + src_));
  ASSERT_EQ(r.exit_code, 0);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["checkpoints"].size(), 1u);
  const auto& cp = j["checkpoints"][0];
  EXPECT_EQ(cp["name"], CoreutilsDigest(src_ + "/m"));
  EXPECT_EQ(cp["valid"], true);
  ASSERT_EQ(cp["files"].size(), 5u);
  const auto& first = cp["files"][0];
  EXPECT_EQ(first["path"], "config.json");
  EXPECT_EQ(first["size"].get<uint64_t>(), ReadFile(src_ + "/m/config.json").size());
  EXPECT_EQ(first["sha256"], RunCommand("sha256sum " + src_ + "/m/config.json").out.substr(0, 64));
}

TEST_F(CtlTest, EmptyTreeSaysSoAndFails) {
  MakeDirs(src_ + "/nothing");
  CommandResult r = RunCommand(Ctl("digest " + src_), true);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.out.find("no checkpoints found under " + src_), std::string::npos) << r.out;
}

TEST_F(CtlTest, MissingSourceNamesPathAndCause) {
  CommandResult r = RunCommand(Ctl("digest " + tmp_ / "absent"), true);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.out.find(tmp_ / "absent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No such file or directory"), std::string::npos) << r.out;
}

TEST_F(CtlTest, BadLinksAreReportedAndTheRestGoOn) {
  WriteModel(src_ + "/good", {});
  WriteModel(src_ + "/escapes", {});
  Symlink("/etc/hostname", src_ + "/escapes/notes.txt");
  WriteModel(src_ + "/dangles", {});
  Symlink("missing.bin", src_ + "/dangles/extra.json");
  CommandResult r = RunCommand(Ctl("digest " + src_) + " 2>" + tmp_ / "err");
  std::string err = ReadFile(tmp_ / "err");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, CoreutilsDigest(src_ + "/good") + "  " + src_ + "/good\n");
  EXPECT_NE(err.find("invalid checkpoint " + src_ + "/escapes: symlink '"), std::string::npos) << err;
  EXPECT_NE(err.find("resolves outside the source root"), std::string::npos) << err;
  EXPECT_NE(err.find("invalid checkpoint " + src_ + "/dangles: dangling symlink"), std::string::npos) << err;
}

TEST_F(CtlTest, UnreadableMemberInvalidatesOnlyItsCheckpoint) {
  WriteModel(src_ + "/good", {});
  WriteModel(src_ + "/locked", {});
  RunCommand("chmod -R a+rX " + src_);
  ::chmod((src_ + "/locked/config.json").c_str(), 0600);  // root's, not nobody's
  MakeDirs(tmp_ / "nobody-state");
  ASSERT_EQ(::chown((tmp_ / "nobody-state").c_str(), 65534, 65534), 0);
  CommandResult r = RunCommand("setpriv --reuid=65534 --regid=65534 --clear-groups " + kCtl + " --state " +
                                   tmp_ / "nobody-state" + " digest " + src_,
                               true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("invalid checkpoint " + src_ + "/locked: cannot open " + src_ + "/locked/config.json: "
                       "Permission denied"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(CoreutilsDigest(src_ + "/good") + "  " + src_ + "/good"), std::string::npos) << r.out;
}

TEST_F(CtlTest, UnreadableSourceFails) {
  WriteModel(src_ + "/m", {});
  ::chmod(src_.c_str(), 0700);
  MakeDirs(tmp_ / "nobody-state");
  ASSERT_EQ(::chown((tmp_ / "nobody-state").c_str(), 65534, 65534), 0);
  CommandResult r = RunCommand("setpriv --reuid=65534 --regid=65534 --clear-groups " + kCtl + " --state " +
                                   tmp_ / "nobody-state" + " digest " + src_,
                               true);
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find(src_), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Permission denied"), std::string::npos) << r.out;
}

TEST_F(CtlTest, NewlineInNameIsReported) {
  WriteModel(src_ + "/m", {});
  WriteFile(src_ + "/m/bad\nname.txt", "x");
  CommandResult r = RunCommand(Ctl("digest " + src_), true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("member name contains a newline: '" + src_ + "/m/bad\\nname.txt'"), std::string::npos)
      << r.out;
}

TEST_F(CtlTest, UnwritableStateDirectoryFails) {
  WriteModel(src_ + "/m", {});
  WriteFile(tmp_ / "plainfile", "x");
  CommandResult r = RunCommand(kCtl + " --state " + tmp_ / "plainfile/state digest " + src_, true);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.out.find(tmp_ / "plainfile"), std::string::npos) << r.out;
}

TEST_F(CtlTest, UsageErrorsExitTwo) {
  EXPECT_EQ(RunCommand(kCtl + " digest --bogus x", true).exit_code, 2);
  EXPECT_EQ(RunCommand(kCtl + " --symlinks sometimes digest x", true).exit_code, 2);
  EXPECT_EQ(RunCommand(kCtl, true).exit_code, 2);
  CommandResult help = RunCommand(kCtl + " --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* word : {"digest", "verify", "--state", "--threads", "--symlinks", "Exit status"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
  }
}

TEST_F(CtlTest, NothingButResultsWhenStderrIsNotATerminal) {
  WriteModel(src_ + "/m", {});
  WriteFile(src_ + "/m/big.bin", RandomBytes(64 << 20, 1));
  CommandResult r = RunCommand(Ctl("digest " + src_) + " 2>" + tmp_ / "err");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(ReadFile(tmp_ / "err"), "");
}

TEST_F(CtlTest, VerboseReportsIndexReuse) {
  WriteModel(src_ + "/m", {});
  RunCommand(Ctl("digest " + src_));
  CommandResult r = RunCommand(Ctl("digest -v " + src_) + " 2>&1 >/dev/null");
  EXPECT_NE(r.out.find("hashed 0 file(s), 0 B; 5 file(s) from the index"), std::string::npos) << r.out;
}

TEST_F(CtlTest, VerifyReportsFilesThatNoLongerMatchTheIndex) {
  WriteModel(src_ + "/m", {});
  ASSERT_EQ(RunCommand(Ctl("digest " + src_)).exit_code, 0);
  CommandResult clean = RunCommand(Ctl("verify " + src_), true);
  EXPECT_EQ(clean.exit_code, 0) << clean.out;
  EXPECT_NE(clean.out.find("5 match the index, 0 do not"), std::string::npos) << clean.out;

  // Content that changed behind an intact stamp (bit rot): make the index
  // disagree with the bytes while the stamp stays as recorded.
  {
    auto index = Index::Open(state_, nullptr);
    ASSERT_TRUE(index.ok()) << index.status().message();
    const FileStamp config = StampOf(src_ + "/m/config.json");
    auto found = (*index)->LookupInode(config.dev, config.ino);
    ASSERT_TRUE(found.ok()) << found.status().message();
    auto& stored = *found;
    ASSERT_TRUE(stored.has_value());
    stored->hashes.sha256.fill(0);
    ASSERT_TRUE((*index)->PutFile(stored->stamp, stored->path, stored->hashes).ok());
  }
  // And a file really modified since it was indexed.
  ZeroTensor(src_ + "/m/model-00002-of-00002.safetensors", 0);

  CommandResult r = RunCommand(Ctl("verify " + src_), true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("MISMATCH    " + src_ + "/m/config.json: content changed although its stamp did not"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("CHANGED     " + src_ + "/m/model-00002-of-00002.safetensors: modified since it was indexed"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("3 match the index, 2 do not"), std::string::npos) << r.out;
}

// A row edited behind the index's back (here: its SHA-256 zeroed, as damage
// or a careless hand would) fails its row checksum: the file is hashed again
// and the checkpoint keeps the digest of its real bytes.
TEST_F(CtlTest, DamagedIndexRowIsDetectedAndTheFileHashedAgain) {
  WriteModel(src_ + "/m", {});
  ASSERT_EQ(RunCommand(Ctl("digest " + src_)).exit_code, 0);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_ + "/index.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE files SET sha256 = zeroblob(32) WHERE path LIKE '%/config.json'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  CommandResult r = RunCommand(Ctl("digest -v " + src_), true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(CoreutilsDigest(src_ + "/m")), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hashed 1 file(s)"), std::string::npos) << r.out;
}

// kill -9 in the middle of indexing leaves an index that opens cleanly and
// holds only correct rows.
TEST_F(CtlTest, KillDashNineMidIndexLeavesACorrectIndex) {
  for (int i = 0; i < 150; ++i) {
    WriteFile(src_ + "/m/shard-" + std::to_string(1000 + i) + ".safetensors", RandomBytes(3 << 20, i));
  }
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(kCtl.c_str(), kCtl.c_str(), "--state", state_.c_str(), "--threads", "1", "digest", src_.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Killed in the middle of indexing with rows committed (a clean empty
  // index would prove nothing). Rows are committed once the oldest waiting
  // is a second old, and hashing this tree may take less: so the indexer is
  // stopped once it has read a few files, for longer than that second, and
  // killed as soon as it committed after it went on.
  const bool reading = WaitFor([&] { return BytesReadBy(pid) >= 8 * (3 << 20); }, std::chrono::seconds(60));
  ::kill(pid, SIGSTOP);
  const uint64_t read_when_stopped = BytesReadBy(pid);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the age that commits rows
  ::kill(pid, SIGCONT);
  const bool first_row = WaitFor([&] { return IndexedFiles() >= 1; }, std::chrono::seconds(60));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(reading) << "the indexer read nothing in 60 s";
  ASSERT_LT(read_when_stopped, uint64_t{150} * (3 << 20)) << "it had read everything when stopped";
  ASSERT_TRUE(first_row) << "no row was committed in 60 s";
  ASSERT_TRUE(WIFSIGNALED(status)) << "indexing finished before it could be killed";

  std::vector<std::string> warnings;
  auto index = Index::Open(state_, &warnings);
  ASSERT_TRUE(index.ok()) << index.status().message();
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  size_t rows = 0;
  for (int i = 0; i < 150; ++i) {
    const std::string path = src_ + "/m/shard-" + std::to_string(1000 + i) + ".safetensors";
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    auto found = (*index)->LookupFile(FileStamp::FromStat(st));
    ASSERT_TRUE(found.ok()) << found.status().message();
    if (const auto& stored = *found) {
      ++rows;
      EXPECT_EQ(stored->sha256, Sha256Of(ReadFile(path))) << path;
    }
  }
  RecordProperty("rows_before_kill", static_cast<int>(rows));
  EXPECT_GE(rows, 1u);  // what was committed before the kill is kept, and correct
  EXPECT_LT(rows, 150u);
  index->reset();
  CommandResult r = RunCommand(Ctl("digest " + src_));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, CoreutilsDigest(src_ + "/m") + "  " + src_ + "/m\n");
}

// The rows of small files are written in batches (one transaction for many):
// a kill -9 at any moment still leaves an index that opens cleanly and whose
// every row is right; what was not committed is hashed again.
TEST_F(CtlTest, KillDashNineAmidBatchedRowsOfSmallFilesLeavesACorrectIndex) {
  std::vector<std::string> paths;
  for (int c = 0; c < 300; ++c) {
    for (int i = 0; i < 10; ++i) {
      paths.push_back(src_ + "/step-" + std::to_string(c) + "/part-" + std::to_string(i) + ".bin");
      WriteFile(paths.back(), RandomBytes(4096, static_cast<uint64_t>(c * 10 + i)));
    }
  }
  size_t killed = 0;
  for (const int after_ms : {30, 100, 250, 500}) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl(kCtl.c_str(), kCtl.c_str(), "--state", state_.c_str(), "digest", src_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(after_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) ++killed;
    std::vector<std::string> warnings;
    auto index = Index::Open(state_, &warnings);
    ASSERT_TRUE(index.ok()) << index.status().message();
    EXPECT_TRUE(warnings.empty()) << warnings[0];
    for (const auto& path : paths) {
      auto found = (*index)->LookupFile(StampOf(path));
      ASSERT_TRUE(found.ok()) << found.status().message();
      if (*found) {
        EXPECT_EQ((*found)->sha256, Sha256Of(ReadFile(path))) << path;
      }
    }
  }
  EXPECT_GT(killed, 0u) << "every run finished before it could be killed; make the tree larger";
  CommandResult r = RunCommand(Ctl("digest " + src_ + "/step-7"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, CoreutilsDigest(src_ + "/step-7") + "  " + src_ + "/step-7\n");
}

}  // namespace
}  // namespace ckptfs::testing
