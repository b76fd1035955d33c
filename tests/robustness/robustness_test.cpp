// What no file in SRC and no local user may do to the daemon (issue 11):
// crash it, hang it, or make it burn I/O, CPU, log lines or memory without
// bound. Each test runs the real daemon under a temporary directory and
// unmounts what it mounted, even when it fails; each states the bound it
// checks, and none is a timing assertion on this noisy machine: "does not
// hang" is a generous timeout (timeout(1)) around the operation.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "ckptfs/file_stamp.h"
#include "ckptfs/index.h"
#include "kernel_caches_lock.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

class RobustnessTest : public MountFixture {
 protected:
  RobustnessTest() : MountFixture("ckptfs-robust") {}
  nlohmann::json Ctl(const std::string& cmd) {
    auto j = nlohmann::json::parse(RunCommand(kCtl + " " + cmd + " --json " + mnt_).out, nullptr, false);
    return j.is_discarded() ? nlohmann::json::object() : j;
  }
  std::string Digest(const std::string& by_name) {
    std::error_code ec;
    auto t = fs::read_symlink(mnt_ + "/by-name/" + by_name, ec);
    return ec ? "" : t.filename().string();
  }
  // Flips a bit of FILE at OFFSET and has the index vouch for the old
  // content under the file's new stamp, as if a tool had restored its times:
  // only the chunk check of a read can find it (and withdraws the digest).
  void RotBehindAnIntactStamp(const std::string& file, size_t offset) {
    std::string bytes = ReadFile(file);
    FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << file;
    std::fseek(f, static_cast<long>(offset), SEEK_SET);
    std::fputc(bytes[offset] ^ 1, f);
    std::fclose(f);
    struct stat st;
    ASSERT_EQ(::stat(file.c_str(), &st), 0);
    auto index = Index::Open(state_, nullptr);
    ASSERT_TRUE(index.ok());
    auto found = (*index)->LookupInode(st.st_dev, st.st_ino);
    ASSERT_TRUE(found.ok()) << found.status().message();
    auto& stored = *found;
    ASSERT_TRUE(stored.has_value());
    ASSERT_TRUE((*index)->PutFile(FileStamp::FromStat(st), stored->path, stored->hashes).ok());
  }
  // The checkpoint at `path` (absolute) as `ckptfsctl status` shows it;
  // an empty object when it is not there.
  nlohmann::json CheckpointStatus(const std::string& path) {
    for (const auto& c : Ctl("status").value("checkpoints", nlohmann::json::array())) {
      if (c.value("path", "") == path) return c;
    }
    return nlohmann::json::object();
  }
  // A field of /proc/PID/status in kB ("VmRSS", "VmHWM"); 0 when absent.
  static uint64_t ProcStatusKib(pid_t pid, const std::string& field) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
    }
    return 0;
  }
  static size_t Count(const std::string& haystack, const std::string& needle) {
    size_t n = 0;
    for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
    return n;
  }
};

