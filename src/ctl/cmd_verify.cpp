// ckptfsctl verify: re-read every member, ignoring the index, and report each
// file whose content no longer matches what the index recorded for it.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ctl.h"

namespace ckptfs::ctl {

namespace {

enum class Verdict { kMatch, kChangedSameContent, kMismatch, kChangedSinceIndexed, kNotIndexed, kIndexError };

const char* VerdictWord(Verdict v) {
  switch (v) {
    case Verdict::kMatch: return "ok";
    case Verdict::kChangedSameContent: return "ok";
    case Verdict::kMismatch: return "MISMATCH";
    case Verdict::kChangedSinceIndexed: return "CHANGED";
    case Verdict::kNotIndexed: return "NOT-INDEXED";
    case Verdict::kIndexError: return "INDEX-ERROR";
  }
  return "?";
}

struct FileVerdict {
  std::string path;
  Verdict verdict;
  std::string detail;
};

FileVerdict Judge(Index& index, const std::string& display_path, const IndexedFile& f) {
  auto found = index.LookupInode(f.member.stamp.dev, f.member.stamp.ino);
  if (!found.ok()) return {display_path, Verdict::kIndexError, found.status().message()};
  auto& stored = *found;
  if (!stored) return {display_path, Verdict::kNotIndexed, "not in the index; run ckptfsctl digest first"};
  // A row without a chain (written before it) is judged on what it has.
  const bool same_chain = !stored->hashes.chain || stored->hashes.chain == f.hashes.chain;
  const bool same_content =
      stored->hashes.sha256 == f.hashes.sha256 && stored->hashes.chunks == f.hashes.chunks && same_chain;
  const bool same_stamp = stored->stamp == f.member.stamp;
  if (same_content) {
    return {display_path, same_stamp ? Verdict::kMatch : Verdict::kChangedSameContent, ""};
  }
  std::string detail = "index has sha256 " + ToHex(stored->hashes.sha256) + ", file now has " + ToHex(f.hashes.sha256);
  if (stored->hashes.sha256 == f.hashes.sha256) {
    detail = stored->hashes.chunks != f.hashes.chunks ? "chunk table in the index differs from the file's"
                                                      : "SHA-256 chain in the index differs from the file's";
  }
  if (same_stamp) {
    return {display_path, Verdict::kMismatch, "content changed although its stamp did not (" + detail + ")"};
  }
  return {display_path, Verdict::kChangedSinceIndexed, "modified since it was indexed (" + detail + ")"};
}

}  // namespace

int RunVerify(const GlobalOptions& g, const VerifyArgs& args) {
  auto index = OpenIndexOrReport(g);
  if (!index) return kExitFatal;

  int exit_code = kExitOk;
  size_t files = 0, bad = 0;
  nlohmann::json json_out = nlohmann::json::array();
  for (const auto& dir : args.dirs) {
    CatalogScan scan;
    if (!ScanOrReport(dir, g, &scan)) {
      exit_code = kExitFatal;
      continue;
    }
    IndexReport report = IndexWithProgress(index.get(), scan, g, /*ignore_index=*/true, "verifying");
    for (const auto& cp : report.checkpoints) {
      nlohmann::json jcp{{"path", cp.abs_path}};
      if (cp.error) {
        PrintError("cannot verify " + cp.abs_path + ": " + *cp.error);
        jcp["error"] = *cp.error;
        json_out.push_back(jcp);
        if (exit_code == kExitOk) exit_code = kExitFailure;
        continue;
      }
      jcp["name"] = cp.name;
      auto looked_up = index->LookupSource(scan.real_root, cp.rel_path);
      if (!looked_up.ok()) PrintError(looked_up.status().message());
      const std::optional<std::string> recorded = looked_up.ok() ? *looked_up : std::nullopt;
      jcp["recorded_name"] = recorded ? nlohmann::json(*recorded) : nlohmann::json(nullptr);
      jcp["files"] = nlohmann::json::array();
      for (const auto& f : cp.files) {
        ++files;
        FileVerdict v = Judge(*index, cp.abs_path + "/" + f.member.rel_path, f);
        const bool ok = v.verdict == Verdict::kMatch || v.verdict == Verdict::kChangedSameContent;
        if (!ok) {
          ++bad;
          if (exit_code == kExitOk) exit_code = kExitFailure;
          if (!args.json) std::printf("%-11s %s: %s\n", VerdictWord(v.verdict), v.path.c_str(), v.detail.c_str());
        }
        jcp["files"].push_back({{"path", f.member.rel_path}, {"status", VerdictWord(v.verdict)}, {"detail", v.detail}});
      }
      if (!args.json) {
        std::printf("%s  %s", cp.name.c_str(), cp.abs_path.c_str());
        if (recorded && *recorded != cp.name) std::printf("  (index recorded %s)", recorded->c_str());
        std::printf("\n");
      }
      json_out.push_back(jcp);
    }
  }
  if (args.json) {
    std::printf("%s\n", nlohmann::json{{"checkpoints", json_out}, {"files", files}, {"failed", bad}}.dump(2).c_str());
  } else {
    std::fprintf(stderr, "ckptfsctl: verified %zu file(s): %zu match the index, %zu do not\n", files, files - bad, bad);
  }
  return exit_code;
}

}  // namespace ckptfs::ctl
