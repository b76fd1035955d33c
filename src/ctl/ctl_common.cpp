#include <unistd.h>

#include <cstdio>

#include "progress.h"
#include "ctl.h"

namespace ckptfs::ctl {

void PrintError(const std::string& message) { std::fprintf(stderr, "ckptfsctl: %s\n", message.c_str()); }
void PrintWarning(const std::string& message) {
  std::fprintf(stderr, "ckptfsctl: warning: %s\n", message.c_str());
}

std::unique_ptr<Index> OpenIndexOrReport(const GlobalOptions& g) {
  std::vector<std::string> warnings;
  auto index = Index::Open(g.state_dir.empty() ? DefaultStateDir() : g.state_dir, &warnings);
  for (const auto& w : warnings) PrintWarning(w);
  if (!index.ok()) {
    PrintError(index.status().message() + " (choose another location with --state DIR)");
    return nullptr;
  }
  return std::move(*index);
}

bool ScanOrReport(const std::string& dir, const GlobalOptions& g, CatalogScan* scan) {
  CatalogOptions options;
  options.symlinks = *ParseSymlinkPolicy(g.symlinks);  // validated by the parser
  auto result = ScanSourceTree(dir, options);
  if (!result.ok()) {
    PrintError(result.status().message());
    return false;
  }
  *scan = std::move(*result);
  for (const auto& w : scan->warnings) PrintWarning(w);
  if (scan->checkpoints.empty()) {
    PrintError("no checkpoints found under " + dir +
               " (a checkpoint is a directory that directly holds a *.safetensors, *.bin, *.pt, *.pth, *.ckpt "
               "or *.gguf file)");
    return false;
  }
  return true;
}

bool KeepOnlyTheDirItself(const std::string& dir, CatalogScan* scan) {
  std::erase_if(scan->checkpoints, [](const CheckpointSource& cp) { return !cp.rel_path.empty(); });
  if (scan->checkpoints.empty()) {
    PrintError(dir + " is not itself a checkpoint (it holds no weight file directly)");
    return false;
  }
  return true;
}

IndexReport IndexWithProgress(Index* index, const CatalogScan& scan, const GlobalOptions& g, bool ignore_index,
                              const char* label, ManifestStore* manifests) {
  ProgressBar bar(label, !g.quiet && ::isatty(STDERR_FILENO) == 1);
  IndexerOptions options;
  options.threads = g.threads;
  options.ignore_index = ignore_index;
  options.manifests = manifests;
  options.on_plan = [&bar](uint64_t total) { bar.SetTotal(total); };
  options.on_bytes = [&bar](uint64_t n) { bar.Add(n); };
  return Indexer(index, options).Run(scan);
}

}  // namespace ckptfs::ctl
