// The daemon as operators and engines meet it: real mounts under a temporary
// directory, always unmounted.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "kernel_caches_lock.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

std::set<std::string> DigestDirs(const std::string& mnt) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(mnt, ec)) {
    const std::string name = e.path().filename();
    if (name.rfind("sha256-", 0) == 0) out.insert(name);
  }
  return out;
}

std::string ReadLink(const std::string& path) {
  std::error_code ec;
  auto target = fs::read_symlink(path, ec);
  return ec ? std::string() : target.string();
}

std::string Xattr(const std::string& path, const std::string& name) {
  char buf[8192];
  ssize_t n = ::getxattr(path.c_str(), name.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

std::string ReadViaMmap(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return "<open failed>";
  struct stat st;
  ::fstat(fd, &st);
  std::string out;
  if (st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      out.assign(static_cast<const char*>(p), static_cast<size_t>(st.st_size));
      ::munmap(p, static_cast<size_t>(st.st_size));
    } else {
      out = "<mmap failed>";
    }
  }
  ::close(fd);
  return out;
}

std::string ReadViaSendfile(const std::string& path, const std::string& scratch) {
  int in = ::open(path.c_str(), O_RDONLY);
  int out = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  struct stat st;
  ::fstat(in, &st);
  off_t off = 0;
  while (off < st.st_size) {
    if (::sendfile(out, in, &off, static_cast<size_t>(st.st_size - off)) <= 0) break;
  }
  ::close(in);
  ::close(out);
  return ReadFile(scratch);
}

class MountTest : public MountFixture {
 protected:
  MountTest() : MountFixture("ckptfs-mount") {}
  void SetUp() override { ::chmod(tmp_.path().c_str(), 0755); }

  bool WaitForDigests(size_t n) {
    return WaitFor([&] { return DigestDirs(mnt_).size() == n; });
  }
};

TEST_F(MountTest, ViewOfTheDemoTree) {
  ASSERT_EQ(RunCommand(std::string(MAKE_DEMO_TREE_PATH) + " " + src_).exit_code, 0);
  auto m = Mount();
  ASSERT_TRUE(WaitUntilIndexed()) << m->Log();
  ASSERT_TRUE(WaitForDigests(5)) << m->Log();  // base and base-copy share one

  const std::string base = CoreutilsDigest(src_ + "/base");
  const std::string finetune = CoreutilsDigest(src_ + "/finetune");
  const std::string run7 = CoreutilsDigest(src_ + "/run7", "checkpoint-*");
  const std::string step500 = CoreutilsDigest(src_ + "/run7/checkpoint-500");
  EXPECT_NE(base, finetune);
  EXPECT_EQ(DigestDirs(mnt_), (std::set<std::string>{base, finetune, run7, step500,
                                                     CoreutilsDigest(src_ + "/run7/checkpoint-1000")}));
  std::set<std::string> root;
  for (const auto& e : fs::directory_iterator(mnt_)) root.insert(e.path().filename());
  EXPECT_TRUE(root.count("by-name"));
  EXPECT_EQ(root.size(), 6u);

  EXPECT_EQ(ReadLink(mnt_ + "/by-name/base"), "../" + base);
  EXPECT_EQ(ReadLink(mnt_ + "/by-name/base-copy"), "../" + base);
  EXPECT_EQ(ReadLink(mnt_ + "/by-name/finetune"), "../" + finetune);
  EXPECT_EQ(ReadLink(mnt_ + "/by-name/run7/checkpoint-500"), "../../" + step500);
  // run7 holds nested checkpoints, so it is a directory of links into its digest.
  EXPECT_TRUE(fs::is_directory(fs::symlink_status(mnt_ + "/by-name/run7")));
  EXPECT_EQ(ReadLink(mnt_ + "/by-name/run7/config.json"), "../../" + run7 + "/config.json");
  EXPECT_EQ(fs::canonical(mnt_ + "/by-name/finetune").filename(), finetune);

  // Every member byte-identical through read, mmap and sendfile, sizes exact.
  for (const char* ck : {"base", "finetune", "run7/checkpoint-500"}) {
    for (const auto& e : fs::directory_iterator(src_ + "/" + ck)) {
      if (!e.is_regular_file()) continue;
      const std::string name = e.path().filename();
      const std::string through = mnt_ + "/by-name/" + ck + "/" + name;
      const std::string expected = ReadFile(e.path());
      EXPECT_EQ(fs::file_size(through), expected.size()) << through;
      EXPECT_EQ(ReadFile(through), expected) << through;
      EXPECT_EQ(ReadViaMmap(through), expected) << through;
      EXPECT_EQ(ReadViaSendfile(through, tmp_ / "sendfile.out"), expected) << through;
    }
  }
  // The same tensor read through the two digest paths differs.
  const std::string shard = "/model-00002-of-00002.safetensors";
  EXPECT_NE(ReadFile(mnt_ + "/" + base + shard), ReadFile(mnt_ + "/" + finetune + shard));
  // Nested checkpoints are not members of their parent's digest directory.
  EXPECT_FALSE(fs::exists(mnt_ + "/" + run7 + "/checkpoint-500"));
  EXPECT_FALSE(fs::exists(mnt_ + "/" + base + "/.git"));

  // Extended attributes.
  EXPECT_EQ(Xattr(mnt_ + "/" + base, "user.ckptfs.digest"), base);
  EXPECT_EQ(Xattr(mnt_ + "/" + base, "user.ckptfs.sources"), src_ + "/base\n" + src_ + "/base-copy\n");
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(src_ + "/base")) total += e.file_size();
  EXPECT_EQ(Xattr(mnt_ + "/" + base, "user.ckptfs.size"), std::to_string(total));
  EXPECT_EQ(Xattr(mnt_ + "/" + base + "/config.json", "user.ckptfs.sha256"),
            RunCommand("sha256sum " + src_ + "/base/config.json").out.substr(0, 64));
  EXPECT_NE(Xattr(mnt_, "user.ckptfs.control"), "");
}

