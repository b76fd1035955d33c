// Checkpoints in motion (issue 20, DESIGN.md section 2): while a checkpoint
// that changed in SRC is verified again, its last verified digest stays in
// the view and its by-name entry keeps pointing at it; the new digest, when
// known, replaces it in one publish. Who may reach it follows SRC at once,
// without waiting for that re-index. Each test holds the re-index at a
// known file (the daemon's pause seam: the file that changed, as only
// changed files are hashed again) so that "while it is verified again" is a
// state the test is in, not a race it hopes to win.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "security_fixture.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;
constexpr size_t kMiB = 1 << 20;

// Reads a by-name link every 2 ms on its own thread and keeps the sequence
// of distinct targets it saw ("" for "absent").
class LinkPoller {
 public:
  explicit LinkPoller(std::string link) : link_(std::move(link)), thread_([this] { Run(); }) {}
  ~LinkPoller() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> Targets() {
    std::lock_guard lock(mu_);
    return targets_;
  }
  uint64_t polls() const { return polls_.load(); }
  uint64_t absent() const { return absent_.load(); }

 private:
  void Run() {
    while (!stop_) {
      char buf[4096];
      const ssize_t n = ::readlink(link_.c_str(), buf, sizeof buf);
      std::string target = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      if (target.empty()) ++absent_;
      {
        std::lock_guard lock(mu_);
        if (targets_.empty() || targets_.back() != target) targets_.push_back(target);
      }
      ++polls_;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  const std::string link_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> polls_{0}, absent_{0};
  std::mutex mu_;
  std::vector<std::string> targets_;
  std::thread thread_;
};

class RevalidationTest : public SecurityTest {
 protected:
  // Mounts with the indexer held before every file named `gate`, lets the
  // first indexing through and waits until `by_name` is shown.
  std::unique_ptr<MountedCkptfs> MountHeldAt(const std::string& gate, const std::string& by_name) {
    MakeDirs(gate_);
    ::setenv("CKPTFS_TEST_PAUSE_BEFORE_HASH", (gate + ":" + gate_).c_str(), 1);
    auto m = Mount();
    ::unsetenv("CKPTFS_TEST_PAUSE_BEFORE_HASH");
    EXPECT_TRUE(WaitFor(Held())) << m->Log();
    ResumeOnce();
    EXPECT_TRUE(WaitFor([&] { return !DigestOf(by_name).empty(); })) << m->Log();
    return m;
  }
  std::function<bool()> Held() {
    return [this] { return ::access((gate_ + "/paused").c_str(), F_OK) == 0; };
  }
  // Lets the held file through; the next one of that name is held again.
  void ResumeOnce() {
    WriteFile(gate_ + "/resume.next", "once");
    fs::rename(gate_ + "/resume.next", gate_ + "/resume");
    EXPECT_TRUE(WaitFor([&] { return !Held()(); }));
  }
  void ResumeAll() { WriteFile(gate_ + "/resume", ""); }

  // The status row of the checkpoint at SRC/rel.
  nlohmann::json Row(const std::string& rel) {
    for (const auto& c : Status().value("checkpoints", nlohmann::json::array())) {
      if (c.value("path", "") == src_ + "/" + rel) return c;
    }
    return nlohmann::json::object();
  }
  bool Settled(const std::string& rel) {
    const auto row = Row(rel);
    return row.value("state", "") == "exposed" && !row.value("revalidating", false);
  }
  bool Listed(const std::string& digest) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(mnt_, ec)) {
      if (e.path().filename() == digest) return true;
    }
    return false;
  }
  // Reads the whole of an open descriptor from offset 0.
  static std::string ReadAll(int fd) {
    std::string out(64 * kMiB, '\0');
    size_t got = 0;
    for (;;) {
      const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
    return out;
  }

  std::string gate_ = tmp_ / "gate";
};

std::string Target(const std::string& digest) { return "../" + digest; }

// chmod -R a+r (nothing changes but ctimes) and chown -R to the same owner:
// the by-name link resolves at every poll through the whole re-verification,
// always to the same digest.
TEST_F(RevalidationTest, ChmodAndChownOfACheckpointNeverTakeItsNameAway) {
  WriteFile(src_ + "/m/model.bin", RandomBytes(2 * kMiB, 1));
  WriteFile(src_ + "/m/config.json", "{\"a\": 1}");
  WriteFile(src_ + "/m/gate.json", "{}");
  auto m = MountHeldAt("gate.json", "m");
  const std::string old = DigestOf("m");
  ASSERT_FALSE(old.empty());

  LinkPoller poller(mnt_ + "/by-name/m");
  ASSERT_EQ(RunCommand("chmod -R a+r " + ShellQuote(src_ + "/m")).exit_code, 0);
  ASSERT_TRUE(WaitFor(Held())) << "the chmod was not verified again\n" << m->Log();
  EXPECT_TRUE(WaitFor([&] { return Row("m").value("revalidating", false); })) << Status().dump(1);
  EXPECT_EQ(Row("m").value("name", ""), old);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // polls while it is held
  ASSERT_EQ(RunCommand("chown -R 0:0 " + ShellQuote(src_ + "/m")).exit_code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(Held()());  // still being verified: the polls above were all inside the window
  ResumeAll();
  EXPECT_TRUE(WaitFor([&] { return Settled("m"); })) << Status().dump(1) << m->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  poller.Stop();

  EXPECT_GT(poller.polls(), 100u);
  EXPECT_EQ(poller.absent(), 0u) << "by-name/m was absent during re-verification";
  EXPECT_EQ(poller.Targets(), std::vector<std::string>{Target(old)});
  EXPECT_EQ(DigestOf("m"), old);
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/m/config.json"), "{\"a\": 1}");
}

// A content change: the link goes from the old digest straight to the new
// one; a reader holding an unchanged file of the old digest reads the right
// bytes throughout; the changed file of the old digest gives its old bytes
// or EIO, never the new ones.
TEST_F(RevalidationTest, AContentChangeMovesTheLinkStraightToTheNewDigest) {
  const std::string weights = RandomBytes(6 * kMiB, 2);
  WriteFile(src_ + "/m/model.bin", weights);
  WriteFile(src_ + "/m/config.json", "{\"v\": 1}");
  auto m = MountHeldAt("config.json", "m");
  const std::string old = DigestOf("m");
  ASSERT_FALSE(old.empty());
  const int held_fd = ::open((mnt_ + "/" + old + "/model.bin").c_str(), O_RDONLY);
  ASSERT_GE(held_fd, 0);
  EXPECT_EQ(ReadAll(held_fd), weights);

  LinkPoller poller(mnt_ + "/by-name/m");
  WriteFile(src_ + "/m/config.json", "{\"v\": 2, \"fine-tuned\": true}");
  ASSERT_TRUE(WaitFor(Held())) << m->Log();
  EXPECT_TRUE(WaitFor([&] { return Row("m").value("revalidating", false); })) << Status().dump(1);
  EXPECT_EQ(DigestOf("m"), old);
  EXPECT_TRUE(Listed(old));
  EXPECT_EQ(ReadAll(held_fd), weights);
  EXPECT_EQ(ReadFile(mnt_ + "/" + old + "/model.bin"), weights);  // unchanged file, opened afresh
  {
    // The changed file under the old name: its old bytes (a sealed copy) or
    // an error, never the new content.
    const int fd = ::open((mnt_ + "/" + old + "/config.json").c_str(), O_RDONLY);
    if (fd >= 0) {
      char buf[256];
      const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
      if (n >= 0) {
        EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "{\"v\": 1}");
      }
      ::close(fd);
    }
  }
  ResumeAll();
  EXPECT_TRUE(WaitFor([&] { return Settled("m") && DigestOf("m") != old; })) << Status().dump(1) << m->Log();
  const std::string now = DigestOf("m");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  poller.Stop();

  EXPECT_EQ(poller.absent(), 0u) << "by-name/m was absent between the two digests";
  EXPECT_EQ(poller.Targets(), (std::vector<std::string>{Target(old), Target(now)}));
  EXPECT_FALSE(Listed(old)) << "no other copy holds the old digest";
  EXPECT_EQ(ReadFile(mnt_ + "/" + now + "/config.json"), "{\"v\": 2, \"fine-tuned\": true}");
  EXPECT_EQ(ReadAll(held_fd), weights);  // an open file of a withdrawn digest keeps its bytes
  ::close(held_fd);
}

// A revocation in SRC (chmod 0700 of the checkpoint's parent) refuses
// another user at once, while the re-index that keeps the content
// available is still held; root still reads it all along.
TEST_F(RevalidationTest, ARevocationAppliesAtOnceWhileTheCheckpointIsVerifiedAgain) {
  WriteFile(src_ + "/p/m/model.bin", RandomBytes(kMiB, 3));
  WriteFile(src_ + "/p/m/config.json", "{}");
  auto m = MountHeldAt("config.json", "p/m");
  const std::string old = DigestOf("p/m");
  ASSERT_FALSE(old.empty());
  const std::vector<Attempt> probes = {{Probe::kRead, mnt_ + "/" + old + "/model.bin"},
                                       {Probe::kRead, mnt_ + "/by-name/p/m/config.json"},
                                       {Probe::kList, mnt_ + "/by-name/p"}};
  EXPECT_EQ(TryAs(kOther, probes), (std::vector<bool>{true, true, true}));

  WriteFile(src_ + "/p/m/config.json", "{\"changed\": true}");
  ASSERT_TRUE(WaitFor(Held())) << m->Log();
  ASSERT_EQ(::chmod((src_ + "/p").c_str(), 0700), 0);
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, probes) == std::vector<bool>{false, false, false}; }))
      << "other still reads what SRC now refuses them\n" << m->Log();
  EXPECT_TRUE(Held()()) << "the refusal must not have waited for the re-index";
  EXPECT_EQ(TryAs(kRoot, probes), (std::vector<bool>{true, true, true})) << "the old digest is still served";
  EXPECT_EQ(TryAs(kOther, {{Probe::kRead, src_ + "/p/m/model.bin"}}), std::vector<bool>{false});  // the oracle

  ResumeAll();
  EXPECT_TRUE(WaitFor([&] { return Settled("p/m") && DigestOf("p/m") != old; })) << Status().dump(1);
  const std::string now = DigestOf("p/m");
  EXPECT_EQ(TryAs(kOther, {{Probe::kRead, mnt_ + "/" + now + "/model.bin"}}), std::vector<bool>{false});
}

