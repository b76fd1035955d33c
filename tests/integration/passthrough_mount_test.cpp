// The host tier of whole files and kernel passthrough under a real mount:
// every file byte for byte through read, mmap and O_DIRECT with no read
// request reaching the daemon; seals on every backing memfd; a source
// changed in place under an open reader; the chunk path forced (option, no
// privilege) serving the same bytes; eviction under open readers; 16 readers
// over a host tier smaller than the data; fills that meet a changed or
// failing source.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <iostream>
#include <random>
#include <thread>

#include "ckptfs/index.h"
#include "ckptfs/sealed_copy.h"
#include "ckptfs/unique_fd.h"
#include "file_reads.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_binaries.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

nlohmann::json Ctl(const std::string& command, const std::string& mnt) { return QueryMount(kCtl, command, mnt); }
nlohmann::json Stats(const std::string& mnt) { return Ctl("stats", mnt); }
uint64_t Opens(const nlohmann::json& stats, const std::string& how) { return stats["opens"].value(how, uint64_t{0}); }
uint64_t PageBytes(uint64_t n) { return (n + 4095) / 4096 * 4096; }

// Bytes of `path` in the page cache (mincore of a mapping of it).
uint64_t ResidentBytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size == 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return 0;
  const size_t page = 4096, pages = (st.st_size + page - 1) / page;
  std::vector<unsigned char> in(pages);
  uint64_t resident = 0;
  if (::mincore(map, st.st_size, in.data()) == 0) {
    for (unsigned char c : in) resident += (c & 1) ? page : 0;
  }
  ::munmap(map, st.st_size);
  return resident;
}

void DropPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

class PassthroughMountTest : public MountFixture {
 public:  // also for the helpers that several tests share
  PassthroughMountTest() : MountFixture("ckptfs-pass") {}
  // The tests of fills at open mount with fill_on_index=off: by default every
  // file hashed at mount is resident before anything opens it.
  // Files are copied at their first open here, not as they are hashed,
  // unless a test says otherwise.
  std::unique_ptr<MountedCkptfs> Mount(std::string extra) {
    if (extra.find("fill_on_index=") == std::string::npos) extra += ",fill_on_index=off";
    return MountFixture::Mount(extra);
  }
  // Mounts and waits for by-name/m; skips the test on a kernel that gives no
  // passthrough (the fallback tests cover those).
  std::unique_ptr<MountedCkptfs> MountWithPassthrough(std::string extra) {
    auto m = Mount(extra);
    EXPECT_TRUE(WaitForLink("m")) << m->Log();
    const auto status = Ctl("status", mnt_);
    if (status["passthrough"]["mode"] != "on") {
      const std::string why = status["passthrough"]["reason"];
      EXPECT_EQ(why.find("CAP_SYS_ADMIN"), std::string::npos) << "the tests run as root: " << why;
      if (why.find("did not offer") != std::string::npos) skip_ = "this kernel has no FUSE passthrough: " + why;
    }
    return m;
  }
  bool WaitForLink(const std::string& name) {
    return WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/" + name); });
  }
  std::string DigestDir(const std::string& by_name) {
    return mnt_ + "/" + fs::read_symlink(mnt_ + "/by-name/" + by_name).filename().string();
  }
  // Files of awkward sizes: empty, one byte, one page less one, one chunk
  // exactly, several chunks and a tail, and a nested config.
  void WriteAwkwardTree(const std::string& cp) {
    const size_t sizes[] = {0, 1, 4095, 4 * kMiB, 13 * kMiB + 7};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      WriteFile(src_ + "/" + cp + "/shard-" + std::to_string(i) + ".safetensors", RandomBytes(sizes[i], 50 + i));
    }
    WriteFile(src_ + "/" + cp + "/tokenizer/config.json", R"({"model": "x"})");
  }
  // Every file of SRC/m, through the digest directory, by read, mmap and O_DIRECT.
  void ExpectEveryFileEqual() {
    size_t files = 0;
    EXPECT_EQ(CompareTree(src_ + "/m", DigestDir("m"), &files), "");
    EXPECT_EQ(files, 6u);
    for (int i = 0; i < 5; ++i) {
      const std::string rel = "/shard-" + std::to_string(i) + ".safetensors";
      EXPECT_TRUE(ReadDirect(DigestDir("m") + rel) == ReadFile(src_ + "/m" + rel)) << rel;
    }
  }

  std::string skip_;
};

#define SKIP_WITHOUT_PASSTHROUGH() \
  if (!skip_.empty()) GTEST_SKIP() << skip_

TEST_F(PassthroughMountTest, EveryFileByteForByteWithNoReadReachingTheDaemon) {
  WriteAwkwardTree("m");
  auto m = MountWithPassthrough("cache_size=256M");
  SKIP_WITHOUT_PASSTHROUGH();
  CommandResult pre = RunCommand(kCtl + " preload " + mnt_ + "/by-name/m", true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  const auto before = Stats(mnt_);
  EXPECT_EQ(before["passthrough"]["mode"], "on");
  EXPECT_EQ(before["tiers"]["host"]["files"], 6);
  ExpectEveryFileEqual();
  const auto after = Stats(mnt_);
  // 6 files by read and mmap, 5 by O_DIRECT. The two shards above
  // SealedCopy::kMemoryCopyMax (2 by read and mmap, 2 by O_DIRECT) pass
  // through and the daemon serves not a byte of them; the small files are
  // held in its memory (no memfd each) and served from there, never from
  // the source.
  EXPECT_EQ(Opens(after, "passthrough") - Opens(before, "passthrough"), 6u) << after.dump();
  // A small file's open is "held in memory", or joins the chunk path of
  // its previous open when that one's RELEASE (asynchronous) has not
  // reached the daemon yet: either way served from the daemon's memory.
  auto small_file_opens = [](const nlohmann::json& s) {
    return Opens(s, "chunk path: held in memory") +
           Opens(s, "chunk path: the file is open through the chunk path by another reader");
  };
  EXPECT_EQ(small_file_opens(after) - small_file_opens(before), 11u)
      << before["opens"].dump() << "\n" << after["opens"].dump();
  EXPECT_LE(after["bytes_served"].get<uint64_t>() - before["bytes_served"].get<uint64_t>(), 3u * (1 + 4095 + 16));
  EXPECT_EQ(after["source_bytes_read"], before["source_bytes_read"]);
  // The daemon asked for 2 MiB pages (shmem_huge=advise, the default) unless
  // the machine's setting already allowed or forbade them.
  const std::string thp = after["memory"]["huge_pages"]["shmem_enabled"];
  EXPECT_NE(thp, "never") << after["memory"].dump();
}

// The kernel may send the daemon 64 reads (read-ahead) at once, not its
// default 12: those are one queue for every user, so twelve read-aheads of
// one user's readers made another user's wait in the kernel, before the
// daemon's per-uid share of its source reads could see them (README,
// measured performance). Read where the kernel shows it: the connection's
// files in fusectl, mounted for the test under its own directory.
TEST_F(PassthroughMountTest, TheKernelMaySendSixtyFourReadAheadsAtOnce) {
  WriteFile(src_ + "/m/model.bin", "w");
  auto m = Mount("");
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << m->Log();
  Fusectl fusectl(tmp_ / "fusectl");
  ASSERT_TRUE(fusectl.mounted());
  const std::string conn = fusectl.ConnectionOf(mnt_);
  ASSERT_TRUE(fs::exists(conn + "/max_background")) << conn;
  EXPECT_EQ(ReadFile(conn + "/max_background"), "64\n");
  EXPECT_EQ(ReadFile(conn + "/congestion_threshold"), "48\n");
}

// Issue 20 item 3: a checkpoint renamed into SRC is resident in the host tier
// when its digest first appears (the indexer filled its copies from the
// bytes it hashed: one read of the disk), and its first load passes through
// with no read reaching the daemon. With fill_on_index=off it is not.
TEST_F(PassthroughMountTest, ACheckpointRenamedIntoSrcIsResidentWhenItsDigestAppears) {
  WriteFile(src_ + "/m/model.bin", "w");
  for (const std::string policy : {"free", "off"}) {
    auto m = MountWithPassthrough("cache_size=256M,fill_on_index=" + policy);
    SKIP_WITHOUT_PASSTHROUGH();
    const std::string stage = src_ + "/.stage-" + policy, name = "new-" + policy;  // hidden until renamed
    uint64_t bytes = 0;
    const size_t sizes[] = {0, 4095, 4 * kMiB, 13 * kMiB + 7};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      WriteFile(stage + "/model-" + std::to_string(i) + ".safetensors", RandomBytes(sizes[i], 80 + i + policy.size()));
      bytes += sizes[i];
    }
    const std::string config = "{\"policy\": \"" + policy + "\"}";
    WriteFile(stage + "/config.json", config);
    bytes += config.size();
    fs::rename(stage, src_ + "/" + name);
    ASSERT_TRUE(WaitForLink(name)) << m->Log();
    const auto first = Stats(mnt_);  // as the digest appeared
    uint64_t resident = 0;
    for (const auto& cp : first["checkpoints"]) {
      if (cp["by_name"].dump().find("by-name/" + name) != std::string::npos) resident = cp["host"];
    }
    EXPECT_EQ(resident, policy == "free" ? bytes : 0) << first.dump(1);
    // Its five files, and m's (hashed at this mount's first scan).
    EXPECT_EQ(first["fills"]["from_indexing"]["completed"], policy == "free" ? 6 : 0) << first["fills"].dump();
    size_t files = 0;
    EXPECT_EQ(CompareTree(src_ + "/" + name, DigestDir(name), &files), "");
    EXPECT_EQ(files, 5u);
    const auto after = Stats(mnt_);
    if (policy == "free") {
      // CompareTree opens each file twice (read(2), then mmap). The two
      // shards above SealedCopy::kMemoryCopyMax pass through; the small
      // files are held in the daemon's memory and served from there;
      // nothing comes from the source.
      EXPECT_EQ(Opens(after, "passthrough") - Opens(first, "passthrough"), 2u * 2) << after.dump(1);
      EXPECT_LE(after["bytes_served"].get<uint64_t>() - first["bytes_served"].get<uint64_t>(),
                2 * (4095 + config.size()))
          << "the first load of the shards reached the daemon";
      EXPECT_EQ(after["source_bytes_read"], first["source_bytes_read"]);
    } else {
      EXPECT_GT(after["source_bytes_read"].get<uint64_t>(), first["source_bytes_read"].get<uint64_t>());
    }
    m->Unmount();
  }
}

