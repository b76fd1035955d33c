// What a user learns of copies they cannot reach (issue 21, items 9 and 14):
// nothing. A digest held only in another user's private directory is, for
// them, a digest nobody holds (ENOENT, as for an unknown one), and the
// sources xattr of a shared digest names only the copies they could find in
// SRC themselves.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "security_fixture.h"

namespace ckptfs::testing {
namespace {

class DisclosureTest : public SecurityTest {
 protected:
  // `stat PATH` as `user`: "ok", or the error stat(1) printed.
  std::string StatAs(const User& user, const std::string& path) {
    AsResult r = RunAs(user, "stat -c ok " + ShellQuote(path) + " 2>&1");
    return r.exit_code == 0 ? "ok" : r.out;
  }
  // SRC/home/owner/<name>/model.bin, the home of mode `home_mode`
  // (/home is root's, 0755); mounted, and once its checkpoint is shown.
  std::unique_ptr<MountedCkptfs> MountHomeCheckpoint(const std::string& name, mode_t home_mode) {
    WriteFile(src_ + "/home/owner/" + name + "/model.bin", "weights of " + name + " nobody else may know of");
    Own(src_ + "/home", 0, 0, 0755);
    Own(src_ + "/home/owner", 2001, 3001, home_mode);
    auto m = Mount();
    EXPECT_TRUE(WaitFor([&] { return !DigestOf("home/owner/" + name).empty(); })) << m->Log();
    return m;
  }
  // SRC/shared/<name>/model.bin, the owner's, in a 0755 directory of
  // root's; mounted, and once its checkpoint is shown.
  std::unique_ptr<MountedCkptfs> MountSharedCheckpoint(const std::string& name, mode_t dir_mode, mode_t file_mode) {
    WriteFile(src_ + "/shared/" + name + "/model.bin", "a fine-tune of " + name);
    Own(src_ + "/shared", 0, 0, 0755);
    Own(src_ + "/shared/" + name, 2001, 3001, dir_mode);
    Own(src_ + "/shared/" + name + "/model.bin", 2001, 3001, file_mode);
    auto m = Mount();
    EXPECT_TRUE(WaitFor([&] { return !DigestOf("shared/" + name).empty(); })) << m->Log();
    return m;
  }
  std::string SourcesAs(const User& user, const std::string& path) {
    return RunAs(user, "getfattr --absolute-names --only-values -n user.ckptfs.sources " + ShellQuote(path) + " 2>&1")
        .out;
  }
};

TEST_F(DisclosureTest, APrivateDigestIsNoMoreThereThanAnUnknownOne) {
  auto m = MountHomeCheckpoint("private-model", 0700);
  ASSERT_FALSE(DigestOf("home/owner/private-model").empty()) << m->Log();
  const std::string digest = mnt_ + "/" + DigestOf("home/owner/private-model");
  const std::string unknown = mnt_ + "/sha256-" + std::string(64, '0');

  EXPECT_EQ(StatAs(kOwner, digest), "ok");
  const std::string as_other = StatAs(kOther, digest);
  EXPECT_NE(as_other.find("No such file or directory"), std::string::npos) << as_other;
  EXPECT_EQ(as_other.find("Permission denied"), std::string::npos) << as_other;
  // The same answer as for a digest that does not exist at all, also for a
  // path below it.
  const std::string as_other_unknown = StatAs(kOther, unknown);
  EXPECT_NE(as_other_unknown.find("No such file or directory"), std::string::npos) << as_other_unknown;
  const std::string below = StatAs(kOther, digest + "/model.bin");
  EXPECT_NE(below.find("No such file or directory"), std::string::npos) << below;
}

// Nor does the time an answer takes tell a hidden digest from an unknown
// one: neither answer is cached by the kernel, so each of them reaches the
// daemon every time. (With a negative entry cached for unknown names only,
// a loop of stats answered those from the kernel's cache in a seventh of
// the time, found attacking the daemon.) Counted, not timed: both kinds of
// names are asked twice in a row, and every ask is a lookup the daemon
// answers.
TEST_F(DisclosureTest, AnUnknownDigestIsNotAnsweredFromACacheThatAHiddenOneMisses) {
  auto m = MountHomeCheckpoint("private-model", 0700);
  ASSERT_FALSE(DigestOf("home/owner/private-model").empty()) << m->Log();
  auto not_found = [&] {
    auto s = nlohmann::json::parse(RunCommand(Ctl() + " stats --json " + mnt_).out, nullptr, false);
    return s.is_discarded() ? uint64_t{0} : s.value("lookups_not_found", uint64_t{0});
  };
  for (const std::string& name : {DigestOf("home/owner/private-model"), "sha256-" + std::string(64, '0'),
                                  std::string("by-name/no-such-model")}) {
    const uint64_t before = not_found();
    const std::string path = ShellQuote(mnt_ + "/" + name);
    AsResult twice = RunAs(kOther, "stat -c ok " + path + " " + path + " 2>&1");
    EXPECT_EQ(twice.out.find("ok"), std::string::npos) << name << ": " << twice.out;
    EXPECT_EQ(not_found() - before, 2u) << name << ": the second ask was answered without the daemon";
  }
}

// The node's counters (tiers, opens, fills) move with every user's files:
// from their deltas another user read the exact size of a private file as
// its copy was made at indexing (fills.from_indexing.bytes, tiers.host.used)
// and saw when its owner loaded it (tiers.host.hits, opens), found attacking
// the daemon. Another user's stats hold only the checkpoints they may see;
// root's hold the counters.
TEST_F(DisclosureTest, TheNodesCountersAreShownToRootAndTheMountsOwnerOnly) {
  auto m = MountHomeCheckpoint("private-model", 0700);
  const std::string digest = DigestOf("home/owner/private-model");
  ASSERT_FALSE(digest.empty()) << m->Log();
  ASSERT_EQ(ReadFile(mnt_ + "/" + digest + "/model.bin"), "weights of private-model nobody else may know of");
  const auto root = nlohmann::json::parse(RunCommand(Ctl() + " stats --json " + mnt_).out, nullptr, false);
  ASSERT_TRUE(root.is_object());
  EXPECT_EQ(root.value("node_counters", false), true) << root.dump();
  EXPECT_TRUE(root.contains("fills") && root.contains("tiers") && root.contains("opens")) << root.dump();
  EXPECT_NE(root.dump().find(digest), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(RunCommand(Ctl() + " status --json " + mnt_).out).contains("reads"));
  for (const User& user : {kOther, kOwner}) {
    AsResult json = RunAs(user, Ctl() + " stats --json " + ShellQuote(mnt_));
    ASSERT_EQ(json.exit_code, 0) << json.out;
    const auto theirs = nlohmann::json::parse(json.out, nullptr, false);
    ASSERT_TRUE(theirs.is_object()) << json.out;
    EXPECT_EQ(theirs.value("node_counters", true), false) << json.out;
    for (const char* key : {"fills", "tiers", "opens", "bytes_served", "source_bytes_read", "lookups_not_found"}) {
      EXPECT_FALSE(theirs.contains(key)) << key << ": " << json.out;
    }
    // Their own checkpoints still have their rows.
    EXPECT_EQ(theirs.dump().find(digest) != std::string::npos, user.uid == kOwner.uid) << json.out;
    AsResult table = RunAs(user, Ctl() + " stats " + ShellQuote(mnt_));
    EXPECT_EQ(table.exit_code, 0) << table.out;
    EXPECT_NE(table.out.find("shown to root and the mount's owner only"), std::string::npos) << table.out;
    AsResult status = RunAs(user, Ctl() + " status --json " + ShellQuote(mnt_));
    ASSERT_EQ(status.exit_code, 0) << status.out;
    const auto their_status = nlohmann::json::parse(status.out, nullptr, false);
    for (const char* key : {"reads", "last_scan", "opens_not_waiting"}) {
      EXPECT_FALSE(their_status.contains(key)) << key << ": " << status.out;
    }
    EXPECT_EQ(RunAs(user, Ctl() + " status " + ShellQuote(mnt_)).exit_code, 0);
    AsResult prometheus = RunAs(user, Ctl() + " stats --prometheus " + ShellQuote(mnt_));
    EXPECT_EQ(prometheus.exit_code, 0) << prometheus.out;
    EXPECT_EQ(prometheus.out.find("ckptfs_cache_used_bytes"), std::string::npos) << prometheus.out;
  }
}

TEST_F(DisclosureTest, TheSourcesXattrNamesOnlyCopiesTheCallerCouldFind) {
  const std::string bytes = "a public model, also kept in a private home";
  WriteFile(src_ + "/pub/model/model.bin", bytes);
  WriteFile(src_ + "/home/owner/acquisition-target-x/model.bin", bytes);
  Own(src_ + "/home", 0, 0, 0755);
  Own(src_ + "/home/owner", 2001, 3001, 0700);
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] {
    return !DigestOf("pub/model").empty() && DigestOf("pub/model") == DigestOf("home/owner/acquisition-target-x");
  })) << m->Log();
  const std::string digest = mnt_ + "/" + DigestOf("pub/model");
  const std::string pub = src_ + "/pub/model\n", priv = src_ + "/home/owner/acquisition-target-x\n";

  EXPECT_EQ(SourcesAs(kRoot, digest), priv + pub);
  EXPECT_EQ(SourcesAs(kOwner, digest), priv + pub);
  EXPECT_EQ(SourcesAs(kOther, digest), pub) << "a path inside a 0700 home leaked";
  EXPECT_EQ(SourcesAs(kMember, digest), pub);
  // Nor a copy in a directory others may stat but not enter: that it holds
  // these bytes is drawn from what they may not read.
  WriteFile(src_ + "/shared/same-as-pub/model.bin", bytes);
  Own(src_ + "/shared", 0, 0, 0755);
  Own(src_ + "/shared/same-as-pub", 2001, 3001, 0700);
  ASSERT_TRUE(RescanAndSettle()) << m->Log();
  const std::string entered = src_ + "/shared/same-as-pub\n";
  ASSERT_EQ(SourcesAs(kRoot, digest), priv + pub + entered);
  EXPECT_EQ(SourcesAs(kOther, digest), pub) << "a copy in a directory others may not enter was named";
  EXPECT_EQ(SourcesAs(kOwner, digest), priv + pub + entered);
  // ckptfsctl ls agrees (it filtered already).
  AsResult ls = RunAs(kOther, Ctl() + " ls --json " + ShellQuote(mnt_));
  EXPECT_EQ(ls.out.find("acquisition-target-x"), std::string::npos) << ls.out;
}

