// ReadOwnership: the owner, mode and access ACL of a source inode, read by
// path after the walk's lstat. Uses setfacl (package acl) on the test's own
// temporary directory.
#include "source_acl.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "test_tree.h"

namespace ckptfs::testing {
namespace {

struct stat LstatOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st;
}

bool SetAcl(const std::string& spec, const std::string& path) {
  return std::system(("setfacl -m '" + spec + "' '" + path + "'").c_str()) == 0;
}

TEST(SourceAclTest, ANamedEntryIsReadAsTheKernelKeepsIt) {
  TempDir dir{"ckptfs-acl"};
  const std::string file = dir / "model.bin";
  WriteFile(file, "w");
  ASSERT_EQ(::chmod(file.c_str(), 0640), 0);
  if (!SetAcl("u:4321:r", file)) GTEST_SKIP() << "no POSIX ACLs on " << dir.path();
  const Ownership o = ReadOwnership(file, LstatOf(file));
  ASSERT_NE(o.acl, nullptr);
  ASSERT_EQ(o.acl->named.size(), 1u);
  EXPECT_EQ(o.acl->named[0].id, 4321u);
  EXPECT_EQ(o.acl->named[0].perm, 4);
}

// A file swapped in between the walk's lstat and the ACL's read (a rename
// by the directory's writer) must not lend its ACL to the inode the walk
// saw: the answer is "owner only", never the other file's grants.
TEST(SourceAclTest, AFileSwappedInAfterTheLstatLendsItsAclToNobody) {
  TempDir dir{"ckptfs-acl"};
  const std::string seen = dir / "seen.bin", swapped = dir / "swapped.bin";
  WriteFile(seen, "victim");
  WriteFile(swapped, "attacker");
  ASSERT_EQ(::chmod(seen.c_str(), 0640), 0);
  ASSERT_EQ(::chmod(swapped.c_str(), 0640), 0);
  if (!SetAcl("u:4321:r", swapped)) GTEST_SKIP() << "no POSIX ACLs on " << dir.path();
  const struct stat st = LstatOf(seen);  // what the walk saw at this path
  const Ownership o = ReadOwnership(swapped, st);  // what the path leads to by the time the ACL is read
  EXPECT_EQ(o.mode & 077, 0u) << "group and other bits must be taken away";
  ASSERT_NE(o.acl, nullptr);
  EXPECT_TRUE(o.acl->named.empty()) << "the swapped-in file's entry for uid 4321 was lent to the inode seen";
}

}  // namespace
}  // namespace ckptfs::testing
