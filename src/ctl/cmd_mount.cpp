// ckptfsctl status / ls / rescan: queries and requests to a running mount.
#include <cstdio>
#include <ctime>

#include "ckptfs/control_protocol.h"
#include "ckptfs/json_path.h"
#include "progress.h"
#include "ctl.h"

namespace ckptfs::ctl {

using namespace protocol;  // the reply keys

namespace {

std::string When(int64_t t) {
  if (t <= 0) return "-";
  char buf[32];
  std::time_t tt = static_cast<std::time_t>(t);
  struct tm tm;
  localtime_r(&tt, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

// The source's filesystem (and how changes are found there) and the
// manifest store, when the daemon reports them.
void PrintFleetLines(const nlohmann::json& j) {
  if (j.contains(kSourceFilesystem)) {
    const auto& fs = j[kSourceFilesystem];
    std::printf("source fs    %s: changes found by %s", fs.value(kFsType, std::string("?")).c_str(),
                fs.value(kFsChangesFoundBy, std::string("?")).c_str());
    if (fs.value(kFsRescan, 0.0) > 0) std::printf(" (rescan every %g s)", fs.value(kFsRescan, 0.0));
    std::printf("%s\n", fs.value(kFsInotify, true) ? "" : "; other clients' changes raise no inotify event here");
  }
  // Said only when some directories go unwatched (max_watches=, or the
  // kernel's own limit): changes there wait for the periodic rescan.
  if (j.contains("last_scan") && j["last_scan"].is_object()) {
    const auto& scan = j["last_scan"];
    const uint64_t dirs = scan.value("directories", uint64_t{0}), watched = scan.value("watched_directories", dirs);
    if (watched < dirs) {
      std::printf("watches      %llu of %llu directories; changes in the others are seen by the periodic rescan "
                  "only (max_watches=, fs.inotify.max_user_watches)\n",
                  static_cast<unsigned long long>(watched), static_cast<unsigned long long>(dirs));
    }
  }
  if (j.contains(kManifests)) {
    const auto& m = j[kManifests];
    const std::string signer = m.value(kSigningKey, std::string());
    std::printf("manifests    %s: records used %llu, ignored %llu, published %llu, withheld %llu (not every user "
                "may read or find them), distrusted %llu; %zu trusted key(s)%s%s\n",
                m.value(kManifestDir, std::string("?")).c_str(), m.value(kRecordsUsed, 0ull),
                m.value(kRecordsIgnored, 0ull), m.value(kRecordsPublished, 0ull),
                m.value("records_withheld", 0ull), m.value(kRecordsDistrusted, 0ull),
                m.value(kTrustedKeys, nlohmann::json::array()).size(), signer.empty() ? "" : ", signing with ",
                signer.c_str());
  }
}

}  // namespace

int RunStatus(const MountArgs& args) {
  nlohmann::json j;
  if (auto done = QueryMount(args.path, protocol::kStatus, &j)) return *done;
  if (auto done = PrintJsonOrDecode(args.path, args.json, j, j)) return *done;
  const auto& opt = j[kOptions];
  const auto& c = j[kCounts];
  std::printf("source       %s\n", j[kSource].get<std::string>().c_str());
  std::printf("mountpoint   %s (daemon pid %d)\n", j[kMountpoint].get<std::string>().c_str(), j[kPid].get<int>());
  if (j.contains(kDaemon)) {
    const auto& d = j[kDaemon];
    std::printf("daemon       %s, started %s, %llu restart(s), last exit: %s%s\n",
                d.value(kVersion, std::string("?")).c_str(), When(d.value(kStartedAt, int64_t{0})).c_str(),
                static_cast<unsigned long long>(d.value(kRestarts, uint64_t{0})),
                d.value(kLastExit, std::string("none")).c_str(),
                d.value(kSupervised, false)
                    ? (", supervisor pid " + std::to_string(d.value(kSupervisorPid, 0))).c_str()
                    : ", no supervisor");
  }
  std::printf("state        %s (index %s)\n", j[kStateDir].get<std::string>().c_str(),
              j[kIndex].get<std::string>().c_str());
  PrintFleetLines(j);
  std::printf("options      rescan=%g settle=%g symlinks=%s threads=%u readahead=%s%s log=%s log_file=%s\n",
              opt[kOptionRescan].get<double>(), opt[kOptionSettle].get<double>(),
              opt[kOptionSymlinks].get<std::string>().c_str(),
              opt[kOptionThreads].get<unsigned>(), FormatBytes(opt[kOptionReadahead].get<uint64_t>()).c_str(),
              opt[kOptionAllowOther].get<bool>() ? " allow_other" : "", opt[kOptionLog].get<std::string>().c_str(),
              opt.value(kOptionLogFile, std::string("?")).c_str());
  const auto& cache = j[kCache];
  std::printf("cache        host %s (whole files) + %s (chunks), fill=%s, depth %u%s\n",
              FormatBytes(cache[kTierHost].get<uint64_t>()).c_str(),
              FormatBytes(cache[kTierChunks].get<uint64_t>()).c_str(),
              opt[kOptionFill].get<std::string>().c_str(), opt[kOptionFillDepth].get<unsigned>(),
              cache[kPinnedMemory].get<bool>() ? "" : ", memory not locked");
  std::printf("passthrough  %s: %s\n", j[kPassthrough][kMode].get<std::string>().c_str(),
              j[kPassthrough][kReason].get<std::string>().c_str());
  if (const uint64_t n = j.value("callers_without_groups", uint64_t{0}); n > 0) {
    std::printf("access       %llu decision(s) without the caller's supplementary groups, granting only what "
                "every set of groups would; the daemon's log says why\n",
                static_cast<unsigned long long>(n));
  }
  std::printf("checkpoints  %zu exposed, %zu indexing, %zu pending, %zu invalid\n", c[kStateExposed].get<size_t>(),
              c[kStateIndexing].get<size_t>(), c[kStatePending].get<size_t>(), c[kStateInvalid].get<size_t>());
  for (const auto& cp : j[kCheckpoints]) {
    const std::string state = cp[kState];
    if (state == kStateExposed) continue;
    std::printf("\n%-9s %s", state.c_str(), cp[kPath].get<std::string>().c_str());
    if (state == kStateIndexing) {
      const uint64_t done = cp.value(kBytesDone, uint64_t{0}), total = cp.value(kBytesTotal, uint64_t{0});
      std::printf("  %s / %s", FormatBytes(done).c_str(), FormatBytes(total).c_str());
    }
    for (const auto& f : cp.value(kHashing, nlohmann::json::array())) {
      std::printf("\n          hashing %s  %s / %s", f.value(kPath, std::string("(a file in a private directory)")).c_str(),
                  FormatBytes(f.value(kBytesDone, uint64_t{0})).c_str(), FormatBytes(f.value(kSize, uint64_t{0})).c_str());
    }
    if (cp.contains(kReason)) std::printf("\n          %s", cp[kReason].get<std::string>().c_str());
    if (cp.value("revalidating", false)) {
      std::printf("\n          serving %s until it is verified again", cp.value(kName, std::string("?")).c_str());
    }
  }
  std::printf("\n");
  return kExitOk;
}

int RunLs(const MountArgs& args) {
  nlohmann::json reply;
  MountPath where;
  if (auto done = QueryRowsUnder(args.path, protocol::kLs, &reply, &where)) return *done;
  if (auto done = PrintJsonOrDecode(args.path, args.json, reply, reply[kCheckpoints])) return *done;
  std::printf("%-71s %6s %11s  %-16s  %s\n", "DIGEST", "FILES", "SIZE", "INDEXED", "BY-NAME");
  for (const auto& row : reply[kCheckpoints]) {
    std::string by_name;
    for (const auto& p : row[kByName]) by_name += (by_name.empty() ? "" : ", ") + p.get<std::string>();
    std::printf("%-71s %6llu %11s  %-16s  %s\n", row[kName].get<std::string>().c_str(),
                static_cast<unsigned long long>(row[kFiles].get<uint64_t>()),
                FormatBytes(row[kSize].get<uint64_t>()).c_str(), When(row[kIndexedAt].get<int64_t>()).c_str(),
                by_name.c_str());
  }
  return kExitOk;
}

int RunRescan(const MountArgs& args) {
  auto where = LocateInMount(args.path);
  if (!where.ok()) {
    PrintError(where.status().message());
    return kExitFatal;
  }
  auto r = CallMount(where->first, protocol::Request(protocol::kRescan));
  if (!r.ok()) {
    PrintError(args.path + ": " + r.status().message());
    return kExitFailure;
  }
  if (args.json) std::printf("%s\n", r->dump().c_str());
  else std::printf("rescan of %s requested\n", where->first.c_str());
  return kExitOk;
}

}  // namespace ckptfs::ctl