// page_reserve= (issue 20 item 5's confound): on a VM that reports free
// memory to its host, where copies are written in 4 KiB pages because fresh
// 2 MiB ones are slow, the tier keeps 2 MiB pages in its free room and the
// indexer writes a new checkpoint's copies into them, as a fill at a first
// open does. The copies are the source's bytes; the reserve stays within
// its size and the tier's, and grows back once a fill is done. Where fresh
// memory is fast, no reserve is kept (copies take 2 MiB pages directly)
// and stats says so.
TEST_F(PassthroughMountTest, CopiesMadeAtIndexingTakeThePageReservesPages) {
  WriteFile(src_ + "/m/model.bin", "w");
  ::setenv("CKPTFS_TEST_RESERVE_AT_ONCE", "1", 1);  // not resting on the suite's busy CPUs
  auto m = Mount("cache_size=256M,page_reserve=32M,fill_on_index=free");
  ::unsetenv("CKPTFS_TEST_RESERVE_AT_ONCE");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  if (SealedCopy::PreferredWrite() != SealedCopy::WriteBy::kSmallPageMapping) {
    EXPECT_EQ(Stats(mnt_)["memory"]["page_reserve"]["on"], false);
    return;
  }
  auto reserve = [&] { return Stats(mnt_)["memory"]["page_reserve"]; };
  ASSERT_TRUE(WaitFor([&] { return reserve()["bytes"] == 32 * kMiB; }, std::chrono::seconds(30)))
      << reserve().dump() << m->Log();
  const std::string stage = src_ + "/.stage", shard = RandomBytes(21 * kMiB + 5, 7);
  WriteFile(stage + "/model.safetensors", shard);
  fs::rename(stage, src_ + "/new");
  ASSERT_TRUE(WaitForLink("new")) << m->Log();
  const auto s = Stats(mnt_);
  // Ten whole 2 MiB pages; the last 1 MiB and 5 bytes are in small pages.
  EXPECT_EQ(s["fills"]["from_indexing"]["reserve_bytes"], 20 * kMiB) << s["fills"].dump(1);
  EXPECT_EQ(s["memory"]["page_reserve"]["given_bytes"], 20 * kMiB) << s["memory"].dump(1);
  EXPECT_EQ(CompareTree(src_ + "/new", DigestDir("new")), "");
  // With the fill done and room to spare, it grows back to its size.
  EXPECT_TRUE(WaitFor([&] { return reserve()["bytes"] == 32 * kMiB; }, std::chrono::seconds(30))) << reserve().dump();
  EXPECT_EQ(reserve()["grown_bytes"], 52 * kMiB);
  // A fill at the first open (fill=wait) takes its pages too.
  ASSERT_EQ(RunCommand(kCtl + " evict " + mnt_ + "/by-name/new").exit_code, 0);
  EXPECT_TRUE(ReadBuffered(DigestDir("new") + "/model.safetensors") == shard);
  EXPECT_EQ(reserve()["given_bytes"], 40 * kMiB) << reserve().dump();
  EXPECT_EQ(Stats(mnt_)["tiers"]["host"]["fills"], 3) << "m's file, the indexer's copy and the open's";
}

TEST_F(PassthroughMountTest, TheFirstOpenIsServedAtOnceAndFillsTheCopyForTheNext) {
  const std::string data = RandomBytes(24 * kMiB + 3, 1);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = MountWithPassthrough("cache_size=256M,fill=open");
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string path = DigestDir("m") + "/model.safetensors";
  EXPECT_TRUE(ReadBuffered(path) == data);
  EXPECT_EQ(Opens(Stats(mnt_), "chunk path: not resident"), 1u);
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["tiers"]["host"]["files"] == 1; })) << m->Log();
  // The first open's release comes after its close: an open before it
  // would join the chunk path the inode is open through.
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["open_inodes"] == 0; }));
  const auto before = Stats(mnt_);
  EXPECT_TRUE(ReadMapped(path) == data);
  const auto after = Stats(mnt_);
  EXPECT_EQ(Opens(after, "passthrough"), 1u);
  EXPECT_EQ(after["read_requests"], before["read_requests"]);
  EXPECT_EQ(after["fills"]["bytes"], data.size());
  EXPECT_GT(after["fills"]["bytes_per_second"].get<uint64_t>(), 0u);
}

TEST_F(PassthroughMountTest, WithFillWaitTheFirstOpenWaitsForTheCopyAndPassesThrough) {
  const std::string data = RandomBytes(24 * kMiB + 3, 5);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = MountWithPassthrough("cache_size=256M,fill=wait");
  SKIP_WITHOUT_PASSTHROUGH();
  EXPECT_TRUE(ReadMapped(DigestDir("m") + "/model.safetensors") == data);
  const auto s = Stats(mnt_);
  EXPECT_EQ(Opens(s, "passthrough"), 1u) << s["opens"].dump();
  EXPECT_EQ(s["read_requests"], 0);
  EXPECT_EQ(s["fills"]["policy"], "wait");
}

// Issue 20 item 5, through the mount: fastsafetensors' pattern under
// fill=wait (each shard's header read through a buffered open that is
// closed at once, shard after shard, then the shards read whole). Only the
// first header opens wait for their copies; once the kernel's release of a
// header open has reached the daemon, the same thread's next opens begin
// their copies and are served from them as they are made (a release comes
// after close returns, so the second shard may still wait: at least one
// open of the four must not). Every byte read is the source's.
TEST_F(PassthroughMountTest, AHeaderScanOfEveryShardWaitsForTheFirstCopiesOnly) {
  std::vector<std::string> data;
  for (int i = 0; i < 4; ++i) {
    data.push_back(RandomBytes(64 * kMiB + i, 70 + i));  // copies that take longer than an open
    WriteFile(src_ + "/m/model-" + std::to_string(i) + ".safetensors", data.back());
  }
  auto m = MountWithPassthrough("cache_size=1G,fill=wait");
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string dir = DigestDir("m");
  for (int i = 0; i < 4; ++i) {
    const std::string path = dir + "/model-" + std::to_string(i) + ".safetensors";
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << path;
    char head[8];
    EXPECT_EQ(::pread(fd, head, sizeof head, 0), static_cast<ssize_t>(sizeof head));
    EXPECT_EQ(std::memcmp(head, data[i].data(), sizeof head), 0) << path;
    ::close(fd);
  }
  const auto s = Stats(mnt_);
  EXPECT_GE(s["fills"]["header_scan_opens"].get<uint64_t>(), 1u) << s["fills"].dump() << "\n" << s["opens"].dump();
  EXPECT_GE(Opens(s, "chunk path: not resident"), 1u) << s["opens"].dump();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(ReadFile(dir + "/model-" + std::to_string(i) + ".safetensors") == data[i]) << "shard " << i;
  }
}

