// The scan planner: what a rescan keeps, shows, waits for, hashes and
// withdraws, from real walks of real trees and real index lookups (the
// planner itself does no I/O; the test feeds it what the watcher would).
#include "ckptfs/scan_planner.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kSettle = 5 * kSecond;

class ScanPlannerTest : public ::testing::Test {
 protected:
  // The walk, then the index lookups the watcher makes for what triage
  // leaves, then the plan at `now_ns`.
  ScanPlan PlanFor(const CatalogScan& scan, const KnownCheckpoints& known, int64_t now_ns) {
    ScanPlanner planner(known, kSettle);
    triage_ = planner.Triage(scan);
    IndexerOptions lookup;
    lookup.lookup_only = true;
    CatalogScan only;
    only.root = scan.root;
    only.real_root = scan.real_root;
    for (const auto* cp : triage_.look_up) only.checkpoints.push_back(*cp);
    lookups_ = Indexer(index_.get(), lookup).Run(only);
    return planner.Plan(triage_, lookups_.checkpoints, now_ns);
  }
  // The newest ctime or mtime of the checkpoint's members.
  static int64_t NewestChange(const CatalogScan& scan, const std::string& rel) {
    int64_t newest = 0;
    for (const auto& cp : scan.checkpoints) {
      if (cp.rel_path != rel) continue;
      for (const auto& m : cp.members) newest = std::max({newest, m.stamp.ctime_ns, m.stamp.mtime_ns});
    }
    return newest;
  }
  // Indexes the tree for real and says what a watcher that showed it knows.
  KnownCheckpoints IndexAndShow(const CatalogScan& scan) {
    IndexReport r = Indexer(index_.get(), {}).Run(scan);
    KnownCheckpoints known;
    for (const auto& cp : scan.checkpoints) {
      known[cp.abs_path].shown_name = Find(r, cp.rel_path).name;
      known[cp.abs_path].shown_fingerprint = cp.WalkFingerprint();
    }
    return known;
  }
  static std::vector<std::string> Paths(const std::vector<const CheckpointSource*>& cps) {
    std::vector<std::string> out;
    for (const auto* cp : cps) out.push_back(cp->rel_path);
    return out;
  }

  TempDir src_{"ckptfs-plan-src"};
  TempDir state_{"ckptfs-plan-state"};
  std::unique_ptr<Index> index_ = OpenIndex(state_.path());
  ScanTriage triage_;
  IndexReport lookups_;
};

TEST_F(ScanPlannerTest, ANewCheckpointThatHasNotSettledWaits) {
  WriteFile(src_ / "a/model.bin", "weights");
  const CatalogScan scan = ScanOk(src_.path());
  const int64_t changed = NewestChange(scan, "a");
  ScanPlan plan = PlanFor(scan, {}, changed + kSecond);
  EXPECT_EQ(Paths(triage_.look_up), std::vector<std::string>{"a"});
  ASSERT_EQ(plan.wait.size(), 1u);
  EXPECT_EQ(plan.wait[0].source->rel_path, "a");
  EXPECT_EQ(plan.wait[0].quiet_ns, kSecond);
  EXPECT_EQ(plan.wait[0].left_ns, kSettle - kSecond);
  EXPECT_EQ(plan.settle_wait_ns, kSettle - kSecond);
  EXPECT_TRUE(plan.index.empty());
  EXPECT_TRUE(plan.show.empty());
  EXPECT_TRUE(plan.withdraw.empty());
}