// Item 3: a FIFO put in place of an indexed file. Reads of the old digest
// fail (EIO) instead of parking every FUSE worker in open(); the daemon keeps
// answering, indexes what comes next, and unmounts. Bound: each read returns
// within 20 s (timeout(1)); on the daemon before the fix it never returned.
TEST_F(RobustnessTest, AFifoInPlaceOfAnIndexedFileHangsNothing) {
  WriteFile(src_ + "/m/model.bin", RandomBytes(kMiB, 1));
  WriteFile(src_ + "/m/config.json", "{}");
  // fill_on_index=off: the reads must go to the source (a copy made at
  // indexing would rightly serve the old verified bytes).
  auto m = Mount("fill_on_index=off");
  ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  const std::string old_file = mnt_ + "/" + Digest("m") + "/config.json";
  ASSERT_EQ(::unlink((src_ + "/m/config.json").c_str()), 0);
  ASSERT_EQ(::mkfifo((src_ + "/m/config.json").c_str(), 0644), 0);
  std::vector<std::thread> readers;
  std::atomic<int> hung{0}, served{0};
  for (int i = 0; i < 16; ++i) {
    readers.emplace_back([&] {
      CommandResult r = RunCommand("timeout 20 dd if=" + ShellQuote(old_file) + " iflag=direct bs=4096 of=/dev/null");
      if (r.exit_code == 124) ++hung;
      if (r.exit_code == 0) ++served;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(hung.load(), 0) << m->Log();
  EXPECT_EQ(served.load(), 0) << "bytes were served from a FIFO under an old digest";
  EXPECT_EQ(RunCommand("timeout 20 " + kCtl + " status " + mnt_).exit_code, 0);
  WriteFile(src_ + "/later/model.bin", "w");
  EXPECT_TRUE(WaitFor([&] { return !Digest("later").empty(); })) << m->Log();
  m->Unmount();
  EXPECT_FALSE(IsMounted(mnt_));
}

// Item 7: an empty member is stored in the index like any file, so an
// unchanged tree is never hashed again.
TEST_F(RobustnessTest, AnEmptyMemberFileIsIndexedOnce) {
  WriteFile(src_ + "/m/model.bin", "weights");
  WriteFile(src_ + "/m/empty.txt", "");
  const std::string ctl = kCtl + " --state " + ShellQuote(state_) + " digest -v " + ShellQuote(src_) + " 2>&1";
  CommandResult first = RunCommand(ctl);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  EXPECT_EQ(first.out.find("NOT NULL"), std::string::npos) << first.out;
  CommandResult second = RunCommand(ctl);
  EXPECT_NE(second.out.find("hashed 0 file(s)"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find(CoreutilsDigest(src_ + "/m")), std::string::npos) << second.out;
}

// Item 8: a start that cannot work says so with its exit status, even when
// the daemon forks into the background: here the state directory sits on a
// full filesystem.
TEST_F(RobustnessTest, AFailedStartExitsNonZeroEvenWhenDaemonizing) {
  WriteFile(src_ + "/m/model.bin", "w");
  const std::string full = tmp_ / "full";
  MakeDirs(full);
  MakeDirs(mnt_);
  ASSERT_EQ(::mount("tmpfs", full.c_str(), "tmpfs", 0, "size=256k"), 0) << std::strerror(errno);
  RunCommand("dd if=/dev/zero of=" + ShellQuote(full + "/filler") + " bs=4k 2>/dev/null");
  CommandResult r = RunCommand(kDaemon + " " + src_ + " " + mnt_ + " -o state=" + full + "/state", true);
  const bool mounted = IsMounted(mnt_);
  if (mounted) RunCommand("fusermount3 -u " + mnt_);
  ::umount2(full.c_str(), MNT_DETACH);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_FALSE(mounted);
  EXPECT_NE(r.out.find(full + "/state"), std::string::npos) << r.out;  // names the path
}

// Item 10: durations are range-checked (settle=9.3e9 used to overflow into
// "no settle"); a mount point that is a file is called one.
TEST_F(RobustnessTest, BadDurationsAndAFileMountPointAreRefusedClearly) {
  WriteFile(src_ + "/m/model.bin", "w");
  MakeDirs(mnt_);
  for (const char* opt : {"settle=9.3e9", "rescan=1e300", "settle=-1", "settle=nan"}) {
    // In the foreground: a daemon that accepted the option would not return
    // (timeout(1) ends it, and the test fails on its exit status).
    CommandResult r = RunCommand("timeout 10 " + kDaemon + " " + src_ + " " + mnt_ + " -f -o state=" + state_ + "," + opt, true);
    if (IsMounted(mnt_)) RunCommand("fusermount3 -u " + mnt_);
    EXPECT_NE(r.exit_code, 0) << opt;
    EXPECT_NE(r.out.find(opt), std::string::npos) << r.out;
  }
  WriteFile(tmp_ / "file", "x");
  CommandResult r = RunCommand("timeout 10 " + kDaemon + " " + src_ + " " + (tmp_ / "file") + " -f -o state=" + state_, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("Not a directory"), std::string::npos) << r.out;
}

// Item 6: readers of a changed file cannot force endless rescans and log
// lines. Bound: 300 failing reads cause at most 5 scans and 3 log lines
// about the file (before the fix: one scan and one line per read).
TEST_F(RobustnessTest, ReadsOfAChangedFileCauseOneReportAndFewRescans) {
  const std::string shard = src_ + "/m/model.bin";
  WriteFile(shard, RandomBytes(24 * kMiB, 2));
  // fill=off: reads through the chunk path. With fill=wait the open would
  // copy the file first, and with fill=open a background copy could finish
  // before the change; every read would then rightly get its old bytes.
  auto m = Mount("fill=off");
  ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  const std::string through = mnt_ + "/" + Digest("m") + "/model.bin";
  int fd = ::open(through.c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  {
    FILE* f = std::fopen(shard.c_str(), "r+b");  // in place: same inode, new stamp
    std::fputc('!', f);
    std::fclose(f);
  }
  // Scans counted by status, which must answer (a daemon that stopped
  // answering would otherwise pass as one that scanned little).
  auto scans_now = [&]() -> uint64_t {
    const nlohmann::json status = Ctl("status");
    EXPECT_TRUE(status.contains("scans") && status["scans"].is_number_unsigned()) << status.dump() << m->Log();
    return status.value("scans", uint64_t{0});
  };
  const uint64_t scans_before = scans_now();
  ASSERT_GE(scans_before, 1u);  // the scan that showed m
  void* buf = nullptr;
  ASSERT_EQ(::posix_memalign(&buf, 4096, kMiB), 0);
  int failed = 0;
  for (int i = 0; i < 300; ++i) {
    if (::pread(fd, buf, kMiB, static_cast<off_t>((i % 24) * kMiB)) < 0) ++failed;
  }
  std::free(buf);
  ::close(fd);
  EXPECT_EQ(failed, 300);
  // The rescans the reads asked for have run (they are coalesced to one a
  // second after the last).
  EXPECT_TRUE(WaitFor([&] { return Ctl("status").value("scan_pending", true) == false; })) << m->Log();
  const uint64_t scans_after = scans_now();
  ASSERT_GE(scans_after, scans_before);
  EXPECT_LE(scans_after - scans_before, 5u) << m->Log();
  EXPECT_LE(Count(m->Log(), "no longer served under this digest"), 3u) << m->Log();
}

// Item 6: bit rot behind an intact stamp is found once: one 24 MiB read
// neither re-reads the source for every request nor reports each of them.
TEST_F(RobustnessTest, BitRotIsReportedOnceAndNotReReadForEveryRequest) {
  const std::string shard = src_ + "/m/model.bin";
  std::string bytes = RandomBytes(24 * kMiB, 3);
  WriteFile(shard, bytes);
  {
    auto m = Mount();
    ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  }
  ASSERT_NO_FATAL_FAILURE(RotBehindAnIntactStamp(shard, 5 * kMiB));
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  const std::string old = Digest("m");
  for (int i = 0; i < 20; ++i) RunCommand("cat " + mnt_ + "/" + old + "/model.bin > /dev/null 2>&1");
  auto stats = Ctl("stats");
  EXPECT_LE(stats.value("verification_failures", uint64_t{999}), 8u) << stats.dump();
  EXPECT_LE(stats.value("source_bytes_read", uint64_t{1} << 40), 48 * kMiB) << stats.dump();
  EXPECT_LE(Count(m->Log(), "does not match the index"), 1u) << m->Log();
}

// Item 10: read-ahead is bounded by what the cache can hold. 16 readers of
// 16 x 32 MiB over cache_size=64M: every reader's current chunk already
// fills the cache, so the daemon reads nothing ahead (before the fix it
// filled 107 chunks ahead, of which 2 were used before being evicted).
// Bound: with all 16 files open, at most 4 read-ahead fills (the in-flight
// budget), and every byte right. The total read
// from the source is printed, not asserted: the rest of the amplification
// (chunks evicted between two of the kernel's requests into them) depends
// on how the readers interleave on this noisy machine.
TEST_F(RobustnessTest, ReadAheadNeverReadsFarMoreThanItServes) {
  std::vector<std::string> parts;
  for (int i = 0; i < 16; ++i) {
    parts.push_back(RandomBytes(32 * kMiB, 10 + static_cast<uint64_t>(i)));
    WriteFile(src_ + "/m/part" + std::to_string(i) + ".bin", parts.back());
  }
  auto m = Mount("cache_size=64M");
  ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  const std::string dir = mnt_ + "/" + Digest("m");
  // All 16 open before the first read, as 16 engine workers would be.
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) fds.push_back(::open((dir + "/part" + std::to_string(i) + ".bin").c_str(), O_RDONLY));
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 16; ++i) {
    readers.emplace_back([&, i] {
      std::string buf(kMiB, '\0');
      for (size_t off = 0; off < 32 * kMiB; off += kMiB) {
        if (::pread(fds[static_cast<size_t>(i)], buf.data(), kMiB, static_cast<off_t>(off)) != static_cast<ssize_t>(kMiB) ||
            buf.compare(0, kMiB, parts[static_cast<size_t>(i)], off, kMiB) != 0) {
          ++wrong;
          return;
        }
      }
    });
  }
  for (auto& t : readers) t.join();
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(wrong.load(), 0);
  auto stats = Ctl("stats");
  EXPECT_LE(stats.value("readahead_fills", uint64_t{1} << 40), 4u) << stats.dump();
  std::cout << "[ read-ahead ] source bytes read / served: "
            << static_cast<double>(stats.value("source_bytes_read", uint64_t{0})) / (16.0 * 32 * kMiB) << "\n";
}

// An open directory copies nothing: one user's loop of opens of a wide
// directory (each copied its whole listing: 15 MB and 20-40 ms of a FUSE
// thread for 50,000 long names) held every thread and took gigabytes.
// Bound: 200 open handles of a 5,000-entry directory of 200-byte names
// (a 1.3 MB listing each, 260 MB copied before) add under 32 MB to the
// daemon, and a listing read through one of them is whole and in order.
TEST_F(RobustnessTest, OpenDirectoriesCopyNoListing) {
  WriteFile(src_ + "/wide/model.bin", "weights");
  const std::string pad(200, 'n');
  for (int i = 0; i < 5000; ++i) WriteFile(src_ + "/wide/" + std::to_string(10000 + i) + pad, "{}");
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !Digest("wide").empty(); }, std::chrono::seconds(60))) << m->Log();
  const std::string dir = mnt_ + "/" + Digest("wide");
  auto rss_kib = [&] { return ProcStatusKib(m->ServingPid(), "VmRSS"); };
  const uint64_t before = rss_kib();
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    fds.push_back(::open(dir.c_str(), O_RDONLY | O_DIRECTORY));
    ASSERT_GE(fds.back(), 0);
  }
  const uint64_t after = rss_kib();
  EXPECT_LT(after, before + 32 * 1024) << "VmRSS " << before << " kB before, " << after << " kB with 200 open";
  std::vector<std::string> names;
  DIR* d = ::fdopendir(fds.back());
  ASSERT_NE(d, nullptr);
  fds.pop_back();
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (int fd : fds) ::close(fd);
  ASSERT_EQ(names.size(), 5003u);  // ".", "..", model.bin and the 5,000
  EXPECT_EQ(names[0], ".");
  EXPECT_EQ(names[1], "..");
  EXPECT_EQ(names[2], "10000" + pad);
  EXPECT_EQ(names[5001], "14999" + pad);
  EXPECT_EQ(names[5002], "model.bin");
}

