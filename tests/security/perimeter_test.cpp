// The perimeter of issue 21: what a hostile writer of the shared manifest
// store and a hostile local user could do to root through the store, the
// control socket's clients and ckptfsctl's output. Each test fails on the
// daemon and ckptfsctl of commit da2c4e1 (CKPTFS_TEST_DAEMON and
// CKPTFS_TEST_CTL point the suite at that build).
#include <sys/xattr.h>

#include <filesystem>

#include "ckptfs/control_protocol.h"
#include "fake_control_server.h"
#include "security_fixture.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

const std::string kFakeDigest = "sha256-" + std::string(64, 'a');

class PerimeterTest : public SecurityTest {
 protected:
  // Every entry below `dir`, however deep ("" when there is none).
  static std::string ListTree(const std::string& dir) {
    std::string out;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      out += it->path().string() + "\n";
    }
    return out;
  }

  // The store, writable by `kOther` (the hostile writer), and a signing key.
  void MakeStoreAndKey() {
    MakeDirs(store_);
    Own(store_, kOther.uid, kOther.gid, 0755);
    MakeDirs(victim_);  // stands for /etc: root's, outside the store
    CommandResult keygen = RunCommand(Ctl() + " keygen " + ShellQuote(key_), true);
    ASSERT_EQ(keygen.exit_code, 0) << keygen.out;
  }

  std::unique_ptr<MountedCkptfs> MountSigning() {
    return Mount("allow_other,manifests=" + store_ + ",manifest_sign=" + key_);
  }

  // A socket's path as the real mount publishes it.
  std::string ControlSocketOf(const std::string& mnt) {
    char buf[4096];
    const ssize_t n = ::getxattr(mnt.c_str(), "user.ckptfs.control", buf, sizeof buf);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

  static bool HasControlBytes(const std::string& s) {
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
      if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
          static_cast<unsigned char>(s[i + 1]) < 0xa0) {
        return true;
      }
    }
    return false;
  }

  std::string store_ = tmp_ / "store";
  std::string victim_ = tmp_ / "victim";
  std::string key_ = tmp_ / "node.key";
};

// Item 2: the store's writer replaces v1/, or every v1/<xx>/, by a link to
// a directory of root's. The signing node (root) must create nothing there,
// and still serve the checkpoint it hashed itself.
TEST_F(PerimeterTest, ASigningNodeWritesNothingOutsideTheStoreThroughLinksInIt) {
  for (const bool whole_layout : {true, false}) {
    SCOPED_TRACE(whole_layout ? "v1 -> victim" : "v1/<xx> -> victim");
    MakeStoreAndKey();
    if (whole_layout) {
      AsResult link = RunAs(kOther, "ln -s " + ShellQuote(victim_) + " " + ShellQuote(store_ + "/v1"));
      ASSERT_EQ(link.exit_code, 0) << link.out;
    } else {
      AsResult links = RunAs(kOther, "mkdir " + ShellQuote(store_ + "/v1") + " && cd " + ShellQuote(store_ + "/v1") +
                                         " && for i in 0 1 2 3 4 5 6 7 8 9 a b c d e f; do for j in 0 1 2 3 4 5 "
                                         "6 7 8 9 a b c d e f; do ln -s " +
                                         ShellQuote(victim_) + " $i$j || exit 1; done; done");
      ASSERT_EQ(links.exit_code, 0) << links.out;
    }
    WriteModel(src_ + "/m", {.seed = whole_layout ? 3u : 4u});
    auto m = MountSigning();
    ASSERT_TRUE(WaitFor([&] { return !DigestOf("m").empty(); })) << m->Log();
    const std::string served = ReadFile(mnt_ + "/by-name/m/config.json");
    EXPECT_EQ(served, ReadFile(src_ + "/m/config.json"));
    EXPECT_EQ(ListTree(victim_), "") << m->Log();
    const nlohmann::json status = Status();
    ASSERT_TRUE(status.contains(protocol::kManifests)) << status.dump();
    EXPECT_EQ(status[protocol::kManifests].value(protocol::kRecordsPublished, uint64_t{99}), 0u) << m->Log();
    m.reset();
    ::unlink(key_.c_str());
    ::unlink((key_ + ".pub").c_str());
    RemoveTree(store_);
    RemoveTree(victim_);
    RemoveTree(src_ + "/m");
    RemoveTree(state_);
  }
}