// One writer's hard links to a public model, in hundreds of checkpoints of
// its own with long names, made user.ckptfs.sources of the public digest
// longer than an extended attribute may be: every getxattr of it failed
// with E2BIG, for everyone (found attacking the daemon with 3,000 links).
// The list is capped: root's copy and the caller's come first, and a last
// line counts the copies left out.
TEST_F(DisclosureTest, ThousandsOfCopiesLeaveTheSourcesXattrReadableWithRootsCopyListed) {
  const std::string bytes = "a public model that one writer links to many times";
  WriteFile(src_ + "/pub/model/model.bin", bytes);
  MakeDirs(src_ + "/w");
  constexpr int kCopies = 300;  // 300 lines of over 230 bytes: past 64 KiB
  const std::string long_name = std::string(200, 'x');
  for (int i = 0; i < kCopies; ++i) {
    const std::string dir = src_ + "/w/" + long_name + "-" + std::to_string(i);
    MakeDirs(dir);
    ASSERT_EQ(::link((src_ + "/pub/model/model.bin").c_str(), (dir + "/model.bin").c_str()), 0) << dir;
    Own(dir, kOther.uid, kOther.gid, 0755);
  }
  Own(src_ + "/w", kOther.uid, kOther.gid, 0755);
  auto m = Mount();
  const std::string last = "w/" + long_name + "-" + std::to_string(kCopies - 1);
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("pub/model").empty() && DigestOf(last) == DigestOf("pub/model"); }))
      << m->Log();
  ASSERT_TRUE(WaitUntilIndexed()) << m->Log();
  const std::string digest = mnt_ + "/" + DigestOf("pub/model");
  for (const User& user : {kRoot, kMember, kOther}) {
    const std::string got = SourcesAs(user, digest);
    EXPECT_EQ(got.find("Argument list too long"), std::string::npos) << user.name;
    EXPECT_LE(got.size(), 65536u) << user.name;
    EXPECT_NE(("\n" + got).find("\n" + src_ + "/pub/model\n"), std::string::npos)
        << user.name << ": " << got.substr(0, 300);
    EXPECT_NE(got.find(" more copies not listed"), std::string::npos)
        << user.name << ": " << got.substr(got.size() > 300 ? got.size() - 300 : 0);
    EXPECT_NE(got.find(long_name + "-0\n"), std::string::npos) << user.name;
  }
}

