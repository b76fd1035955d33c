// What a user learns of copies they cannot reach (issue 21, items 9 and 14):
// nothing. A digest held only in another user's private directory is, for
// them, a digest nobody holds (ENOENT, as for an unknown one), and the
// sources xattr of a shared digest names only the copies they could find in
// SRC themselves.
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
  std::string SourcesAs(const User& user, const std::string& path) {
    return RunAs(user, "getfattr --absolute-names --only-values -n user.ckptfs.sources " + ShellQuote(path) + " 2>&1")
        .out;
  }
};

TEST_F(DisclosureTest, APrivateDigestIsNoMoreThereThanAnUnknownOne) {
  WriteFile(src_ + "/home/owner/private-model/model.bin", "weights nobody else may know of");
  Own(src_ + "/home", 0, 0, 0755);
  Own(src_ + "/home/owner", 2001, 3001, 0700);
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return !DigestOf("home/owner/private-model").empty(); })) << m->Log();
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
  // ckptfsctl ls agrees (it filtered already).
  AsResult ls = RunAs(kOther, Ctl() + " ls --json " + ShellQuote(mnt_));
  EXPECT_EQ(ls.out.find("acquisition-target-x"), std::string::npos) << ls.out;
}

}  // namespace
}  // namespace ckptfs::testing