TEST_F(ScanPlannerTest, ANewCheckpointThatHasSettledIsIndexed) {
  WriteFile(src_ / "a/model.bin", "weights");
  WriteFile(src_ / "b/model.bin", "fresh");
  const CatalogScan scan = ScanOk(src_.path());
  const int64_t newest = std::max(NewestChange(scan, "a"), NewestChange(scan, "b"));
  ScanPlan plan = PlanFor(scan, {}, newest + kSettle);  // quiet for exactly settle: settled
  EXPECT_EQ(Paths(plan.index), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(plan.wait.empty());
  EXPECT_EQ(plan.settle_wait_ns, 0);
  EXPECT_EQ(plan.valid, 2u);
  EXPECT_EQ(plan.files_looked_up, 2u);
}

// Ready means ready: what the index knows is shown at once, settled or not
// (a remount right after a copy shows it without waiting).
TEST_F(ScanPlannerTest, ACheckpointTheIndexKnowsIsShownAtOnceSettledOrNot) {
  WriteFile(src_ / "a/model.bin", "weights");
  const CatalogScan scan = ScanOk(src_.path());
  const std::string name = IndexAndShow(scan).begin()->second.shown_name.value_or("");
  ScanPlan plan = PlanFor(scan, {}, NewestChange(scan, "a"));  // changed this very moment
  ASSERT_EQ(plan.show.size(), 1u);
  EXPECT_EQ(plan.show[0].indexed->name, name);
  EXPECT_TRUE(plan.show[0].announce);
  EXPECT_TRUE(plan.wait.empty());
  EXPECT_TRUE(plan.index.empty());
}

TEST_F(ScanPlannerTest, AnUnchangedCheckpointIsKeptWithoutALookup) {
  WriteFile(src_ / "a/model.bin", "weights");
  for (int i = 0; i < 20; ++i) WriteFile(src_ / ("a/f" + std::to_string(i)), "x");
  WriteFile(src_ / "b/model.bin", "other");
  const CatalogScan first = ScanOk(src_.path());
  KnownCheckpoints known = IndexAndShow(first);
  const CatalogScan again = ScanOk(src_.path());
  ScanPlan plan = PlanFor(again, known, NewestChange(again, "a") + kSettle);
  EXPECT_EQ(Paths(plan.keep), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(triage_.look_up.empty());
  EXPECT_TRUE(lookups_.checkpoints.empty());
  EXPECT_EQ(plan.files_looked_up, 0u);
  EXPECT_TRUE(plan.show.empty() && plan.index.empty() && plan.withdraw.empty() && plan.vanished.empty());

  // The same walk, but its digest was withdrawn: it is looked up again.
  known[src_ / "a"].shown_name.reset();
  plan = PlanFor(again, known, NewestChange(again, "a") + kSettle);
  EXPECT_EQ(Paths(plan.keep), std::vector<std::string>{"b"});
  EXPECT_EQ(Paths(triage_.look_up), std::vector<std::string>{"a"});
  EXPECT_EQ(plan.files_looked_up, 21u);
  ASSERT_EQ(plan.show.size(), 1u);  // the index still knows it
}

TEST_F(ScanPlannerTest, AVanishedCheckpointIsForgottenAndWithdrawn) {
  WriteFile(src_ / "a/model.bin", "weights");
  WriteFile(src_ / "gone/model.bin", "going");
  KnownCheckpoints known = IndexAndShow(ScanOk(src_.path()));
  const std::string gone_name = *known[src_ / "gone"].shown_name;
  known[src_ / "never-shown"].reason = "queued for indexing";
  RemoveTree(src_ / "gone");
  const CatalogScan scan = ScanOk(src_.path());
  ScanPlan plan = PlanFor(scan, known, NewestChange(scan, "a") + kSettle);
  EXPECT_EQ(plan.vanished, (std::vector<std::string>{src_ / "gone", src_ / "never-shown"}));
  ASSERT_EQ(plan.withdraw.size(), 1u);
  EXPECT_EQ(plan.withdraw[0].path, src_ / "gone");
  EXPECT_EQ(plan.withdraw[0].name, gone_name);
  EXPECT_EQ(plan.withdraw[0].why, ScanPlan::Why::kRemoved);
  EXPECT_EQ(Paths(plan.keep), std::vector<std::string>{"a"});
}

TEST_F(ScanPlannerTest, AChangedCheckpointIsReindexedWhileItsOldDigestStays) {
  WriteFile(src_ / "a/model.bin", "weights");
  KnownCheckpoints known = IndexAndShow(ScanOk(src_.path()));
  const std::string old_name = *known[src_ / "a"].shown_name;
  WriteFile(src_ / "a/model.bin", "fine-tuned");
  const CatalogScan scan = ScanOk(src_.path());
  ScanPlan plan = PlanFor(scan, known, NewestChange(scan, "a") + kSettle);
  EXPECT_EQ(Paths(triage_.look_up), std::vector<std::string>{"a"});
  EXPECT_EQ(Paths(plan.index), std::vector<std::string>{"a"});
  // Never dark while re-verified: nothing withdrawn, the old digest kept.
  EXPECT_TRUE(plan.withdraw.empty());
  ASSERT_EQ(plan.revalidate.size(), 1u);
  EXPECT_EQ(plan.revalidate[0].shown_name, old_name);
  EXPECT_EQ(plan.revalidate[0].source->abs_path, src_ / "a");
  EXPECT_TRUE(plan.vanished.empty());

  // Not settled yet: kept all the same, and waited for.
  plan = PlanFor(scan, known, NewestChange(scan, "a") + 1);
  EXPECT_EQ(plan.wait.size(), 1u);
  EXPECT_TRUE(plan.index.empty());
  EXPECT_TRUE(plan.withdraw.empty());
  ASSERT_EQ(plan.revalidate.size(), 1u);
  EXPECT_EQ(plan.revalidate[0].shown_name, old_name);
}

TEST_F(ScanPlannerTest, AChangeThatTheIndexKnowsMovesTheNameAtOnce) {
  WriteFile(src_ / "a/model.bin", "weights");
  KnownCheckpoints known = IndexAndShow(ScanOk(src_.path()));
  // Content the index already knows (here: indexed as it is now) is shown
  // under its digest in this plan; nothing is revalidated or withdrawn.
  WriteFile(src_ / "a/model.bin", "fine-tuned");
  IndexAndShow(ScanOk(src_.path()));
  const CatalogScan scan = ScanOk(src_.path());
  ScanPlan plan = PlanFor(scan, known, NewestChange(scan, "a") + kSettle);
  ASSERT_EQ(plan.show.size(), 1u);
  EXPECT_TRUE(plan.show[0].announce);
  EXPECT_NE(plan.show[0].indexed->name, *known[src_ / "a"].shown_name);
  EXPECT_TRUE(plan.revalidate.empty());
  EXPECT_TRUE(plan.withdraw.empty());
}

TEST_F(ScanPlannerTest, AnInvalidCheckpointIsWithdrawnAndLoggedOncePerReason) {
  WriteFile(src_ / "a/model.bin", "weights");
  KnownCheckpoints known = IndexAndShow(ScanOk(src_.path()));
  Symlink("/nonexistent-target", src_ / "a/dangling.json");
  const CatalogScan scan = ScanOk(src_.path());
  ScanPlan plan = PlanFor(scan, known, NewestChange(scan, "a") + kSettle);
  ASSERT_EQ(plan.invalid.size(), 1u);
  EXPECT_TRUE(plan.invalid[0].second);  // a new reason: told
  ASSERT_EQ(plan.withdraw.size(), 1u);
  EXPECT_EQ(plan.withdraw[0].why, ScanPlan::Why::kInvalid);
  EXPECT_EQ(plan.valid, 0u);

  known[src_ / "a"] = {.shown_name = std::nullopt, .shown_fingerprint = std::nullopt,
                       .reason = *scan.checkpoints.at(0).invalid_reason};
  plan = PlanFor(scan, known, NewestChange(scan, "a") + kSettle);
  ASSERT_EQ(plan.invalid.size(), 1u);
  EXPECT_FALSE(plan.invalid[0].second);  // the same reason: not told again
  EXPECT_TRUE(plan.withdraw.empty());
}

TEST(WalkTriggersTest, OnlyAnInotifyOrSettleRescanWithAPreviousWalkIsIncremental) {
  const WalkTriggers incremental{.have_previous_walk = true, .inotify = true};
  EXPECT_FALSE(NeedsFullWalk(incremental));
  auto with = [&](auto change) {
    WalkTriggers why = incremental;
    change(why);
    return NeedsFullWalk(why);
  };
  EXPECT_TRUE(with([](WalkTriggers& w) { w.asked = true; }));           // ckptfsctl rescan, SIGHUP, a withdrawal
  EXPECT_TRUE(with([](WalkTriggers& w) { w.periodic = true; }));        // rescan=SECONDS
  EXPECT_TRUE(with([](WalkTriggers& w) { w.read_triggered = true; }));  // a read found a source changed
  EXPECT_TRUE(with([](WalkTriggers& w) { w.events_lost = true; }));     // inotify overflowed
  EXPECT_TRUE(with([](WalkTriggers& w) { w.have_previous_walk = false; }));
  EXPECT_TRUE(with([](WalkTriggers& w) { w.inotify = false; }));
}

}  // namespace
}  // namespace ckptfs::testing
