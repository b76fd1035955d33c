// Whether a member is a safetensors file, by its name: what the stamped
// header form, the host tier's fill at indexing and the indexer's header
// sizes all decide on, so that they agree.
#pragma once

#include <string_view>

namespace ckptfs {

// "x.safetensors" is one; ".safetensors" alone (a hidden name) is not.
inline bool IsSafetensorsName(std::string_view path) {
  constexpr std::string_view kExt = ".safetensors";
  return path.size() > kExt.size() && path.substr(path.size() - kExt.size()) == kExt;
}

}  // namespace ckptfs
