// The verified chunk path under a real mount: preload, pins, stats,
// corruption, registration with gpu= (simulated device), and a stress test. Tests of
// the chunk cache itself mount with fill=off, which keeps no whole files, so
// that every read goes through it (tests/integration/passthrough_mount_test.cpp
// covers the host tier of whole files and kernel passthrough).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "ckptfs/file_stamp.h"
#include "ckptfs/index.h"
#include "file_reads.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

nlohmann::json Stats(const std::string& mnt) { return QueryMount(kCtl, "stats", mnt); }

class CacheMountTest : public MountFixture {
 protected:
  CacheMountTest() : MountFixture("ckptfs-cache") {}
  std::string Digest(const std::string& by_name) { return fs::read_symlink(mnt_ + "/by-name/" + by_name).filename(); }
  bool WaitForLink(const std::string& name) {
    return WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/" + name); });
  }

  // Flips one bit of `path` at `offset`, and has the index vouch for the old
  // bytes under the file's new stamp, as if a tool had restored the file's
  // times (written through the Index, so the row's checksum is valid and only
  // the content check can catch it). Returns the file's bytes now. The
  // daemon must not be running.
  std::string FlipABitBehindAnIntactStamp(const std::string& path, uint64_t offset) {
    std::string bytes = ReadFile(path);
    bytes[offset] ^= 0x01;
    {
      FILE* f = std::fopen(path.c_str(), "r+b");
      EXPECT_NE(f, nullptr) << path;
      if (f == nullptr) return bytes;
      std::fseek(f, static_cast<long>(offset), SEEK_SET);
      std::fputc(bytes[offset], f);
      std::fclose(f);
    }
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    auto index = Index::Open(state_, nullptr);
    EXPECT_TRUE(index.ok()) << index.status().message();
    if (!index.ok()) return bytes;
    auto found = (*index)->LookupInode(st.st_dev, st.st_ino);
    EXPECT_TRUE(found.ok() && found->has_value()) << path << " is not in the index";
    if (!found.ok() || !found->has_value()) return bytes;
    EXPECT_TRUE((*index)->PutFile(FileStamp::FromStat(st), (*found)->path, (*found)->hashes).ok());
    return bytes;
  }
};

