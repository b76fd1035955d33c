// A source tree and a real mount of it for the security suite: the mount
// point and SRC sit under a temporary directory every test user may enter,
// and the mount is always unmounted (MountedCkptfs's destructor).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "as_user.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_binaries.h"
#include "test_tree.h"

namespace ckptfs::testing {

inline const User kRoot{"root", 0, 0, {}};
inline const User kOwner{"owner", 2001, 3001, {3001}};
inline const User kMember{"group-member", 2002, 2002, {3001}};
inline const User kOther{"other", 2003, 2003, {}};
inline const User kExcluded{"excluded-group", 2004, 2004, {5000}};  // kept out by 0705 dirs of group 5000

// The binaries under test (test_binaries.h: CKPTFS_TEST_DAEMON and
// CKPTFS_TEST_CTL point the suite at other builds).
inline std::string Daemon() { return kDaemon; }
inline std::string Ctl() { return kCtl; }

class SecurityTest : public MountFixture {
 protected:
  SecurityTest() : MountFixture("ckptfs-sec") {}
  void SetUp() override {
    ::chmod(tmp_.path().c_str(), 0755);  // so the test users can reach SRC and the mount
    MakeDirs(src_);
    ::chmod(src_.c_str(), 0755);
  }

  std::unique_ptr<MountedCkptfs> Mount(const std::string& extra = "allow_other") { return MountAt(src_, mnt_, extra); }
  std::unique_ptr<MountedCkptfs> MountAt(const std::string& src, const std::string& mnt,
                                         const std::string& extra = "allow_other") {
    return MountWith(src, mnt, Options(extra));
  }

  nlohmann::json Status() {
    CommandResult r = RunCommand(Ctl() + " status --json " + mnt_);
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_discarded() ? nlohmann::json::object() : j;
  }

  // Asks for a rescan and waits until one has run to the end with nothing
  // left to index.
  bool RescanAndSettle() {
    const uint64_t before = Status().value("scans", uint64_t{0});
    RunCommand(Ctl() + " rescan " + mnt_);
    return WaitFor([&] {
      auto s = Status();
      if (s.value("scans", uint64_t{0}) <= before || !s.contains("counts")) return false;
      return s["counts"]["indexing"] == 0 && s["counts"]["pending"] == 0;
    });
  }

  // The digest directory a by-name path leads to ("sha256-..."), or "".
  std::string DigestOf(const std::string& by_name) {
    char buf[4096];
    ssize_t n = ::readlink((mnt_ + "/by-name/" + by_name).c_str(), buf, sizeof buf);
    if (n <= 0) return "";
    std::string target(buf, static_cast<size_t>(n));
    return target.substr(target.rfind("sha256-"));
  }

  void Own(const std::string& path, uid_t uid, gid_t gid, mode_t mode) {
    ASSERT_EQ(::lchown(path.c_str(), uid, gid), 0) << path;
    ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
  }
};

}  // namespace ckptfs::testing