// A member with another link outside SRC: a chmod made through that name
// raises no event in any directory the daemon watches (inotify tells the
// directory of the name used), so before the file itself was watched the
// revocation waited for the periodic rescan (never, with rescan=0).
TEST_F(RevalidationTest, ARevocationThroughAHardLinkOutsideSrcAppliesAtOnce) {
  const std::string outside = tmp_ / "outside";
  MakeDirs(outside);
  ::chmod(outside.c_str(), 0755);
  WriteFile(outside + "/config.json", "{\"private\": \"later\"}");
  ::chmod((outside + "/config.json").c_str(), 0644);
  WriteFile(src_ + "/pub/ck/model.bin", RandomBytes(kMiB, 5));
  ASSERT_EQ(::link((outside + "/config.json").c_str(), (src_ + "/pub/ck/config.json").c_str()), 0);
  auto m = Mount();
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("pub/ck").empty(); })) << m->Log();
  const std::string file = mnt_ + "/" + DigestOf("pub/ck") + "/config.json";
  EXPECT_EQ(TryAs(kOther, {{Probe::kRead, file}}), std::vector<bool>{true});

  ASSERT_EQ(::chmod((outside + "/config.json").c_str(), 0600), 0);
  EXPECT_EQ(TryAs(kOther, {{Probe::kRead, src_ + "/pub/ck/config.json"}}), std::vector<bool>{false});  // the oracle
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, {{Probe::kRead, file}}) == std::vector<bool>{false}; }))
      << "other still reads, through the mount, what SRC now refuses them\n" << m->Log();
  EXPECT_EQ(TryAs(kRoot, {{Probe::kRead, file}}), std::vector<bool>{true});
}