// Item 9: memory stays flat as a checkpoint goes through many versions: the
// view frees the nodes of withdrawn digests once the kernel forgets them.
// Bound: resident memory after 50 versions of a 2,000-file checkpoint is
// within 10% (plus 4 MiB of allocator slack) of what it was after 10.
TEST_F(RobustnessTest, MemoryStaysFlatAcrossManyVersionsOfACheckpoint) {
  WriteFile(src_ + "/m/model.bin", "weights");
  for (int i = 0; i < 2000; ++i) WriteFile(src_ + "/m/files/f" + std::to_string(i) + ".txt", std::to_string(i));
  // Without the page reserve: it grows, by design, to a share of the host
  // tier (its pages are mapped, and counted in VmRSS), which would hide a
  // leak or look like one.
  auto m = Mount("page_reserve=off");
  ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  auto rss_kib = [&] { return ProcStatusKib(m->ServingPid(), "VmRSS"); };
  uint64_t after_10 = 0;
  for (int version = 1; version <= 50; ++version) {
    const std::string before = Digest("m");
    WriteFile(src_ + "/m/version.txt", std::to_string(version));
    // Touch the view as an engine would, so the kernel holds (and later
    // forgets) nodes of each version.
    RunCommand("ls -l " + mnt_ + "/by-name/m/files > /dev/null");
    ASSERT_TRUE(WaitFor([&] { return Digest("m") != before && !Digest("m").empty(); })) << m->Log();
    if (version == 10) after_10 = rss_kib();
  }
  // The kernel forgets unused dentries and inodes, and the daemon the nodes
  // it held for them (their FORGETs come asynchronously).
  KernelCachesLock one_dropper_at_a_time;
  ASSERT_TRUE(WaitFor([&] {
    KernelCachesLock::DropDentriesAndInodes();
    return Ctl("stats").value("kernel_held_nodes", uint64_t{1} << 60) == 0;
  })) << Ctl("stats").dump();
  const uint64_t after_50 = rss_kib();
  EXPECT_LE(after_50, after_10 + after_10 / 10 + 4096) << "VmRSS " << after_10 << " kB after 10 versions, "
                                                       << after_50 << " kB after 50";
  std::cout << "[ memory ] VmRSS " << after_10 << " kB after 10 versions, " << after_50 << " kB after 50\n";
}