TEST_F(MountTest, EverythingIsReadOnly) {
  WriteModel(src_ + "/m", {});
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  const std::string dir = mnt_ + "/" + *DigestDirs(mnt_).begin();
  const std::string file = dir + "/config.json";
  errno = 0;
  EXPECT_EQ(::open(file.c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::open(file.c_str(), O_RDWR), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::open((dir + "/new").c_str(), O_WRONLY | O_CREAT, 0644), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::unlink(file.c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::rename(file.c_str(), (dir + "/x").c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::chmod(file.c_str(), 0777), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::mkdir((mnt_ + "/by-name/new").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::setxattr(file.c_str(), "user.x", "1", 1, 0), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::symlink("x", (mnt_ + "/by-name/l").c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  struct stat st;
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0222, 0u);  // write bits removed
  EXPECT_EQ(ReadFile(src_ + "/m/config.json"), ReadFile(file));  // and the source is untouched
}

TEST_F(MountTest, OwnersAndModesAreMirroredAndEnforced) {
  WriteModel(src_ + "/m", {});
  RunCommand("chmod -R a+rX " + src_);
  ASSERT_EQ(::chown((src_ + "/m/config.json").c_str(), 1234, 1234), 0);
  ASSERT_EQ(::chmod((src_ + "/m/config.json").c_str(), 0600), 0);
  auto m = Mount("allow_other");
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  const std::string file = mnt_ + "/by-name/m/config.json";
  struct stat st;
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_mode & 07777, 0400u);
  CommandResult owner = RunCommand("setpriv --reuid=1234 --regid=1234 --clear-groups cat " + file, true);
  EXPECT_EQ(owner.exit_code, 0) << owner.out;
  EXPECT_EQ(owner.out, ReadFile(src_ + "/m/config.json"));
  CommandResult other = RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups cat " + file, true);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.out.find("Permission denied"), std::string::npos) << other.out;
  // Files readable by all stay readable by all.
  EXPECT_EQ(RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups cat " + mnt_ + "/by-name/m/tokenizer.json")
                .exit_code,
            0);
}

TEST_F(MountTest, IdenticalCopiesGrantWhatAnyCopyGrants) {
  WriteModel(src_ + "/open", {});
  CopyTree(src_ + "/open", src_ + "/private");
  RunCommand("chmod -R a+rX " + src_ + " && chmod 0700 " + src_ + "/private");
  auto m = Mount("allow_other");
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  const std::string digest = *DigestDirs(mnt_).begin();
  // Someone else's private copy of a public checkpoint locks nobody out
  // (DESIGN.md section 2: access through any one source copy is enough).
  CommandResult other = RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups cat " + mnt_ + "/" + digest +
                                       "/config.json",
                                   true);
  EXPECT_EQ(other.exit_code, 0) << other.out;
  // With the open copy gone, only the private one is left: now they cannot.
  RemoveTree(src_ + "/open");
  RunCommand(kCtl + " rescan " + mnt_);
  ASSERT_TRUE(WaitFor([&] {
    return RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups cat " + mnt_ + "/" + digest + "/config.json")
               .exit_code != 0;
  })) << m->Log();
  EXPECT_EQ(RunCommand("cat " + mnt_ + "/" + digest + "/config.json").exit_code, 0);  // root still can
}

TEST_F(MountTest, ChangedCheckpointGetsNewDigestAndOldReaderNeverSeesNewBytes) {
  WriteModel(src_ + "/m", {.seed = 1, .shards = 1, .tensors_per_shard = 2, .tensor_bytes = 8 << 20});
  const std::string shard = "model-00001-of-00001.safetensors";
  const std::string old_bytes = ReadFile(src_ + "/m/" + shard);
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  const std::string old_digest = *DigestDirs(mnt_).begin();

  // A reader opens the old file and reads its first page only.
  int fd = ::open((mnt_ + "/by-name/m/" + shard).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char first[4096];
  ASSERT_EQ(::pread(fd, first, sizeof first, 0), static_cast<ssize_t>(sizeof first));

  ZeroTensor(src_ + "/m/" + shard, 1);  // rewritten in place
  const std::string new_digest = CoreutilsDigest(src_ + "/m");
  ASSERT_TRUE(WaitFor([&] { return DigestDirs(mnt_) == std::set<std::string>{new_digest}; })) << m->Log();
  EXPECT_EQ(ReadLink(mnt_ + "/by-name/m"), "../" + new_digest);
  // Withdrawn from lookups too, once the kernel is told: the listing shows
  // the publish at once, the kernel's cached entry goes with the
  // invalidation sent just after it (seen late under ThreadSanitizer).
  EXPECT_TRUE(WaitFor([&] { return !fs::exists(mnt_ + "/" + old_digest); })) << m->Log();
  EXPECT_TRUE(ReadFile(mnt_ + "/by-name/m/" + shard) == ReadFile(src_ + "/m/" + shard));

  // The old reader: old bytes (still cached) or EIO, never the new bytes.
  std::string rest(old_bytes.size() - 4096, '\0');
  ssize_t n = ::pread(fd, rest.data(), rest.size(), 4096);
  if (n >= 0) {
    EXPECT_EQ(rest.substr(0, static_cast<size_t>(n)), old_bytes.substr(4096, static_cast<size_t>(n)));
  } else {
    EXPECT_EQ(errno, EIO);
  }
  ::close(fd);
}

TEST_F(MountTest, NewAndDeletedCheckpointsAppearAndDisappear) {
  WriteModel(src_ + "/a", {.seed = 1});
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  WriteModel(src_ + "/b", {.seed = 2});
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/b"); })) << m->Log();
  EXPECT_EQ(DigestDirs(mnt_).size(), 2u);
  RemoveTree(src_ + "/a");
  ASSERT_TRUE(WaitFor([&] { return !fs::exists(fs::symlink_status(mnt_ + "/by-name/a")); })) << m->Log();
  EXPECT_EQ(DigestDirs(mnt_), std::set<std::string>{CoreutilsDigest(src_ + "/b")});
}

TEST_F(MountTest, PrivateFstabLineMountsThroughMountFuse) {
  WriteModel(src_ + "/m", {});
  MakeDirs(mnt_);
  // Installed, the type is fuse.ckptfs; mount.fuse3 runs "ckptfs" from the
  // standard PATH. The build tree is not on it, so name the binary by path
  // (fuse./path/to/ckptfs), which takes the same route through mount(8) and
  // mount.fuse3.
  WriteFile(tmp_ / "fstab", src_ + " " + mnt_ + " fuse." + kDaemon + " ro,allow_other,nofail,state=" + state_ +
                                ",settle=0 0 0\n");
  CommandResult r = RunCommand("mount -T " + tmp_ / "fstab" + " " + mnt_, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  bool ok = WaitFor([&] { return DigestDirs(mnt_).size() == 1; });
  CommandResult mounts = RunCommand("grep ' " + mnt_ + " ' /proc/self/mounts");
  CommandResult u = RunCommand("umount " + mnt_, true);
  EXPECT_TRUE(ok);
  EXPECT_NE(mounts.out.find("fuse.ckptfs"), std::string::npos) << mounts.out;
  EXPECT_NE(mounts.out.find("allow_other"), std::string::npos) << mounts.out;
  EXPECT_EQ(u.exit_code, 0) << u.out;
  EXPECT_FALSE(IsMounted(mnt_));
}

TEST_F(MountTest, RefusesBadStartsBeforeMounting) {
  MakeDirs(mnt_);
  WriteFile(tmp_ / "file", "x");
  WriteModel(src_ + "/m", {});
  struct Case {
    std::string args;
    std::string message;
  } cases[] = {
      {tmp_ / "absent " + mnt_, "No such file or directory"},
      {tmp_ / "file " + mnt_, "Not a directory"},
      {src_ + " " + mnt_ + " -o state=" + tmp_ / "file/state", "Not a directory"},
      {src_ + " " + mnt_ + " -o bogus", "unknown option 'bogus'"},
      {src_ + " " + mnt_ + " -o settle=soon", "settle=soon"},
      {src_ + " " + mnt_ + " -o symlinks=maybe", "symlinks=maybe"},
      {src_ + " " + mnt_ + " -o rw", "read-only"},
      {src_, "expected SRC and MOUNTPOINT"},
  };
  for (const auto& c : cases) {
    CommandResult r = RunCommand("timeout 20 " + kDaemon + " " + c.args + " -f", true);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << ": " << r.out;
    EXPECT_FALSE(IsMounted(mnt_)) << c.args;
  }
  CommandResult help = RunCommand(kDaemon + " --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* opt : {"state=", "rescan=", "settle=", "symlinks=", "threads=", "log=", "readahead=",
                          "allow_other", "fsname="}) {
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  }
}

TEST_F(MountTest, DaemonizesAndStopsOnUnmount) {
  WriteModel(src_ + "/m", {});
  MakeDirs(mnt_);
  CommandResult r = RunCommand(kDaemon + " " + src_ + " " + mnt_ + " -o state=" + state_ + ",settle=0", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(IsMounted(mnt_));
  EXPECT_TRUE(WaitFor([&] { return DigestDirs(mnt_).size() == 1; }));
  const std::string pid = RunCommand("pgrep -f '^" + kDaemon + " " + src_ + " '").out;
  EXPECT_FALSE(pid.empty());
  EXPECT_EQ(RunCommand("fusermount3 -u " + mnt_).exit_code, 0);
  EXPECT_TRUE(WaitFor([&] { return RunCommand("pgrep -f '^" + kDaemon + " " + src_ + " '").out.empty(); }));
}

TEST_F(MountTest, RemountOfUnchangedTreeHashesNothing) {
  for (int c = 0; c < 100; ++c) {
    for (int f = 0; f < 9; ++f) {
      WriteFile(src_ + "/ckpt-" + std::to_string(c) + "/part-" + std::to_string(f) + ".json",
                RandomBytes(512, static_cast<uint64_t>(c * 100 + f)));
    }
    WriteFile(src_ + "/ckpt-" + std::to_string(c) + "/model.safetensors", std::to_string(c));
  }
  {
    auto m = Mount();
    ASSERT_TRUE(WaitForDigests(100)) << m->Log();
  }
  auto start = std::chrono::steady_clock::now();
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(100)) << m->Log();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("remount_1000_files_seconds", std::to_string(seconds));
  std::printf("remount of 1,000 files in 100 checkpoints showed everything after %.3f s\n", seconds);
  EXPECT_EQ(m->Log().find("indexing checkpoint"), std::string::npos) << m->Log();  // nothing hashed
}

TEST_F(MountTest, StatusLsAndRescanThroughTheControlSocket) {
  WriteModel(src_ + "/good", {});
  WriteModel(src_ + "/bad", {});
  Symlink("/etc/hostname", src_ + "/bad/notes.txt");
  RunCommand("chmod -R a+rX " + src_);
  auto m = Mount("allow_other");
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  CommandResult status = RunCommand(kCtl + " status " + mnt_, true);
  EXPECT_EQ(status.exit_code, 0) << status.out;
  EXPECT_NE(status.out.find("1 exposed, 0 indexing, 0 pending, 1 invalid"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("invalid   " + src_ + "/bad"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("resolves outside the source root"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("state        " + state_), std::string::npos) << status.out;

  auto json = nlohmann::json::parse(RunCommand(kCtl + " ls --json " + mnt_).out);
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0]["name"], CoreutilsDigest(src_ + "/good"));
  EXPECT_EQ(json[0]["by_name"][0], "by-name/good");
  EXPECT_EQ(json[0]["files"], 5);
  CommandResult ls = RunCommand(kCtl + " ls " + mnt_);
  EXPECT_NE(ls.out.find(CoreutilsDigest(src_ + "/good")), std::string::npos) << ls.out;

  EXPECT_EQ(RunCommand(kCtl + " rescan " + mnt_).exit_code, 0);
  CommandResult refused = RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups " + kCtl + " rescan " + mnt_, true);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.out.find("rescan is for root or the mount's owner"), std::string::npos) << refused.out;
  // Queries are open to everyone.
  EXPECT_EQ(RunCommand("setpriv --reuid=4321 --regid=4321 --clear-groups " + kCtl + " status " + mnt_).exit_code, 0);
  EXPECT_NE(RunCommand(kCtl + " status " + tmp_.path(), true).out.find("not a ckptfs mount"), std::string::npos);
}

TEST_F(MountTest, SourceFaultsAreLoggedAndNothingWrongIsServed) {
  WriteModel(src_ + "/del", {.seed = 1});
  WriteModel(src_ + "/trunc", {.seed = 2});
  WriteModel(src_ + "/esc", {.seed = 3});
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(3)) << m->Log();
  const std::string del_digest = fs::read_symlink(mnt_ + "/by-name/del").filename();
  const std::string trunc_file = mnt_ + "/by-name/trunc/config.json";
  int trunc_fd = ::open(trunc_file.c_str(), O_RDONLY);
  ASSERT_GE(trunc_fd, 0);

  ::unlink((src_ + "/del/config.json").c_str());
  ASSERT_EQ(::truncate((src_ + "/trunc/config.json").c_str(), 3), 0);
  Symlink("/etc/hostname", src_ + "/esc/escape.txt");
  ASSERT_TRUE(WaitFor([&] { return !fs::exists(mnt_ + "/by-name/esc"); })) << m->Log();
  char buf[64];
  ssize_t n = ::pread(trunc_fd, buf, sizeof buf, 0);
  EXPECT_TRUE(n < 0 || std::string(buf, static_cast<size_t>(n)) != ReadFile(src_ + "/trunc/config.json").substr(0, 3));
  ::close(trunc_fd);
  EXPECT_TRUE(WaitFor([&] { return DigestDirs(mnt_).count(del_digest) == 0; }));
  EXPECT_NE(m->Log().find("checkpoint " + src_ + "/esc is invalid and not shown: symlink"), std::string::npos)
      << m->Log();

  // The source disappears entirely: everything is withdrawn, the daemon lives.
  fs::rename(src_, tmp_ / "moved");
  ASSERT_TRUE(WaitFor([&] { return DigestDirs(mnt_).empty(); })) << m->Log();
  EXPECT_NE(m->Log().find("cannot scan source"), std::string::npos) << m->Log();
  fs::rename(tmp_ / "moved", src_);
  EXPECT_TRUE(WaitFor([&] { return DigestDirs(mnt_).size() == 2; })) << m->Log();  // del and trunc, re-indexed
}

// DESIGN.md section 2, "ready means ready": with a warm index, `mount`
// returns only once every indexed checkpoint is visible, so `mount && cat`
// works the first time (the daemonized form, as mount(8) and fstab run it).
TEST_F(MountTest, MountReturnsWithEveryIndexedCheckpointVisible) {
  WriteModel(src_ + "/org/m", {});
  {
    auto m = Mount();  // indexes once
    ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/org/m"); })) << m->Log();
  }
  struct Unmounter {
    std::string mnt;
    ~Unmounter() {
      if (IsMounted(mnt)) RunCommand("fusermount3 -u " + mnt);
    }
  } guard{mnt_};
  for (int i = 0; i < 20; ++i) {
    CommandResult r = RunCommand(kDaemon + " " + src_ + " " + mnt_ + " -o state=" + state_ + ",settle=0 && cat " + mnt_ +
                                     "/by-name/org/m/config.json",
                                 true);
    EXPECT_EQ(r.exit_code, 0) << "remount " << i << ": " << r.out;
    ASSERT_EQ(RunCommand("fusermount3 -u " + mnt_).exit_code, 0);
    ASSERT_TRUE(WaitFor([&] { return !IsMounted(mnt_); }));
  }
}

TEST_F(MountTest, MountPointInsideTheSourceIsNeverWalked) {
  WriteModel(src_ + "/m", {});
  mnt_ = src_ + "/models";
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  auto scans = [&] {
    auto j = nlohmann::json::parse(RunCommand(kCtl + " status --json " + mnt_).out, nullptr, false);
    return j.is_object() ? j.value("scans", uint64_t{0}) : uint64_t{0};
  };
  const uint64_t before = scans();
  EXPECT_EQ(RunCommand(kCtl + " rescan " + mnt_).exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return scans() > before; }));
  EXPECT_EQ(DigestDirs(mnt_).size(), 1u);  // answered: no deadlock, nothing from inside the mount
}

// A directory renamed into SRC is walked at once (issue 20: an atomic
// arrival is no burst), but a writer renaming directories in a loop gets no
// more walks than the debounce allows: at most one per 0.3 s of the storm
// (plus the one it ends with), however many renames it makes.
TEST_F(MountTest, ARenameStormGetsNoMoreWalksThanTheDebounceAllows) {
  WriteModel(src_ + "/m", {});
  auto m = Mount("settle=0,rescan=0");
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  auto scans = [&] {
    auto j = nlohmann::json::parse(RunCommand(kCtl + " status --json " + mnt_).out, nullptr, false);
    return j.is_object() ? j.value("scans", uint64_t{0}) : uint64_t{0};
  };
  WriteModel(src_ + "/.stage", {});
  const uint64_t before = scans();
  const auto start = std::chrono::steady_clock::now();
  int renames = 0;
  for (; std::chrono::steady_clock::now() - start < std::chrono::seconds(2); ++renames) {
    fs::rename(src_ + "/.stage", src_ + "/arrived");
    fs::rename(src_ + "/arrived", src_ + "/.stage");
  }
  const double storm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fs::rename(src_ + "/.stage", src_ + "/arrived");
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/arrived"); })) << m->Log();
  const uint64_t walks = scans() - before;
  EXPECT_GT(renames, 100);
  EXPECT_LE(walks, static_cast<uint64_t>(storm_s / 0.3) + 3) << renames << " renames in " << storm_s << " s";
}

TEST_F(MountTest, LongPathsAndNamesDoNotBreakTheWalk) {
  WriteModel(src_ + "/m", {});
  WriteFile(src_ + "/m/" + std::string(255, 'n'), "name at NAME_MAX");
  // A directory chain deeper than PATH_MAX, made with relative mkdir/chdir.
  std::string deep = src_ + "/deep";
  MakeDirs(deep);
  RunCommand("cd " + deep + " && for i in $(seq 1 25); do d=$(printf 'd%.0s' $(seq 1 200)); mkdir $d && cd $d; done && "
             "echo w > model.safetensors");
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << m->Log();
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/m/" + std::string(255, 'n')), "name at NAME_MAX");
  EXPECT_EQ(RunCommand(kCtl + " status " + mnt_).exit_code, 0);
  RunCommand("rm -rf " + deep);
}

TEST_F(MountTest, ThousandsOfCheckpoints) {
  for (int i = 0; i < 2000; ++i) WriteFile(src_ + "/c" + std::to_string(i) + "/w.bin", std::to_string(i));
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return DigestDirs(mnt_).size() == 2000; }, std::chrono::seconds(120))) << m->Log();
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/c1234/w.bin"), "1234");
}

