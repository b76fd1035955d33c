// Permits with a caller whose supplementary groups cannot be known (a FUSE
// caller outside the daemon's PID namespace): allowed exactly when allowed
// whatever groups the caller is in. Each case is checked against the same
// decision made for every set of groups the caller could be in.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "ckptfs/ownership.h"

namespace ckptfs {
namespace {

constexpr uid_t kUid = 2002;
constexpr gid_t kPrimary = 2002;

Caller Known(std::vector<gid_t> groups) {
  return Caller(kUid, kPrimary, [groups] { return std::optional<std::vector<gid_t>>(groups); });
}
Caller Unknown() {
  return Caller(kUid, kPrimary, [] { return std::optional<std::vector<gid_t>>(); });
}

std::shared_ptr<const ExtendedAcl> Acl(uint8_t group_obj, std::vector<ExtendedAcl::Entry> named) {
  auto acl = std::make_shared<ExtendedAcl>();
  acl->group_obj = group_obj;
  acl->named = std::move(named);
  return acl;
}
ExtendedAcl::Entry Group(gid_t gid, uint8_t perm) { return {ExtendedAcl::Entry::Tag::kGroup, gid, perm}; }
ExtendedAcl::Entry User(uid_t uid, uint8_t perm) { return {ExtendedAcl::Entry::Tag::kUser, uid, perm}; }

// Allowed for every subset of `gids` as the caller's supplementary groups.
bool AllowedForEveryGroupSet(const Ownership& o, const std::vector<gid_t>& gids, int want) {
  for (unsigned set = 0; set < (1u << gids.size()); ++set) {
    std::vector<gid_t> groups;
    for (size_t i = 0; i < gids.size(); ++i) {
      if (set & (1u << i)) groups.push_back(gids[i]);
    }
    Caller c = Known(groups);
    if (!Permits(o, c, want)) return false;
  }
  return true;
}

TEST(OwnershipTest, ModeBitsWithUnknownGroups) {
  struct Case {
    mode_t mode;
    gid_t gid;
    bool allowed;
  } cases[] = {
      {0644, 3001, true},      // group and other alike: groups do not matter
      {0640, 3001, false},     // only the group grants: refused
      {0604, 3001, false},     // the group is kept out: the caller might be in it
      {0600, 3001, false},     // nobody but the owner
      {0640, kPrimary, true},  // the primary group is known without /proc
      {0604, kPrimary, false},  // and keeps the caller out
  };
  for (const Case& c : cases) {
    const Ownership o(1000, c.gid, c.mode);
    Caller unknown = Unknown();
    EXPECT_EQ(Permits(o, unknown, kWantRead), c.allowed) << std::oct << c.mode << " gid " << std::dec << c.gid;
    EXPECT_EQ(Permits(o, unknown, kWantRead), AllowedForEveryGroupSet(o, {c.gid, 4000}, kWantRead))
        << std::oct << c.mode;
  }
  // Known groups decide as before: the member of 3001 is in under 0640, out under 0604.
  Caller member = Known({3001});
  EXPECT_TRUE(Permits(Ownership(1000, 3001, 0640), member, kWantRead));
  Caller member_again = Known({3001});
  EXPECT_FALSE(Permits(Ownership(1000, 3001, 0604), member_again, kWantRead));
  Caller none = Known({});
  EXPECT_TRUE(Permits(Ownership(1000, 3001, 0604), none, kWantRead));
}

TEST(OwnershipTest, AclsWithUnknownGroupsGrantOnlyWhatEveryMembershipGrants) {
  struct Case {
    const char* what;
    mode_t mode;  // group bits: the mask
    std::shared_ptr<const ExtendedAcl> acl;
    bool allowed;
  } cases[] = {
      {"a named entry for this user decides alone", 0640, Acl(0, {User(kUid, 4), Group(3002, 0)}), true},
      {"every group entry and other grant", 0644, Acl(4, {Group(3002, 4), Group(3003, 4)}), true},
      {"other grants, one named group refuses", 0644, Acl(4, {Group(3002, 4), Group(3003, 0)}), false},
      // In 3002 alone or in none the caller is let in; in 3003 alone, not:
      // only a check of each named group alone finds that.
      {"one group grants, another refuses, other grants", 0644, Acl(4, {Group(3002, 4), Group(3003, 0)}), false},
      {"every group grants but other does not", 0640, Acl(4, {Group(3002, 4)}), false},
      {"the mask refuses what the groups grant", 0604, Acl(4, {Group(3002, 4)}), false},
      {"nobody but the owner", 0600, Acl(0, {Group(3002, 0)}), false},
  };
  for (const Case& c : cases) {
    const Ownership o(1000, 3001, c.mode, c.acl);
    Caller unknown = Unknown();
    EXPECT_EQ(Permits(o, unknown, kWantRead), c.allowed) << c.what;
    EXPECT_EQ(Permits(o, unknown, kWantRead), AllowedForEveryGroupSet(o, {3001, 3002, 3003, 4000}, kWantRead))
        << c.what;
  }
}

// Every ACL of a small space: the owning group (3001 or the caller's
// primary group) and its entry, up to two named groups (one of them may be
// the primary group), the mask and "other", each granting r, x, both or
// nothing; asked for r and for r|x. Unknown groups must decide as the
// oracle over every set of groups does.
TEST(OwnershipTest, EveryAclOfASmallSpaceAgreesWithEveryGroupSet) {
  const uint8_t perms[] = {0, 1, 4, 5};
  const std::vector<std::vector<gid_t>> nameds = {{}, {3002}, {3002, 3003}, {kPrimary, 3003}};
  size_t checked = 0, allowed = 0;
  for (gid_t owning : {gid_t{3001}, kPrimary}) {
    for (const auto& named_gids : nameds) {
      for (unsigned combo = 0; combo < (1u << (2 * (3 + named_gids.size()))); ++combo) {
        auto perm = [&](unsigned i) { return perms[(combo >> (2 * i)) & 3u]; };
        std::vector<ExtendedAcl::Entry> named;
        for (size_t i = 0; i < named_gids.size(); ++i) named.push_back(Group(named_gids[i], perm(3 + i)));
        const mode_t mode = static_cast<mode_t>(0700 | (perm(1) << 3) | perm(2));  // mask, other
        const Ownership o(1000, owning, mode, Acl(perm(0), named));
        for (int want : {int{kWantRead}, kWantRead | kWantSearch}) {
          Caller unknown = Unknown();
          const bool got = Permits(o, unknown, want);
          ASSERT_EQ(got, AllowedForEveryGroupSet(o, {3001, 3002, 3003, 4000}, want))
              << "owning " << owning << " mode " << std::oct << mode << std::dec << " group_obj " << int(perm(0))
              << " named " << named.size() << " want " << want;
          ++checked;
          allowed += got ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(allowed, 0u);  // the space has both answers
  EXPECT_LT(allowed, checked);
}

TEST(OwnershipTest, GroupsAreReadOnlyWhenADecisionNeedsThem) {
  int loads = 0;
  Caller c(kUid, kPrimary, [&loads] {
    ++loads;
    return std::optional<std::vector<gid_t>>(std::vector<gid_t>{3001});
  });
  EXPECT_TRUE(Permits(Ownership(1000, 3001, 0644), c, kWantRead));
  EXPECT_EQ(loads, 0);
  EXPECT_TRUE(Permits(Ownership(1000, 3001, 0640), c, kWantRead));
  EXPECT_TRUE(Permits(Ownership(1000, 3001, 0750), c, kWantSearch));
  EXPECT_EQ(loads, 1);  // once per caller
}

// Who may be told a path (user.ckptfs.sources, ckptfsctl): whoever may list
// every directory above it, or its owner, who named it; and of a copy of a
// checkpoint, only whoever may also enter it.
TEST(OwnershipTest, APathIsToldToWhoMayListItsDirectoriesOrOwnsIt) {
  const Ownership src{0, 0, 0755}, search_only{0, 0, 0711};
  const AccessPath in_0711{DirChain::Extend(DirChain::Extend(nullptr, src), search_only),
                           Ownership{kUid, kPrimary, 0755}};
  const AccessPath others_in_0711{in_0711.dirs, Ownership{4000, 4000, 0755}};
  const AccessPath private_in_0755{DirChain::Extend(nullptr, src), Ownership{4000, 4000, 0700}};
  Caller caller = Known({});
  EXPECT_TRUE(MayLearnPath(in_0711, caller));          // their own checkpoint
  EXPECT_FALSE(MayLearnPath(others_in_0711, caller));  // another's name in a directory they cannot list
  EXPECT_TRUE(MayLearnPath(private_in_0755, caller));  // ls of its parent tells them
  EXPECT_FALSE(MayKnowCopy(private_in_0755, caller));  // but not what it holds
  EXPECT_TRUE(MayKnowCopy(in_0711, caller));
  EXPECT_FALSE(EveryoneMayLearnPath(in_0711));
  EXPECT_TRUE(EveryoneMayLearnPath(private_in_0755));
}

}  // namespace
}  // namespace ckptfs
