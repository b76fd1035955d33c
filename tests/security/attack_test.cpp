// Attacks on the daemon by an unprivileged local user of a shared node
// (issue 10), each through the real daemon. Every test here fails on the
// daemon of commit ad90932 (run the suite with CKPTFS_TEST_DAEMON and
// CKPTFS_TEST_CTL pointing at that build to see it).
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/xattr.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/index.h"
#include "faulty_fs_mount.h"
#include "indexed_source_file.h"
#include "security_fixture.h"

namespace ckptfs::testing {
namespace {

const std::string kSecret = "TOP-SECRET-ROOT-ONLY-0123456789";

class AttackTest : public SecurityTest {
 protected:
  // Everything the mount shows, read as `user`: the concatenated bytes of
  // every file the user may read, found by walking the digest directories.
  std::string EverythingReadableAs(const User& user) {
    return RunAs(user, "find " + ShellQuote(mnt_) + "/ -type f -exec cat {} + 2>/dev/null").out;
  }
};

// Item 1: a symlink swapped in between the walk's lstat and the hasher's
// open. The test seam pauses the indexer just before it opens x.txt; the
// attacker, who owns the checkpoint, then replaces x.txt with a link to a
// root-only file, inside SRC or outside it.
TEST_F(AttackTest, SymlinkSwappedInDuringIndexingNeverExposesARootOnlyFile) {
  for (const bool inside : {false, true}) {
    SCOPED_TRACE(inside ? "secret inside SRC" : "secret outside SRC");
    TempDir scratch{"ckptfs-sec-race"};
    ::chmod(scratch.path().c_str(), 0755);
    const std::string secret = inside ? src_ + "/rootonly/secret" : scratch / "secret";
    WriteFile(secret, kSecret);
    Own(secret, 0, 0, 0600);
    if (inside) Own(src_ + "/rootonly", 0, 0, 0700);
    const std::string pub = src_ + "/pub" + (inside ? "1" : "2");
    WriteFile(pub + "/ck/model.bin", "weights");
    WriteFile(pub + "/ck/x.txt", "harmless");
    ASSERT_EQ(RunCommand("chown -R 2003:2003 " + pub).exit_code, 0);

    const std::string gate = scratch / "gate";
    MakeDirs(gate);
    ::setenv("CKPTFS_TEST_PAUSE_BEFORE_HASH", ("x.txt:" + gate).c_str(), 1);
    auto m = Mount();
    ::unsetenv("CKPTFS_TEST_PAUSE_BEFORE_HASH");
    ASSERT_TRUE(WaitFor([&] { return ::access((gate + "/paused").c_str(), F_OK) == 0; })) << m->Log();
    // The attack, as the attacker: mv -f a link over the file being indexed.
    AsResult swap = RunAs(kOther, "cd " + ShellQuote(pub + "/ck") + " && ln -s " + ShellQuote(secret) +
                                      " link && mv -f link x.txt");
    ASSERT_EQ(swap.exit_code, 0) << swap.out;
    WriteFile(gate + "/resume", "");
    ASSERT_TRUE(RescanAndSettle()) << m->Log();

    EXPECT_EQ(EverythingReadableAs(kOther).find(kSecret), std::string::npos) << m->Log();
    AsResult direct = RunAs(kOther, "cat " + ShellQuote(mnt_ + "/by-name/" + pub.substr(src_.size() + 1) + "/ck/x.txt"));
    EXPECT_EQ(direct.out.find(kSecret), std::string::npos) << direct.out;
    // Whatever the mount shows of it, it never shows the secret as the attacker's.
    for (const auto& digest : {DigestOf(pub.substr(src_.size() + 1) + "/ck")}) {
      if (digest.empty()) continue;
      struct stat st;
      if (::stat((mnt_ + "/" + digest + "/x.txt").c_str(), &st) == 0 &&
          ReadFile(mnt_ + "/" + digest + "/x.txt") == kSecret) {
        EXPECT_EQ(st.st_uid, 0u);
        EXPECT_EQ(st.st_mode & 0077, 0u);
      }
    }
    m.reset();
    RemoveTree(pub);
  }
}

// Item 2: a contained symlink into a private directory (a hub cache whose
// blobs/ is private) is readable only by who can reach the target.
TEST_F(AttackTest, ContainedSymlinkIntoAPrivateDirectoryIsNotReadableByOthers) {
  const std::string hub = src_ + "/hub/models--org--m";
  WriteFile(hub + "/blobs/aaaa", "private weights");
  WriteFile(hub + "/snapshots/c0ffee/config.json", "{}");
  Symlink("../../blobs/aaaa", hub + "/snapshots/c0ffee/model.safetensors");
  Own(hub + "/blobs", 2001, 3001, 0700);
  Own(hub + "/blobs/aaaa", 2001, 3001, 0644);
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("hub/models--org--m/snapshots/c0ffee").empty(); })) << m->Log();
  const std::string file = mnt_ + "/" + DigestOf("hub/models--org--m/snapshots/c0ffee") + "/model.safetensors";
  EXPECT_NE(RunAs(kOther, "cat " + ShellQuote(hub + "/snapshots/c0ffee/model.safetensors")).exit_code, 0);
  EXPECT_NE(RunAs(kOther, "cat " + ShellQuote(file)).exit_code, 0);
  EXPECT_EQ(RunAs(kOwner, "cat " + ShellQuote(file)).out, "private weights");
  EXPECT_EQ(RunAs(kOther, "cat " + ShellQuote(mnt_ + "/" + DigestOf("hub/models--org--m/snapshots/c0ffee") +
                                                 "/config.json")).exit_code,
            0);
}