// Item 12: a user's own directory that carries user.ckptfs.control (naming
// the user's own socket server) and user.ckptfs.digest is no mount: root's
// ckptfsctl neither prints its "digest path" nor talks to its socket.
TEST_F(PerimeterTest, FakeCkptfsXattrsOnAUsersDirectoryAreNotBelieved) {
  const std::string fake = tmp_ / "looks-like-a-mount";
  const std::string socket = tmp_ / "fake.sock";
  MakeDirs(fake);
  Own(fake, kOther.uid, kOther.gid, 0755);
  FakeControlServer server(socket, kOther.uid,
                           {{"", R"({"ok":true,"pid":1,"checkpoints":[],"FAKE":"believed"})"}});
  ASSERT_TRUE(server.listening());
  AsResult setup = RunAs(kOther, "setfattr -n user.ckptfs.control -v " + ShellQuote(socket) + " " + ShellQuote(fake) +
                                     " && setfattr -n user.ckptfs.digest -v " + kFakeDigest + " " + ShellQuote(fake) +
                                     " && mkdir " + ShellQuote(fake + "/" + kFakeDigest) + " && echo evil > " +
                                     ShellQuote(fake + "/" + kFakeDigest + "/model.bin"));
  ASSERT_EQ(setup.exit_code, 0) << setup.out;

  CommandResult resolve = RunCommand(Ctl() + " resolve " + ShellQuote(fake), true);
  EXPECT_NE(resolve.exit_code, 0) << resolve.out;
  EXPECT_EQ(resolve.out.find(kFakeDigest), std::string::npos) << resolve.out;
  EXPECT_NE(resolve.out.find("not a ckptfs mount"), std::string::npos) << resolve.out;
  for (const char* cmd : {"status", "ls", "stats", "rescan", "restart"}) {
    CommandResult r = RunCommand("timeout 60 " + Ctl() + " " + cmd + " " + ShellQuote(fake), true);
    EXPECT_NE(r.exit_code, 0) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("not a ckptfs mount"), std::string::npos) << cmd << ": " << r.out;
  }
  EXPECT_EQ(server.accepted(), 0) << "ckptfsctl talked to the user's socket";
}

// Item 12: a real mount whose socket is now served by another user (the
// daemon died and someone bound the path, or the path was theirs): the
// peer's credentials are not the mount's daemon's, and nothing it says is
// believed.
TEST_F(PerimeterTest, AControlSocketServedByAnotherUserIsNotBelieved) {
  WriteModel(src_ + "/m", {});
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("m").empty(); })) << m->Log();
  const std::string socket = ControlSocketOf(mnt_);
  ASSERT_FALSE(socket.empty());
  {
    FakeControlServer server(socket, kOther.uid, {{"", R"({"ok":false,"error":"FAKE-SERVER-SAYS-HI"})"}});
    ASSERT_TRUE(server.listening());
    for (const char* cmd : {"status", "ls", "stats", "rescan", "restart"}) {
      CommandResult r = RunCommand("timeout 60 " + Ctl() + " " + cmd + " " + mnt_, true);
      EXPECT_NE(r.exit_code, 0) << cmd << ": " << r.out;
      EXPECT_EQ(r.out.find("FAKE-SERVER"), std::string::npos) << cmd << ": " << r.out;
      EXPECT_NE(r.out.find("uid " + std::to_string(kOther.uid)), std::string::npos) << cmd << ": " << r.out;
      EXPECT_NE(r.out.find("not believed"), std::string::npos) << cmd << ": " << r.out;
    }
  }
  ::unlink(socket.c_str());
}

// Item 15: whatever a control socket sends (here a server that passes every
// check, as the mount's own daemon would when it echoes a hostile name),
// ckptfsctl prints with its control characters escaped: no escape
// sequence reaches root's terminal, in text or in --json.
TEST_F(PerimeterTest, ControlCharactersFromTheSocketAreEscapedInEverythingPrinted) {
  WriteModel(src_ + "/m", {});
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("m").empty(); })) << m->Log();
  const std::string socket = ControlSocketOf(mnt_);
  ASSERT_FALSE(socket.empty());
  const std::string nasty = R"(\u001b]0;owned\u0007\u001b[2J\u009b31m\u007f)";
  {
    FakeControlServer server(
        socket, 0,
        {{"", R"({"ok":false,"error":"refused )" + nasty + R"("})"},
         {"ls", R"({"ok":true,"checkpoints":[{"name":"sha256-)" + nasty + R"(","files":1,"size":1,"indexed_at":0,)"
                R"("by_name":["by-name/)" + nasty + R"("],"sources":["/src/)" + nasty + R"("]}]})"}});
    ASSERT_TRUE(server.listening());
    for (const std::string cmd : {"status", "rescan", "ls", "ls --json", "stats", "preload", "evict"}) {
      CommandResult r = RunCommand("timeout 60 " + Ctl() + " " + cmd + " " + mnt_, true);
      EXPECT_FALSE(HasControlBytes(r.out)) << cmd << ": " << ShellQuote(r.out);
      EXPECT_NE(r.out.find("x1b]0;owned"), std::string::npos) << cmd << ": " << ShellQuote(r.out);
    }
    EXPECT_GT(server.accepted(), 0);
  }
  ::unlink(socket.c_str());
}

}  // namespace
}  // namespace ckptfs::testing
