#include "fleet.h"

#include <cstdio>

#include "ckptfs/control_protocol.h"

namespace ckptfs::daemon {

Result<std::unique_ptr<ManifestStore>> OpenManifestStore(const MountOptions& o, std::vector<std::string>* warnings) {
  if (o.manifests.empty()) return std::unique_ptr<ManifestStore>();
  Keyring trusted;
  if (!o.manifest_keys.empty()) {
    auto ring = Keyring::Load(o.manifest_keys);
    if (!ring.ok()) return Status::Error("manifest_keys=" + o.manifest_keys + ": " + ring.status().message());
    trusted = std::move(*ring);
  }
  std::optional<SigningKey> signer;
  if (!o.manifest_sign.empty()) {
    std::string loose;
    auto key = SigningKey::Load(o.manifest_sign, &loose);
    if (!key.ok()) return Status::Error("manifest_sign=" + o.manifest_sign + ": " + key.status().message());
    if (!loose.empty()) warnings->push_back(loose);
    signer = std::move(*key);
  }
  return ManifestStore::Open(o.manifests, std::move(trusted), std::move(signer));
}

std::string AdaptRescanToFilesystem(const SourceFilesystem& fs, MountOptions& o) {
  if (fs.inotify_complete) return "";
  char seconds[32];
  if (!o.rescan_given) o.rescan_s = kRemoteRescanS;
  std::snprintf(seconds, sizeof seconds, "%g", o.rescan_s);
  if (o.rescan_s <= 0) {
    return "source " + o.source + " is on " + fs.type +
           ": changes made by other clients raise no inotify event, and rescan=0 turns the periodic rescan off; "
           "only `ckptfsctl rescan` or SIGHUP will find them";
  }
  return "source " + o.source + " is on " + fs.type +
         ": changes made by other clients raise no inotify event; they are found by the periodic rescan every " +
         seconds + " s" + (o.rescan_given ? "" : " (rescan= sets it)");
}

namespace {

// What finds changes in SRC, for status: with rescan=0 there is no
// periodic rescan to name.
std::string ChangesFoundBy(bool inotify, double rescan_s) {
  if (rescan_s > 0) return inotify ? "inotify and the periodic rescan" : "the periodic rescan";
  return inotify ? "inotify only (rescan=0)" : "nothing but ckptfsctl rescan or SIGHUP (rescan=0)";
}

}  // namespace

void AddFleetStatus(nlohmann::json& status, const ManifestStore* store, const SourceFilesystem& fs,
                    const MountOptions& o) {
  using namespace protocol;
  status[kSourceFilesystem] = {
      {kFsType, fs.type},
      {kFsInotify, fs.inotify_complete},
      {kFsChangesFoundBy, ChangesFoundBy(fs.inotify_complete, o.rescan_s)},
      {kFsRescan, o.rescan_s}};
  if (store == nullptr) return;
  const ManifestStore::Stats s = store->GetStats();
  status[kManifests] = {{kManifestDir, store->dir()},
                        {kTrustedKeys, store->keyring().key_ids()},
                        {kSigningKey, store->signer_key_id()},
                        {kRecordsUsed, s.used},
                        {kRecordsIgnored, s.ignored},
                        {kRecordsPublished, s.published},
                        {"records_already_there", s.already},
                        {"records_withheld", s.withheld},
                        {kRecordsDistrusted, s.distrusted}};
}

void DistrustRecordOf(ManifestStore* store, const std::string& real_source, const SourceCopy& copy) {
  if (store == nullptr) return;
  const std::string& path = copy.path;
  if (path.size() <= real_source.size() + 1 || path.compare(0, real_source.size(), real_source) != 0 ||
      path[real_source.size()] != '/') {
    return;
  }
  store->Distrust(path.substr(real_source.size() + 1), copy.stamp);
}

}  // namespace ckptfs::daemon