// Watches go first to the directories a revocation needs: a SRC writer's
// empty directories, more than the daemon may watch, do not push them out.
// With room for 40 watches and 300 empty directories as deep as the
// private checkpoint's parent and sorting before it, a chmod of the
// checkpoint still refuses another user at once (rescan=0: nothing but a
// watch would tell), and the daemon watches no more than 40 directories.
TEST_F(RevalidationTest, EmptyDirectoriesCannotTakeTheWatchesARevocationNeeds) {
  for (int i = 0; i < 300; ++i) MakeDirs(src_ + "/aaa/d" + std::to_string(i));
  WriteFile(src_ + "/zzz/team/ck/model.bin", RandomBytes(kMiB, 9));
  auto m = Mount("allow_other,max_watches=40,rescan=0");
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("zzz/team/ck").empty(); })) << m->Log();
  const std::string file = mnt_ + "/" + DigestOf("zzz/team/ck") + "/model.bin";
  ASSERT_EQ(TryAs(kOther, {{Probe::kRead, file}}), std::vector<bool>{true});
  EXPECT_NE(m->Log().find("more than the 40 watched"), std::string::npos) << m->Log();
  size_t watches = 0;  // the daemon's inotify watches, as /proc tells them: one line each
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(m->ServingPid()) + "/fdinfo")) {
    std::ifstream info(e.path());
    for (std::string line; std::getline(info, line);) watches += line.rfind("inotify wd:", 0) == 0 ? 1 : 0;
  }
  EXPECT_GE(watches, 4u);
  EXPECT_LE(watches, 40u);
  const auto last_scan = Status()["last_scan"];
  EXPECT_EQ(last_scan["directories"], 305) << last_scan.dump();  // SRC, aaa and its 300, zzz, team, ck
  EXPECT_EQ(last_scan["watched_directories"], 40) << last_scan.dump();
  const auto shown = RunCommand(kCtl + " status " + mnt_);
  EXPECT_NE(shown.out.find("watches      40 of 305 directories"), std::string::npos) << shown.out;

  ASSERT_EQ(::chmod((src_ + "/zzz/team/ck").c_str(), 0700), 0);
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, {{Probe::kRead, file}}) == std::vector<bool>{false}; }))
      << "other still reads, through the mount, what SRC now refuses them\n" << m->Log();
}