// Item 3: revoking access in SRC is applied, even to a reader whose kernel
// caches already hold the entry.
TEST_F(AttackTest, RevokingAccessInSourceIsAppliedThroughTheDigestPath) {
  WriteFile(src_ + "/team/m/model.bin", "shared weights");
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("team/m").empty(); })) << m->Log();
  const std::string file = mnt_ + "/" + DigestOf("team/m") + "/model.bin";
  ASSERT_EQ(RunAs(kOther, "cat " + ShellQuote(file)).out, "shared weights");
  ASSERT_EQ(::chmod((src_ + "/team").c_str(), 0700), 0);
  ASSERT_TRUE(RescanAndSettle()) << m->Log();
  EXPECT_NE(RunAs(kOther, "cat " + ShellQuote(file)).exit_code, 0);
  EXPECT_NE(RunAs(kOther, "stat " + ShellQuote(file)).exit_code, 0);
  EXPECT_EQ(ReadFile(file), "shared weights");  // root still reads it
}

// Item 4: copying a public checkpoint into one's own 0700 directory locks
// nobody out, and the owner of a private checkpoint reads it.
TEST_F(AttackTest, APrivateCopyLocksNobodyOutAndItsOwnerReadsIt) {
  WriteFile(src_ + "/public/m/model.bin", "public weights");
  WriteFile(src_ + "/mallory/m/model.bin", "public weights");
  Own(src_ + "/mallory", 2003, 2003, 0700);
  WriteFile(src_ + "/alice/m/model.bin", "alice's weights");
  ASSERT_EQ(RunCommand("chown -R 2001:3001 " + src_ + "/alice && chmod -R go-rwx " + src_ + "/alice").exit_code, 0);
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("public/m").empty() && !DigestOf("alice/m").empty(); })) << m->Log();
  EXPECT_EQ(RunAs(kMember, "cat " + ShellQuote(mnt_ + "/" + DigestOf("public/m") + "/model.bin")).out,
            "public weights");
  const std::string alice = mnt_ + "/" + DigestOf("alice/m") + "/model.bin";
  EXPECT_EQ(RunAs(kOwner, "cat " + ShellQuote(alice)).out, "alice's weights");
  EXPECT_NE(RunAs(kMember, "cat " + ShellQuote(alice)).exit_code, 0);
}