// Every thread of the daemon may hold a lock that opens wait on (the
// process's mmap lock included, which any page it takes holds), so none may
// run at a priority that busy CPUs starve: the page reserve's thread at
// idle priority held opens up and kept a restart's old daemon alive for
// seconds on the suite's loaded machine. Bound: each thread runs under the
// test's own scheduling policy and at its nice value or better, the
// reserve's thread included (where there is a reserve: a VM that reports
// free pages; PageReserveTest.ItsThreadRunsAtItsCallersPriority checks it
// anywhere).
TEST_F(RobustnessTest, NoThreadOfTheDaemonRunsAtAPriorityBusyCpusStarve) {
  const int our_policy = ::sched_getscheduler(0);
  errno = 0;
  const int our_nice = ::getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  WriteFile(src_ + "/m/model.bin", "weights");
  auto m = Mount("page_reserve=32M");
  ASSERT_TRUE(WaitFor([&] { return !Digest("m").empty(); })) << m->Log();
  const pid_t daemon = m->ServingPid();
  std::set<std::string> names;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(daemon) + "/task")) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // a thread that ended meanwhile
    // tid (comm) state ...: comm may hold spaces, so count fields after ')'.
    const auto open = line.find('('), close = line.rfind(')');
    const std::string name = line.substr(open + 1, close - open - 1);
    names.insert(name);
    std::istringstream rest(line.substr(close + 2));
    std::vector<std::string> fields(3);  // fields[3] is field 3 (state), as proc(5) counts
    for (std::string f; rest >> f;) fields.push_back(f);
    ASSERT_GT(fields.size(), 41u) << line;
    EXPECT_LE(std::stoi(fields[19]), our_nice) << "thread " << name << " runs at nice " << fields[19];
    EXPECT_EQ(std::stoi(fields[41]), our_policy)
        << "thread " << name << " runs under scheduling policy " << fields[41] << " (0: SCHED_OTHER, 5: SCHED_IDLE)";
  }
  const bool reserve_on = Ctl("stats")["memory"]["page_reserve"].value("on", false);
  if (reserve_on) {
    EXPECT_TRUE(names.count("ckptfs-reserve")) << "no reserve thread among " << names.size();
  }
  std::cout << "[ threads ] " << names.size() << " names, page reserve " << (reserve_on ? "on" : "off") << "\n";
}

// Item 9: a change in one checkpoint costs that checkpoint, not the tree. A
// rescan keeps a checkpoint it walks exactly as last time without asking
// the index about each of its files, and the publish reuses its nodes.
TEST_F(RobustnessTest, AChangeInOneCheckpointCostsThatCheckpointOnly) {
  WriteFile(src_ + "/big/model.bin", "weights");
  for (int i = 0; i < 3000; ++i) WriteFile(src_ + "/big/d" + std::to_string(i % 30) + "/f" + std::to_string(i), "x");
  WriteFile(src_ + "/small/model.bin", "one");
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !Digest("big").empty() && !Digest("small").empty(); })) << m->Log();
  const std::string big = Digest("big"), before = Digest("small");

  WriteFile(src_ + "/small/model.bin", "two");
  ASSERT_TRUE(WaitFor([&] { return Digest("small") != before && !Digest("small").empty(); })) << m->Log();
  const auto scan = Ctl("status")["last_scan"];
  ASSERT_TRUE(scan.is_object()) << Ctl("status").dump();
  EXPECT_EQ(scan.value("checkpoints", 0), 2) << scan.dump();
  EXPECT_GE(scan.value("checkpoints_kept", 0), 1) << scan.dump();
  EXPECT_LE(scan.value("files_looked_up", 99999), 1) << scan.dump();  // small's one file at most
  EXPECT_GE(scan.value("nodes_reused", 0), 3000) << scan.dump();     // big's members, not rebuilt
  EXPECT_LT(scan.value("nodes_built", 99999), 100) << scan.dump();
  EXPECT_EQ(Digest("big"), big);
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/big/d7/f7"), "x");
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/small/model.bin"), "two");
}

