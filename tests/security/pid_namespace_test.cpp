// A daemon that cannot see its callers' processes: run in a PID namespace of
// its own (a container, a Kubernetes pod without hostPID), every request
// comes to it as pid 0, so it cannot read the caller's supplementary groups
// (the kernel does not send them; they come from /proc/PID). It must then
// grant only what any groups would grant: taking them as "none" would let a
// member of a group that the mode keeps out (0604) in as "other". And it
// must say why a member of a group is refused what the group grants, or an
// operator sees only EACCES.
#include <unistd.h>

#include <fstream>

#include "security_fixture.h"

namespace ckptfs::testing {
namespace {

class PidNamespaceTest : public SecurityTest {
 protected:
  // A "daemon" that runs the real one as pid 1 of a new PID namespace
  // (util-linux unshare; --kill-child: it dies with the wrapper).
  std::string DaemonInOwnPidNamespace() {
    const std::string wrapper = tmp_ / "ckptfs-in-pid-namespace";
    std::ofstream(wrapper) << "#!/bin/sh\nexec unshare --pid --fork --kill-child " << ShellQuote(Daemon())
                           << " \"$@\"\n";
    ::chmod(wrapper.c_str(), 0755);
    return wrapper;
  }

  // Every checkpoint of BuildTree shown (root sees them all).
  bool AllShown() {
    return WaitFor([&] { return !DigestOf("grp").empty() && !DigestOf("kept-out").empty() && !DigestOf("open").empty(); });
  }

  // grp/: the owner's, readable by group 3001 only (0750, files 0640).
  // kept-out/: group 3001 kept out by its bits, everyone else let in
  // (0705, files 0604). open/: readable by everyone (0755, 0644).
  void BuildTree() {
    struct Ck {
      const char* name;
      mode_t dir, file;
    } cks[] = {{"grp", 0750, 0640}, {"kept-out", 0705, 0604}, {"open", 0755, 0644}};
    for (const Ck& c : cks) {
      const std::string dir = src_ + "/" + c.name;
      WriteFile(dir + "/model.safetensors", std::string(c.name) + " weights");
      Own(dir + "/model.safetensors", kOwner.uid, 3001, c.file);
      Own(dir, kOwner.uid, 3001, c.dir);
    }
  }

  bool Reads(const User& u, const std::string& path) {
    const std::vector<bool> got = TryAs(u, {{Probe::kRead, path}});
    if (got.empty()) ADD_FAILURE() << "could not probe " << path << " as " << u.name;
    return !got.empty() && got[0];
  }
  std::string InMount(const std::string& ck) { return mnt_ + "/by-name/" + ck + "/model.safetensors"; }
  std::string InSource(const std::string& ck) { return src_ + "/" + ck + "/model.safetensors"; }
};

TEST_F(PidNamespaceTest, CallersWhoseGroupsCannotBeReadGetOnlyWhatAnyGroupsWouldGrant) {
  BuildTree();
  // What the kernel decides in SRC, for the record of this test.
  ASSERT_TRUE(Reads(kMember, InSource("grp")));
  ASSERT_FALSE(Reads(kMember, InSource("kept-out")));
  ASSERT_TRUE(Reads(kOther, InSource("kept-out")));

  if (RunCommand("unshare --pid --fork --kill-child true").exit_code != 0) {
    GTEST_SKIP() << "unshare --pid cannot run here";
  }
  auto m = MountWith(src_, mnt_, Options("allow_other,supervise=off"), DaemonInOwnPidNamespace());
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(AllShown()) << m->Log();

  // Decisions that need no supplementary group are the kernel's.
  EXPECT_TRUE(Reads(kOwner, InMount("grp")));
  EXPECT_TRUE(Reads(kOwner, InMount("kept-out")));
  EXPECT_TRUE(Reads(kOther, InMount("open")));
  EXPECT_TRUE(Reads(kMember, InMount("open")));
  EXPECT_FALSE(Reads(kOther, InMount("grp")));
  // The member of group 3001 may be in any group, as far as the daemon can
  // tell: the group that keeps them out of kept-out/ keeps them out here
  // too (read as "no groups", they would be let in as "other")...
  EXPECT_FALSE(Reads(kMember, InMount("kept-out")));
  // ... and so is everyone else, who might be in that group.
  EXPECT_FALSE(Reads(kOther, InMount("kept-out")));
  // What only their group grants is refused, and the log and status say why.
  EXPECT_FALSE(Reads(kMember, InMount("grp")));
  const std::string log = m->Log();
  EXPECT_NE(log.find("outside this daemon's PID namespace"), std::string::npos) << log;
  EXPECT_NE(log.find("hostPID: true"), std::string::npos) << log;
  EXPECT_GT(Status().value("callers_without_groups", uint64_t{0}), 0u);
  // Logged once, however many decisions.
  EXPECT_EQ(log.find("outside this daemon's PID namespace"), log.rfind("outside this daemon's PID namespace"));
  CommandResult status = RunCommand(Ctl() + " status " + mnt_);
  EXPECT_NE(status.out.find("without the caller's supplementary groups"), std::string::npos) << status.out;
}

TEST_F(PidNamespaceTest, ADaemonThatSeesItsCallersGrantsWhatTheirGroupsGrant) {
  BuildTree();
  auto m = Mount("allow_other,supervise=off");
  ASSERT_TRUE(m->ok()) << m->Log();
  ASSERT_TRUE(AllShown()) << m->Log();
  EXPECT_TRUE(Reads(kMember, InMount("grp")));
  EXPECT_FALSE(Reads(kMember, InMount("kept-out")));
  EXPECT_TRUE(Reads(kOther, InMount("kept-out")));
  EXPECT_EQ(Status().value("callers_without_groups", uint64_t{1}), 0u);
  EXPECT_EQ(m->Log().find("PID namespace"), std::string::npos) << m->Log();
  CommandResult status = RunCommand(Ctl() + " status " + mnt_);
  EXPECT_EQ(status.out.find("supplementary groups"), std::string::npos) << status.out;
}

}  // namespace
}  // namespace ckptfs::testing
