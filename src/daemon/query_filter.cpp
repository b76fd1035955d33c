#include "query_filter.h"

namespace ckptfs::daemon {

bool VisibleTo(const CheckpointState& state, const ControlServer::Request& r) {
  if (r.privileged) return true;
  Caller caller(r.peer_uid, r.peer_gid, [groups = r.peer_groups] { return groups; });
  if (!MayReach(state.access, caller)) return false;
  const bool has_parent = state.access.dirs && !state.access.dirs->empty();
  if (has_parent && Permits(state.access.dirs->back(), caller, kWantRead)) return true;
  return Permits(state.access.self, caller, kWantSearch);
}

std::vector<CheckpointState> VisibleStates(std::vector<CheckpointState> states, const ControlServer::Request& r) {
  std::vector<CheckpointState> out;
  for (auto& s : states) {
    if (!VisibleTo(s, r)) continue;
    if (!r.privileged && !s.reason_shown.empty()) s.reason = s.reason_shown;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ckptfs::daemon
