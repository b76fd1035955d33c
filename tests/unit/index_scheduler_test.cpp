// The IndexScheduler: many checkpoints indexed at once, each with a fair
// share of the workers; files two jobs need hashed once; cancelled jobs never
// reported.
#include "ckptfs/index_scheduler.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "mounted_ckptfs.h"
#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

// The reports of the jobs a test submitted, as they come.
class Reports {
 public:
  IndexScheduler::Done For(const std::string& name) {
    return [this, name](IndexReport r) {
      std::lock_guard lock(mu_);
      done_[name] = std::move(r);
      cv_.notify_all();
    };
  }
  bool WaitFor(const std::string& name, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_.count(name) > 0; });
  }
  bool Has(const std::string& name) {
    std::lock_guard lock(mu_);
    return done_.count(name) > 0;
  }
  IndexReport Get(const std::string& name) {
    std::lock_guard lock(mu_);
    return done_.at(name);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, IndexReport> done_;
};

std::shared_ptr<const CatalogScan> ScanOf(const std::string& root) {
  return std::make_shared<const CatalogScan>(ScanOk(root));
}

// The part of `scan` that is checkpoint `rel`.
std::shared_ptr<const CatalogScan> Only(const CatalogScan& scan, const std::string& rel) {
  auto s = std::make_shared<CatalogScan>();
  s->root = scan.root;
  s->real_root = scan.real_root;
  for (const auto& cp : scan.checkpoints) {
    if (cp.rel_path == rel) s->checkpoints.push_back(cp);
  }
  return s;
}

class IndexSchedulerTest : public ::testing::Test {
 protected:
  TempDir src_{"ckptfs-src"};
  TempDir state_{"ckptfs-state"};
  std::unique_ptr<Index> index_ = OpenIndex(state_.path());
  Reports reports_;
};

// Issue 21 item 4: with one worker, a checkpoint submitted while a 64 GiB
// sparse file (minutes of SHA-256) is being hashed is indexed meanwhile: the
// large file yields between chunks, and moves on (its progress shows).
TEST_F(IndexSchedulerTest, ASmallCheckpointIsIndexedWhileAHugeFileIsHashedOnTheOnlyWorker) {
  MakeDirs(src_ / "big/m");
  const int fd = ::open((src_ / "big/m/model.bin").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(64ull << 30)), 0);
  ::close(fd);
  WriteFile(src_ / "small/m/model.bin", RandomBytes(1000, 1));
  IndexScheduler scheduler(index_.get(), 1);
  const auto big = scheduler.Submit(ScanOf(src_ / "big"), {}, reports_.For("big"));
  auto hashing = [&] {
    auto p = scheduler.ProgressOf(big);
    return p && p->hashing.size() == 1 && p->hashing[0].path == "model.bin" && p->hashing[0].done > 0 ? p->hashing[0].done
                                                                                                         : uint64_t{0};
  };
  ASSERT_TRUE(WaitFor([&] { return hashing() > 0; }, std::chrono::seconds(60)));
  scheduler.Submit(ScanOf(src_ / "small"), {}, reports_.For("small"));
  ASSERT_TRUE(reports_.WaitFor("small"));
  EXPECT_FALSE(reports_.Has("big"));
  const IndexReport report = reports_.Get("small");
  const auto& small = report.checkpoints.at(0);
  ASSERT_FALSE(small.error) << *small.error;
  EXPECT_EQ(small.name, CoreutilsDigest(src_ / "small/m"));
  const uint64_t then = hashing();
  EXPECT_TRUE(WaitFor([&] { return hashing() > then; }, std::chrono::seconds(60))) << "the large file stopped";
  EXPECT_EQ(scheduler.ProgressOf(big)->bytes_total, 64ull << 30);
  scheduler.Cancel(big);
  EXPECT_FALSE(scheduler.ProgressOf(big));
  scheduler.Stop();
  EXPECT_FALSE(reports_.Has("big"));  // cancelled: never reported
}

