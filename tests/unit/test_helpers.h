// Small helpers shared by the unit tests: index a tree through the library
// exactly as ckptfsctl does, and recompute digests with coreutils.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ckptfs/catalog.h"
#include "ckptfs/index.h"
#include "ckptfs/indexer.h"
#include "test_tree.h"

namespace ckptfs::testing {

inline CatalogScan ScanOk(const std::string& root, SymlinkPolicy policy = SymlinkPolicy::kContained) {
  CatalogOptions options;
  options.symlinks = policy;
  auto scan = ScanSourceTree(root, options);
  EXPECT_TRUE(scan.ok()) << scan.status().message();
  return scan.ok() ? std::move(*scan) : CatalogScan{};
}

inline std::unique_ptr<Index> OpenIndex(const std::string& state_dir) {
  std::vector<std::string> warnings;
  auto index = Index::Open(state_dir, &warnings);
  EXPECT_TRUE(index.ok()) << index.status().message();
  return index.ok() ? std::move(*index) : nullptr;
}

// rel_path -> checkpoint, or a failed test.
inline const IndexedCheckpoint& Find(const IndexReport& report, const std::string& rel_path) {
  for (const auto& cp : report.checkpoints) {
    if (cp.rel_path == rel_path) return cp;
  }
  ADD_FAILURE() << "no checkpoint " << rel_path;
  static IndexedCheckpoint none;
  return none;
}

}  // namespace ckptfs::testing