// Item 5: control queries answer each caller only about what it could see.
TEST_F(AttackTest, ControlQueriesLeakNoNamesOrLinkTargetsTheCallerCannotSee) {
  WriteFile(src_ + "/alice/acquisition-target-x/llama-ft/model.bin", "w");
  Own(src_ + "/alice", 2001, 3001, 0700);
  WriteFile(src_ + "/pub/broken/model.bin", "w");
  Symlink("/root/.ssh/id_ed25519", src_ + "/pub/broken/probe");  // dangling or not: not theirs to know
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("alice/acquisition-target-x/llama-ft").empty(); })) << m->Log();
  for (const char* cmd : {"status", "status --json", "ls", "ls --json"}) {
    AsResult other = RunAs(kOther, Ctl() + " " + cmd + " " + ShellQuote(mnt_));
    EXPECT_EQ(other.exit_code, 0) << cmd << ": " << other.out;
    EXPECT_EQ(other.out.find("acquisition-target-x"), std::string::npos) << cmd << ": " << other.out;
    EXPECT_EQ(other.out.find("id_ed25519"), std::string::npos) << cmd << ": " << other.out;
    EXPECT_EQ(other.out.find("dangling"), std::string::npos) << cmd << ": " << other.out;
    if (std::string(cmd) == "status") continue;  // its text lists only checkpoints that are not exposed
    AsResult owner = RunAs(kOwner, Ctl() + " " + cmd + " " + ShellQuote(mnt_));
    EXPECT_NE(owner.out.find("acquisition-target-x"), std::string::npos) << cmd << ": " << owner.out;
  }
  EXPECT_NE(RunCommand(Ctl() + " status " + ShellQuote(mnt_)).out.find("id_ed25519"), std::string::npos);
}

// A writer's link into another user's private directory makes their own
// checkpoint invalid (a dangling link inside): the reason names that link
// only to whoever may list the directory it lies in. Found attacking the
// daemon: status told the link's writer a name from the private home.
TEST_F(AttackTest, AReasonNamesOnlyEntriesOfDirectoriesTheCallerMayList) {
  MakeDirs(src_ + "/home/alice");
  Symlink("../../nowhere", src_ + "/home/alice/secret-project-falcon");
  WriteFile(src_ + "/home/alice/notes\\falcon-budget", "a member name the digest rule refuses");
  Own(src_ + "/home", 0, 0, 0755);
  Own(src_ + "/home/alice", 2001, 3001, 0700);
  WriteFile(src_ + "/mallory/m/model.bin", "w");
  Symlink("../../home/alice", src_ + "/mallory/m/peek");
  ASSERT_EQ(RunCommand("chown -hR 2003:2003 " + ShellQuote(src_ + "/mallory")).exit_code, 0);
  auto m = Mount();
  auto status_as = [&](const User& u) { return RunAs(u, Ctl() + " status " + ShellQuote(mnt_) + " 2>&1").out; };
  ASSERT_TRUE(WaitFor([&] { return status_as(kRoot).find("secret-project-falcon") != std::string::npos; }))
      << m->Log();
  const std::string mallory = status_as(kOther);
  EXPECT_NE(mallory.find("mallory/m"), std::string::npos) << mallory;  // told it is invalid
  EXPECT_EQ(mallory.find("secret-project-falcon"), std::string::npos) << mallory;
  EXPECT_EQ(mallory.find("falcon-budget"), std::string::npos) << mallory;
  EXPECT_NE(mallory.find("problem(s) in directories you may not list"), std::string::npos) << mallory;
  const std::string alice = status_as(kOwner);
  EXPECT_NE(alice.find("secret-project-falcon"), std::string::npos) << alice;  // her own directory
  EXPECT_NE(alice.find("falcon-budget"), std::string::npos) << alice;
}

// Item 6: a symlink in SRC that leads into the mount (MNT inside SRC) is
// refused; the daemon never indexes its own view.
TEST_F(AttackTest, TheDaemonNeverWalksIntoItsOwnMountThroughASymlink) {
  mnt_ = src_ + "/mnt";
  MakeDirs(mnt_);
  WriteFile(src_ + "/a/model.bin", "w");
  MakeDirs(src_ + "/loop");
  Symlink("../mnt/by-name", src_ + "/loop/view");
  Symlink("../mnt", src_ + "/loop/all");
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("a").empty(); })) << m->Log();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(RescanAndSettle()) << m->Log();
  auto status = Status();
  ASSERT_TRUE(status.contains("checkpoints")) << status.dump();
  for (const auto& c : status["checkpoints"]) {
    EXPECT_EQ(c["path"].get<std::string>().find("/loop/"), std::string::npos) << status.dump();
  }
  EXPECT_EQ(status["checkpoints"].size(), 1u) << status.dump();
}