// Issue 20 item 5: a parallel loader opens its shards with O_DIRECT. Its
// first open under fill=wait does not wait for the whole copy: it is
// answered through the daemon, which serves its reads from the copy as it
// is made (the chunks it asks for first), so the source is read once, by
// the fill, and the next open passes through.
TEST_F(PassthroughMountTest, WithFillWaitAnODirectOpenIsServedFromTheCopyWhileItIsMade) {
  const std::string data = RandomBytes(40 * kMiB + 5, 9);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = MountWithPassthrough("cache_size=256M,fill=wait");
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string path = DigestDir("m") + "/model.safetensors";
  {  // one open: from the middle first, then all of it
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    ASSERT_GE(fd, 0);
    void* buf = nullptr;
    ASSERT_EQ(::posix_memalign(&buf, 4096, data.size() + 4096), 0);
    const size_t middle = 20 * kMiB;
    EXPECT_EQ(::pread(fd, buf, data.size() - middle, middle), static_cast<ssize_t>(data.size() - middle));
    EXPECT_EQ(std::memcmp(buf, data.data() + middle, data.size() - middle), 0);
    EXPECT_EQ(::pread(fd, buf, data.size() + 4096, 0), static_cast<ssize_t>(data.size()));
    EXPECT_EQ(std::memcmp(buf, data.data(), data.size()), 0);
    std::free(buf);
    ::close(fd);
  }
  auto s = Stats(mnt_);
  EXPECT_EQ(Opens(s, "chunk path: not resident"), 1u) << s["opens"].dump();
  EXPECT_EQ(Opens(s, "passthrough"), 0u) << s["opens"].dump();
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["tiers"]["host"]["files"] == 1; })) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["open_inodes"] == 0; }));  // the release after the close
  EXPECT_TRUE(ReadDirect(path) == data);
  s = Stats(mnt_);
  EXPECT_EQ(Opens(s, "passthrough"), 1u) << s["opens"].dump();
  EXPECT_EQ(s["source_bytes_read"], data.size()) << "the source was read more than once: " << s.dump();
  std::cout << "reads served from the copy in progress: " << s["fills"]["streamed_reads"] << "\n";
}

// The other shards beside an opened one are copied in the background, in
// free room only: never a file of another suffix (an optimizer state beside
// safetensors shards), never by evicting what is resident.
TEST_F(PassthroughMountTest, TheOtherShardsAreCopiedWhileTheyFitInFreeRoom) {
  // cache_size=64M leaves 48 MiB for whole files (16 MiB go to chunks):
  // the opened shard and one more fit, a third does not.
  std::vector<std::string> shards;
  for (int i = 1; i <= 3; ++i) {
    shards.push_back(RandomBytes(20 * kMiB, 60 + i));
    WriteFile(src_ + "/m/model-0000" + std::to_string(i) + "-of-00003.safetensors", shards.back());
  }
  WriteFile(src_ + "/m/optimizer.pt", RandomBytes(kMiB, 70));
  auto m = MountWithPassthrough("cache_size=64M");  // fill=wait, the default
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string dir = DigestDir("m");
  EXPECT_TRUE(ReadMapped(dir + "/model-00001-of-00003.safetensors") == shards[0]);
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["tiers"]["host"]["files"] == 2; })) << Stats(mnt_).dump();
  const auto s = Stats(mnt_);
  EXPECT_EQ(s["fills"]["completed"], 2);
  EXPECT_EQ(s["tiers"]["host"]["evictions"], 0);
  // The second shard was copied before its open: it passes through at once.
  EXPECT_TRUE(ReadMapped(dir + "/model-00002-of-00003.safetensors") == shards[1]);
  EXPECT_EQ(Opens(Stats(mnt_), "passthrough"), 2u);
  EXPECT_EQ(Stats(mnt_)["read_requests"], 0);
}

// A copy made from a source that is not in the page cache leaves it out of
// the page cache (O_DIRECT reads): with fill_io=direct, and by default
// (fill_io=auto, which reads uncached chunks directly). The bytes are the same.
void ExpectAColdFillLeavesThePageCacheAlone(PassthroughMountTest& t, const std::string& options,
                                            const std::string& io) {
  const std::string data = RandomBytes(24 * kMiB + 4097, 12);
  const std::string source = t.src_ + "/m/model.safetensors";
  WriteFile(source, data);
  auto m = t.MountWithPassthrough("cache_size=256M" + options);
  if (!t.skip_.empty()) return;
  ::sync();
  DropPageCache(source);
  ASSERT_LT(ResidentBytes(source), data.size() / 10) << "the page cache of the source was not dropped";
  ASSERT_EQ(RunCommand(kCtl + " preload " + t.mnt_ + "/by-name/m").exit_code, 0);
  EXPECT_LT(ResidentBytes(source), data.size() / 10);
  const auto s = Stats(t.mnt_);
  EXPECT_EQ(s["fills"]["io"], io);
  EXPECT_EQ(s["fills"]["direct_bytes"], data.size());
  EXPECT_EQ(s["fills"]["direct_refused"], 0);
  EXPECT_TRUE(ReadMapped(t.DigestDir("m") + "/model.safetensors") == data);
  EXPECT_EQ(Opens(Stats(t.mnt_), "passthrough"), 1u);
}

TEST_F(PassthroughMountTest, DirectFillsLeaveTheSourcePageCacheAlone) {
  ExpectAColdFillLeavesThePageCacheAlone(*this, ",fill_io=direct", "direct");
  SKIP_WITHOUT_PASSTHROUGH();
}

TEST_F(PassthroughMountTest, ByDefaultAColdSourceIsCopiedWithoutFillingItsPageCache) {
  ExpectAColdFillLeavesThePageCacheAlone(*this, "", "auto");
  SKIP_WITHOUT_PASSTHROUGH();
}