// A user's link to another's private checkpoint (SRC/other/m ->
// ../home/owner/secret-model) is a path they cannot follow in SRC: its
// by-name entry is no more there for them than one whose link leads
// nowhere (SRC/other/n), neither listed nor found, so that it tells them
// neither that the checkpoint exists nor its digest; whoever can follow it
// finds it and the digest it leads to.
TEST_F(DisclosureTest, AByNameLinkThroughAPrivateDirectoryIsNoMoreThereThanOneLeadingNowhere) {
  WriteFile(src_ + "/home/owner/secret-model/model.bin", "weights nobody else may know of");
  Own(src_ + "/home", 0, 0, 0755);
  Own(src_ + "/home/owner", 2001, 3001, 0700);
  MakeDirs(src_ + "/other");
  Symlink("../home/owner/secret-model", src_ + "/other/m");
  Symlink("../home/owner/no-such-model", src_ + "/other/n");
  Own(src_ + "/other", 2003, 2003, 0755);
  ASSERT_EQ(::lchown((src_ + "/other/m").c_str(), 2003, 2003), 0);
  ASSERT_EQ(::lchown((src_ + "/other/n").c_str(), 2003, 2003), 0);
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("other/m").empty(); })) << m->Log();
  const std::string dir = mnt_ + "/by-name/other";
  auto probe = [&](const User& u, const std::string& name) {
    const std::string path = ShellQuote(dir + "/" + name);
    return RunAs(u, "readlink " + path + " 2>&1; stat -c ok " + path + " 2>&1 | sed 's/.*: //'").out;
  };
  const std::string m_as_other = probe(kOther, "m");
  EXPECT_EQ(m_as_other.find("sha256-"), std::string::npos) << m_as_other;
  EXPECT_EQ(m_as_other, probe(kOther, "n"));
  EXPECT_NE(m_as_other.find("No such file or directory"), std::string::npos) << m_as_other;
  EXPECT_EQ(RunAs(kOther, "ls -A " + ShellQuote(dir) + " 2>&1").out, "");
  EXPECT_EQ(RunAs(kOwner, "readlink " + ShellQuote(dir + "/m")).out, "../../" + DigestOf("other/m") + "\n");
  EXPECT_EQ(RunAs(kOwner, "ls -A " + ShellQuote(dir)).out, "m\n");
}

