// The checkpoint digest, version 1 (DESIGN.md section 1, a public contract):
// the SHA-256 of the canonical manifest, one line per member in ascending byte
// order of its relative path:
//     <64 lowercase hex of the file's SHA-256><two spaces><relative path>\n
// which is exactly what `sha256sum` prints for those paths.
#pragma once

#include <string>
#include <vector>

#include "ckptfs/hashes.h"

namespace ckptfs {

struct ManifestEntry {
  std::string rel_path;
  Sha256Digest sha256{};
  uint64_t size = 0;
};

// `entries` must be sorted by rel_path (byte order) and free of duplicates.
std::string CanonicalManifest(const std::vector<ManifestEntry>& entries);

// "sha256-<64 lowercase hex>" of the manifest.
std::string CheckpointName(const std::string& canonical_manifest);

// True for a well-formed "sha256-<64 lowercase hex>".
bool IsCheckpointName(const std::string& name);

}  // namespace ckptfs