// And a source in the page cache is copied from there.
TEST_F(PassthroughMountTest, ByDefaultACachedSourceIsCopiedFromThePageCache) {
  const std::string data = RandomBytes(24 * kMiB + 4097, 13);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = MountWithPassthrough("cache_size=256M");
  SKIP_WITHOUT_PASSTHROUGH();
  ReadFile(src_ + "/m/model.safetensors");  // in the page cache now
  // Held open, so that no other test's drop of unused inodes takes its pages.
  const UniqueFd source(::open((src_ + "/m/model.safetensors").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(source.valid());
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  const auto s = Stats(mnt_);
  EXPECT_EQ(s["fills"]["cached_bytes"], data.size());
  EXPECT_EQ(s["fills"]["direct_bytes"], 0);
  EXPECT_TRUE(ReadMapped(DigestDir("m") + "/model.safetensors") == data);
}

TEST_F(PassthroughMountTest, EveryBackingMemfdIsSealed) {
  WriteAwkwardTree("m");
  auto m = MountWithPassthrough("cache_size=256M");
  SKIP_WITHOUT_PASSTHROUGH();
  ASSERT_EQ(RunCommand(kCtl + " preload --pin " + mnt_ + "/by-name/m").exit_code, 0);
  ExpectEveryFileEqual();  // every copy is a backing file now
  const auto memfds = HostTierMemfds(m->ServingPid());
  EXPECT_EQ(memfds.size(), 2u);  // the two shards above SealedCopy::kMemoryCopyMax
  for (const auto& fd_path : memfds) {
    const int fd = ::open(fd_path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << fd_path;
    EXPECT_EQ(::fcntl(fd, F_GET_SEALS), F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) << fd_path;
    EXPECT_EQ(::pwrite(fd, "x", 1, 0), -1) << fd_path;  // root included
    EXPECT_EQ(errno, EPERM);
    ::close(fd);
  }
  const auto stats = Stats(mnt_);
  uint64_t pages = PageBytes(0) + PageBytes(1) + PageBytes(4095) + PageBytes(4 * kMiB) + PageBytes(13 * kMiB + 7) +
                   PageBytes(14);
  EXPECT_EQ(stats["tiers"]["host"]["pinned"], pages);
  EXPECT_EQ(stats["tiers"]["host"]["used"], pages);
}

TEST_F(PassthroughMountTest, SourceChangedInPlaceNeverReachesTheOldName) {
  const std::string shard = src_ + "/m/model.safetensors";
  const std::string old_bytes = RandomBytes(16 * kMiB, 2);
  std::string new_bytes = old_bytes;
  for (size_t i = 0; i < new_bytes.size(); i += 4096) new_bytes[i] ^= 0x5a;
  WriteFile(shard, old_bytes);
  auto m = MountWithPassthrough("cache_size=256M");
  SKIP_WITHOUT_PASSTHROUGH();
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  const std::string old_dir = DigestDir("m");
  const int dir_fd = ::open(old_dir.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dir_fd, 0);
  const int fd = ::openat(dir_fd, "model.safetensors", O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, old_bytes.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(Opens(Stats(mnt_), "passthrough"), 1u);

  {  // in place: same inode, same size, new bytes
    const int w = ::open(shard.c_str(), O_WRONLY);
    ASSERT_EQ(::pwrite(w, new_bytes.data(), new_bytes.size(), 0), static_cast<ssize_t>(new_bytes.size()));
    ::close(w);
  }
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m") && DigestDir("m") != old_dir; })) << m->Log();

  std::string through_fd(old_bytes.size(), '\0');
  EXPECT_EQ(::pread(fd, through_fd.data(), through_fd.size(), 0), static_cast<ssize_t>(old_bytes.size()));
  EXPECT_TRUE(through_fd == old_bytes);
  EXPECT_TRUE(std::string(static_cast<const char*>(map), old_bytes.size()) == old_bytes);
  // A new open of the old digest: old bytes or an error, never new bytes.
  for (const std::string& again : {ReadBuffered(old_dir + "/model.safetensors"), ReadMapped(old_dir + "/model.safetensors")}) {
    EXPECT_TRUE(again == old_bytes || again.rfind("<", 0) == 0) << again.substr(0, 40);
  }
  const int fd2 = ::openat(dir_fd, "model.safetensors", O_RDONLY);
  if (fd2 >= 0) {
    std::string second(old_bytes.size(), '\0');
    const ssize_t n = ::pread(fd2, second.data(), second.size(), 0);
    EXPECT_TRUE(n < 0 || second.substr(0, static_cast<size_t>(n)) == old_bytes.substr(0, static_cast<size_t>(n)));
    ::close(fd2);
  }
  // The new digest serves the new bytes.
  EXPECT_TRUE(ReadBuffered(DigestDir("m") + "/model.safetensors") == new_bytes);
  EXPECT_TRUE(ReadMapped(DigestDir("m") + "/model.safetensors") == new_bytes);
  ::munmap(map, old_bytes.size());
  ::close(fd);
  ::close(dir_fd);
}

TEST_F(PassthroughMountTest, PassthroughOffServesTheSameBytesThroughTheDaemon) {
  WriteAwkwardTree("m");
  auto m = Mount("cache_size=256M,passthrough=off");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const auto status = Ctl("status", mnt_);
  EXPECT_EQ(status["passthrough"]["mode"], "off");
  EXPECT_EQ(status["passthrough"]["reason"], "passthrough=off");
  ExpectEveryFileEqual();  // not resident yet: the chunk path
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  const auto before = Stats(mnt_);
  ExpectEveryFileEqual();  // resident: served by the daemon from its copies (O_DIRECT reads always reach it)
  const auto after = Stats(mnt_);
  EXPECT_EQ(Opens(after, "passthrough"), 0u);
  EXPECT_GT(Opens(after, "chunk path: passthrough off"), 0u);
  EXPECT_GT(after["read_requests"].get<uint64_t>(), before["read_requests"].get<uint64_t>());
  EXPECT_EQ(after["source_bytes_read"], before["source_bytes_read"]);  // from the copies, not the source
}

// Root in a user namespace has no CAP_SYS_ADMIN in the initial namespace, as
// an unprivileged mount: the kernel refuses backing files, and the daemon
// says so and serves the chunk path.
TEST_F(PassthroughMountTest, WithoutPrivilegeTheChunkPathServesTheSameBytes) {
  WriteAwkwardTree("m");
  MakeDirs(mnt_);
  const std::string status_file = tmp_ / "status.json";
  const std::string script =
      kDaemon + " " + src_ + " " + mnt_ + " -o state=" + state_ + ",settle=0,rescan=0 || exit 10\n" +
      "for i in $(seq 1 200); do [ -L " + mnt_ + "/by-name/m ] && break; sleep 0.05; done\n" +
      kCtl + " status --json " + mnt_ + " > " + status_file + "\n" +
      COMPARE_TREE_PATH " " + src_ + "/m " + mnt_ + "/by-name/m; a=$?\n" +
      kCtl + " preload " + mnt_ + "/by-name/m >/dev/null || echo preload failed\n" +
      COMPARE_TREE_PATH " " + src_ + "/m " + mnt_ + "/by-name/m; b=$?\n" +
      "fusermount3 -u " + mnt_ + "\nexit $((a + b))\n";
  WriteFile(tmp_ / "userns.sh", script);
  CommandResult r = RunCommand("unshare --user --map-root-user --mount sh " + tmp_ / "userns.sh", true);
  if (r.exit_code == 10) GTEST_SKIP() << "no FUSE mount in a user namespace here: " << r.out;
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("6 files equal"), std::string::npos) << r.out;
  auto status = nlohmann::json::parse(ReadFile(status_file), nullptr, false);
  ASSERT_FALSE(status.is_discarded()) << ReadFile(status_file);
  EXPECT_EQ(status["passthrough"]["mode"], "off");
  const std::string why = status["passthrough"]["reason"];
  EXPECT_TRUE(why.find("CAP_SYS_ADMIN") != std::string::npos || why.find("did not offer") != std::string::npos) << why;
}

// Pages of the calling process that are shared memory it maps (the host
// tier's copies, through passthrough mappings), from /proc/self/status.
uint64_t MappedSharedMemory() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stoull(line.substr(9)) * 1024;
  }
  return 0;
}

// A reader that maps each file and closes it keeps the copy's pages with a
// mapping the daemon is not told of (its RELEASE comes at the close). Such
// readers could make the daemon copy file after file, each copy evicted
// for the next and kept by its mapping: memory without bound, past
// cache_size. The tier asks the kernel whether a copy is still held, and
// counts it: copies in use are not evicted, what does not fit is served by
// the chunk path, and the mapped copies never exceed cache_size.
TEST_F(PassthroughMountTest, MappingsKeptAfterTheirCloseStayWithinCacheSize) {
  constexpr int kFiles = 6;
  constexpr uint64_t kSize = 12 * kMiB;
  std::vector<std::string> bytes;
  for (int i = 0; i < kFiles; ++i) {
    bytes.push_back(RandomBytes(kSize, 100 + i));
    WriteFile(src_ + "/m/s" + std::to_string(i) + ".safetensors", bytes.back());
  }
  auto m = MountWithPassthrough("cache_size=32M,fill=wait,fill_on_index=off");
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string dir = DigestDir("m");
  const uint64_t shared_before = MappedSharedMemory();
  std::vector<void*> maps;
  auto map_each_file = [&] {
    for (int i = 0; i < kFiles; ++i) {
      const int fd = ::open((dir + "/s" + std::to_string(i) + ".safetensors").c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      void* map = ::mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      ASSERT_NE(map, MAP_FAILED);
      maps.push_back(map);
      EXPECT_TRUE(std::memcmp(map, bytes[i].data(), kSize) == 0) << "s" << i;  // touches every page
    }
  };
  map_each_file();
  auto s = Stats(mnt_);
  const uint64_t capacity = s["tiers"]["host"]["capacity"];
  // Each file is mapped once: the shared memory mapped is the copies kept.
  const uint64_t mapped = MappedSharedMemory() - shared_before;
  EXPECT_LE(mapped, capacity) << "mapped copies: " << mapped;
  EXPECT_GE(mapped, kSize);  // the first fitted, and passed through
  // Mapped again, the files whose copies were evicted are not copied again
  // past the budget either.
  map_each_file();
  s = Stats(mnt_);
  const uint64_t used = s["tiers"]["host"]["used"], held = s["held_by_readers"];
  EXPECT_LE(used + held, capacity);
  EXPECT_GE(used + held, kSize);
  EXPECT_GE(Opens(s, "chunk path: not resident"), 1u) << s.dump();  // what did not fit
  for (void* map : maps) ::munmap(map, kSize);
  // Let go of, every copy can be evicted again: a new file fits.
  EXPECT_TRUE(WaitFor([&] {
    auto now = Stats(mnt_);
    return now["held_by_readers"] == 0 && now["open_inodes"] == 0;
  }));
  ASSERT_EQ(RunCommand(kCtl + " evict " + mnt_ + "/by-name/m").exit_code, 0);
  EXPECT_TRUE(HostTierMemfds(m->ServingPid()).empty());
}

TEST_F(PassthroughMountTest, EvictionUnderOpenReadersKeepsTheirBytes) {
  const std::string a = RandomBytes(16 * kMiB + 1, 3), b = RandomBytes(8 * kMiB, 4);
  WriteFile(src_ + "/m/a.safetensors", a);
  WriteFile(src_ + "/m/b.safetensors", b);
  // fill=open: an open of an evicted file is then served by the chunk path
  // (with fill=wait it would be copied again first).
  auto m = MountWithPassthrough("cache_size=256M,fill=open");
  SKIP_WITHOUT_PASSTHROUGH();
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  const std::string dir = DigestDir("m");
  const int fa = ::open((dir + "/a.safetensors").c_str(), O_RDONLY);
  const int fb = ::open((dir + "/b.safetensors").c_str(), O_RDONLY);
  ASSERT_TRUE(fa >= 0 && fb >= 0);
  void* map = ::mmap(nullptr, a.size(), PROT_READ, MAP_SHARED, fa, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(RunCommand(kCtl + " evict " + mnt_ + "/by-name/m").exit_code, 0);

  auto s = Stats(mnt_);
  EXPECT_EQ(s["tiers"]["host"]["used"], 0);
  EXPECT_EQ(s["tiers"]["host"]["files"], 0);
  EXPECT_EQ(s["held_by_readers"], PageBytes(a.size()) + PageBytes(b.size()));
  std::string got(a.size(), '\0');
  EXPECT_EQ(::pread(fa, got.data(), got.size(), 0), static_cast<ssize_t>(a.size()));
  EXPECT_TRUE(got == a);
  EXPECT_TRUE(std::string(static_cast<const char*>(map), a.size()) == a);
  // Another open of a while it is held joins its passthrough copy.
  const uint64_t reads = s["read_requests"];
  EXPECT_TRUE(ReadBuffered(dir + "/a.safetensors") == a);
  EXPECT_EQ(Stats(mnt_)["read_requests"], reads);

  // A copy the tier let go of keeps one descriptor while its readers (an
  // open file, a mapping, a passthrough backing) keep its pages: the
  // daemon asks the kernel through it whether they still do.
  EXPECT_EQ(HostTierMemfds(m->ServingPid()).size(), 2u);
  ::close(fb);  // b's copy is let go: its backing id closed, its pages freed
  EXPECT_TRUE(WaitFor([&] { return Stats(mnt_)["held_by_readers"] == PageBytes(a.size()); }));
  EXPECT_EQ(HostTierMemfds(m->ServingPid()).size(), 1u);
  ::munmap(map, a.size());
  ::close(fa);
  EXPECT_TRUE(WaitFor([&] { return Stats(mnt_)["held_by_readers"] == 0 && Stats(mnt_)["open_inodes"] == 0; }));
  EXPECT_TRUE(HostTierMemfds(m->ServingPid()).empty());
  // Not resident any more: the chunk path serves it (and fills it again).
  EXPECT_TRUE(ReadBuffered(dir + "/b.safetensors") == b);
  EXPECT_EQ(Opens(Stats(mnt_), "chunk path: not resident"), 1u);
}

// The kernel fails a passthrough open of an inode another reader holds open
// through the page cache (and the reverse) with EIO: an open joins the mode
// in force until the inode's last file is closed.
TEST_F(PassthroughMountTest, AnOpenJoinsTheModeOfTheReadersBeforeIt) {
  const std::string data = RandomBytes(12 * kMiB, 6);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = MountWithPassthrough("cache_size=256M,fill=preload");
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string path = DigestDir("m") + "/model.safetensors";
  const int first = ::open(path.c_str(), O_RDONLY);  // not resident: the chunk path
  ASSERT_GE(first, 0);
  char byte;
  ASSERT_EQ(::pread(first, &byte, 1, 0), 1);
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  EXPECT_TRUE(ReadBuffered(path) == data);  // resident now, but joins the chunk path
  EXPECT_TRUE(ReadMapped(path) == data);
  EXPECT_EQ(Opens(Stats(mnt_), "chunk path: the file is open through the chunk path by another reader"), 2u);
  ::close(first);
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["open_inodes"] == 0; }));
  EXPECT_TRUE(ReadMapped(path) == data);
  EXPECT_EQ(Opens(Stats(mnt_), "passthrough"), 1u);
}

