// ckptfsctl digest: print the digest name of every checkpoint under each DIR.
#include <cstdio>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>

#include "progress.h"
#include "ckptfs/safetensors_header.h"
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

// The first 8 + N bytes of the safetensors file at `path` (fewer if the
// file breaks the format: the parser then says how).
Result<std::string> ReadHeaderPrefix(const std::string& path, uint64_t file_size) {
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (fp == nullptr) return Status::Error(std::strerror(errno));
  std::string buf(8, '\0');
  size_t got = std::fread(buf.data(), 1, 8, fp);
  buf.resize(got);
  uint64_t need = 0;
  auto h = ParseSafetensorsHeader(buf, file_size, &need);
  if (!h.ok() && h.status().code() == Status::Code::kNeedMore && need > buf.size()) {
    buf.resize(static_cast<size_t>(need));
    got = std::fread(buf.data() + 8, 1, static_cast<size_t>(need - 8), fp);
    buf.resize(8 + got);
  }
  std::fclose(fp);
  return buf;
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
    if (!ScanOrReport(dir, g, &scan) || (args.no_nested && !KeepOnlyTheDirItself(dir, &scan))) {
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

int RunDigestStamped(const GlobalOptions& g, const DigestArgs& args) {
  auto index = OpenIndexOrReport(g);
  if (!index) return kExitFatal;
  int exit_code = kExitOk;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& file : args.dirs) {
    // A safetensors file is a weight file, so the directory holding it is
    // its checkpoint.
    const auto slash = file.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : file.substr(0, slash));
    const std::string base = slash == std::string::npos ? file : file.substr(slash + 1);
    if (!IsWeightFileName(base) || base.size() < 12 || base.compare(base.size() - 12, 12, ".safetensors") != 0) {
      PrintError(file + ": not a *.safetensors file");
      exit_code = kExitFailure;
      continue;
    }
    CatalogScan scan;
    if (!ScanOrReport(dir, g, &scan) || !KeepOnlyTheDirItself(dir, &scan)) {
      exit_code = kExitFailure;
      continue;
    }
    IndexReport report = IndexWithProgress(index.get(), scan, g, false, "hashing");
    if (report.checkpoints.empty() || report.checkpoints[0].error) {
      PrintError("cannot digest " + dir + ": " +
                 (report.checkpoints.empty() ? std::string("not a checkpoint") : *report.checkpoints[0].error));
      exit_code = kExitFailure;
      continue;
    }
    const auto& cp = report.checkpoints[0];
    const IndexedFile* member = nullptr;
    for (const auto& f : cp.files) {
      if (f.member.rel_path == base) member = &f;
    }
    if (member == nullptr) {
      PrintError(file + ": not a member of checkpoint " + dir);
      exit_code = kExitFailure;
      continue;
    }
    auto prefix = ReadHeaderPrefix(member->member.open_path, member->hashes.size);
    if (!prefix.ok()) {
      PrintError(file + ": " + prefix.status().message());
      exit_code = kExitFailure;
      continue;
    }
    auto header = ParseSafetensorsHeader(*prefix, member->hashes.size);
    if (!header.ok()) {
      PrintError(file + ": " + header.status().message() + " (it is served unstamped)");
      exit_code = kExitFailure;
      continue;
    }
    const std::string stamped = StampedHeaderBytes(*header, cp.name, ToHex(member->hashes.sha256));
    // Read back with the header parser, not ordered_json::parse: that one
    // takes time quadratic in the number of keys.
    auto stamped_json = ParseHeaderJson(std::string_view(stamped).substr(8));
    if (!stamped_json.ok()) {
      PrintError(file + ": the stamped header does not parse: " + stamped_json.status().message());
      exit_code = kExitFailure;
      continue;
    }
    out.push_back({{"file", file},
                   {"checkpoint", cp.name},
                   {"sha256", ToHex(member->hashes.sha256)},
                   {"header_bytes", {{"source", 8 + header->header_len}, {"stamped", stamped.size()}}},
                   {"header", std::move(*stamped_json)}});
  }
  std::printf("%s\n", (out.size() == 1 ? out[0] : out).dump(2).c_str());
  return exit_code;
}

}  // namespace ckptfs::ctl