// Item 7: a comma in SRC does not inject FUSE options.
TEST_F(AttackTest, ACommaInTheSourcePathInjectsNoMountOption) {
  const std::string src = tmp_ / "src,allow_other";
  WriteFile(src + "/m/model.bin", "w");
  ::chmod(src.c_str(), 0755);
  auto m = MountAt(src, mnt_, "");  // no allow_other asked for
  ASSERT_TRUE(m->ok());
  std::ifstream info("/proc/self/mountinfo");
  std::string line, ours;
  while (std::getline(info, line)) {
    if (line.find(" " + mnt_ + " ") != std::string::npos) ours = line;
  }
  ASSERT_FALSE(ours.empty());
  // "... - fuse.ckptfs SOURCE SUPER-OPTIONS": the source keeps its comma, the
  // options gain nothing.
  std::istringstream fields(ours.substr(ours.find(" - ") + 3));
  std::string type, source, options;
  fields >> type >> source >> options;
  EXPECT_EQ(source, src) << ours;
  EXPECT_EQ(options.find("allow_other"), std::string::npos) << ours;
  EXPECT_NE(RunAs(kOther, "ls " + ShellQuote(mnt_)).exit_code, 0);
}

// Item 9: an index row edited behind the daemon's back is not trusted.
TEST_F(AttackTest, AnEditedIndexRowDoesNotRenameACheckpoint) {
  WriteFile(src_ + "/m/model.bin", "weights");
  WriteFile(src_ + "/m/config.json", "{}");
  const std::string expected = CoreutilsDigest(src_ + "/m");
  {
    auto m = Mount();
    ASSERT_TRUE(WaitFor([&] { return DigestOf("m") == expected; })) << m->Log();
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state_ + "/index.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE files SET sha256 = zeroblob(32)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("m").empty(); })) << m->Log();
  EXPECT_EQ(DigestOf("m"), expected);
}


// Issue 21 item 7: a user's own copy of a public model (same digest), which
// the user then truncates, costs no other reader an EIO. The copy is a hard
// link to a file of the attacker's outside SRC, truncated through that
// path: inotify sees nothing, so no rescan takes the copy away before the
// victim reads, and the first read after the truncation is the one that
// used to fail. With the public copy owned by root the daemon reads it
// first and never touches the attacker's; with both copies owned by
// ordinary users it reads the attacker's first (path order), finds it
// changed, and serves the read from the other copy.
TEST_F(AttackTest, ATruncatedCopyOfASharedModelGivesOtherReadersNoEio) {
  const std::string weights = RandomBytes(9 * 1024 * 1024 + 17, 21);  // three chunks
  for (const bool public_is_roots : {true, false}) {
    SCOPED_TRACE(public_is_roots ? "public copy owned by root" : "public copy owned by another user");
    TempDir home{"ckptfs-sec-mallory"};
    ::chmod(home.path().c_str(), 0755);
    WriteFile(src_ + "/zzz-public/m/model.bin", weights);
    WriteFile(src_ + "/zzz-public/m/config.json", "{}");
    if (!public_is_roots) {
      ASSERT_EQ(RunCommand("chown -R 2001:3001 " + src_ + "/zzz-public").exit_code, 0);
    }
    const std::string own = home / "model.bin";
    WriteFile(own, weights);
    WriteFile(src_ + "/aaa/m/config.json", "{}");
    ASSERT_EQ(RunCommand("chown -R 2003:2003 " + home.path() + " " + src_ + "/aaa").exit_code, 0);
    AsResult link = RunAs(kOther, "ln " + ShellQuote(own) + " " + ShellQuote(src_ + "/aaa/m/model.bin"));
    ASSERT_EQ(link.exit_code, 0) << link.out;

    auto m = Mount("allow_other,fill=off");  // every read goes to the source
    // Each checkpoint is shown as its indexing ends: wait for both.
    ASSERT_TRUE(WaitFor([&] { return !DigestOf("aaa/m").empty() && !DigestOf("zzz-public/m").empty(); }))
        << m->Log();
    ASSERT_EQ(DigestOf("aaa/m"), DigestOf("zzz-public/m"));
    const std::string file = mnt_ + "/" + DigestOf("aaa/m") + "/model.bin";
    AsResult cut = RunAs(kOther, "truncate -s 0 " + ShellQuote(own));
    ASSERT_EQ(cut.exit_code, 0) << cut.out;

    AsResult read = RunAs(kMember, "sha256sum < " + ShellQuote(file));
    EXPECT_EQ(read.exit_code, 0) << read.out << m->Log();
    EXPECT_EQ(read.out.substr(0, 64), ToHex(Sha256Of(weights))) << read.out;
    if (public_is_roots) {
      EXPECT_EQ(m->Log().find(src_ + "/aaa/m/model.bin"), std::string::npos)
          << "the attacker's copy was read although root's came first:\n" << m->Log();
    }
    m.reset();
    RemoveTree(src_ + "/aaa");
    RemoveTree(src_ + "/zzz-public");
  }
}

// Issue 21, storage you do not trust: bytes changed behind a file's back so
// that every chunk still passes its XXH3-128 check. A storage that holds the
// bytes can craft such chunks; here the index is made to vouch for the
// forged chunk table under the file's real SHA-256, which is what such a
// forgery achieves. Under verify=xxh3 the forged bytes are served (the
// check this test must see fooled, or it proves nothing); under
// verify=sha256 they never are: not from a sealed copy (fill=wait) nor from
// the chunk path (fill=off), whose chunks are checked against the file's
// SHA-256 chain (a row with it) or the whole file's SHA-256 (a row without).
TEST_F(AttackTest, BytesForgedToPassTheirChunkChecksAreNeverServedUnderVerifySha256) {
  const std::string real = RandomBytes(2 * kChunkSize + 3, 31);
  std::string forged = real;
  for (size_t i = kChunkSize; i < kChunkSize + 64; ++i) forged[i] = static_cast<char>(~forged[i]);
  const std::string path = src_ + "/m/model.bin";
  WriteFile(path, real);
  WriteFile(src_ + "/m/config.json", "{}");
  std::string digest;
  {
    auto m = Mount();
    ASSERT_TRUE(WaitFor([&] { return !DigestOf("m").empty(); })) << m->Log();
    digest = DigestOf("m");
  }
  WriteFile(path, forged);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  FileHashes vouched{static_cast<uint64_t>(st.st_size), Sha256Of(real), {}, std::nullopt};
  for (uint64_t at = 0; at < forged.size(); at += kChunkSize) {
    vouched.chunks.push_back(HashChunk(forged.data() + at, std::min<uint64_t>(kChunkSize, forged.size() - at)));
  }
  // The row once with the chain of the real bytes (a row this daemon wrote
  // when it hashed them: each chunk is checked alone) and once without (a
  // row from before the chain: the whole file is checked first).
  for (const bool with_chain : {false, true}) {
    for (const char* options : {"verify=xxh3,fill=off", "verify=sha256,fill=wait", "verify=sha256,fill=off"}) {
      if (with_chain && std::string(options).find("xxh3") != std::string::npos) continue;
      SCOPED_TRACE(std::string(options) + (with_chain ? ", with the chain" : ", without the chain"));
      if (with_chain) vouched.chain = testing::ChainOfBytes(real);
      {  // again each time: a mount that caught the forgery had the file hashed again
        auto index = Index::Open(state_, nullptr);
        ASSERT_TRUE(index.ok());
        ASSERT_TRUE((*index)->PutFile(FileStamp::FromStat(st), path, vouched).ok());
      }
      auto m = Mount(std::string("allow_other,") + options);
      ASSERT_TRUE(WaitFor([&] { return DigestOf("m") == digest; })) << m->Log();
      AsResult read = RunAs(kMember, "sha256sum < " + ShellQuote(mnt_ + "/" + digest + "/model.bin"));
      if (std::string(options).find("xxh3") != std::string::npos) {
        ASSERT_EQ(read.out.substr(0, 64), ToHex(Sha256Of(forged))) << "the forgery did not pass XXH3: " << read.out;
        continue;
      }
      EXPECT_NE(read.exit_code, 0) << read.out;
      EXPECT_EQ(read.out.find(ToHex(Sha256Of(forged))), std::string::npos) << read.out << m->Log();
    }
  }
}

// The same forgery under the default, verify=auto, where nobody asked for
// sha256: bytes forged into a file that a user other than root and the
// mount's owner may write (they own it, or its group or others may write
// it) are served only once checked against the file's SHA-256 (each chunk
// against the chain a row this daemon wrote holds, or the whole file first
// for a row without it), so never; such
// a user can make them for real (a second write into a dirty shared
// mapping keeps the stamp, and XXH3-128 is not built against forgery). A
// file only root may write is read on its XXH3-128s alone, and the forgery
// passes them there (what auto trusts; the check this test must see
// fooled), and so is a file of a user the mount trusts (trusted_writers=).
// The index is told the forged chunk table, as a collision would.
TEST_F(AttackTest, BytesForgedIntoAFileAUserMayWriteAreNeverServedUnderVerifyAuto) {
  struct Case {
    const char* name;
    uid_t uid;
    mode_t mode;
    const char* options;
    bool trusted;
    bool chain = false;  // the row holds the chain of the real bytes
  };
  const Case cases[] = {
      {"a user's file, chunk path", kOther.uid, 0644, "fill=off", false},
      {"a user's file, copy at open", kOther.uid, 0644, "fill=wait", false},
      {"a user's file, O_DIRECT reader streamed from the copy", kOther.uid, 0644, "fill=wait,direct", false},
      {"a user's file, chunk path, with the chain", kOther.uid, 0644, "fill=off", false, true},
      {"a user's file, copy at open, with the chain", kOther.uid, 0644, "fill=wait", false, true},
      {"a user's file, O_DIRECT reader streamed, with the chain", kOther.uid, 0644, "fill=wait,direct", false, true},
      {"root's file that its group may write", 0, 0664, "fill=off", false},
      {"root's file, 0644", 0, 0644, "fill=off", true},
      {"a user's file, the user a trusted writer", kOther.uid, 0644, "fill=off,trusted_writers=2003", true},
  };
  int seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string real = RandomBytes(2 * kChunkSize + 3, ++seed);
    std::string forged = real;
    for (size_t i = kChunkSize; i < kChunkSize + 64; ++i) forged[i] = static_cast<char>(~forged[i]);
    const std::string dir = src_ + "/m" + std::to_string(seed), path = dir + "/model.bin";
    WriteFile(path, real);
    Own(path, c.uid, c.uid, c.mode);
    std::string options = std::string("allow_other,fill_on_index=off,") + c.options;
    const bool direct = options.ends_with(",direct");
    if (direct) options.resize(options.size() - 7);
    std::string digest;
    {
      auto m = Mount(options);
      ASSERT_TRUE(WaitFor([&] { return !DigestOf(dir.substr(src_.size() + 1)).empty(); })) << m->Log();
      digest = DigestOf(dir.substr(src_.size() + 1));
    }
    WriteFile(path, forged);  // the same inode, owner and mode
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    FileHashes vouched{static_cast<uint64_t>(st.st_size), Sha256Of(real), {}, std::nullopt};
    for (uint64_t at = 0; at < forged.size(); at += kChunkSize) {
      vouched.chunks.push_back(HashChunk(forged.data() + at, std::min<uint64_t>(kChunkSize, forged.size() - at)));
    }
    if (c.chain) vouched.chain = testing::ChainOfBytes(real);
    {
      auto index = Index::Open(state_, nullptr);
      ASSERT_TRUE(index.ok());
      ASSERT_TRUE((*index)->PutFile(FileStamp::FromStat(st), path, vouched).ok());
    }
    auto m = Mount(options);
    ASSERT_TRUE(WaitFor([&] { return DigestOf(dir.substr(src_.size() + 1)) == digest; })) << m->Log();
    auto stats = nlohmann::json::parse(RunCommand(Ctl() + " stats --json " + mnt_).out, nullptr, false);
    EXPECT_EQ(stats["fills"]["verify"], "auto") << stats.dump();
    const std::string file = ShellQuote(mnt_ + "/" + digest + "/model.bin");
    AsResult read = RunAs(kMember, direct ? "dd if=" + file + " iflag=direct bs=4M status=none | sha256sum"
                                          : "sha256sum < " + file);
    if (c.trusted) {
      EXPECT_EQ(read.out.substr(0, 64), ToHex(Sha256Of(forged))) << "the forgery did not pass XXH3: " << read.out;
    } else {
      EXPECT_EQ(read.out.find(ToHex(Sha256Of(forged))), std::string::npos) << read.out << m->Log();
      EXPECT_EQ(read.out.find(ToHex(Sha256Of(real))), std::string::npos) << "the forged file held the real bytes";
    }
    m.reset();
    RemoveTree(dir);
  }
}