TEST_F(PassthroughMountTest, OpensAndClosesDoNotAccumulateBackingIdsOrInodes) {
  WriteAwkwardTree("m");
  auto m = MountWithPassthrough("cache_size=256M");
  SKIP_WITHOUT_PASSTHROUGH();
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  for (int round = 0; round < 20; ++round) ExpectEveryFileEqual();
  EXPECT_TRUE(WaitFor([&] { return Stats(mnt_)["open_inodes"] == 0; }));
  // One per copy of the two shards held in memfds, however often opened.
  EXPECT_EQ(HostTierMemfds(m->ServingPid()).size(), 2u);
  EXPECT_EQ(Opens(Stats(mnt_), "passthrough"), 20u * 6);
}

// 16 readers, by read and mmap, over 4 files whose total is 2.5 times the
// host tier, while preloads keep evicting one file for another: every byte
// compared, the budget never exceeded, copies held by readers included.
TEST_F(PassthroughMountTest, SixteenReadersOverAHostTierSmallerThanTheData) {
  std::vector<std::string> contents;
  for (int i = 0; i < 4; ++i) {
    contents.push_back(RandomBytes(20 * kMiB + static_cast<size_t>(i) * 12345, 200 + static_cast<uint64_t>(i)));
    WriteFile(src_ + "/m/shard-" + std::to_string(i) + ".safetensors", contents.back());
  }
  auto m = MountWithPassthrough("cache_size=48M");  // 16M for chunks, 32M for whole files: one shard at a time
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string dir = DigestDir("m");
  std::atomic<int> mismatches{0}, reads{0};
  std::atomic<bool> done{false};
  uint64_t over_budget = 0, refused = 0;
  std::thread churn([&] {
    for (int i = 0; !done; i = (i + 1) % 4) {
      const auto r = RunCommand(kCtl + " preload " + dir + "/shard-" + std::to_string(i) + ".safetensors",
                                /*merge_stderr=*/true);
      if (r.out.find("no room in the host tier") != std::string::npos) ++refused;  // every copy was in use
      const auto s = Stats(mnt_);
      const auto& host = s["tiers"]["host"];
      if (host["used"].get<uint64_t>() + host["filling"].get<uint64_t>() + s["held_by_readers"].get<uint64_t>() >
          host["capacity"].get<uint64_t>()) {
        ++over_budget;
      }
    }
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 16; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      for (int round = 0; round < 6; ++round) {
        const size_t file = rng() % 4;
        const std::string path = dir + "/shard-" + std::to_string(file) + ".safetensors";
        const std::string got = (t + round) % 2 ? ReadMapped(path) : ReadBuffered(path);
        ++reads;
        if (got != contents[file]) ++mismatches;
      }
    });
  }
  for (auto& r : readers) r.join();
  done = true;
  churn.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(reads.load(), 96);
  EXPECT_EQ(over_budget, 0u);
  const auto s = Stats(mnt_);
  // The tier was fought over: preloads evicted copies, or were refused
  // while every copy was in use (a copy in use is not evicted for room).
  EXPECT_GT(s["tiers"]["host"]["evictions"].get<uint64_t>() + refused, 0u);
  EXPECT_EQ(s["failed_reads"], 0);
  EXPECT_TRUE(WaitFor([&] { return Stats(mnt_)["held_by_readers"] == 0; }));
}