// Without a supervisor (supervise=off), a daemon killed takes its connection
// with it: ENOTCONN, a lazy unmount, a mount again. (Under a supervisor a
// killed daemon is replaced: RestartTest.)
TEST_F(MountTest, KillDashNineThenLazyUnmountThenRemount) {
  WriteModel(src_ + "/m", {});
  auto m = Mount("supervise=off");
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  m->KillDashNine();
  CommandResult ls = RunCommand("ls " + mnt_, true);
  EXPECT_NE(ls.exit_code, 0);
  EXPECT_NE(ls.out.find("Transport endpoint is not connected"), std::string::npos) << ls.out;
  EXPECT_EQ(RunCommand("fusermount3 -u -z " + mnt_).exit_code, 0);
  EXPECT_FALSE(IsMounted(mnt_));
  auto again = Mount();
  EXPECT_TRUE(WaitForDigests(1)) << again->Log();
}

// A file the daemon may not read (here: a daemon without the capabilities
// that let root read anything, over a file that only its owner may read):
// that checkpoint is reported invalid with the cause, the others are served.
TEST_F(MountTest, FileUnreadableByTheDaemonInvalidatesItsCheckpoint) {
  WriteModel(src_ + "/open", {.seed = 1});
  WriteModel(src_ + "/locked", {.seed = 2});
  RunCommand("chmod -R a+rX " + src_);
  ASSERT_EQ(::chown((src_ + "/locked/config.json").c_str(), 1234, 1234), 0);
  ASSERT_EQ(::chmod((src_ + "/locked/config.json").c_str(), 0600), 0);
  MakeDirs(mnt_);
  const std::string log = tmp_ / "capless-daemon.log";
  CommandResult r = RunCommand("setpriv --bounding-set=-dac_override,-dac_read_search " + kDaemon + " " + src_ +
                                   " " + mnt_ + " -o state=" + state_ + ",settle=0 2>" + log,
                               true);
  ASSERT_EQ(r.exit_code, 0) << r.out << ReadFile(log);
  bool shown = WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/open"); });
  CommandResult status = RunCommand(kCtl + " status " + mnt_, true);
  const bool locked_shown = fs::exists(fs::symlink_status(mnt_ + "/by-name/locked"));
  RunCommand("fusermount3 -u " + mnt_);
  EXPECT_TRUE(shown);
  EXPECT_FALSE(locked_shown);
  EXPECT_NE(status.out.find("invalid   " + src_ + "/locked"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("cannot open " + src_ + "/locked/config.json: Permission denied"), std::string::npos)
      << status.out;
  EXPECT_FALSE(IsMounted(mnt_));
}

TEST_F(MountTest, SigtermStopsCleanlySighupRescansAndOomScoreIsLowered) {
  WriteModel(src_ + "/m", {});
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  const std::string socket = Xattr(mnt_, "user.ckptfs.control");
  ASSERT_FALSE(socket.empty());
  EXPECT_TRUE(fs::exists(socket));
  std::ifstream oom("/proc/" + std::to_string(m->ServingPid()) + "/oom_score_adj");
  int score = 0;
  oom >> score;
  // Lowered, or (where the sandbox refuses it even to root) the refusal was said.
  EXPECT_TRUE(score < 0 || m->Log().find("cannot lower oom_score_adj to -500") != std::string::npos)
      << "oom_score_adj " << score << "\n" << m->Log();

  auto scans = [&] {
    auto j = nlohmann::json::parse(RunCommand(kCtl + " status --json " + mnt_).out, nullptr, false);
    return j.is_discarded() ? -1 : j["scans"].get<int>();
  };
  ASSERT_TRUE(WaitFor([&] { return scans() >= 1; }));
  const int before = scans();
  ::kill(m->pid(), SIGHUP);
  EXPECT_TRUE(WaitFor([&] { return scans() > before; })) << m->Log();
  EXPECT_TRUE(IsMounted(mnt_));  // HUP rescans; it does not stop the daemon

  ::kill(m->pid(), SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return !IsMounted(mnt_); })) << m->Log();
  EXPECT_TRUE(WaitFor([&] { return !fs::exists(socket); }));
  EXPECT_NE(m->Log().find("unmounting " + mnt_), std::string::npos) << m->Log();
}