// A filesystem mounted inside SRC says what it likes of owners and modes: a
// user who may mount FUSE filesystems (user_allow_other) mounts one on a
// directory of theirs that says root owns everything, 0444, and serves
// crafted chunks after indexing (helper-18 did it). Its copies are never
// trusted, whatever they claim: reading one takes a proof. faultyfs claims
// exactly that (uid 0, files 0444, directories 0555).
TEST_F(AttackTest, ACopyOnAFilesystemMountedInsideSrcIsNotTrustedWhateverItsOwnersSay) {
  const std::string bytes = RandomBytes(2 * kChunkSize + 5, 61);
  WriteFile(tmp_ / "backing", bytes);
  FaultyFsMount inner(FAULTYFS_PATH, tmp_ / "backing", src_ + "/inner", tmp_ / "no-fault");
  ASSERT_TRUE(inner.ok());
  auto m = Mount("allow_other,fill_on_index=off");
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("inner/m").empty(); })) << m->Log();
  auto proven = [&] {
    auto stats = nlohmann::json::parse(RunCommand(Ctl() + " stats --json " + mnt_).out, nullptr, false);
    return stats["fills"]["proven"].get<uint64_t>();
  };
  ASSERT_EQ(proven(), 0u);
  EXPECT_TRUE(RunAs(kMember, "cat " + ShellQuote(mnt_ + "/" + DigestOf("inner/m") + "/model.safetensors")).out ==
              bytes);
  EXPECT_EQ(proven(), 1u) << "a copy below a mount inside SRC was read on its XXH3-128s alone" << m->Log();
  m.reset();
}