// With stamp_headers a safetensors file is copied in its stamped form, one
// copy per checkpoint (the stamp names it): passthrough serves exactly the
// bytes the chunk path serves.
TEST_F(PassthroughMountTest, StampedFilesArePassedThroughInTheirStampedForm) {
  const std::string model = MakeSafetensors({{"w", "U8", {9 * kMiB + 3}, RandomBytes(9 * kMiB + 3, 7)},
                                             {"b", "F32", {5}, RandomBytes(20, 8)}});
  WriteFile(src_ + "/m/model.safetensors", model);
  WriteFile(src_ + "/m2/model.safetensors", model);
  WriteFile(src_ + "/m2/config.json", "{}");  // another checkpoint, so another stamp
  auto m = MountWithPassthrough("cache_size=256M,fill=preload,stamp_headers");
  SKIP_WITHOUT_PASSTHROUGH();
  ASSERT_TRUE(WaitForLink("m2"));
  std::map<std::string, std::string> chunk_path;
  for (const std::string cp : {"m", "m2"}) {
    chunk_path[cp] = ReadDirect(DigestDir(cp) + "/model.safetensors");  // not resident: the chunk path
    ASSERT_NE(chunk_path[cp].find("ckptfs.checkpoint"), std::string::npos);
  }
  EXPECT_NE(chunk_path["m"], chunk_path["m2"]);
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m2").exit_code, 0);
  EXPECT_EQ(Stats(mnt_)["tiers"]["host"]["files"], 3);  // two stamped forms of one file, and config.json
  const uint64_t reads = Stats(mnt_)["read_requests"];
  for (const std::string cp : {"m", "m2"}) {
    const std::string path = DigestDir(cp) + "/model.safetensors";
    EXPECT_TRUE(ReadBuffered(path) == chunk_path[cp]) << cp;
    EXPECT_TRUE(ReadMapped(path) == chunk_path[cp]) << cp;
    EXPECT_EQ(fs::file_size(path), chunk_path[cp].size());
  }
  const auto after = Stats(mnt_);
  EXPECT_EQ(Opens(after, "passthrough"), 4u);
  EXPECT_EQ(after["read_requests"], reads);
}

// A source on a filesystem that can fail on demand (tests/support/faulty_fs.cpp).
class FaultySourceTest : public PassthroughMountTest {
 protected:
  void SetUp() override {
    data_ = RandomBytes(16 * kMiB, 9);
    WriteFile(tmp_ / "backing", data_);
    MakeDirs(faulty_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl(FAULTYFS_PATH, FAULTYFS_PATH, (tmp_ / "backing").c_str(), faulty_.c_str(), trigger_.c_str(),
              faulty_extra_, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ASSERT_TRUE(WaitFor([&] { return IsMounted(faulty_); }));
    src_ = faulty_;
  }
  void TearDown() override {
    ::unlink(trigger_.c_str());  // a read left stalled lets go, so the unmount below does not wait on it
    mount_.reset();
    if (IsMounted(faulty_)) RunCommand("fusermount3 -u -z " + ShellQuote(faulty_));
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  std::string Through() { return mnt_ + "/by-name/m/model.safetensors"; }

  // Mounts with `options` once the index rows of the weight files of
  // `links` have lost their SHA-256 chains (a first mount indexes them), as
  // rows written before the chain, or hashes taken from a manifest, leave
  // a file: under verify=sha256 only a pass over the whole file then proves
  // its bytes.
  void MountWithoutChains(const std::string& options, const std::vector<std::string>& links) {
    mount_ = Mount(options);
    for (const auto& link : links) ASSERT_TRUE(WaitForLink(link)) << mount_->Log();
    mount_.reset();
    {
      auto index = Index::Open(state_, nullptr);
      ASSERT_TRUE(index.ok()) << index.status().message();
      for (const auto& link : links) {
        struct stat st;
        ASSERT_EQ(::stat((src_ + "/" + link + "/model.safetensors").c_str(), &st), 0);
        auto row = (*index)->LookupInode(st.st_dev, st.st_ino);
        ASSERT_TRUE(row.ok() && *row && (*row)->hashes.chain) << link;
        FileHashes without = (*row)->hashes;
        without.chain.reset();
        ASSERT_TRUE((*index)->PutFile((*row)->stamp, (*row)->path, without).ok());
      }
    }
    mount_ = Mount(options);
    for (const auto& link : links) ASSERT_TRUE(WaitForLink(link)) << mount_->Log();
  }

  // Runs `request` while the source stalls ("stall"). Should it not be
  // done within 20 s, the stall is let go, so that the test ends: true
  // when `request` was done before that.
  bool DoneWhileStalled(const std::function<void()>& request) {
    std::atomic<bool> done{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 200 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::unlink(trigger_.c_str());
    });
    request();
    const bool let_go = ::access(trigger_.c_str(), F_OK) != 0;
    done = true;
    watchdog.join();
    return !let_go;
  }
  // A child that reads 1 MiB of `path` at `at` with O_DIRECT as `uid` (no
  // supplementary groups) and writes it to `out` when given; it exits 0
  // when it read something.
  static pid_t ReadAsUser(uid_t uid, const std::string& path, off_t at, const std::string& out) {
    const pid_t pid = ::fork();
    if (pid == 0) {  // system calls only: the test's other threads may hold malloc's locks
      const int o = out.empty() ? -1 : ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) {
        ::_exit(3);
      }
      const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
      alignas(4096) static char buf[kMiB];
      const ssize_t n = fd >= 0 ? ::pread(fd, buf, sizeof buf, at) : -1;
      if (o >= 0 && n > 0 && ::write(o, buf, static_cast<size_t>(n)) != n) ::_exit(4);
      ::_exit(n > 0 ? 0 : 1);
    }
    return pid;
  }
  // Process `pid` waits in a FUSE read (an O_DIRECT one waits in fuse_direct_IO).
  static bool InAFuseRead(pid_t pid) {
    const std::string wchan = ReadFile("/proc/" + std::to_string(pid) + "/wchan");
    return wchan == "request_wait_answer" || wchan.rfind("fuse_", 0) == 0;
  }

  std::string data_;
  std::string faulty_ = tmp_ / "faulty";
  std::string trigger_ = tmp_ / "fault";
  const char* faulty_extra_ = nullptr;  // faultyfs's fourth argument ("two": a second checkpoint, n)
  pid_t pid_ = -1;
  std::unique_ptr<MountedCkptfs> mount_;
};

TEST_F(FaultySourceTest, AReadFailureDuringAFillAbandonsIt) {
  mount_ = MountWithPassthrough("cache_size=256M,fill=preload");
  SKIP_WITHOUT_PASSTHROUGH();
  WriteFile(trigger_, "");  // the disk goes bad at 8 MiB
  CommandResult pre = RunCommand(kCtl + " preload " + mnt_ + "/by-name/m", true);
  EXPECT_NE(pre.exit_code, 0);
  EXPECT_NE(pre.out.find("Input/output error"), std::string::npos) << pre.out;
  auto s = Stats(mnt_);
  EXPECT_EQ(s["tiers"]["host"]["files"], 0);
  // Nothing partial is kept, let alone handed over: its pages go once the
  // reader threads still copying chunks into it are done, and its room with
  // them.
  EXPECT_TRUE(WaitFor([&] {
    auto now = Stats(mnt_);
    return HostTierMemfds(mount_->ServingPid()).empty() && now["tiers"]["host"]["filling"] == 0 &&
           now["fills"]["abandoned"].get<uint64_t>() >= 1u;
  }));
  EXPECT_TRUE(ReadDirect(Through(), 0, kMiB) == data_.substr(0, kMiB));  // the chunk path goes on
  EXPECT_EQ(ReadDirect(Through(), 8 * kMiB, kMiB), "<read: Input/output error>");
  ::unlink(trigger_.c_str());
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return Stats(mnt_)["open_inodes"] == 0; }));  // the chunk path's opens released
  const uint64_t reads = Stats(mnt_)["read_requests"];
  EXPECT_TRUE(ReadBuffered(Through()) == data_);
  EXPECT_EQ(Stats(mnt_)["read_requests"], reads);  // passthrough now
}