TEST_F(CacheMountTest, ReadAfterPreloadReadsNoSourceBytes) {
  WriteFile(src_ + "/m/model.safetensors", RandomBytes(40 * kMiB + 123, 1));
  WriteFile(src_ + "/m/config.json", "{}");
  auto m = Mount("cache_size=128M,fill=off");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  EXPECT_NE(RunCommand(kCtl + " status --json " + mnt_).out.find("\"pinned_memory\": true"), std::string::npos);
  CommandResult pre = RunCommand(kCtl + " preload " + mnt_ + "/by-name/m --pin", true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  EXPECT_NE(pre.out.find("preloaded " + mnt_ + "/by-name/m (2 file(s), 40.00 MiB) into the chunk tier, pinned"),
            std::string::npos)
      << pre.out;
  const auto before = Stats(mnt_);
  EXPECT_EQ(before["source_bytes_read"].get<uint64_t>(), 40 * kMiB + 123 + 2);
  // Eleven chunks of the model and one of the config, each file opened once
  // (kept open between its chunks: OpenSourceFiles).
  EXPECT_EQ(before["source_chunks_read"], 12);
  EXPECT_EQ(before["source_opens"], 2) << before.dump();
  EXPECT_TRUE(ReadDirect(mnt_ + "/by-name/m/model.safetensors") == ReadFile(src_ + "/m/model.safetensors"));
  const auto after = Stats(mnt_);
  EXPECT_EQ(after["source_bytes_read"], before["source_bytes_read"]);  // served from memory only
  EXPECT_GT(after["tiers"]["chunks"]["hits"].get<uint64_t>(), before["tiers"]["chunks"]["hits"].get<uint64_t>());
  EXPECT_EQ(after["tiers"]["chunks"]["pinned"].get<uint64_t>(), 12 * 4 * kMiB);  // 11 chunks + config.json's
  // Per-checkpoint numbers add up to the tier's.
  uint64_t pinned = 0;
  for (const auto& cp : after["checkpoints"]) pinned += cp["pinned"].get<uint64_t>();
  EXPECT_EQ(pinned, 40 * kMiB + 123 + 2);

  EXPECT_EQ(RunCommand(kCtl + " unpin " + mnt_ + "/by-name/m").exit_code, 0);
  EXPECT_EQ(Stats(mnt_)["tiers"]["chunks"]["pinned"], 0);
  EXPECT_EQ(RunCommand(kCtl + " evict " + mnt_ + "/" + Digest("m") + "/model.safetensors").exit_code, 0);
  EXPECT_EQ(Stats(mnt_)["tiers"]["chunks"]["used"], 4 * kMiB);  // only config.json's chunk is left
}

TEST_F(CacheMountTest, PinsLargerThanTheCacheFailClearly) {
  WriteFile(src_ + "/m/model.safetensors", RandomBytes(40 * kMiB, 2));
  auto m = Mount("cache_size=16M");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  CommandResult r = RunCommand(kCtl + " preload --pin " + mnt_ + "/by-name/m", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("pinning would exceed the host tier"), std::string::npos) << r.out;
  // Reads still work, from the unpinned slots.
  EXPECT_TRUE(ReadDirect(mnt_ + "/by-name/m/model.safetensors") == ReadFile(src_ + "/m/model.safetensors"));
}

TEST_F(CacheMountTest, ChangedPreloadAndStatsNeedTheOwner) {
  WriteFile(src_ + "/m/model.safetensors", RandomBytes(kMiB, 3));
  RunCommand("chmod -R a+rX " + src_ + " && chmod a+rx " + tmp_.path());
  auto m = Mount("allow_other");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const std::string as_other = "setpriv --reuid=4321 --regid=4321 --clear-groups ";
  CommandResult r = RunCommand(as_other + kCtl + " preload " + mnt_ + "/by-name/m", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("preload is for root or the mount's owner"), std::string::npos) << r.out;
  EXPECT_EQ(RunCommand(as_other + kCtl + " stats " + mnt_).exit_code, 0);
}

// Content that changed while its stamp did not (here: the index is edited to
// the new stamp, as if a tool had restored the file's times): only the chunk
// check catches it. The read fails with EIO, the digest is withdrawn, and the
// file is hashed again.
TEST_F(CacheMountTest, CorruptChunkGivesEioAndIsNeverServed) {
  const std::string shard = src_ + "/m/model.safetensors";
  WriteFile(shard, RandomBytes(12 * kMiB, 4));
  WriteFile(src_ + "/m/config.json", "{}");
  std::string old_digest;
  {
    auto m = Mount("");
    ASSERT_TRUE(WaitForLink("m")) << m->Log();
    old_digest = Digest("m");
  }
  const std::string bytes = FlipABitBehindAnIntactStamp(shard, 5 * kMiB);  // in chunk 1
  if (HasFatalFailure()) return;

  // fill=off: the chunk path, which this is about (with fill=wait the open's
  // copy would meet the bad chunk first; with fill=open a background copy
  // would race with the reads).
  auto m = Mount("fill=off");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  ASSERT_EQ(Digest("m"), old_digest);  // the index vouched for it
  const std::string through = mnt_ + "/" + old_digest + "/model.safetensors";
  // One open file throughout: the digest leaves the view as soon as the bad
  // chunk is found (read-ahead may find it first), but this reader keeps it.
  int fd = ::open(through.c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  void* buf = nullptr;
  ASSERT_EQ(::posix_memalign(&buf, 4096, kMiB), 0);
  ASSERT_EQ(::pread(fd, buf, kMiB, 0), static_cast<ssize_t>(kMiB));
  EXPECT_TRUE(std::string(static_cast<char*>(buf), kMiB) == bytes.substr(0, kMiB));  // chunk 0 is intact
  errno = 0;
  EXPECT_EQ(::pread(fd, buf, kMiB, 4 * kMiB), -1);  // chunk 1 is not, and is never served
  EXPECT_EQ(errno, EIO);
  std::free(buf);
  ::close(fd);
  EXPECT_NE(m->Log().find("chunk 1 (offset 4194304) does not match the index"), std::string::npos) << m->Log();
  EXPECT_GE(Stats(mnt_)["verification_failures"].get<uint64_t>(), 1u);
  // Withdrawn, then hashed again under the name of what it holds now.
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m") && Digest("m") != old_digest; })) << m->Log();
  EXPECT_FALSE(fs::exists(mnt_ + "/" + old_digest));
  EXPECT_TRUE(ReadDirect(mnt_ + "/by-name/m/model.safetensors") == bytes);
}

// A reader that finds a damaged chunk reports it to the watcher and goes
// on: it does not wait for the index nor for the watcher's lock, which a
// publish holds (for seconds on a large tree). Nor do other readers. Here a
// publish is held (CKPTFS_TEST_HOLD_PUBLISH) while a reader meets a bad chunk
// and another checkpoint is opened and read; both must be answered while
// the publish still waits, and once it ends the report takes effect.
TEST_F(CacheMountTest, ABadChunkFoundDuringASlowPublishHoldsUpNoReader) {
  const std::string shard = src_ + "/m/model.safetensors";
  WriteFile(shard, RandomBytes(12 * kMiB, 14));
  const std::string other = RandomBytes(3 * kMiB + 7, 15);
  WriteFile(src_ + "/n/model.safetensors", other);
  std::string old_digest;
  {
    auto m = Mount("");
    ASSERT_TRUE(WaitForLink("m") && WaitForLink("n")) << m->Log();
    old_digest = Digest("m");
  }
  const std::string bytes = FlipABitBehindAnIntactStamp(shard, 5 * kMiB);  // in chunk 1
  ASSERT_FALSE(HasFatalFailure());

  const std::string gate = tmp_ / "gate";
  MakeDirs(gate);
  ::setenv("CKPTFS_TEST_HOLD_PUBLISH", gate.c_str(), 1);
  auto m = Mount("fill=off");
  ::unsetenv("CKPTFS_TEST_HOLD_PUBLISH");
  ASSERT_TRUE(WaitForLink("m") && WaitForLink("n")) << m->Log();
  ASSERT_EQ(Digest("m"), old_digest);
  const std::string bad = mnt_ + "/" + old_digest + "/model.safetensors";
  const std::string good = mnt_ + "/" + Digest("n") + "/model.safetensors";

  // A new checkpoint in SRC: its scan's publish is held.
  WriteFile(gate + "/hold", "");
  WriteFile(src_ + "/o/model.safetensors", RandomBytes(kMiB, 16));
  ASSERT_TRUE(WaitFor([&] { return fs::exists(gate + "/held"); })) << m->Log();

  // In a child, so that a reader held up is seen as such (and killed): 0
  // when the bad chunk failed with EIO and the other file read right.
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(bad.c_str(), O_RDONLY | O_DIRECT);
    void* buf = nullptr;
    if (fd < 0 || ::posix_memalign(&buf, 4096, kMiB) != 0) ::_exit(3);
    errno = 0;
    if (::pread(fd, buf, kMiB, 4 * kMiB) != -1 || errno != EIO) ::_exit(1);
    ::close(fd);
    ::_exit(ReadFile(good) == other ? 0 : 2);
  }
  int status = 0;
  const bool answered = WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(30));
  const bool still_held = fs::exists(gate + "/held");
  fs::remove(gate + "/hold");  // the publish goes on
  if (!answered) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  ASSERT_TRUE(answered) << "readers waited for the publish" << m->Log();
  EXPECT_TRUE(still_held) << "the publish ended before the readers were answered: this proved nothing";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status << m->Log();

  // The report took effect: hashed again under the name of what it holds.
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m") && Digest("m") != old_digest; })) << m->Log();
  EXPECT_FALSE(fs::exists(mnt_ + "/" + old_digest));
  EXPECT_TRUE(ReadDirect(mnt_ + "/by-name/m/model.safetensors") == bytes);
  EXPECT_TRUE(WaitForLink("o")) << m->Log();
}