// A checkpoint directory others may not enter (0700 in a 0755 parent):
// they can stat it in SRC, and learn its name, but nothing drawn from what
// it holds. Its digest (a fingerprint of its bytes: enough to confirm a
// guess of them), its size and its file count are no more there for them
// than those of a checkpoint nobody holds; its owner sees it all.
TEST_F(DisclosureTest, ACheckpointOthersMayNotEnterShowsThemNothingDrawnFromItsBytes) {
  auto m = MountSharedCheckpoint("alice-ft", 0700, 0600);
  const std::string digest = DigestOf("shared/alice-ft");
  ASSERT_FALSE(digest.empty()) << m->Log();
  EXPECT_EQ(RunAs(kOther, "stat -c ok " + ShellQuote(src_ + "/shared/alice-ft")).out, "ok\n");  // SRC tells that much
  auto what_other_learns = [&](const User& u) {
    return RunAs(u, "ls " + ShellQuote(mnt_) + "; readlink " + ShellQuote(mnt_ + "/by-name/shared/alice-ft") + "; " +
                        Ctl() + " ls " + ShellQuote(mnt_) + "; " + Ctl() + " status " + ShellQuote(mnt_) + " 2>&1")
        .out;
  };
  const std::string other = what_other_learns(kOther);
  EXPECT_EQ(other.find(digest.substr(7, 16)), std::string::npos) << other;
  EXPECT_EQ(other.find("alice-ft"), std::string::npos) << other;
  const std::string stat_as_other = StatAs(kOther, mnt_ + "/" + digest);
  EXPECT_NE(stat_as_other.find("No such file or directory"), std::string::npos) << stat_as_other;
  const std::string owner = what_other_learns(kOwner);
  EXPECT_NE(owner.find(digest), std::string::npos) << owner;
  EXPECT_NE(owner.find("alice-ft"), std::string::npos) << owner;
}