TEST_F(MountTest, ResolvePrintsTheDigestPathBehindALink) {
  ASSERT_EQ(RunCommand(std::string(MAKE_DEMO_TREE_PATH) + " " + src_).exit_code, 0);
  auto m = Mount();
  ASSERT_TRUE(WaitForDigests(5)) << m->Log();
  CommandResult r = RunCommand(kCtl + " resolve " + mnt_ + "/by-name/finetune");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, mnt_ + "/" + CoreutilsDigest(src_ + "/finetune") + "\n");
  CommandResult nested = RunCommand(kCtl + " resolve " + mnt_ + "/by-name/run7/checkpoint-500");
  EXPECT_EQ(nested.out, mnt_ + "/" + CoreutilsDigest(src_ + "/run7/checkpoint-500") + "\n");
  CommandResult dir = RunCommand(kCtl + " resolve " + mnt_ + "/by-name", true);
  EXPECT_EQ(dir.exit_code, 1);
  EXPECT_NE(dir.out.find("neither a checkpoint nor inside a digest directory"), std::string::npos) << dir.out;
  CommandResult outside = RunCommand(kCtl + " resolve " + src_ + "/base", true);
  EXPECT_EQ(outside.exit_code, 3);
  EXPECT_NE(outside.out.find("is not a ckptfs mount nor inside one"), std::string::npos) << outside.out;
}

