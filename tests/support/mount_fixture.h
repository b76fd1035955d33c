// MountFixture: what a test of a real mount starts from. A temporary
// directory of its own holding SRC (src/), the mount point (mnt/) and the
// state directory (state/), and Mount(), which mounts SRC there with the
// options the tests share and checks that it mounted. The MountedCkptfs it
// returns unmounts and reaps the daemon however the test ends; the
// directory goes with the fixture.
//
// Header-only: kDaemon is the build's path as the including test executable
// was compiled with it (test_binaries.h).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "mounted_ckptfs.h"
#include "test_binaries.h"
#include "test_tree.h"

namespace ckptfs::testing {

// Public, for the helpers a test file writes that take its fixture.
class MountFixture : public ::testing::Test {
 public:
  explicit MountFixture(const std::string& prefix) : tmp_(prefix) {}

  // The options every test mount starts from: the test's own state
  // directory, no settle wait, no periodic rescan (a test that changes SRC
  // waits for what it changed, or asks for a rescan); then `extra`.
  std::string Options(const std::string& extra = "") const {
    return "state=" + state_ + ",settle=0,rescan=0" + (extra.empty() ? "" : "," + extra);
  }

  // `daemon SRC MNT -f -o Options(extra)`.
  std::unique_ptr<MountedCkptfs> Mount(const std::string& extra = "", const std::string& daemon = kDaemon) {
    return MountWith(src_, mnt_, Options(extra), daemon);
  }
  // The same with every part named; each mount logs to a file of its own in
  // the temporary directory.
  std::unique_ptr<MountedCkptfs> MountWith(const std::string& src, const std::string& mnt,
                                           const std::string& options, const std::string& daemon = kDaemon) {
    auto m = std::make_unique<MountedCkptfs>(daemon, src, mnt, options,
                                             tmp_ / ("daemon-" + std::to_string(++mounts_) + ".log"));
    EXPECT_TRUE(m->ok()) << m->Log();
    return m;
  }

  // Waits until the mount at `mnt` has walked SRC and has nothing left to
  // index. A first mount (an empty index) shows each checkpoint as its own
  // hashing ends: a test that waited for one of them may not see the others
  // yet. False when that state never came.
  bool WaitUntilIndexed(const std::string& mnt) const {
    return WaitFor([&] {
      auto s = nlohmann::json::parse(RunCommand(kCtl + " status --json " + ShellQuote(mnt)).out, nullptr, false);
      if (s.is_discarded() || !s.contains("counts") || s.value("scans", uint64_t{0}) == 0) return false;
      return s["counts"]["indexing"] == 0 && s["counts"]["pending"] == 0;
    });
  }
  bool WaitUntilIndexed() const { return WaitUntilIndexed(mnt_); }

  // fusectl, mounted under the test's directory for as long as it lives
  // (however the test ends), to read and set what the kernel holds for a
  // FUSE connection.
  class Fusectl {
   public:
    explicit Fusectl(std::string dir) : dir_(std::move(dir)) {
      std::filesystem::create_directories(dir_);
      mounted_ = RunCommand("mount -t fusectl fusectl " + ShellQuote(dir_)).exit_code == 0;
    }
    ~Fusectl() {
      if (mounted_) RunCommand("umount " + ShellQuote(dir_));
    }
    Fusectl(const Fusectl&) = delete;
    Fusectl& operator=(const Fusectl&) = delete;
    bool mounted() const { return mounted_; }
    // The directory of the connection of the FUSE mount at `mnt`.
    std::string ConnectionOf(const std::string& mnt) const {
      struct stat st;
      if (::stat(mnt.c_str(), &st) != 0) return "";
      return dir_ + "/" + std::to_string(minor(st.st_dev));
    }

   private:
    std::string dir_;
    bool mounted_ = false;
  };

  TempDir tmp_;
  std::string src_ = tmp_ / "src";
  std::string mnt_ = tmp_ / "mnt";
  std::string state_ = tmp_ / "state";
  int mounts_ = 0;  // mounts so far, which name their logs
};

}  // namespace ckptfs::testing