// The same once the checkpoint directory is closed to others after they
// opened its digest directory: a descriptor taken before stats it no more
// (its lookup would be refused; the kernel asks again on every fstat, as
// nobody else may cache such an entry).
TEST_F(DisclosureTest, ADescriptorTakenBeforeACheckpointWasClosedStatsItNoMore) {
  auto m = MountSharedCheckpoint("ft", 0755, 0644);
  ASSERT_FALSE(DigestOf("shared/ft").empty()) << m->Log();
  const std::string flags = tmp_ / "flags";
  MakeDirs(flags);
  ASSERT_EQ(::chmod(flags.c_str(), 0777), 0);
  const std::string script = flags + "/hold.py";
  WriteFile(script,
            "import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_PATH)\n"
            "print(os.fstat(fd).st_mode & 0o777, flush=True)\n"
            "open(sys.argv[2] + '/ready', 'w').close()\n"
            "while not os.path.exists(sys.argv[2] + '/go'): time.sleep(0.02)\n"
            "try:\n  os.fstat(fd); print('stat ok')\nexcept OSError as e: print('stat', e.strerror)\n");
  ASSERT_EQ(::chmod(script.c_str(), 0644), 0);
  AsResult held;
  std::thread holder([&] {
    held = RunAs(kOther, "/usr/bin/python3 " + ShellQuote(script) + " " +
                             ShellQuote(mnt_ + "/" + DigestOf("shared/ft")) + " " + ShellQuote(flags) + " 2>&1");
  });
  const bool ready = WaitFor([&] { return ::access((flags + "/ready").c_str(), F_OK) == 0; });
  ASSERT_EQ(::chmod((src_ + "/shared/ft").c_str(), 0700), 0);
  const bool settled = RescanAndSettle();
  WriteFile(flags + "/go", "");
  holder.join();
  ASSERT_TRUE(ready) << held.out;
  ASSERT_TRUE(settled) << m->Log();
  EXPECT_NE(held.out.find("stat Permission denied"), std::string::npos) << held.out;
}

// A name in a directory others may enter but not list (0711) is not
// theirs to learn: neither the sources xattr nor ckptfsctl tells it them,
// though they may use the checkpoint (they could reach it, knowing the
// name). Found attacking the daemon: both printed it.
TEST_F(DisclosureTest, ANameInADirectoryOthersMayOnlyEnterIsNotToldThem) {
  auto m = MountHomeCheckpoint("secret-model-name", 0711);
  ASSERT_FALSE(DigestOf("home/owner/secret-model-name").empty()) << m->Log();
  const std::string digest = mnt_ + "/" + DigestOf("home/owner/secret-model-name");
  EXPECT_NE(RunAs(kOther, "ls " + ShellQuote(src_ + "/home/owner") + " 2>&1").out.find("Permission denied"),
            std::string::npos);
  EXPECT_EQ(StatAs(kOther, digest), "ok");  // reachable: its bytes are theirs to read
  EXPECT_EQ(SourcesAs(kOther, digest), "");
  const std::string ls = RunAs(kOther, Ctl() + " ls " + ShellQuote(mnt_) + "; " + Ctl() + " status " +
                                           ShellQuote(mnt_) + " 2>&1").out;
  EXPECT_EQ(ls.find("secret-model-name"), std::string::npos) << ls;
  EXPECT_EQ(SourcesAs(kOwner, digest), src_ + "/home/owner/secret-model-name\n");
}