// Directories of one owner cannot take the watches of another's: a SRC
// writer's 200 tiny checkpoints (their directories serve, as any
// checkpoint's do) sit shallower than a hub cache's blobs/, whose watch
// applies a chmod of a blob; with room for 40 watches the owners take
// turns, and the blob's revocation still refuses another user at once.
TEST_F(RevalidationTest, OneWritersCheckpointsCannotTakeTheWatchesOfAnothers) {
  constexpr uid_t kWriter = 65534;
  for (int i = 0; i < 200; ++i) {
    const std::string dir = src_ + "/hostile/c" + std::to_string(100 + i);
    WriteFile(dir + "/m.safetensors", "x\n");
    ASSERT_EQ(::chown(dir.c_str(), kWriter, kWriter), 0);
  }
  ASSERT_EQ(::chown((src_ + "/hostile").c_str(), kWriter, kWriter), 0);
  const std::string repo = src_ + "/hub/models--org--tiny";
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  const std::string weights = RandomBytes(kMiB, 11);
  WriteHubSnapshot(repo, commit, {{"model.safetensors", weights}, {"config.json", "{}"}});
  WriteHubRef(repo, "main", commit);
  const std::string snapshot = "hub/models--org--tiny/snapshots/" + commit;
  auto m = Mount("allow_other,max_watches=40,rescan=0");
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf(snapshot).empty(); })) << m->Log();
  const std::string file = mnt_ + "/" + DigestOf(snapshot) + "/model.safetensors";
  ASSERT_EQ(TryAs(kOther, {{Probe::kRead, file}}), std::vector<bool>{true});
  EXPECT_NE(m->Log().find("more than the 40 watched"), std::string::npos) << m->Log();

  std::string blob;  // the weights' blob: the only one of their size
  for (const auto& e : fs::directory_iterator(repo + "/blobs")) {
    if (fs::file_size(e.path()) == weights.size()) blob = e.path();
  }
  ASSERT_FALSE(blob.empty());
  ASSERT_EQ(::chmod(blob.c_str(), 0600), 0);
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, {{Probe::kRead, file}}) == std::vector<bool>{false}; }))
      << "other still reads, through the mount, a blob SRC now refuses them\n" << m->Log();
}