// Found attacking the daemon as a writer of one directory: two thousand
// checkpoints of one sparse 1 TiB file each (seconds to make, no disk) were
// all begun at once, each holding its tables so far, and the daemon grew
// past 8 GB. An owner has at most twice the workers' number of large files
// begun; the rest of its files wait, and another owner's are hashed
// meanwhile. The count goes back down as files end (cancelled here). And
// the jobs of one source root hold one descriptor of it between them, not
// one each (2040 descriptors for 2000 checkpoints, in that attack).
TEST_F(IndexSchedulerTest, AnOwnerHasAtMostTwiceTheWorkersLargeFilesBegun) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give the files another owner";
  constexpr int kCheckpoints = 10;
  constexpr uid_t kWriter = 2101;
  auto sparse = [&](const std::string& dir) {
    MakeDirs(dir);
    const int fd = ::open((dir + "/model.bin").c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(64ull << 30)), 0);
    ASSERT_EQ(::fchown(fd, kWriter, kWriter), 0);
    ::close(fd);
  };
  for (int i = 0; i <= kCheckpoints; ++i) sparse(src_ / ("w" + std::to_string(i) + "/m"));
  WriteFile(src_ / "root/m/model.bin", RandomBytes(9 << 20, 2));  // root's, large too
  const auto scan = ScanOf(src_.path());                          // a job per checkpoint, as the daemon submits them
  IndexScheduler scheduler(index_.get(), 2);
  std::vector<IndexScheduler::JobId> jobs;
  for (int i = 0; i < kCheckpoints; ++i) {
    const std::string name = "w" + std::to_string(i);
    jobs.push_back(scheduler.Submit(Only(*scan, name + "/m"), {}, reports_.For(name)));
  }
  auto descriptors_of_root = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      if (std::filesystem::read_symlink(e.path(), ec) == std::filesystem::path(scan->real_root)) ++n;
    }
    return n;
  };
  EXPECT_EQ(descriptors_of_root(), 1u);
  // Begun files, and the bytes hashed of them, over every job.
  auto begun = [&] {
    std::pair<size_t, uint64_t> sum{0, 0};
    for (auto id : jobs) {
      auto p = scheduler.ProgressOf(id);
      if (!p) continue;
      sum.first += p->hashing.size();
      for (const auto& f : p->hashing) sum.second += f.done;
    }
    return sum;
  };
  // Enough hashing for many turns (a turn is at least 50 ms of one file,
  // about 70 MB here): every job has had its turn several times over.
  ASSERT_TRUE(WaitFor([&] { return begun().second > (4ull << 30); }, std::chrono::seconds(120)));
  EXPECT_EQ(begun().first, 4u) << "files begun of one owner, with two workers";
  // Another owner's large file is hashed meanwhile.
  scheduler.Submit(Only(*scan, "root/m"), {}, reports_.For("root"));
  ASSERT_TRUE(reports_.WaitFor("root"));
  ASSERT_FALSE(reports_.Get("root").checkpoints.at(0).error);
  EXPECT_EQ(reports_.Get("root").checkpoints.at(0).name, CoreutilsDigest(src_ / "root/m"));
  EXPECT_LE(begun().first, 4u);
  // Cancelled, its files end, and the owner's next file begins.
  for (auto id : jobs) scheduler.Cancel(id);
  const auto last = scheduler.Submit(Only(*scan, "w" + std::to_string(kCheckpoints) + "/m"), {}, reports_.For("last"));
  EXPECT_TRUE(WaitFor(
      [&] {
        auto p = scheduler.ProgressOf(last);
        return p && p->hashing.size() == 1 && p->hashing[0].done > 0;
      },
      std::chrono::seconds(60)));
  scheduler.Stop();
}