// Item 9, the walk: a rescan that inotify started re-reads only the
// directories it named. Whatever the change, the view must then agree with
// a full walk of the source (ckptfsctl digest, its own index): new, removed,
// nested and renamed checkpoints, a file changed deep down, a write through
// a hard link from elsewhere (no event in the checkpoint's directories). (A
// change that raises no event in SRC at all, such as a write through a hard
// link made after the last walk saw the file, or through a shared mmap, is
// found by verification on read, which asks for a full walk, and by the
// periodic rescan.)
TEST_F(RobustnessTest, IncrementalRescansAgreeWithAFullWalk) {
  WriteFile(src_ + "/team/a/model.bin", "a");
  WriteFile(src_ + "/team/a/sub/deep/config.json", "{}");
  WriteFile(src_ + "/team/b/model.bin", "b");
  WriteFile(src_ + "/other/c/model.bin", "c");
  for (int i = 0; i < 50; ++i) WriteFile(src_ + "/other/c/d" + std::to_string(i % 5) + "/f" + std::to_string(i), "x");
  ASSERT_EQ(::link((src_ + "/other/c/d1/f1").c_str(), (tmp_ / "outside-link").c_str()), 0);
  auto m = Mount();  // rescan=0: nothing but inotify starts a rescan
  const std::string full_state = tmp_ / "full-walk-state";
  // (path, digest) of every valid checkpoint, by a full walk of SRC.
  auto full_walk = [&] {
    std::set<std::pair<std::string, std::string>> out;
    std::istringstream lines(RunCommand(kCtl + " --state " + full_state + " digest " + src_).out);
    for (std::string line; std::getline(lines, line);) {
      const auto sep = line.find("  ");
      if (line.rfind("sha256-", 0) == 0 && sep != std::string::npos) out.emplace(line.substr(sep + 2), line.substr(0, sep));
    }
    return out;
  };
  auto shown = [&] {
    std::set<std::pair<std::string, std::string>> out;
    const auto status = Ctl("status");
    for (const auto& c : status.value("checkpoints", nlohmann::json::array())) {
      if (c.value("state", "") != "exposed") return std::set<std::pair<std::string, std::string>>{};  // not settled
      out.emplace(c.value("path", ""), c.value("name", ""));
    }
    return out;
  };
  int incremental_scans = 0;
  auto agree = [&](const std::string& step) {
    const auto expected = full_walk();
    ASSERT_FALSE(expected.empty()) << step;
    EXPECT_TRUE(WaitFor([&] { return shown() == expected; })) << step << "\n" << Ctl("status").dump(1) << m->Log();
    incremental_scans += Ctl("status")["last_scan"].value("incremental", false) ? 1 : 0;
  };
  agree("mounted");

  WriteFile(src_ + "/team/a/sub/deep/config.json", R"({"changed": true})");
  agree("a file changed three directories down");
  WriteFile(src_ + "/team/new/model.bin", "new");
  agree("a new checkpoint in a new directory");
  WriteFile(src_ + "/team/a/sub/model.bin", "nested");
  agree("a nested checkpoint in an existing directory");
  fs::remove_all(src_ + "/team/a/sub");
  agree("the nested checkpoint removed");
  fs::rename(src_ + "/other/c", src_ + "/other/renamed");
  agree("a checkpoint directory renamed");
  // In place, through the other name: no event in other/renamed. The walk
  // that saw a file with two links re-reads its directories every time.
  WriteFile(tmp_ / "outside-link", "written through the other name");
  WriteFile(src_ + "/team/b/model.bin", "b2");  // some event, so that a rescan runs
  agree("a write through a hard link from outside the source");
  EXPECT_GE(incremental_scans, 5) << "the incremental path was hardly exercised";
}

// Issue 9, the view: a withdrawn digest leaves the listing at once (DESIGN.md
// section 2), also while another checkpoint is being indexed. `small` rots
// behind an intact stamp, so a read of it withdraws its digest while the
// indexer is held before big/gate.json; then it is let through to be held
// again before big/sub/gate.json. The withdrawn digest must be gone from the
// listing while `big` is still held there (before the fix it stayed listed,
// and was published again, until the whole indexing pass had ended).
TEST_F(RobustnessTest, AWithdrawnDigestLeavesTheListingWhileAnotherIsIndexed) {
  const std::string shard = src_ + "/small/model.bin";
  WriteFile(shard, RandomBytes(8 * kMiB, 4));
  {
    auto m = Mount();
    ASSERT_TRUE(WaitFor([&] { return !Digest("small").empty(); })) << m->Log();
  }
  ASSERT_NO_FATAL_FAILURE(RotBehindAnIntactStamp(shard, 5 * kMiB));
  // Largest first on one thread: big/gate.json, then big/sub/gate.json.
  WriteFile(src_ + "/big/model.bin", "weights");
  WriteFile(src_ + "/big/gate.json", RandomBytes(2 * kMiB, 5));
  WriteFile(src_ + "/big/sub/gate.json", RandomBytes(kMiB, 6));
  const std::string gate = tmp_ / "gate";
  MakeDirs(gate);
  ::setenv("CKPTFS_TEST_PAUSE_BEFORE_HASH", ("gate.json:" + gate).c_str(), 1);
  auto m = Mount("threads=1");
  ::unsetenv("CKPTFS_TEST_PAUSE_BEFORE_HASH");
  const std::string old = Digest("small");
  ASSERT_FALSE(old.empty()) << m->Log();  // shown at mount: the index vouches for it
  auto held = [&] { return ::access((gate + "/paused").c_str(), F_OK) == 0; };
  ASSERT_TRUE(WaitFor(held)) << m->Log();
  auto state_of = [&](const std::string& rel) { return CheckpointStatus(src_ + "/" + rel).value("state", "absent"); };
  ASSERT_EQ(state_of("big"), "indexing");
  EXPECT_NE(RunCommand("cat " + mnt_ + "/" + old + "/model.bin > /dev/null 2>&1").exit_code, 0);  // EIO
  auto listed = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(mnt_, ec)) {
      if (e.path().filename() == old) return true;
    }
    return false;
  };
  // Through the first gate only (renamed into place: the daemon never reads
  // a half-written word).
  WriteFile(gate + "/resume.next", "once");
  fs::rename(gate + "/resume.next", gate + "/resume");
  EXPECT_TRUE(WaitFor([&] { return !listed() && held(); })) << m->Log();
  EXPECT_FALSE(listed()) << m->Log();
  EXPECT_EQ(state_of("big"), "indexing") << Ctl("status").dump(1);
  EXPECT_FALSE(fs::exists(mnt_ + "/" + old));

  WriteFile(gate + "/resume", "");
  EXPECT_TRUE(WaitFor([&] { return !Digest("big").empty() && !Digest("small").empty() && Digest("small") != old; }))
      << Ctl("status").dump(1) << m->Log();
}

