// ckptfsctl status / ls / rescan: queries and requests to a running mount.
#include <cstdio>
#include <ctime>

#include "ckptfs/control_protocol.h"
#include "ckptfs/json_path.h"
#include "ckptfs/progress.h"
#include "ctl.h"

namespace ckptfs::ctl {

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
  if (j.contains("source_filesystem")) {
    const auto& fs = j["source_filesystem"];
    std::printf("source fs    %s: changes found by %s", fs.value("type", std::string("?")).c_str(),
                fs.value("changes_found_by", std::string("?")).c_str());
    if (fs.value("rescan", 0.0) > 0) std::printf(" (rescan every %g s)", fs.value("rescan", 0.0));
    std::printf("%s\n", fs.value("inotify", true) ? "" : "; other clients' changes raise no inotify event here");
  }
  if (j.contains("manifests")) {
    const auto& m = j["manifests"];
    const std::string signer = m.value("signing_key", std::string());
    std::printf("manifests    %s: records used %llu, ignored %llu, published %llu, distrusted %llu; %zu trusted "
                "key(s)%s%s\n",
                m.value("dir", std::string("?")).c_str(), m.value("records_used", 0ull),
                m.value("records_ignored", 0ull), m.value("records_published", 0ull),
                m.value("records_distrusted", 0ull), m.value("trusted_keys", nlohmann::json::array()).size(),
                signer.empty() ? "" : ", signing with ", signer.c_str());
  }
}

}  // namespace

int RunStatus(const MountArgs& args) {
  nlohmann::json j;
  if (auto done = QueryMount(args.path, protocol::kStatus, &j)) return *done;
  if (auto done = PrintJsonOrDecode(args.path, args.json, j, j)) return *done;
  const auto& opt = j["options"];
  const auto& c = j["counts"];
  std::printf("source       %s\n", j["source"].get<std::string>().c_str());
  std::printf("mountpoint   %s (daemon pid %d)\n", j["mountpoint"].get<std::string>().c_str(), j["pid"].get<int>());
  if (j.contains("daemon")) {
    const auto& d = j["daemon"];
    std::printf("daemon       %s, started %s, %llu restart(s), last exit: %s%s\n",
                d.value("version", std::string("?")).c_str(), When(d.value("started_at", int64_t{0})).c_str(),
                static_cast<unsigned long long>(d.value("restarts", uint64_t{0})),
                d.value("last_exit", std::string("none")).c_str(),
                d.value("supervised", false)
                    ? (", supervisor pid " + std::to_string(d.value("supervisor_pid", 0))).c_str()
                    : ", no supervisor");
  }
  std::printf("state        %s (index %s)\n", j["state_dir"].get<std::string>().c_str(),
              j["index"].get<std::string>().c_str());
  PrintFleetLines(j);
  std::printf("options      rescan=%g settle=%g symlinks=%s threads=%u readahead=%s%s log=%s log_file=%s\n",
              opt["rescan"].get<double>(), opt["settle"].get<double>(), opt["symlinks"].get<std::string>().c_str(),
              opt["threads"].get<unsigned>(), FormatBytes(opt["readahead"].get<uint64_t>()).c_str(),
              opt["allow_other"].get<bool>() ? " allow_other" : "", opt["log"].get<std::string>().c_str(),
              opt.value("log_file", std::string("?")).c_str());
  const auto& cache = j["cache"];
  std::printf("cache        host %s (whole files) + %s (chunks), fill=%s, depth %u%s\n",
              FormatBytes(cache["host"].get<uint64_t>()).c_str(), FormatBytes(cache["chunks"].get<uint64_t>()).c_str(),
              opt["fill"].get<std::string>().c_str(), opt["fill_depth"].get<unsigned>(),
              cache["pinned_memory"].get<bool>() ? "" : ", memory not locked");
  std::printf("passthrough  %s: %s\n", j["passthrough"]["mode"].get<std::string>().c_str(),
              j["passthrough"]["reason"].get<std::string>().c_str());
  std::printf("checkpoints  %zu exposed, %zu indexing, %zu pending, %zu invalid\n", c["exposed"].get<size_t>(),
              c["indexing"].get<size_t>(), c["pending"].get<size_t>(), c["invalid"].get<size_t>());
  for (const auto& cp : j["checkpoints"]) {
    const std::string state = cp["state"];
    if (state == "exposed") continue;
    std::printf("\n%-9s %s", state.c_str(), cp["path"].get<std::string>().c_str());
    if (state == "indexing") {
      const uint64_t done = cp.value("bytes_done", uint64_t{0}), total = cp.value("bytes_total", uint64_t{0});
      std::printf("  %s / %s", FormatBytes(done).c_str(), FormatBytes(total).c_str());
    }
    if (cp.contains("reason")) std::printf("\n          %s", cp["reason"].get<std::string>().c_str());
  }
  std::printf("\n");
  return kExitOk;
}

int RunLs(const MountArgs& args) {
  nlohmann::json reply;
  MountPath where;
  if (auto done = QueryRowsUnder(args.path, protocol::kLs, &reply, &where)) return *done;
  if (auto done = PrintJsonOrDecode(args.path, args.json, reply, reply["checkpoints"])) return *done;
  std::printf("%-71s %6s %11s  %-16s  %s\n", "DIGEST", "FILES", "SIZE", "INDEXED", "BY-NAME");
  for (const auto& row : reply["checkpoints"]) {
    std::string by_name;
    for (const auto& p : row["by_name"]) by_name += (by_name.empty() ? "" : ", ") + p.get<std::string>();
    std::printf("%-71s %6llu %11s  %-16s  %s\n", row["name"].get<std::string>().c_str(),
                static_cast<unsigned long long>(row["files"].get<uint64_t>()),
                FormatBytes(row["size"].get<uint64_t>()).c_str(), When(row["indexed_at"].get<int64_t>()).c_str(),
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