// The root numbers its entries, for each caller, among the digests that
// caller may reach: offsets with gaps would tell another user how many
// private digests sort between two of theirs, and when they come and go.
// Read a few entries a call (each call goes on from the offset the last
// one ended at), then from every offset it gave, as seekdir would.
TEST_F(DisclosureTest, TheRootsOffsetsCountOnlyTheDigestsTheCallerMayReach) {
  for (int i = 0; i < 4; ++i) WriteFile(src_ + "/pub/m" + std::to_string(i) + "/model.bin", "public " + std::to_string(i));
  for (int i = 0; i < 24; ++i) {
    WriteFile(src_ + "/home/owner/p" + std::to_string(i) + "/model.bin", "private " + std::to_string(i));
  }
  Own(src_ + "/home", 0, 0, 0755);
  Own(src_ + "/home/owner", 2001, 3001, 0700);
  auto m = Mount();
  std::vector<std::string> pub, priv;
  ASSERT_TRUE(WaitFor([&] {
    pub.clear();
    priv.clear();
    for (int i = 0; i < 4; ++i) pub.push_back(DigestOf("pub/m" + std::to_string(i)));
    for (int i = 0; i < 24; ++i) priv.push_back(DigestOf("home/owner/p" + std::to_string(i)));
    return std::count(pub.begin(), pub.end(), "") + std::count(priv.begin(), priv.end(), "") == 0;
  })) << m->Log();
  std::sort(pub.begin(), pub.end());
  // Without a private digest between two public ones there would be no gap to see.
  ASSERT_TRUE(std::any_of(priv.begin(), priv.end(), [&](const std::string& p) {
    return pub.front() < p && p < pub.back();
  }));

  std::optional<std::string> seen = InChildAs(kOther, [&] {
    std::string out;
    const int fd = ::open(mnt_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return std::string("open failed");
    // One line per entry: its name and the offset it gives.
    std::vector<std::pair<std::string, off_t>> entries;
    alignas(8) char buf[200];  // room for two entries named by a digest
    auto read_some = [&](std::vector<std::pair<std::string, off_t>>& into) {
      const ssize_t n = ::getdents64(fd, buf, sizeof buf);
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const dirent64*>(buf + at);
        into.emplace_back(e->d_name, e->d_off);
        at += e->d_reclen;
      }
      return n > 0;
    };
    while (read_some(entries)) {
    }
    for (const auto& [name, off] : entries) out += name + " " + std::to_string(off) + "\n";
    // From each offset, the entry after it.
    for (const auto& [name, off] : entries) {
      std::vector<std::pair<std::string, off_t>> next;
      ::lseek(fd, off, SEEK_SET);
      read_some(next);
      out += "after " + name + ": " + (next.empty() ? std::string("-") : next.front().first) + "\n";
    }
    ::close(fd);
    return out;
  });
  ASSERT_TRUE(seen.has_value());
  std::vector<std::string> names{".", "..", "by-name"};
  names.insert(names.end(), pub.begin(), pub.end());
  std::string expected;
  for (size_t k = 0; k < names.size(); ++k) expected += names[k] + " " + std::to_string(k + 1) + "\n";
  for (size_t k = 0; k < names.size(); ++k) {
    expected += "after " + names[k] + ": " + (k + 1 < names.size() ? names[k + 1] : "-") + "\n";
  }
  EXPECT_EQ(*seen, expected);
}

}  // namespace
}  // namespace ckptfs::testing
