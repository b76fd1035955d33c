// ckptfsctl digest: print the digest name of every checkpoint under each DIR.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ckptfs/progress.h"
#include "ctl.h"

namespace ckptfs::ctl {

namespace {

nlohmann::json CheckpointJson(const IndexedCheckpoint& cp) {
  nlohmann::json j;
  j["path"] = cp.abs_path;
  j["valid"] = !cp.error.has_value();
  if (cp.error) {
    j["error"] = *cp.error;
    j["unsettled"] = cp.unsettled;
    return j;
  }
  j["name"] = cp.name;
  j["digest"] = cp.name.substr(7);
  j["size"] = cp.total_size;
  j["files"] = nlohmann::json::array();
  for (const auto& f : cp.files) {
    j["files"].push_back({{"path", f.member.rel_path}, {"size", f.hashes.size}, {"sha256", ToHex(f.hashes.sha256)}});
  }
  return j;
}

}  // namespace

int RunDigest(const GlobalOptions& g, const DigestArgs& args) {
  auto index = OpenIndexOrReport(g);
  if (!index) return kExitFatal;

  int exit_code = kExitOk;
  std::vector<IndexedCheckpoint> results;
  IndexReport totals;
  for (const auto& dir : args.dirs) {
    CatalogScan scan;
    if (!ScanOrReport(dir, g, &scan)) {
      exit_code = kExitFatal;
      continue;
    }
    IndexReport report = IndexWithProgress(index.get(), scan, g, /*ignore_index=*/false, "hashing");
    for (const auto& w : report.warnings) PrintWarning(w);
    totals.files_hashed += report.files_hashed;
    totals.bytes_hashed += report.bytes_hashed;
    totals.files_from_index += report.files_from_index;
    for (auto& cp : report.checkpoints) {
      if (cp.error) {
        PrintError(std::string(cp.unsettled ? "checkpoint still changing, try again once it is quiet: "
                                            : "invalid checkpoint ") +
                   cp.abs_path + ": " + *cp.error);
        if (exit_code == kExitOk) exit_code = kExitFailure;
      }
      results.push_back(std::move(cp));
    }
  }

  size_t valid = 0;
  for (const auto& cp : results) valid += cp.error ? 0 : 1;
  if (args.json) {
    nlohmann::json out;
    out["checkpoints"] = nlohmann::json::array();
    for (const auto& cp : results) out["checkpoints"].push_back(CheckpointJson(cp));
    out["files_hashed"] = totals.files_hashed;
    out["bytes_hashed"] = totals.bytes_hashed;
    out["files_from_index"] = totals.files_from_index;
    std::printf("%s\n", out.dump(2).c_str());
  } else if (args.manifest) {
    // A single checkpoint prints its bare manifest, so that
    // `ckptfsctl digest --manifest DIR | sha256sum` recomputes the digest;
    // with several, a "# NAME  PATH" line heads each block.
    for (const auto& cp : results) {
      if (cp.error) continue;
      if (valid > 1) std::printf("# %s  %s\n", cp.name.c_str(), cp.abs_path.c_str());
      std::fwrite(cp.manifest.data(), 1, cp.manifest.size(), stdout);
    }
  } else {
    for (const auto& cp : results) {
      if (!cp.error) std::printf("%s  %s\n", cp.name.c_str(), cp.abs_path.c_str());
    }
  }
  if (args.verbose) {
    std::fprintf(stderr, "ckptfsctl: %zu checkpoint(s); hashed %llu file(s), %s; %llu file(s) from the index %s\n",
                 valid, static_cast<unsigned long long>(totals.files_hashed),
                 FormatBytes(totals.bytes_hashed).c_str(), static_cast<unsigned long long>(totals.files_from_index),
                 index->path().c_str());
  }
  return exit_code;
}

}  // namespace ckptfs::ctl