TEST_F(CacheMountTest, SourceShrinkingUnderAnOpenReaderGivesEio) {
  const std::string shard = src_ + "/m/model.safetensors";
  WriteFile(shard, RandomBytes(16 * kMiB, 5));
  // fill=off: the chunk path. With fill=wait the open would copy the file
  // first, and with fill=open a background copy could finish before the
  // shrink; either way the reader would rightly keep its verified bytes.
  auto m = Mount("fill=off");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const std::string through = mnt_ + "/by-name/m/model.safetensors";
  int fd = ::open(through.c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::truncate(shard.c_str(), 2 * kMiB), 0);
  void* buf = nullptr;
  ASSERT_EQ(::posix_memalign(&buf, 4096, kMiB), 0);
  errno = 0;
  EXPECT_EQ(::pread(fd, buf, kMiB, 8 * kMiB), -1);
  EXPECT_EQ(errno, EIO);
  std::free(buf);
  ::close(fd);
}

// Issue 12: with gpu=, a pinned host-tier copy is registered with the device
// (the simulated one records it) while it is pinned. Issue 23: the GPU chunk
// tier is gone; a preload into it is refused with why, by ckptfsctl and by
// the daemon (a client that speaks the protocol itself), and changes nothing.
TEST_F(CacheMountTest, PinnedHostCopyIsRegisteredWithTheGpuDevice) {
  const std::string data = RandomBytes(10 * kMiB + 5, 8);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = Mount("cache_size=64M,fill=preload,gpu=sim");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  CommandResult pin = RunCommand(kCtl + " preload --pin " + mnt_ + "/by-name/m", true);
  ASSERT_EQ(pin.exit_code, 0) << pin.out;
  auto s1 = Stats(mnt_);
  EXPECT_GE(s1["tiers"]["host"]["registered"].get<uint64_t>(), data.size());
  EXPECT_EQ(s1["tiers"]["host"]["registered"], s1["tiers"]["host"]["pinned"]);

  CommandResult gpu = RunCommand(kCtl + " preload --tier gpu " + mnt_ + "/by-name/m", true);
  EXPECT_NE(gpu.exit_code, 0);
  EXPECT_NE(gpu.out.find("--tier gpu is gone: the GPU chunk tier was removed"), std::string::npos) << gpu.out;
  const std::string raw = RunCommand(
      "python3 -c 'import json, os, socket, sys\n"
      "s = socket.socket(socket.AF_UNIX)\n"
      "s.connect(os.getxattr(sys.argv[1], \"user.ckptfs.control\").decode())\n"
      "s.sendall(json.dumps({\"cmd\": \"preload\", \"path\": \"by-name/m\", \"tier\": \"gpu\"}).encode() + b\"\\n\")\n"
      "print(s.makefile().readline())' " + ShellQuote(mnt_), true).out;
  auto reply = nlohmann::json::parse(raw, nullptr, false);
  ASSERT_TRUE(reply.is_object()) << raw;
  EXPECT_EQ(reply["ok"], false) << raw;
  EXPECT_NE(reply.value("error", std::string()).find("the GPU chunk tier was removed"), std::string::npos) << raw;
  auto s2 = Stats(mnt_);
  EXPECT_EQ(s2["source_bytes_read"], s1["source_bytes_read"]);
  EXPECT_EQ(s2["tiers"]["host"]["registered"], s1["tiers"]["host"]["registered"]);
  EXPECT_FALSE(s2["tiers"].contains("gpu"));
  EXPECT_FALSE(s2["checkpoints"][0].contains("gpu"));
  EXPECT_TRUE(ReadDirect(mnt_ + "/by-name/m/model.safetensors") == data);
  ASSERT_EQ(RunCommand(kCtl + " unpin " + mnt_ + "/by-name/m", true).exit_code, 0);
  EXPECT_EQ(Stats(mnt_)["tiers"]["host"]["registered"].get<uint64_t>(), 0u);
}

