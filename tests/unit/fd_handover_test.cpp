// FdHandover::FromEnvironment's reading of the channel list the supervisor
// passes (CKPTFS_SUPERVISED_FUSE_CHANNELS): every descriptor an open
// /dev/fuse named once, or none taken at all.
#include "fd_handover.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "ckptfs/handover_protocol.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs::daemon {
namespace {

class FdHandoverTest : public ::testing::Test {
 protected:
  // The channels a daemon started with `list` takes.
  size_t ChannelsTaken(const std::string& list) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd theirs(sv[1]);
    ::setenv(handover::kEnvFuseFd, std::to_string(fuse_.get()).c_str(), 1);
    ::setenv(handover::kEnvLinkFd, std::to_string(sv[0]).c_str(), 1);  // the handover owns it from here
    ::setenv(handover::kEnvFuseChannels, list.c_str(), 1);
    auto h = FdHandover::FromEnvironment();
    EXPECT_NE(h, nullptr);
    last_link_ = sv[0];
    if (!h) return 0;
    const auto channels = h->TakeChannels();
    EXPECT_EQ(std::getenv(handover::kEnvFuseChannels), nullptr) << "left for the daemon's children";
    for (const UniqueFd& c : channels) EXPECT_NE(::fcntl(c.get(), F_GETFD) & FD_CLOEXEC, 0);
    return channels.size();
  }
  static int Dup(const UniqueFd& fd) { return ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0); }

  UniqueFd fuse_{::open("/dev/fuse", O_RDWR | O_CLOEXEC)};
  UniqueFd a_{::open("/dev/fuse", O_RDWR | O_CLOEXEC)};
  UniqueFd b_{::open("/dev/fuse", O_RDWR | O_CLOEXEC)};
  UniqueFd null_{::open("/dev/null", O_RDONLY | O_CLOEXEC)};
  int last_link_ = -1;
};

TEST_F(FdHandoverTest, OpenFuseDescriptorsNamedOnceAreTaken) {
  ASSERT_TRUE(fuse_.valid() && a_.valid() && b_.valid()) << "/dev/fuse";
  EXPECT_EQ(ChannelsTaken(std::to_string(Dup(a_)) + "," + std::to_string(Dup(b_))), 2u);
  EXPECT_EQ(ChannelsTaken(""), 0u);
}

TEST_F(FdHandoverTest, AnyBadEntryRefusesThemAll) {
  ASSERT_TRUE(fuse_.valid() && a_.valid() && null_.valid());
  const std::string a = std::to_string(Dup(a_));
  EXPECT_EQ(ChannelsTaken(a + "," + a), 0u);                                  // named twice
  EXPECT_EQ(ChannelsTaken(a + "," + std::to_string(Dup(null_))), 0u);        // not /dev/fuse
  EXPECT_EQ(ChannelsTaken(a + "," + std::to_string(fuse_.get())), 0u);       // the shared descriptor
  EXPECT_EQ(ChannelsTaken(a + ",x"), 0u);
  EXPECT_EQ(ChannelsTaken(a + ",4294967299"), 0u);                            // wraps to a small number
  EXPECT_EQ(ChannelsTaken(a + ",,"), 0u);
  EXPECT_EQ(ChannelsTaken("2"), 0u);                                         // standard error
  // The link the handover took: refused as a channel, and still its link.
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd theirs(sv[1]);
  ::setenv(handover::kEnvFuseFd, std::to_string(fuse_.get()).c_str(), 1);
  ::setenv(handover::kEnvLinkFd, std::to_string(sv[0]).c_str(), 1);
  ::setenv(handover::kEnvFuseChannels, (a + "," + std::to_string(sv[0])).c_str(), 1);
  auto h = FdHandover::FromEnvironment();
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(h->TakeChannels().empty());
  EXPECT_EQ(::fcntl(std::stoi(a), F_GETFD) >= 0, true) << "a refused list closes nothing";
}

}  // namespace
}  // namespace ckptfs::daemon