// A symlink DAG (issue 21): 25 directories, each holding two contained
// links to the next, are 2^24 paths from the first. Bound: each directory
// is walked by at most 256 paths in one walk (kMaxPathsPerDirectory), the
// checkpoint that holds the rest is invalid with a clear reason, and a
// checkpoint beside it is served as soon as the mount returns. Before the
// bound the walk ate gigabytes and the mount never answered.
TEST_F(RobustnessTest, ASymlinkDagCostsItsDirectoriesNotItsPaths) {
  constexpr int kLevels = 25;
  WriteFile(src_ + "/dag/d0/model.bin", "weights");
  for (int k = 0; k < kLevels; ++k) {
    const std::string d = src_ + "/dag/d" + std::to_string(k);
    MakeDirs(d);
    if (k + 1 < kLevels) {
      Symlink("../d" + std::to_string(k + 1), d + "/a");
      Symlink("../d" + std::to_string(k + 1), d + "/b");
    } else {
      WriteFile(d + "/leaf.json", "{}");
    }
  }
  WriteFile(src_ + "/ok/model.bin", "fine");
  // The DAG's other directories are not checkpoints, and their problems are
  // only warnings; d0 is one, and it holds them all.
  auto m = Mount();
  ASSERT_TRUE(m->ok()) << m->Log();
  EXPECT_TRUE(WaitFor([&] { return !Digest("ok").empty(); })) << m->Log();
  nlohmann::json dag;
  ASSERT_TRUE(WaitFor([&] {
    dag = CheckpointStatus(src_ + "/dag/d0");
    return dag.value("state", "") == "invalid";
  })) << Ctl("status").dump(1);
  const std::string reason = dag.value("reason", "");
  EXPECT_NE(reason.find("paths through symlinks"), std::string::npos) << dag.dump(1);
  EXPECT_LT(reason.size(), 8192u) << "the reason itself must stay bounded";
  EXPECT_TRUE(Digest("dag/d0").empty());
  const uint64_t peak_kb = ProcStatusKib(m->ServingPid(), "VmHWM");
  EXPECT_LT(peak_kb, 512u * 1024) << "peak resident memory of the daemon, kB";
  std::cout << "[ symlink DAG ] " << kLevels << " levels, daemon peak RSS " << peak_kb << " kB\n";
}

// A SRC writer's deep, empty directories: each directory's access chain
// (the directories to search down to it) used to be a copy of its parent's
// plus itself, so a chain of N nested directories cost N^2/2 entries, and
// each symlink to a file a copy of two chains joined: three chains of 1,977
// nested directories with 500 links each took the daemon to 1.47 GB. A
// chain now shares its parent's, and a link's joins two without copying;
// the walk stops 1,024 levels down. Bound: the daemon's peak resident
// memory stays under 120 MB for four chains of 990 directories with 200
// links each (about 90 MB of chain copies alone before; 94 MB in all
// now, most of it the paths of the directories, each as long as its
// depth), one as deep as a path may be, and one checkpoint 1,010 levels
// down.
TEST_F(RobustnessTest, DeepDirectoriesCostTheirNumberNotTheirDepthSquared) {
  constexpr int kChains = 4, kDepth = 990, kLinks = 200, kMidDepth = 1010;
  // Such trees outlast std::filesystem's removal (a descriptor a level):
  // rm(1) takes them down, after the mount is gone, even when a check fails.
  struct RemoveDeepTrees {
    std::string src;
    ~RemoveDeepTrees() { RunCommand("rm -rf " + ShellQuote(src)); }
  } remove_deep_trees{src_};
  // A chain of `levels` directories "a" under SRC/NAME, made a level at a
  // time through descriptors (each call's path is short), with a weight
  // file and `links` symlinks to it at the bottom.
  auto chain = [&](const std::string& name, int levels, int links) {
    const std::string top = src_ + "/" + name;
    MakeDirs(top);
    int fd = ::open(top.c_str(), O_PATH | O_DIRECTORY);
    for (int i = 0; i < levels && fd >= 0; ++i) {
      ASSERT_EQ(::mkdirat(fd, "a", 0755), 0) << "level " << i;
      const int next = ::openat(fd, "a", O_PATH | O_DIRECTORY);
      ::close(fd);
      fd = next;
    }
    ASSERT_GE(fd, 0);
    const int w = ::openat(fd, "w.safetensors", O_WRONLY | O_CREAT | O_EXCL, 0644);
    ASSERT_GE(w, 0);
    ASSERT_EQ(::write(w, name.data(), name.size()), static_cast<ssize_t>(name.size()));
    ::close(w);
    for (int l = 0; l < links; ++l) {
      ASSERT_EQ(::symlinkat("w.safetensors", fd, ("l" + std::to_string(l) + ".json").c_str()), 0);
    }
    ::close(fd);
  };
  for (int c = 0; c < kChains; ++c) chain("chain" + std::to_string(c), kDepth, kLinks);
  // As deep as a path may be (PATH_MAX), below a checkpoint.
  chain("deep", static_cast<int>((4000 - (src_.size() + 16)) / 2), 0);
  WriteFile(src_ + "/deep/a/top.safetensors", "a checkpoint above a chain too deep to walk");
  chain("mid", kMidDepth, 0);
  WriteFile(src_ + "/ok/model.bin", "fine");
  auto m = Mount();
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !Digest("ok").empty(); })) << m->Log();
  auto state_of = [&](const std::string& path) {
    nlohmann::json found;
    WaitFor([&] {
      found = CheckpointStatus(path);
      return found.value("state", "") == "invalid" || found.value("state", "") == "exposed";
    });
    return found.empty() ? nlohmann::json{{"state", "(not in status)"}} : found;
  };
  // The 990-deep checkpoints are shown, with their links.
  std::string bottom = "chain0";
  for (int i = 0; i < kDepth; ++i) bottom += "/a";
  EXPECT_TRUE(WaitFor([&] { return !Digest(bottom).empty(); })) << state_of(src_ + "/" + bottom).dump(1);
  // The walk stops 1,024 levels down: the checkpoint above holds the
  // problem, so it is invalid, with the reason.
  const nlohmann::json deep = state_of(src_ + "/deep/a");
  EXPECT_NE(deep.value("reason", "").find("levels below the source root; they are not walked"), std::string::npos)
      << deep.dump(1);
  // A checkpoint 1,010 levels down is walked, but its by-name link would
  // climb "../" 1,010 times: invalid, with the reason.
  std::string mid = src_ + "/mid";
  for (int i = 0; i < kMidDepth; ++i) mid += "/a";
  const nlohmann::json too_deep = state_of(mid);
  EXPECT_NE(too_deep.value("reason", "").find("longer than a symlink may be"), std::string::npos) << too_deep.dump(1);
  const uint64_t peak_kb = ProcStatusKib(m->ServingPid(), "VmHWM");
  EXPECT_GT(peak_kb, 0u);
  EXPECT_LT(peak_kb, 120u * 1024) << "peak resident memory of the daemon, kB";
  std::cout << "[ deep directories ] " << kChains << " chains of " << kDepth << " directories with " << kLinks
            << " links each, one as deep as a path may be, one of " << kMidDepth << ": daemon peak RSS " << peak_kb
            << " kB\n";
}

