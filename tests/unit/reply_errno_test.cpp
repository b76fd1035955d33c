// The errno a failed FUSE request is answered with: the system's own where it
// is true of the view, EIO otherwise.
#include "reply_errno.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace ckptfs::fuse {
namespace {

TEST(ReplyErrnoTest, PassesOnWhatIsTrueOfTheViewAndSaysEioForTheRest) {
  for (int err : {ENOMEM, ETIMEDOUT, ESTALE}) {
    EXPECT_EQ(ReplyErrno(Status::FromErrno("read", err)), err) << err;
  }
  // A path in SRC that vanished or is refused to the daemon says nothing
  // true of the file open in the view.
  // Nor do the daemon's own limits: EMFILE or ENOSPC would send the reader
  // after its own descriptors or disk.
  for (int err : {ENOENT, EACCES, EPERM, ENOTDIR, ELOOP, EIO, EAGAIN, EINTR, EMFILE, ENFILE, ENOSPC}) {
    EXPECT_EQ(ReplyErrno(Status::FromErrno("read", err)), EIO) << err;
  }
  EXPECT_EQ(ReplyErrno(Status::Changed("the source changed")), EIO);
  EXPECT_EQ(ReplyErrno(Status::Corrupt("a chunk does not match")), EIO);
  EXPECT_EQ(ReplyErrno(Status::Error("anything")), EIO);
}

}  // namespace
}  // namespace ckptfs::fuse