// A fill that failed while one of its reads is stuck on the source keeps
// its room until that read returns: its pages are still there, and room
// handed to the next fill meanwhile would let the tier hold more than
// cache_size.
TEST_F(FaultySourceTest, AFailedFillKeepsItsRoomUntilAStuckReadLetsGoOfItsPages) {
  mount_ = MountWithPassthrough("cache_size=256M,fill=preload,fill_depth=4");
  SKIP_WITHOUT_PASSTHROUGH();
  WriteFile(trigger_, "stall");  // the first chunk's reads hang, the third's fail
  CommandResult pre = RunCommand(kCtl + " preload " + mnt_ + "/by-name/m", true);
  EXPECT_NE(pre.exit_code, 0);
  EXPECT_NE(pre.out.find("Input/output error"), std::string::npos) << pre.out;
  auto s = Stats(mnt_);
  EXPECT_EQ(s["tiers"]["host"]["files"], 0);
  EXPECT_EQ(HostTierMemfds(mount_->ServingPid()).size(), 1u);  // the stuck read writes into it
  EXPECT_EQ(s["tiers"]["host"]["filling"], PageBytes(data_.size()));  // bytes reserved for fills
  ::unlink(trigger_.c_str());
  EXPECT_TRUE(WaitFor([&] {
    auto now = Stats(mnt_);
    return HostTierMemfds(mount_->ServingPid()).empty() && now["tiers"]["host"]["filling"] == 0;
  }));
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  EXPECT_TRUE(ReadBuffered(Through()) == data_);
}