// A SRC writer's files with several links are each watched with inotify
// (so that a chmod through another name is seen), from the daemon's share
// of the system's watches: at most 4,096 of them, then one warning. Bound:
// 4,100 files of two links each cost at most 4,096 file watches plus one a
// directory.
TEST_F(RobustnessTest, FilesWithSeveralLinksCostAtMost4096Watches) {
  constexpr int kFiles = 4100;
  MakeDirs(src_ + "/links/ck");
  MakeDirs(src_ + "/links/other");
  WriteFile(src_ + "/links/ck/model.safetensors", "weights");
  for (int i = 0; i < kFiles; ++i) {
    const std::string name = "/f" + std::to_string(i) + ".json";
    WriteFile(src_ + "/links/ck" + name, std::to_string(i));
    ASSERT_EQ(::link((src_ + "/links/ck" + name).c_str(), (src_ + "/links/other" + name).c_str()), 0);
  }
  auto m = Mount();
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !Digest("links/ck").empty(); }, std::chrono::seconds(60))) << m->Log();
  EXPECT_TRUE(WaitFor([&] { return m->Log().find("more than 4096 files with several links") != std::string::npos; }))
      << m->Log();
  // The daemon's inotify watches, as /proc tells them: one line each.
  size_t watches = 0;
  const std::string fds = "/proc/" + std::to_string(m->ServingPid()) + "/fdinfo";
  for (const auto& e : fs::directory_iterator(fds)) {
    std::ifstream info(e.path());
    for (std::string line; std::getline(info, line);) watches += line.rfind("inotify wd:", 0) == 0 ? 1 : 0;
  }
  EXPECT_GT(watches, 4096u);  // the file watches are there
  EXPECT_LE(watches, 4096u + 10) << "4,096 file watches and a few directories";
}

// Links within links: each level entered through a link adds the chain of
// directories down to its target, so a chain of hidden directories, each
// with a link to the next, makes the directories to search grow with the
// square of the levels, and every request and scan walks them. Bound: past
// 4,096 directories to search the walk stops, and the checkpoint says why.
TEST_F(RobustnessTest, LinksWithinLinksStopAt4096DirectoriesToSearch) {
  std::string hidden = src_ + "/.c";  // not walked itself: reached only through the links
  MakeDirs(src_);
  Symlink(".c", src_ + "/s");
  WriteFile(hidden + "/model.safetensors", "weights");
  for (int i = 0; i < 150; ++i) {
    MakeDirs(hidden + "/.c");
    Symlink(".c", hidden + "/s");
    hidden += "/.c";
  }
  WriteFile(src_ + "/ok/model.bin", "fine");
  auto m = Mount();
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !Digest("ok").empty(); })) << m->Log();
  nlohmann::json found;
  EXPECT_TRUE(WaitFor([&] {
    found = CheckpointStatus(src_ + "/s");
    return found.value("state", "") == "invalid";
  })) << Ctl("status").dump(1);
  EXPECT_NE(found.value("reason", "").find("links within links"), std::string::npos) << found.dump(1);
}

