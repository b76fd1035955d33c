#include "query_filter.h"

#include <set>

namespace ckptfs::daemon {

bool VisibleTo(const CheckpointState& state, const ControlServer::Request& r) {
  if (r.privileged) return true;
  Caller caller(r.peer_uid, r.peer_gid, [groups = r.peer_groups] { return groups; });
  // Its digest, size and file count are drawn from the bytes inside: only
  // for whoever could enter it too.
  return MayKnowCopy(state.access, caller);
}

// The names of the files being hashed, as far as the caller could list them
// in SRC: those directly in a checkpoint directory it may read. Deeper ones
// (a subdirectory may be private) are shown without their name.
void HideUnlistableNames(CheckpointState& state, const ControlServer::Request& r) {
  Caller caller(r.peer_uid, r.peer_gid, [groups = r.peer_groups] { return groups; });
  const bool lists_dir = Permits(state.access.self, caller, kWantRead);
  for (auto& f : state.hashing) {
    if (!lists_dir || f.path.find('/') != std::string::npos) f.path.clear();
  }
}

// An invalid checkpoint's reason as this caller may be told it: each
// problem whose directory they may list; the others only counted.
std::string ReasonFor(const CheckpointState& state, const ControlServer::Request& r) {
  Caller caller(r.peer_uid, r.peer_gid, [groups = r.peer_groups] { return groups; });
  std::string out;
  size_t unlisted = 0;
  for (const ShownProblem& p : state.problems_shown) {
    if (MayLearnPath(p.listing, caller) && Permits(p.listing.self, caller, kWantRead | kWantSearch)) {
      out += (out.empty() ? "" : "; ") + p.text;
    } else {
      ++unlisted;
    }
  }
  if (unlisted > 0) {
    out += (out.empty() ? "" : "; ") + std::to_string(unlisted) +
           " problem(s) in directories you may not list (root and the mount's owner are told them)";
  }
  return out;
}

std::vector<CheckpointState> VisibleStates(std::vector<CheckpointState> states, const ControlServer::Request& r) {
  std::vector<CheckpointState> out;
  for (auto& s : states) {
    if (!VisibleTo(s, r)) continue;
    if (!r.privileged && !s.problems_shown.empty()) s.reason = ReasonFor(s, r);
    if (!r.privileged) HideUnlistableNames(s, r);
    out.push_back(std::move(s));
  }
  return out;
}

std::map<std::string, std::vector<std::string>> VisibleByName(const std::vector<CheckpointState>& visible,
                                                              const View& view, const std::string& source) {
  std::map<std::string, std::vector<std::string>> out;
  std::set<std::string> sources;
  for (const auto& s : visible) {
    if (!s.Serves()) continue;
    sources.insert(s.path);
    out[s.name];
  }
  // The source a by-name path mirrors: SRC/<p>, or, when SRC is itself a
  // checkpoint and by-name starts with its base name, SRC/<p minus it>.
  const std::string base = source.substr(source.rfind('/') + 1);
  auto mirrors_visible = [&](const std::string& by_name) {
    const std::string p = by_name.substr(std::string("by-name/").size());
    if (sources.count(source + "/" + p)) return true;
    if (p == base) return sources.count(source) > 0;
    return p.rfind(base + "/", 0) == 0 && sources.count(source + p.substr(base.size())) > 0;
  };
  for (const auto& [path, digest] : view.ByNameLinks()) {
    auto it = out.find(digest);
    if (it != out.end() && mirrors_visible(path)) it->second.push_back(path);
  }
  return out;
}

}  // namespace ckptfs::daemon