TEST_F(CacheMountTest, GpuOptionsWithoutADevice) {
  WriteFile(src_ + "/m/model.safetensors", "w");
  MakeDirs(mnt_);
  if (RunCommand("nvidia-smi -L 2>/dev/null | grep -q GPU").exit_code == 0) {
    GTEST_SKIP() << "this machine has a GPU; the no-device path cannot be staged here";
  }
  CommandResult r = RunCommand(kDaemon + " " + src_ + " " + mnt_ + " -f -o state=" + state_ + ",gpu=0", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("gpu=0:"), std::string::npos) << r.out;
  EXPECT_FALSE(IsMounted(mnt_));
  auto m = Mount("gpu=auto");
  EXPECT_TRUE(WaitForLink("m")) << m->Log();
  EXPECT_NE(m->Log().find("gpu=auto: no usable CUDA device"), std::string::npos) << m->Log();
}

// Issue 23: an fstab line that still sizes the removed GPU chunk tier is
// refused at mount, in one line that says why, and nothing is mounted.
TEST_F(CacheMountTest, TheRemovedGpuCacheSizeIsRefusedAtMount) {
  WriteFile(src_ + "/m/model.safetensors", "w");
  MakeDirs(mnt_);
  // MountedCkptfs unmounts in its destructor should a daemon mount after all.
  MountedCkptfs m(kDaemon, src_, mnt_, "state=" + state_ + ",gpu=sim,gpu_cache_size=1G", tmp_ / "refused.log");
  EXPECT_FALSE(m.ok());
  EXPECT_FALSE(IsMounted(mnt_));
  EXPECT_NE(m.Log().find("option gpu_cache_size= is gone: the GPU chunk tier was removed"), std::string::npos)
      << m.Log();
}

