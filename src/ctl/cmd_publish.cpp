// ckptfsctl publish: indexes a source tree once and publishes signed records
// of its files to a manifest store, so that nodes mounting the same tree
// with manifests=DIR hash nothing. Records already there (signed by a
// trusted key) are reused: a second run hashes only what changed.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ckptfs/manifest_store.h"
#include "progress.h"
#include "ctl.h"

namespace ckptfs::ctl {

namespace {

Result<std::unique_ptr<ManifestStore>> OpenStore(const PublishArgs& args) {
  auto key = SigningKey::Load(args.sign);
  if (!key.ok()) return Status::Error("--sign " + args.sign + ": " + key.status().message());
  Keyring trusted;
  if (!args.keys.empty()) {
    auto ring = Keyring::Load(args.keys);
    if (!ring.ok()) return Status::Error("--keys " + args.keys + ": " + ring.status().message());
    trusted = std::move(*ring);
  }
  return ManifestStore::Open(args.manifests, std::move(trusted), std::move(*key));
}

}  // namespace

int RunPublish(const GlobalOptions& g, const PublishArgs& args) {
  auto store = OpenStore(args);
  if (!store.ok()) {
    PrintError(store.status().message());
    return kExitFatal;
  }
  CatalogScan scan;
  if (!ScanOrReport(args.source, g, &scan)) return kExitFatal;
  IndexReport report = IndexWithProgress(nullptr, scan, g, /*ignore_index=*/false, "publishing", store->get());
  for (const auto& w : report.warnings) PrintWarning(w);

  int exit_code = kExitOk;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& cp : report.checkpoints) {
    if (cp.error) {
      PrintError(std::string(cp.unsettled ? "checkpoint still changing, publish again once it is quiet: "
                                          : "invalid checkpoint ") + cp.abs_path + ": " + *cp.error);
      exit_code = kExitFailure;
      continue;
    }
    if (!args.json) std::printf("%s  %s\n", cp.name.c_str(), cp.abs_path.c_str());
    list.push_back({{"path", cp.abs_path}, {"name", cp.name}, {"files", cp.files.size()}, {"size", cp.total_size}});
  }
  const ManifestStore::Stats s = (*store)->GetStats();
  if (args.json) {
    std::printf("%s\n", nlohmann::json{{"checkpoints", list},
                                       {"key", (*store)->signer_key_id()},
                                       {"files_hashed", report.files_hashed},
                                       {"bytes_hashed", report.bytes_hashed},
                                       {"files_with_records", report.files_from_manifests},
                                       {"records_written", s.published},
                                       {"records_already_there", s.already},
                                       {"records_ignored", s.ignored}}
                            .dump(2)
                            .c_str());
  } else if (!g.quiet) {
    std::fprintf(stderr,
                 "ckptfsctl: hashed %llu file(s), %s; %llu file(s) already had a trusted record; wrote %llu "
                 "record(s) to %s (key %s)\n",
                 static_cast<unsigned long long>(report.files_hashed), FormatBytes(report.bytes_hashed).c_str(),
                 static_cast<unsigned long long>(report.files_from_manifests),
                 static_cast<unsigned long long>(s.published), args.manifests.c_str(),
                 (*store)->signer_key_id().c_str());
  }
  return exit_code;
}

}  // namespace ckptfs::ctl
