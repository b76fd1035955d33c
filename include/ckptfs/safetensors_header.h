// The safetensors header: parsing it under the format's rules, and stamping
// it with the checkpoint's identity (mount option stamp_headers).
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// UTF-8 JSON, then the tensor data. The parser refuses anything that breaks
// the format's rules and says which rule, so a file that breaks one is served
// unstamped rather than guessed at.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ckptfs/status.h"

namespace ckptfs {

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsHeader {
  uint64_t header_len = 0;        // N
  nlohmann::ordered_json json;    // the header, in its original key order
  uint64_t data_len = 0;          // bytes after the header
  size_t tensors = 0;
};

// Bytes of one element of `dtype`, or 0 for an unknown dtype.
uint64_t DtypeSize(std::string_view dtype);

// Parses the header of a file of `file_size` bytes, given its first bytes
// `prefix` (at least 8, and 8 + N once N is known; pass what you have and
// call again with more if the status says so).
//   - kNeedMore: `prefix` is too short; need_bytes says how many are needed.
//   - kError: the file breaks a rule; the message names it.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size,
                                                 uint64_t* need_bytes = nullptr);

// The stamped header for a file of checkpoint `checkpoint_name`
// ("sha256-<hex>") whose own SHA-256 is `file_sha256_hex`: the original JSON,
// key order and content kept, with "ckptfs.checkpoint" and "ckptfs.sha256"
// set in __metadata__ (created if absent), padded with spaces so that its
// length differs from the original's by a multiple of 8 (the data section
// keeps its alignment). Returns the 8-byte length plus the JSON.
std::string StampedHeaderBytes(const SafetensorsHeader& header, const std::string& checkpoint_name,
                               const std::string& file_sha256_hex);

}  // namespace ckptfs