// mount.ckptfs keeps no list of options of its own: it passes every one on,
// and the daemon ignores those of mount(8), fstab and systemd (one list, the
// daemon's). Each is checked through the real helper and the real daemon's
// parser (--version stops right after it).
TEST(MountHelperTest, PassesEveryOptionOnAndTheDaemonIgnoresTheBookkeeping) {
  const std::string helper = std::string(CKPTFS_SOURCE_DIR) + "/mount/mount.ckptfs";
  for (const char* bookkeeping : {"_netdev", "nofail", "auto", "noauto", "user", "nouser", "users", "owner", "group",
                                  "defaults", "comment=x", "x-systemd.automount", "x-systemd.requires=/mnt/nfs",
                                  "loop"}) {
    const std::string opts = std::string("ro,") + bookkeeping + ",allow_other,cache_size=8G,state=/var/lib/ckptfs";
    CommandResult r = RunCommand(helper + " /srv/ckpt /models -f -o " + opts, true);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    const std::string args = "/srv/ckpt /models -o " + opts;
    ASSERT_EQ(r.out, "ckptfs " + args + "\n") << bookkeeping;
    CommandResult parsed = RunCommand(kDaemon + " " + args + " --version", true);
    EXPECT_EQ(parsed.exit_code, 0) << bookkeeping << ": " << parsed.out;
    EXPECT_EQ(parsed.out.rfind("ckptfs ", 0), 0u) << bookkeeping << ": " << parsed.out;
  }
}