// Hub cache: a revision resolves through refs/ (a by-name file) to its
// snapshot link while the only snapshot is verified again.
// Names read from an open by-name directory, from where it stands to its
// end, with getdents64 in a small buffer (a few entries a call).
std::vector<std::string> ReadNames(int fd, size_t calls = SIZE_MAX) {
  std::vector<std::string> names;
  alignas(8) char buf[512];
  for (size_t call = 0; call < calls; ++call) {
    const ssize_t n = ::getdents64(fd, buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const dirent64*>(buf + at);
      names.emplace_back(e->d_name);
      at += e->d_reclen;
    }
  }
  return names;
}

// A listing of by-name read while one of its checkpoints moves to a new
// digest still names that checkpoint, once: the link is a new node (its
// inode number comes from its target), which the open directory finds by
// its name. Nothing here looks the link up, so the kernel holds no node of
// it that could stand in for the one the publish replaced.
TEST_F(RevalidationTest, AListingInProgressKeepsACheckpointThatMovesToANewDigest) {
  constexpr int kCheckpoints = 200;
  auto name_of = [](int i) {
    const std::string n = std::to_string(1000 + i);
    return "c" + n.substr(1);
  };
  for (int i = 0; i < kCheckpoints; ++i) WriteFile(src_ + "/run/" + name_of(i) + "/model.bin", "weights " + name_of(i));
  auto m = Mount("allow_other,settle=0,rescan=0");
  ASSERT_TRUE(m->ok()) << m->Log();
  const std::string moving = "run/" + name_of(kCheckpoints - 10);
  ASSERT_TRUE(WaitFor([&] { return Settled(moving) && Settled("run/" + name_of(0)); })) << Status().dump(1);
  const std::string old = Row(moving).value("name", "");
  ASSERT_FALSE(old.empty());

  const int fd = ::open((mnt_ + "/by-name/run").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<std::string> names = ReadNames(fd, 2);
  ASSERT_FALSE(names.empty());
  ASSERT_LT(names.size(), 50u);  // most of the listing is still to come
  WriteFile(src_ + "/" + moving + "/model.bin", "new weights");
  const bool moved = WaitFor([&] {
    const std::string now = Row(moving).value("name", "");
    return !now.empty() && now != old && Listed(now) && !Listed(old);
  });
  for (const std::string& n : ReadNames(fd)) names.push_back(n);
  ::close(fd);
  ASSERT_TRUE(moved) << Status().dump(1);
  std::vector<std::string> expected{".", ".."};
  for (int i = 0; i < kCheckpoints; ++i) expected.push_back(name_of(i));
  EXPECT_EQ(names, expected);
}

// A directory that a link in SRC reaches by a second path (run/latest ->
// step-2) has one watch, and its events count for both paths: a chmod of
// a file in it applies at once to the copy each path serves (rescan=0:
// nothing else would tell), and ckptfsctl status counts the directory as
// watched.
TEST_F(RevalidationTest, ARevocationAppliesToEveryPathALinkGivesADirectory) {
  WriteFile(src_ + "/run/step-2/model.bin", RandomBytes(kMiB, 21));
  Symlink("step-2", src_ + "/run/latest");
  auto m = Mount("allow_other,settle=0,rescan=0");
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return Settled("run/step-2") && Settled("run/latest"); })) << Status().dump(1);
  ASSERT_EQ(DigestOf("run/step-2"), DigestOf("run/latest"));
  const std::string file = mnt_ + "/" + DigestOf("run/step-2") + "/model.bin";
  ASSERT_EQ(TryAs(kOther, {{Probe::kRead, file}}), std::vector<bool>{true});
  const auto last_scan = Status()["last_scan"];
  EXPECT_EQ(last_scan["watched_directories"], last_scan["directories"]) << last_scan.dump();
  const auto shown = RunCommand(kCtl + " status " + mnt_);
  EXPECT_EQ(shown.out.find("watches "), std::string::npos) << shown.out;
  // With rescan=0, inotify is all there is, and status says so.
  EXPECT_NE(shown.out.find("changes found by inotify only (rescan=0)"), std::string::npos) << shown.out;

  // The event comes from the directory's one watch, for a file in it.
  ASSERT_EQ(::chmod((src_ + "/run/step-2/model.bin").c_str(), 0600), 0);
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, {{Probe::kRead, file}}) == std::vector<bool>{false}; }))
      << "other still reads, through the path of the link, what SRC now refuses them\n" << Status().dump(1);
}

