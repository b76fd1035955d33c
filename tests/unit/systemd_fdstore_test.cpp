// The systemd fd store protocol, against a notification socket of our own
// (no systemd as PID 1 needed): what FDSTORE=1 sends, and what a process
// started with LISTEN_FDS/LISTEN_FDNAMES takes back.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ckptfs/systemd_fdstore.h"
#include "notify_datagram.h"
#include "test_tree.h"

namespace ckptfs::supervisor {
namespace {

// One datagram from `sock`: its text and the descriptor it carried (-1: none).
std::pair<std::string, int> ReceiveNotification(int sock) {
  auto d = testing::ReceiveNotifyDatagram(sock);
  if (!d) return {"", -1};
  return {d->text, d->fds.empty() ? -1 : d->fds.front()};
}

class FdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sock_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    ASSERT_EQ(::bind(sock_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("NOTIFY_SOCKET"); }

  testing::TempDir tmp_{"ckptfs-fdstore"};
  std::string path_ = tmp_ / "notify";
  UniqueFd sock_;
};

TEST_F(FdStoreTest, TheFuseDescriptorAndTheInitRequestGoToTheStoreByName) {
  ASSERT_TRUE(UnderSystemd());
  UniqueFd fuse(::memfd_create("stand-in-for-dev-fuse", MFD_CLOEXEC));
  ASSERT_TRUE(StoreFuseFd(fuse.get()).ok());
  auto [text, fd] = ReceiveNotification(sock_.get());
  UniqueFd got(fd);
  EXPECT_EQ(text, "FDSTORE=1\nFDNAME=fuse");
  struct stat a {}, b {};
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fstat(fuse.get(), &a), 0);
  ASSERT_EQ(::fstat(fd, &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);  // the same open file

  const std::vector<uint8_t> init = {0x68, 0, 0, 0, 26, 0, 0, 0, 1, 2, 3};
  ASSERT_TRUE(StoreInitRequest(init).ok());
  auto [init_text, init_fd] = ReceiveNotification(sock_.get());
  UniqueFd init_copy(init_fd);
  EXPECT_EQ(init_text, "FDSTORE=1\nFDNAME=fuse-init");
  std::vector<uint8_t> back(64);
  back.resize(static_cast<size_t>(::pread(init_fd, back.data(), back.size(), 0)));
  EXPECT_EQ(back, init);
  EXPECT_TRUE(::fcntl(init_fd, F_GET_SEALS) & F_SEAL_WRITE);  // nobody changes it in the store
}

TEST(FdStoreRestartTest, AProcessStartedWithTheStoredDescriptorsTakesThemBack) {
  // systemd passes them from descriptor 3 on; keep whatever the test runner has there.
  UniqueFd saved3(::fcntl(3, F_DUPFD_CLOEXEC, 100)), saved4(::fcntl(4, F_DUPFD_CLOEXEC, 100));
  UniqueFd fuse(::memfd_create("stand-in-for-dev-fuse", 0)), init(::memfd_create("init", 0));
  const std::vector<uint8_t> request = {7, 7, 7, 7};
  ASSERT_EQ(::pwrite(init.get(), request.data(), request.size(), 0), 4);
  struct stat fuse_st {};
  ASSERT_EQ(::fstat(fuse.get(), &fuse_st), 0);
  ASSERT_EQ(::dup2(fuse.get(), 3), 3);
  ASSERT_EQ(::dup2(init.get(), 4), 4);
  ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
  ::setenv("LISTEN_FDS", "2", 1);
  ::setenv("LISTEN_FDNAMES", "fuse:fuse-init", 1);
  auto stored = TakeStoredConnection();
  EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);  // not passed on to the daemons
  ASSERT_TRUE(stored.has_value());
  struct stat st {};
  ASSERT_EQ(::fstat(stored->fuse.get(), &st), 0);
  EXPECT_EQ(st.st_ino, fuse_st.st_ino);
  EXPECT_EQ(stored->init_request, request);
  stored->fuse.reset();
  if (saved3.valid()) ::dup2(saved3.get(), 3);
  if (saved4.valid()) ::dup2(saved4.get(), 4);
  // Without LISTEN_FDS there is nothing to take.
  EXPECT_FALSE(TakeStoredConnection().has_value());
}

TEST(FdStoreOutsideSystemdTest, StoringSaysWhyItCannot) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(UnderSystemd());
  const Status s = StoreFuseFd(0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not run by systemd"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ckptfs::supervisor
