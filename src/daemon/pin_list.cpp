#include "pin_list.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "cache_commands.h"
#include "ckptfs/hashes.h"
#include "ckptfs/mutex.h"

namespace ckptfs::daemon {

namespace {

// `path` is `prefix` or lies below it.
bool AtOrBelow(const std::string& path, const std::string& prefix) {
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || prefix.empty() || prefix.back() == '/' || path[prefix.size()] == '/';
}

}  // namespace

PinList::PinList(const std::string& state_dir, const std::string& canonical_mountpoint)
    : path_(state_dir + "/pins-" + ToHex(Sha256Of(canonical_mountpoint)).substr(0, 16) + ".json") {}

std::vector<PinList::Pin> PinList::Load() const {
  MutexLock lock(mu_);
  return ReadLocked();
}

std::vector<PinList::Pin> PinList::ReadLocked() const {
  std::vector<Pin> pins;
  std::ifstream in(path_);
  if (!in) return pins;
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("pins") || !j["pins"].is_array()) {
    spdlog::warn("pin list {} is damaged; it is started afresh", path_);
    return pins;
  }
  for (const auto& p : j["pins"]) {
    if (p.is_object() && p.value("path", nlohmann::json()).is_string()) {
      pins.push_back({p["path"], p.value("tier", std::string("host"))});
    }
  }
  return pins;
}

void PinList::Clear() {
  MutexLock lock(mu_);
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("cannot remove the pin list {}: {}", path_, std::strerror(errno));
  }
}

Status PinList::Save(const std::vector<Pin>& pins) const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : pins) list.push_back({{"path", p.path}, {"tier", p.tier}});
  // Written aside and renamed: a crash leaves the old list or the new one.
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"pins", list}}.dump(1) << "\n";
    out.flush();
    if (!out) return Status::FromErrno("cannot write the pin list " + tmp, errno);
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) return Status::FromErrno("cannot replace " + path_, errno);
  return Status::Ok();
}

void PinList::Record(const ControlServer::Request& r, const nlohmann::json& reply) {
  const std::string cmd = r.body.value("cmd", std::string());
  if (reply.value("ok", false) != true || !r.body.contains("path") || !r.body["path"].is_string()) return;
  const std::string path = r.body["path"];
  const bool pin = cmd == "preload" && r.body.value("pin", false);
  if (!pin && cmd != "unpin" && cmd != "evict") return;
  MutexLock lock(mu_);
  std::vector<Pin> pins = ReadLocked();
  if (pin) {
    const std::string tier = r.body.value("tier", std::string("host"));
    auto same = [&](const Pin& p) { return p.path == path && p.tier == tier; };
    if (std::none_of(pins.begin(), pins.end(), same)) pins.push_back({path, tier});
  } else {
    std::erase_if(pins, [&](const Pin& p) { return AtOrBelow(p.path, path); });
  }
  if (Status s = Save(pins); !s.ok()) spdlog::warn("{}", s.message());
}

void RestorePins(fuse::FsContext& ctx, const PinList& pins, const std::atomic<bool>& stop) {
  for (const PinList::Pin& p : pins.Load()) {
    if (stop) return;
    ControlServer::Request r{{{"cmd", "preload"}, {"path", p.path}, {"tier", p.tier}, {"pin", true}},
                             ::geteuid(),
                             ::getegid(),
                             {},
                             /*privileged=*/true,
                             &stop,
                             [](const nlohmann::json&) { return true; }};
    const nlohmann::json reply = HandlePreload(ctx, r);
    if (reply.value("ok", false)) spdlog::info("pinned {} again ({} tier)", p.path, p.tier);
    else spdlog::warn("cannot pin {} again: {}", p.path, reply.value("error", std::string("?")));
  }
}

}  // namespace ckptfs::daemon
