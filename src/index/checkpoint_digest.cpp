#include "ckptfs/checkpoint_digest.h"

namespace ckptfs {

std::string CanonicalManifest(const std::vector<ManifestEntry>& entries) {
  std::string out;
  for (const auto& e : entries) {
    out += ToHex(e.sha256);
    out += "  ";
    out += e.rel_path;
    out += '\n';
  }
  return out;
}

std::string CheckpointName(const std::string& canonical_manifest) {
  return "sha256-" + ToHex(Sha256Of(canonical_manifest));
}

bool IsCheckpointName(const std::string& name) {
  static constexpr std::string_view kPrefix = "sha256-";
  if (name.size() != kPrefix.size() + 64 || name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace ckptfs