// A trainer's rotation (README, "Writing checkpoints into SRC"): the last
// step renamed aside and the new one renamed into its name, in one breath.
// The directory now at that name is another one: it is read anew (not taken
// from the last walk because its path and mode match), its checkpoint is
// indexed, and it gets a watch of its own, so that a chmod in it applies at
// once (rescan=0).
TEST_F(RevalidationTest, ADirectoryRenamedIntoThePlaceOfAnotherIsReadAnewAndWatched) {
  const std::string a_bytes = RandomBytes(kMiB, 31), b_bytes = RandomBytes(kMiB, 32);
  WriteFile(src_ + "/pub/a/m/w.bin", a_bytes);
  WriteFile(src_ + "/pub/.new/m/w.bin", b_bytes);
  auto m = Mount("allow_other,settle=0,rescan=0");
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("pub/a/m").empty(); })) << m->Log();
  const std::string old = DigestOf("pub/a/m");
  ASSERT_EQ(::rename((src_ + "/pub/a").c_str(), (src_ + "/pub/b").c_str()), 0);
  ASSERT_EQ(::rename((src_ + "/pub/.new").c_str(), (src_ + "/pub/a").c_str()), 0);
  EXPECT_TRUE(WaitFor([&] {
    const std::string now = DigestOf("pub/a/m");
    return !now.empty() && now != old && DigestOf("pub/b/m") == old;
  })) << "pub/a/m: " << DigestOf("pub/a/m") << ", pub/b/m: " << DigestOf("pub/b/m") << ", old " << old << "\n"
      << Status().dump(1);
  const std::string file = mnt_ + "/by-name/pub/a/m/w.bin";
  ASSERT_EQ(ReadFile(file), b_bytes);
  ASSERT_EQ(TryAs(kOther, {{Probe::kRead, file}}), std::vector<bool>{true});
  ASSERT_EQ(::chmod((src_ + "/pub/a/m/w.bin").c_str(), 0600), 0);
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, {{Probe::kRead, file}}) == std::vector<bool>{false}; }))
      << "other still reads what SRC now refuses them: the new directory has no watch\n" << Status().dump(1);
  // And an atomic swap of the two names (renameat2 RENAME_EXCHANGE).
  const std::string now_a = DigestOf("pub/a/m");
  ASSERT_EQ(::renameat2(AT_FDCWD, (src_ + "/pub/a").c_str(), AT_FDCWD, (src_ + "/pub/b").c_str(), RENAME_EXCHANGE), 0);
  EXPECT_TRUE(WaitFor([&] { return DigestOf("pub/a/m") == old && DigestOf("pub/b/m") == now_a; }))
      << "pub/a/m: " << DigestOf("pub/a/m") << ", pub/b/m: " << DigestOf("pub/b/m") << "\n" << Status().dump(1);
}

