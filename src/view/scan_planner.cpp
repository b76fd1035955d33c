#include "ckptfs/scan_planner.h"

#include <algorithm>
#include <set>

namespace ckptfs {

namespace {

// The newest change of any member (ctime catches a chmod or a rename that
// left mtime alone).
int64_t NewestChangeNs(const CheckpointSource& cp) {
  int64_t newest = 0;
  for (const auto& m : cp.members) newest = std::max({newest, m.stamp.ctime_ns, m.stamp.mtime_ns});
  return newest;
}

}  // namespace

std::optional<std::string> ScanPlanner::ShownName(const std::string& path) const {
  auto it = known_.find(path);
  if (it == known_.end()) return std::nullopt;
  return it->second.shown_name;
}

ScanTriage ScanPlanner::Triage(const CatalogScan& scan) const {
  ScanTriage t;
  std::set<std::string> seen;
  for (const auto& cp : scan.checkpoints) {
    seen.insert(cp.abs_path);
    auto old = known_.find(cp.abs_path);
    if (!cp.valid()) {
      t.invalid.emplace_back(&cp, old == known_.end() || old->second.reason != *cp.invalid_reason);
      continue;
    }
    ++t.valid;
    const Sha256Digest fingerprint = cp.WalkFingerprint();
    t.fingerprints[cp.abs_path] = fingerprint;
    if (old != known_.end() && old->second.shown_name && old->second.shown_fingerprint == fingerprint) {
      t.keep.push_back(&cp);
      continue;
    }
    t.look_up.push_back(&cp);
    t.files_to_look_up += cp.members.size();
  }
  for (const auto& [path, k] : known_) {
    if (!seen.count(path)) t.vanished.push_back(path);
  }
  return t;
}

ScanPlan ScanPlanner::Plan(const ScanTriage& triage, const std::vector<IndexedCheckpoint>& lookups,
                           int64_t now_ns) const {
  ScanPlan plan;
  plan.invalid = triage.invalid;
  plan.keep = triage.keep;
  plan.vanished = triage.vanished;
  plan.fingerprints = triage.fingerprints;
  plan.valid = triage.valid;
  plan.files_looked_up = triage.files_to_look_up;
  for (const auto& path : triage.vanished) {
    if (auto name = ShownName(path)) plan.withdraw.push_back({path, *name, ScanPlan::Why::kRemoved});
  }
  for (const auto& [cp, announce] : triage.invalid) {
    if (auto name = ShownName(cp->abs_path)) plan.withdraw.push_back({cp->abs_path, *name, ScanPlan::Why::kInvalid});
  }
  for (size_t i = 0; i < triage.look_up.size(); ++i) {
    const CheckpointSource& cp = *triage.look_up[i];
    const auto shown = ShownName(cp.abs_path);
    // A missing answer counts as "not known": the checkpoint is hashed.
    if (i < lookups.size() && !lookups[i].error) {
      plan.show.push_back({&cp, &lookups[i], shown != lookups[i].name});
      continue;
    }
    // Not known to the index: the digest shown for this path stays until
    // the new one is known (its bytes are still checked on every read), and
    // moves in one publish then.
    if (shown) plan.revalidate.push_back({&cp, *shown});
    const int64_t quiet_ns = now_ns - NewestChangeNs(cp);
    if (quiet_ns < settle_ns_) {
      const int64_t left_ns = settle_ns_ - quiet_ns;
      plan.wait.push_back({&cp, quiet_ns, left_ns});
      plan.settle_wait_ns = plan.settle_wait_ns == 0 ? left_ns : std::min(plan.settle_wait_ns, left_ns);
      continue;
    }
    plan.index.push_back(&cp);
  }
  return plan;
}

bool NeedsFullWalk(const WalkTriggers& why) {
  return why.asked || why.periodic || why.read_triggered || why.events_lost || !why.have_previous_walk ||
         !why.inotify;
}

}  // namespace ckptfs