// A SRC writer's names go into the log with their control characters
// escaped: a newline in a directory's name forged a whole log line, and an
// escape sequence went raw to the terminal of whoever read the log. Bound:
// no line of the log is the forged one, and no escape byte is in it.
TEST_F(RobustnessTest, NamesInTheLogCannotForgeLinesOrDriveATerminal) {
  const std::string forged = "ckptfs: 2026-12-05 07:00:00.000 info: checkpoint trusted-llama verified OK";
  WriteFile(src_ + "/b\n" + forged + "/model.safetensors", "invalid: a newline in its path");
  const std::string titled = "e\x1b]0;pwned\x07x";
  WriteFile(src_ + "/" + titled + "/model.bin", "shown, and logged as it is indexed");
  // A name that spells an escape itself: its backslash is escaped too, so
  // it cannot pass for the newline above.
  const std::string spelled = "s\\x0a" + forged.substr(0, 14);
  WriteFile(src_ + "/" + spelled + "/model.bin", "shown: the backslash is in its directory, not a member");
  WriteFile(src_ + "/ok/model.bin", "fine");
  auto m = Mount();
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !Digest(titled).empty() && !Digest("ok").empty(); })) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return m->Log().find("s\\x5cx0a") != std::string::npos; })) << m->Log();
  EXPECT_EQ(m->Log().find("s\\x0a"), std::string::npos) << m->Log();
  ASSERT_TRUE(WaitFor([&] {
    const std::string log = m->Log();
    return log.find("verified OK") != std::string::npos && log.find("pwned") != std::string::npos;
  })) << m->Log();
  const std::string log = m->Log();
  EXPECT_EQ(log.find("\n" + forged), std::string::npos) << log;
  EXPECT_NE(log.find("\\x0a" + forged), std::string::npos) << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << log;
  EXPECT_EQ(log.find('\x07'), std::string::npos) << log;
  EXPECT_NE(log.find("e\\x1b]0;pwned\\x07x"), std::string::npos) << log;
}

// Issue 21 item 4: `truncate -s 15T` in one checkpoint (hours of SHA-256 of
// zeros, even with its holes not read) must not stop the indexing of every
// other checkpoint. With one hashing thread, a checkpoint added while the
// huge file is hashed is shown meanwhile; status says which file is being
// hashed and how far it is, and that figure moves on; unmount stops the
// hash. Bound: the small checkpoint is shown within WaitFor's 20 s (before
// the fix, after the huge file: hours).
TEST_F(RobustnessTest, AHugeSparseFileHoldsBackNoOtherCheckpoint) {
  MakeDirs(src_ + "/big");
  const std::string huge = src_ + "/big/model.bin";
  ASSERT_EQ(RunCommand("truncate -s 15T " + huge + " || truncate -s 1T " + huge).exit_code, 0);
  auto m = Mount("threads=1");
  auto hashed = [&]() -> uint64_t {
    const nlohmann::json c = CheckpointStatus(src_ + "/big");
    if (c.value("state", "") != "indexing") return 0;
    for (const auto& f : c.value("hashing", nlohmann::json::array())) {
      if (f.value("path", "") == "model.bin" && f.value("size", uint64_t{0}) == fs::file_size(huge)) {
        return f.value("bytes_done", uint64_t{0});
      }
    }
    return 0;
  };
  ASSERT_TRUE(WaitFor([&] { return hashed() > 0; })) << Ctl("status").dump(1) << m->Log();
  WriteFile(src_ + "/small/model.bin", "w");
  EXPECT_TRUE(WaitFor([&] { return !Digest("small").empty(); })) << Ctl("status").dump(1) << m->Log();
  const uint64_t then = hashed();
  EXPECT_TRUE(WaitFor([&] { return hashed() > then; })) << Ctl("status").dump(1);
  EXPECT_TRUE(Digest("big").empty());
  const std::string text = RunCommand(kCtl + " status " + mnt_).out;
  EXPECT_NE(text.find("hashing model.bin"), std::string::npos) << text;
  m->Unmount();
  EXPECT_FALSE(IsMounted(mnt_));
}

// Issue 21 item 4: a sparse file's holes are not read (the daemon reads its
// few data chunks, not its 2 GiB), and its SHA-256 is still the plain
// SHA-256 of its bytes, as sha256sum prints it (DESIGN section 1).
TEST_F(RobustnessTest, ASparseFileIsHashedAsSha256sumDoesWithoutReadingItsHoles) {
  MakeDirs(src_ + "/sparse");
  const std::string file = src_ + "/sparse/model.bin";
  ASSERT_EQ(RunCommand("truncate -s 2G " + file).exit_code, 0);
  {
    FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    for (const long at : {0L, 7L * 1024 * 1024 + 5, 1500L * 1024 * 1024 + 3}) {
      const std::string bytes = RandomBytes(kMiB + 11, static_cast<uint64_t>(at));
      std::fseek(f, at, SEEK_SET);
      std::fwrite(bytes.data(), 1, bytes.size(), f);
    }
    std::fclose(f);
  }
  const int fd = ::open(file.c_str(), O_RDONLY);
  const bool holes = fd >= 0 && ::lseek(fd, 0, SEEK_HOLE) < static_cast<off_t>(fs::file_size(file));
  if (fd >= 0) ::close(fd);
  if (!holes) GTEST_SKIP() << "the filesystem under " << src_ << " does not report holes";
  auto m = Mount("supervise=off");
  ASSERT_TRUE(WaitFor([&] { return !Digest("sparse").empty(); }, std::chrono::seconds(120))) << m->Log();
  char sha[65] = {};
  const std::string served = mnt_ + "/" + Digest("sparse") + "/model.bin";
  ASSERT_EQ(::getxattr(served.c_str(), "user.ckptfs.sha256", sha, 64), 64) << served;
  EXPECT_EQ(std::string(sha), RunCommand("sha256sum " + file).out.substr(0, 64));
  std::ifstream io("/proc/" + std::to_string(m->ServingPid()) + "/io");
  uint64_t read_bytes = 0;
  for (std::string key; io >> key;) {
    if (key == "rchar:") io >> read_bytes;
  }
  EXPECT_LT(read_bytes, 256 * kMiB) << "bytes the daemon read to index a 2 GiB file with 3 MiB of data";
  m->Unmount();
}

}  // namespace
}  // namespace ckptfs::testing