// Under fill=wait an open waits for its file's copy, on a FUSE thread.
// Opens of a file whose copy takes long (here: never ends, its first
// chunk's source read stuck) hold at most half of those threads, whoever
// makes them; the rest do not wait (their reads are served from the copy
// as it is made), so every other request still finds a thread. Found
// attacking the daemon: eight loops opening one 400 MB file stalled
// another user's 13-byte read for 10 s on a slow source.
TEST_F(FaultySourceTest, OpensWaitingForACopyLeaveThreadsForEveryoneElse) {
  // 4 FUSE threads; the file not copied at indexing, so that its opens
  // wait; one chunk read at a time, so that the copy stays on the stuck one.
  mount_ = MountWithPassthrough("cache_size=256M,threads=2,fill_on_index=off,supervise=off,fill_depth=1");
  SKIP_WITHOUT_PASSTHROUGH();
  WriteFile(trigger_, "stall");  // the first chunk's reads hang
  // Eight processes open the file. Two wait, half the threads; the others
  // find their places taken and return.
  const std::string file = Through();
  std::vector<pid_t> openers;
  for (int i = 0; i < 8; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(file.c_str(), O_RDONLY);
      if (fd >= 0) ::close(fd);
      ::_exit(0);
    }
    ASSERT_GT(pid, 0);
    openers.push_back(pid);
  }
  // Each opener waits in its open or is done with it. (Nothing here asks
  // the mount: ckptfsctl finds the daemon through an xattr of the mount,
  // which waits behind the opens too, before the fix.)
  auto waiting_or_done = [](pid_t pid) {
    const std::string wchan = ReadFile("/proc/" + std::to_string(pid) + "/wchan");
    return wchan == "request_wait_answer" || wchan == "0" || wchan.empty();
  };
  EXPECT_TRUE(WaitFor([&] { return std::all_of(openers.begin(), openers.end(), waiting_or_done); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Anyone's request meanwhile: a listing (no kernel cache answers it).
  // Should it wait behind the opens (as before the fix), the stuck read is
  // let go after 20 s, so that the test ends, and fails.
  const auto before = std::chrono::steady_clock::now();
  CommandResult ls;
  EXPECT_TRUE(DoneWhileStalled([&] { ls = RunCommand("ls " + ShellQuote(mnt_ + "/by-name/m")); }))
      << "a listing waited behind the opens until the stuck read was let go ("
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count() << " s)";
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_NE(ls.out.find("model.safetensors"), std::string::npos) << ls.out;
  ::unlink(trigger_.c_str());  // the stuck read goes on, the copy completes, the waiting opens return
  for (pid_t pid : openers) ::waitpid(pid, nullptr, 0);
  EXPECT_GE(Ctl("status", mnt_).value("opens_not_waiting", uint64_t{0}), 1u);
  EXPECT_TRUE(ReadBuffered(Through()) == data_);
}

// Under verify=sha256 nothing of a file whose index row has no SHA-256
// chain (a row from before it, or a manifest's hashes) is served before its
// whole SHA-256 passed, so a read of such a file not yet proven may wait
// for the whole file to be read. Such reads wait off the FUSE threads: eight processes reading one
// byte each of a file whose proof cannot finish (its first chunk's source
// read stuck) leave every other request a thread. Found attacking the
// daemon: four such readers held all four threads for the 10 s of a 2 GiB
// file's proof, and another user's listing waited as long.
TEST_F(FaultySourceTest, ReadsWaitingForAProofLeaveThreadsForEveryoneElse) {
  // Passthrough or not: nothing is resident, so every read is the daemon's.
  MountWithoutChains("cache_size=256M,threads=2,verify=sha256,fill=off,supervise=off", {"m"});
  if (HasFatalFailure()) return;
  const std::string file = Through();
  ASSERT_TRUE(fs::exists(file)) << mount_->Log();
  WriteFile(trigger_, "stall");  // the first chunk's reads hang
  std::vector<pid_t> readers;
  for (int i = 0; i < 8; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
      alignas(4096) static char buf[4096];
      if (fd >= 0) (void)!::pread(fd, buf, sizeof buf, static_cast<off_t>(8 * kMiB));
      ::_exit(0);
    }
    ASSERT_GT(pid, 0);
    readers.push_back(pid);
  }
  EXPECT_TRUE(WaitFor([&] { return std::all_of(readers.begin(), readers.end(), InAFuseRead); }))
      << ReadFile("/proc/" + std::to_string(readers[0]) + "/wchan");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Anyone's request meanwhile: a listing (no kernel cache answers it).
  // Should it wait behind the reads (as before the fix), the stuck read is
  // let go after 20 s, so that the test ends, and fails.
  CommandResult ls;
  EXPECT_TRUE(DoneWhileStalled([&] { ls = RunCommand("ls " + ShellQuote(mnt_ + "/by-name/m")); }))
      << "a listing waited behind the reads until the stuck source read was let go";
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_NE(ls.out.find("model.safetensors"), std::string::npos) << ls.out;
  ::unlink(trigger_.c_str());  // the proof completes, the waiting reads are answered
  for (pid_t pid : readers) ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(ReadDirect(file, 8 * kMiB, kMiB) == data_.substr(8 * kMiB, kMiB));
}

// A file whose index row holds its SHA-256 chain (every file this daemon
// hashed) has each chunk proven alone: under verify=sha256 its second chunk
// is served while its first cannot be read (a stalled source). A row
// without the chain needs a pass over the whole file first, which waits
// for the first chunk (ReadsWaitingForAProofLeaveThreadsForEveryoneElse):
// there the stall is let go after 20 s, so that the test ends, and fails.
TEST_F(FaultySourceTest, UnderVerifySha256AChunkIsProvenAloneByTheFilesChain) {
  mount_ = Mount("cache_size=256M,verify=sha256,fill=off,supervise=off");
  ASSERT_TRUE(WaitForLink("m")) << mount_->Log();
  WriteFile(trigger_, "stall");  // reads of the first chunk hang
  std::string got;
  EXPECT_TRUE(DoneWhileStalled([&] { got = ReadDirect(Through(), 4 * kMiB, kMiB); }))
      << "the read waited for a proof of the whole file";
  EXPECT_TRUE(got == data_.substr(4 * kMiB, kMiB)) << got.substr(0, 80);
}

// A chain proven by a pass over the whole file (its row had none: from
// before the chain) is kept in the file's index row, whether the pass was
// the chunk path's or a fill's, so that after a restart its chunks are
// proven alone.
TEST_F(FaultySourceTest, AChainProvenByAWholePassIsKeptInTheIndex) {
  struct stat st;
  ASSERT_EQ(::stat((src_ + "/m/model.safetensors").c_str(), &st), 0);
  auto row_has_chain = [&] {
    auto index = Index::Open(state_, nullptr);
    if (!index.ok()) return false;
    auto row = (*index)->LookupInode(st.st_dev, st.st_ino);
    return row.ok() && *row && (*row)->hashes.chain.has_value();
  };
  for (const char* fill : {"fill=off", "fill=wait"}) {
    SCOPED_TRACE(fill);
    MountWithoutChains(std::string("cache_size=256M,verify=sha256,supervise=off,") + fill, {"m"});
    if (HasFatalFailure()) return;
    ASSERT_FALSE(row_has_chain());
    EXPECT_TRUE(ReadBuffered(Through()) == data_);
    EXPECT_TRUE(WaitFor(row_has_chain)) << mount_->Log();
    mount_.reset();
  }
}

// With a second checkpoint, n, that never fails.
class TwoCheckpointFaultySourceTest : public FaultySourceTest {
 protected:
  TwoCheckpointFaultySourceTest() { faulty_extra_ = "two"; }

  // With the source stalled, `readers` O_DIRECT reads of m by user 2101 at
  // `at`, each left waiting in a FUSE read; then user 2102's read of n,
  // which must be answered while they wait (DoneWhileStalled), with n's
  // bytes.
  void ExpectAnotherUsersReadWhileOnesAreStuck(int readers, off_t at) {
    const std::string stalled = Through(), other = mnt_ + "/by-name/n/model.safetensors";
    ASSERT_TRUE(fs::exists(stalled) && fs::exists(other)) << mount_->Log();
    WriteFile(trigger_, "stall");  // m's first chunk hangs; n never does
    std::vector<pid_t> stuck;
    for (int i = 0; i < readers; ++i) {
      stuck.push_back(ReadAsUser(2101, stalled, at, ""));
      ASSERT_GT(stuck.back(), 0);
    }
    EXPECT_TRUE(WaitFor([&] { return std::all_of(stuck.begin(), stuck.end(), InAFuseRead); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::string got = tmp_ / "read-by-2102";
    int status = -1;
    EXPECT_TRUE(DoneWhileStalled([&] { ::waitpid(ReadAsUser(2102, other, 0, got), &status, 0); }))
        << "user 2102's read waited until user 2101's stalled reads were let go";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    std::string inverted = data_.substr(0, kMiB);
    for (char& c : inverted) c = static_cast<char>(~c);
    EXPECT_TRUE(ReadFile(got) == inverted);
    ::unlink(trigger_.c_str());
    for (pid_t pid : stuck) ::waitpid(pid, nullptr, 0);
  }
};

// Reads that wait for a proof run on a pool in which each uid holds at most
// half the threads: one user's reads stuck behind a proof that cannot end
// (a stalled source) leave another user's proof a thread.
TEST_F(TwoCheckpointFaultySourceTest, OneUsersProofsLeaveAnotherUserAProvingThread) {
  fs::permissions(tmp_.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  MountWithoutChains("allow_other,cache_size=256M,threads=2,verify=sha256,fill=off,supervise=off", {"m", "n"});
  if (HasFatalFailure()) return;
  // Another user's read of n needs a proof too. Should it wait behind
  // user 2101's (as before the pool was shared by uid), the stalled read
  // is let go after 20 s, so that the test ends, and fails.
  ExpectAnotherUsersReadWhileOnesAreStuck(4, static_cast<off_t>(8 * kMiB));
}

// Reads of the source run on a pool in which each uid holds at most half
// the threads, and the FUSE threads only hand them over: eight reads of one
// user stuck on a stalled source (twice the FUSE threads) leave another
// user's read of another file a thread. Found measuring: twelve chunk-path
// readers of one user made another user's 0.23 s read of a 512 MiB file of
// root's take 7.6 s (tests/bench/bench_fair_share.sh).
TEST_F(TwoCheckpointFaultySourceTest, OneUsersReadsStuckOnTheSourceLeaveAnotherUserAThread) {
  fs::permissions(tmp_.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  mount_ = Mount("allow_other,cache_size=256M,threads=2,verify=xxh3,fill=off,supervise=off");
  ASSERT_TRUE(WaitForLink("m") && WaitForLink("n")) << mount_->Log();
  // Should user 2102's read wait behind user 2101's (as when the FUSE
  // threads read the source themselves), the stalled reads are let go
  // after 20 s, so that the test ends, and fails.
  ExpectAnotherUsersReadWhileOnesAreStuck(8, 0);
}

// With a second checkpoint, n, whose model.safetensors holds m's very bytes
// beside a config.json of its own: another digest that shares m's file,
// and so the copy being made of it.
class TwinCheckpointFaultySourceTest : public FaultySourceTest {
 protected:
  TwinCheckpointFaultySourceTest() { faulty_extra_ = "twin"; }
};

// m's index row has no SHA-256 chain (from before it), so the copy of the
// file its open begins is proven whole and serves nothing before; n's row
// has one. A reader of n does not wait for that copy, whose proof cannot
// end (m's first chunk is stalled): its chunks are proven against n's
// chain on the chunk path. Should it wait for m's copy, as it did, the
// stall is let go after 20 s, so that the test ends, and fails.
TEST_F(TwinCheckpointFaultySourceTest, AReaderWithTheChainWaitsForNoOtherDigestsWholeProof) {
  // One chunk read at a time, so that the copy stays on the stalled one.
  MountWithoutChains("cache_size=256M,verify=sha256,fill=wait,fill_depth=1,supervise=off", {"m"});
  if (HasFatalFailure()) return;
  ASSERT_TRUE(WaitForLink("n")) << mount_->Log();
  const std::string twin = mnt_ + "/by-name/n/model.safetensors";
  ASSERT_NE(fs::read_symlink(mnt_ + "/by-name/m"), fs::read_symlink(mnt_ + "/by-name/n"));
  WriteFile(trigger_, "stall");  // m's first chunk hangs; n never does
  const pid_t opener = ::fork();
  if (opener == 0) {  // waits in its open for m's copy (fill=wait)
    const int fd = ::open(Through().c_str(), O_RDONLY);
    if (fd >= 0) ::close(fd);
    ::_exit(0);
  }
  ASSERT_GT(opener, 0);
  EXPECT_TRUE(WaitFor([&] { return InAFuseRead(opener); })) << ReadFile("/proc/" + std::to_string(opener) + "/wchan");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::string got;
  EXPECT_TRUE(DoneWhileStalled([&] { got = ReadDirect(twin, 4 * kMiB, kMiB); }))
      << "n's reader waited for m's copy, proven whole";
  EXPECT_TRUE(got == data_.substr(4 * kMiB, kMiB)) << got.substr(0, 80);
  ::unlink(trigger_.c_str());
  ::waitpid(opener, nullptr, 0);
}

TEST_F(FaultySourceTest, ASourceChangedUnderAFillAbandonsItAndIsIndexedAgain) {
  mount_ = MountWithPassthrough("cache_size=256M,fill=preload");
  SKIP_WITHOUT_PASSTHROUGH();
  const std::string digest = fs::read_symlink(mnt_ + "/by-name/m").filename();
  WriteFile(trigger_, "change");  // new times, no inotify event: only the fill's stamp check can tell
  CommandResult pre = RunCommand(kCtl + " preload " + mnt_ + "/" + digest, true);
  EXPECT_NE(pre.exit_code, 0);
  EXPECT_NE(pre.out.find("source changed"), std::string::npos) << pre.out;
  EXPECT_EQ(Stats(mnt_)["tiers"]["host"]["files"], 0);
  // Its pages go once the fill's other chunk reads are done with it.
  EXPECT_TRUE(WaitFor([&] {
    return HostTierMemfds(mount_->ServingPid()).empty() && Stats(mnt_)["tiers"]["host"]["filling"] == 0;
  }));
  // The fill asked for a rescan: the file is hashed again under its new
  // stamp, and its (unchanged) content is served again.
  ASSERT_TRUE(WaitFor([&] { return ReadDirect(Through(), 0, kMiB) == data_.substr(0, kMiB); })) << mount_->Log();
  EXPECT_NE(mount_->Log().find("source changed since it was indexed"), std::string::npos) << mount_->Log();
  ASSERT_EQ(RunCommand(kCtl + " preload " + mnt_ + "/by-name/m").exit_code, 0);
  EXPECT_TRUE(ReadBuffered(Through()) == data_);
}

}  // namespace
}  // namespace ckptfs::testing