TEST(MountHelperTest, FlagsAndUsage) {
  const std::string helper = std::string(CKPTFS_SOURCE_DIR) + "/mount/mount.ckptfs";
  EXPECT_EQ(RunCommand(helper + " /srv /models -f").out, "ckptfs /srv /models\n");
  // -n and -s are ignored, -t TYPE skipped, flags combine, -oLIST sticks.
  EXPECT_EQ(RunCommand(helper + " /srv /models -n -s -t ckptfs -fv -onofail -o settle=1").out,
            "ckptfs /srv /models -o nofail,settle=1\n");
  const std::string usage = "usage: mount.ckptfs SRC MOUNTPOINT [-o OPTIONS] [-f] [-v] [-n] [-s]\n";
  CommandResult one = RunCommand(helper + " /srv 2>&1");
  EXPECT_EQ(one.exit_code, 1);
  EXPECT_EQ(one.out, usage);
  CommandResult bad = RunCommand(helper + " /srv /models -q 2>&1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "mount.ckptfs: unknown argument '-q'\n" + usage);
}

// Lookups are counted before the entry reply (as libfuse's passthrough_hp
// does): a FORGET the kernel sends as soon as it has the entry, here while
// the lookup's worker still waits after its reply
// (CKPTFS_TEST_ENTRY_REPLY_DELAY_MS), finds the count and gives it back, so
// nothing is held once the kernel has forgotten every entry. Counted after
// the reply, each such entry stayed held for as long as the mount lived.
TEST_F(MountTest, AnEntryForgottenWhileItsLookupEndsIsNotHeldForEver) {
  KernelCachesLock no_other_drops;  // another test's drop would forget the entries counted below
  WriteModel(src_ + "/m", ModelSpec{});
  ::setenv("CKPTFS_TEST_ENTRY_REPLY_DELAY_MS", "400", 1);
  auto m = Mount();
  ::unsetenv("CKPTFS_TEST_ENTRY_REPLY_DELAY_MS");
  ASSERT_TRUE(m->ok());
  ASSERT_TRUE(WaitForDigests(1)) << m->Log();
  const std::string dir = mnt_ + "/" + *DigestDirs(mnt_).begin();
  auto held = [&] { return QueryMount(kCtl, "stats", mnt_).value("kernel_held_nodes", uint64_t{1} << 60); };
  auto forget_all = [] { KernelCachesLock::DropDentriesAndInodes(); };
  forget_all();
  ASSERT_TRUE(WaitFor([&] { forget_all(); return held() == 0; })) << m->Log();
  for (const char* name : {"config.json", "tokenizer.json", "config.json", "tokenizer.json"}) {
    struct stat st;
    // The stat returns with the reply; its worker waits on, and the kernel
    // forgets both entries (the digest directory, the file) meanwhile.
    ASSERT_EQ(::stat((dir + "/" + name).c_str(), &st), 0) << name;
    EXPECT_GE(held(), 1u) << "the lookup was not counted at all";
    forget_all();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the last workers end their lookups
  EXPECT_TRUE(WaitFor([&] { forget_all(); return held() == 0; })) << "nodes held: " << held();
}

}  // namespace
}  // namespace ckptfs::testing