// Two checkpoints that share a file (links into one blob, as a hub cache's
// revisions do), indexed at once: the file is read once, for both.
TEST_F(IndexSchedulerTest, AFileTwoJobsNeedIsHashedOnceForBoth) {
  WriteFile(src_ / "blobs/w", RandomBytes(3 * kChunkSize, 2));
  Symlink("../blobs/w", src_ / "a/model.safetensors");
  Symlink("../blobs/w", src_ / "b/model.safetensors");
  const CatalogScan scan = ScanOk(src_.path());
  const uint64_t opened = FileHasher::files_opened();
  {
    IndexScheduler scheduler(index_.get(), 2);
    scheduler.Submit(Only(scan, "a"), {}, reports_.For("a"));
    scheduler.Submit(Only(scan, "b"), {}, reports_.For("b"));
    ASSERT_TRUE(reports_.WaitFor("a") && reports_.WaitFor("b"));
  }
  EXPECT_EQ(FileHasher::files_opened() - opened, 1u);
  const auto a = reports_.Get("a").checkpoints.at(0), b = reports_.Get("b").checkpoints.at(0);
  ASSERT_FALSE(a.error || b.error);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.name, CoreutilsDigest(src_ / "a"));
}

// A file whose bytes failed a check behind an intact stamp is forgotten by
// the index, and the rescan after it must read it again: what was hashed
// lately of it (kept for jobs whose lookups raced a hash) is dropped too.
// Left there, the old hashes came back, and the copy with them.
TEST_F(IndexSchedulerTest, AFileTheIndexForgotIsHashedAgainNotTakenFromWhatWasHashedLately) {
  WriteFile(src_ / "m/model.bin", RandomBytes(kChunkSize + 1, 3));
  struct stat st;
  ASSERT_EQ(::stat((src_ / "m/model.bin").c_str(), &st), 0);
  IndexScheduler scheduler(index_.get(), 1);
  auto index_again = [&](const std::string& name, bool forget_recent) {
    EXPECT_TRUE(index_->ForgetFile(st.st_dev, st.st_ino).ok());
    if (forget_recent) scheduler.ForgetRecent(st.st_dev, st.st_ino);
    const uint64_t opened = FileHasher::files_opened();
    scheduler.Submit(ScanOf(src_ / "m"), {}, reports_.For(name));
    EXPECT_TRUE(reports_.WaitFor(name));
    return FileHasher::files_opened() - opened;
  };
  scheduler.Submit(ScanOf(src_ / "m"), {}, reports_.For("first"));
  ASSERT_TRUE(reports_.WaitFor("first"));
  EXPECT_EQ(index_again("taken from the recent hashes", false), 0u);  // what the fix is for
  EXPECT_EQ(index_again("read again", true), 1u);
}

// A job cancelled while the file it shares with another is being hashed is
// never reported; the file is still hashed, once, for the other.
TEST_F(IndexSchedulerTest, ACancelledJobIsNeverReportedAndTheFileItSharedIsStillHashedForTheOther) {
  WriteFile(src_ / "blobs/w", RandomBytes(6 * kChunkSize, 3));
  Symlink("../blobs/w", src_ / "a/model.bin");
  Symlink("../blobs/w", src_ / "b/model.bin");
  const CatalogScan scan = ScanOk(src_.path());
  std::atomic<bool> reached{false}, released{false};
  IndexerOptions held;  // a's first chunk waits for the test
  held.chunk_read_hook = [&](const std::string&, uint64_t i) {
    if (i != 0) return;
    reached = true;
    while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  const uint64_t opened = FileHasher::files_opened();
  IndexScheduler scheduler(index_.get(), 2);
  const auto a = scheduler.Submit(Only(scan, "a"), held, reports_.For("a"));
  ASSERT_TRUE(WaitFor([&] { return reached.load(); }));
  const auto b = scheduler.Submit(Only(scan, "b"), {}, reports_.For("b"));
  // b waits for the file a is hashing.
  ASSERT_TRUE(WaitFor([&] {
    auto p = scheduler.ProgressOf(b);
    return p && p->hashing.size() == 1;
  }));
  scheduler.Cancel(a);
  released = true;
  ASSERT_TRUE(reports_.WaitFor("b"));
  const IndexReport report = reports_.Get("b");
  ASSERT_FALSE(report.checkpoints.at(0).error) << *report.checkpoints.at(0).error;
  EXPECT_EQ(report.checkpoints.at(0).name, CoreutilsDigest(src_ / "b"));
  EXPECT_EQ(FileHasher::files_opened() - opened, 1u);
  scheduler.Stop();
  EXPECT_FALSE(reports_.Has("a"));
}

}  // namespace
}  // namespace ckptfs::testing