// A member that is a link into a hidden directory (.blobs/, which the walk
// skips, as every dot-path): that directory is watched all the same, so a
// chmod of the blob refuses another user at once (rescan=0).
TEST_F(RevalidationTest, ARevocationInAHiddenDirectoryALinkLeadsIntoAppliesAtOnce) {
  WriteFile(src_ + "/.blobs/abc", RandomBytes(kMiB, 33));
  WriteFile(src_ + "/pub/m/config.json", "{}");
  Symlink("../../.blobs/abc", src_ + "/pub/m/w.bin");
  auto m = Mount("allow_other,settle=0,rescan=0");
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("pub/m").empty(); })) << m->Log();
  const std::string file = mnt_ + "/" + DigestOf("pub/m") + "/w.bin";
  ASSERT_EQ(TryAs(kOther, {{Probe::kRead, file}}), std::vector<bool>{true});
  ASSERT_EQ(::chmod((src_ + "/.blobs/abc").c_str(), 0600), 0);
  EXPECT_TRUE(WaitFor([&] { return TryAs(kOther, {{Probe::kRead, file}}) == std::vector<bool>{false}; }))
      << "other still reads a blob SRC now refuses them\n" << Status().dump(1);
}

TEST_F(RevalidationTest, AHubRevisionResolvesWhileItsOnlySnapshotIsVerifiedAgain) {
  const std::string repo = src_ + "/hub/models--org--tiny";
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  const std::string gate_bytes = "{\"gate\": 1}";
  WriteHubSnapshot(repo, commit,
                   {{"model.safetensors", RandomBytes(kMiB, 4)}, {"config.json", "{}"}, {"gate.json", gate_bytes}});
  WriteHubRef(repo, "main", commit);
  // Snapshot files are links into blobs/<sha256>: the indexer opens the blob.
  const std::string gate_blob = RunCommand("printf %s " + ShellQuote(gate_bytes) + " | sha256sum").out.substr(0, 64);
  const std::string snapshot = "hub/models--org--tiny/snapshots/" + commit;
  auto m = MountHeldAt(gate_blob, snapshot);
  const std::string old = DigestOf(snapshot);
  ASSERT_FALSE(old.empty());
  const std::string ref = mnt_ + "/by-name/hub/models--org--tiny/refs/main";
  ASSERT_EQ(ReadFile(ref), commit);

  LinkPoller poller(mnt_ + "/by-name/" + snapshot);
  ASSERT_EQ(RunCommand("chmod -R a+r " + ShellQuote(repo + "/blobs")).exit_code, 0);
  ASSERT_TRUE(WaitFor(Held())) << m->Log();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(ReadFile(ref), commit) << "refs/main vanished during the re-index";
    EXPECT_EQ(DigestOf("hub/models--org--tiny/snapshots/" + ReadFile(ref)), old);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ResumeAll();
  EXPECT_TRUE(WaitFor([&] { return Settled(snapshot); })) << Status().dump(1);
  poller.Stop();
  EXPECT_EQ(poller.absent(), 0u);
  EXPECT_EQ(poller.Targets().size(), 1u);
  EXPECT_EQ(DigestOf(snapshot), old);
}

}  // namespace
}  // namespace ckptfs::testing