// The same bytes under two digests: a public checkpoint whose copy is
// trusted, and one whose only copy needs a proof (here on a filesystem
// mounted inside SRC, whose reads its owner can stall). A reader of the
// second waits for the proof; a reader of the same chunk of the first must
// not wait with it (the proof is taken outside the chunk's slot).
TEST_F(AttackTest, AProofOfSharedBytesHoldsUpNoReaderOfATrustedCopy) {
  const std::string bytes = RandomBytes(3 * kChunkSize, 62);
  WriteFile(tmp_ / "backing", bytes);
  WriteFile(src_ + "/pub/m/model.safetensors", bytes);
  WriteFile(src_ + "/pub/m/config.json", "{}");  // another digest than inner/m's
  const std::string trigger = tmp_ / "fault";
  FaultyFsMount inner(FAULTYFS_PATH, tmp_ / "backing", src_ + "/inner", trigger);
  ASSERT_TRUE(inner.ok());
  auto m = Mount("allow_other,fill=off,threads=2");
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("inner/m").empty() && !DigestOf("pub/m").empty(); })) << m->Log();
  const std::string stalled = mnt_ + "/" + DigestOf("inner/m") + "/model.safetensors";
  const std::string trusted = mnt_ + "/" + DigestOf("pub/m") + "/model.safetensors";
  WriteFile(trigger, "stall");  // reads of the inner copy's first chunk hang, so its proof does
  const pid_t prover = ::fork();
  if (prover == 0) {
    const int fd = ::open(stalled.c_str(), O_RDONLY | O_DIRECT);
    alignas(4096) static char buf[4096];
    ::_exit(fd >= 0 && ::pread(fd, buf, sizeof buf, static_cast<off_t>(2 * kChunkSize)) > 0 ? 0 : 1);
  }
  ASSERT_GT(prover, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the proof has begun and stalls
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 200 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::unlink(trigger.c_str());
  });
  CommandResult read = RunCommand("dd if=" + ShellQuote(trusted) + " iflag=direct bs=4096 count=1 skip=" +
                                  std::to_string(2 * kChunkSize / 4096) + " status=none | sha256sum");
  const bool let_go = ::access(trigger.c_str(), F_OK) != 0;
  done = true;
  watchdog.join();
  EXPECT_FALSE(let_go) << "a read of the trusted copy waited for another digest's proof of the same bytes";
  EXPECT_EQ(read.out.substr(0, 64), ToHex(Sha256Of(bytes.substr(2 * kChunkSize, 4096)))) << read.out;
  ::unlink(trigger.c_str());
  ::waitpid(prover, nullptr, 0);
  m.reset();
}

}  // namespace
}  // namespace ckptfs::testing