TEST_F(CacheMountTest, CacheLargerThanMemoryDoesNotHurtTheDaemon) {
  WriteFile(src_ + "/m/model.safetensors", RandomBytes(8 * kMiB, 7));
  auto m = Mount("cache_size=64T");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  EXPECT_NE(m->Log().find("cache_size="), std::string::npos) << m->Log();
  EXPECT_TRUE(ReadDirect(mnt_ + "/by-name/m/model.safetensors") == ReadFile(src_ + "/m/model.safetensors"));
  // Memory is taken as the cache fills: the daemon stays small.
  std::ifstream status("/proc/" + std::to_string(m->ServingPid()) + "/status");
  std::string line;
  uint64_t rss_kib = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss_kib = std::stoull(line.substr(6));
  }
  EXPECT_GT(rss_kib, 0u);
  EXPECT_LT(rss_kib, 512u * 1024);
}

// 16 readers over 4 files, sequential and random, through a cache smaller
// than the data: every byte compared with the source.
TEST_F(CacheMountTest, StressManyReadersSmallCache) {
  std::vector<std::string> contents;
  for (int i = 0; i < 4; ++i) {
    contents.push_back(RandomBytes(20 * kMiB + static_cast<size_t>(i) * 12345, 100 + static_cast<uint64_t>(i)));
    WriteFile(src_ + "/m/shard-" + std::to_string(i) + ".safetensors", contents.back());
  }
  auto m = Mount("cache_size=24M,fill=off");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  std::atomic<int> mismatches{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 16; ++t) {
    readers.emplace_back([&, t] {
      const int file = t % 4;
      const std::string path = mnt_ + "/by-name/m/shard-" + std::to_string(file) + ".safetensors";
      const std::string& want = contents[static_cast<size_t>(file)];
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      if (t < 8) {  // sequential, whole file
        ++reads;
        if (ReadDirect(path) != want) ++mismatches;
        return;
      }
      for (int i = 0; i < 40; ++i) {  // random 4 KiB-aligned ranges
        const uint64_t off = (rng() % (want.size() / 4096)) * 4096;
        const size_t len = static_cast<size_t>(4096 * (1 + rng() % 256));
        ++reads;
        if (ReadDirect(path, off, len) != want.substr(off, len)) ++mismatches;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(reads.load(), 8 + 8 * 40);
  auto s = Stats(mnt_);
  EXPECT_LE(s["tiers"]["chunks"]["used"].get<uint64_t>(), 24 * kMiB);
  EXPECT_GT(s["tiers"]["chunks"]["evictions"].get<uint64_t>(), 0u);
  EXPECT_EQ(s["failed_reads"], 0);
}

// A source whose reads start failing after it was indexed (a bad sector):
// the read that needs the bad bytes fails with EIO (ETIMEDOUT when the
// source timed out) and names the cause in the log; everything else is
// still served, and the digest stays.
TEST_F(CacheMountTest, SourceReadErrorFailsOnlyTheReadsThatNeedIt) {
  const std::string data = RandomBytes(16 * kMiB, 9);
  WriteFile(tmp_ / "backing", data);
  const std::string faulty = tmp_ / "faulty";
  const std::string trigger = tmp_ / "fail-now";
  MakeDirs(faulty);
  struct Child {
    pid_t pid = -1;
    std::string mnt;
    ~Child() {
      if (IsMounted(mnt)) RunCommand("fusermount3 -u -z " + ShellQuote(mnt));
      if (pid > 0) {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } child;
  child.mnt = faulty;
  child.pid = ::fork();
  if (child.pid == 0) {
    ::execl(FAULTYFS_PATH, FAULTYFS_PATH, (tmp_ / "backing").c_str(), faulty.c_str(), trigger.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_TRUE(WaitFor([&] { return IsMounted(faulty); }));
  src_ = faulty;
  auto m = Mount("cache_size=16M");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const std::string through = mnt_ + "/by-name/m/model.safetensors";
  WriteFile(trigger, "");  // the disk goes bad after indexing, before any read
  EXPECT_TRUE(ReadDirect(through, 0, kMiB) == data.substr(0, kMiB));
  EXPECT_EQ(ReadDirect(through, 8 * kMiB, kMiB), "<read: Input/output error>");
  EXPECT_NE(m->Log().find("cannot read source " + faulty + "/m/model.safetensors at offset 8388608: "
                          "Input/output error"),
            std::string::npos)
      << m->Log();
  EXPECT_TRUE(ReadDirect(through, 4 * kMiB, kMiB) == data.substr(4 * kMiB, kMiB));  // the rest goes on
  // A network source that times out: the reader is told so, not just "I/O
  // error" (the reply carries the source's own errno where it is true of
  // the view too).
  WriteFile(trigger, "timeout");
  EXPECT_EQ(ReadDirect(through, 8 * kMiB, kMiB), "<read: Connection timed out>");
  ::unlink(trigger.c_str());
  // Not withdrawn: an I/O error is not a lie about the content.
  EXPECT_TRUE(ReadDirect(through, 8 * kMiB, kMiB) == data.substr(8 * kMiB, kMiB));
  EXPECT_EQ(Stats(mnt_)["verification_failures"], 0);
  m->Unmount();
}

// Without the right to lock memory (no CAP_IPC_LOCK, RLIMIT_MEMLOCK 0) the
// cache goes on unpinned (and says so once in the log).
TEST_F(CacheMountTest, RefusedPinningGoesOnUnpinned) {
  const std::string data = RandomBytes(40 * kMiB, 8);
  WriteFile(src_ + "/m/model.safetensors", data);
  MakeDirs(mnt_);
  const std::string log = tmp_ / "unpinned.log";
  CommandResult r = RunCommand("setpriv --bounding-set=-ipc_lock prlimit --memlock=0:0 " + kDaemon + " " + src_ + " " +
                                   mnt_ + " -o state=" + state_ + ",settle=0,cache_size=128M 2>" + log,
                               true);
  ASSERT_EQ(r.exit_code, 0) << r.out << ReadFile(log);
  const bool shown = WaitForLink("m");
  const bool same = shown && ReadDirect(mnt_ + "/by-name/m/model.safetensors") == data;
  // A pinned whole file: resident and never evicted, but not locked.
  CommandResult pin = RunCommand(kCtl + " preload --pin " + mnt_ + "/by-name/m", true);
  const bool pinned_same = ReadBuffered(mnt_ + "/by-name/m/model.safetensors") == data;
  CommandResult status = RunCommand(kCtl + " status --json " + mnt_);
  const auto stats = Stats(mnt_);
  RunCommand("fusermount3 -u " + mnt_);
  EXPECT_TRUE(shown);
  EXPECT_TRUE(same);
  EXPECT_EQ(pin.exit_code, 0) << pin.out;
  EXPECT_TRUE(pinned_same);
  EXPECT_EQ(stats["tiers"]["host"]["pinned"], 40 * kMiB) << stats.dump();
  EXPECT_EQ(stats["memory"]["locked"], false) << stats.dump();
  auto j = nlohmann::json::parse(status.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << status.out;
  // The daemon was started in the background: its log went to syslog, so ask
  // the daemon itself whether it pinned.
  EXPECT_EQ(j["cache"]["pinned_memory"], false) << status.out;
}

}  // namespace
}  // namespace ckptfs::testing
