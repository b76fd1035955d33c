// The safetensors header: parsing it under the format's rules, and stamping
// it with the checkpoint's identity (mount option stamp_headers).
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// UTF-8 JSON, then the tensor data. The parser refuses anything that breaks
// the format's rules and says which rule, so a file that breaks one is served
// unstamped rather than guessed at.
//
// Headers come from any file in SRC, so parsing must survive hostile ones:
// it takes time linear in N (up to 100 MB), bounds the nesting depth before
// any recursive code sees the JSON, and refuses a key repeated in an object.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ckptfs/status.h"

namespace ckptfs {

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;
// Deepest nesting of arrays and objects a header may have, the top object
// counting 1. The format needs 3 (top object, tensor, shape); extra keys
// may nest further, up to about what the Rust reference parser allows
// (serde_json's recursion limit is 128). The bound keeps nlohmann's
// recursive copy, compare and dump far from the end of any thread's stack.
inline constexpr size_t kMaxSafetensorsHeaderDepth = 128;

struct SafetensorsHeader {
  uint64_t header_len = 0;        // N
  // The header, in its original key order. ordered_json looks keys up by a
  // linear scan: fine on a tensor's few keys, not in a loop over the top level.
  nlohmann::ordered_json json;
  uint64_t data_len = 0;          // bytes after the header
  size_t tensors = 0;
};

// Bytes of one element of `dtype`, or 0 for an unknown dtype.
uint64_t DtypeSize(std::string_view dtype);

// Parses header JSON text in time linear in its length, keeping key order.
// Refuses text that is not UTF-8 JSON, nests deeper than
// kMaxSafetensorsHeaderDepth, or repeats a key within one object (readers
// disagree on which value wins, so two of them could see different tensors).
Result<nlohmann::ordered_json> ParseHeaderJson(std::string_view text);

// Parses the header of a file of `file_size` bytes, given its first bytes
// `prefix` (at least 8, and 8 + N once N is known; pass what you have and
// call again with more if the status says so).
//   - kNeedMore: `prefix` is too short; need_bytes says how many are needed.
//   - kError: the file breaks a rule; the message names it.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size,
                                                 uint64_t* need_bytes = nullptr);

// The first `len` bytes of a file (fewer only at its end), for reading no
// more of a header than parsing asks for.
using PrefixReader = std::function<Result<std::string>(uint64_t len)>;

// Reads and parses the header of a file of `file_size` bytes through
// `read_prefix`, asking for 8 bytes and then for 8 + N. A header that breaks
// a format rule gives nullopt, with the rule in *why; only a failed read is
// an error.
Result<std::optional<SafetensorsHeader>> ReadSafetensorsHeader(uint64_t file_size, const PrefixReader& read_prefix,
                                                               std::string* why);

// The stamped header for a file of checkpoint `checkpoint_name`
// ("sha256-<hex>") whose own SHA-256 is `file_sha256_hex`: the original JSON,
// key order and content kept, with "ckptfs.checkpoint" and "ckptfs.sha256"
// set in __metadata__ (created if absent), padded with spaces so that its
// length differs from the original's by a multiple of 8 (the data section
// keeps its alignment). Returns the 8-byte length plus the JSON, written as
// nlohmann's dump() writes it, in time linear in the header's size.
std::string StampedHeaderBytes(const SafetensorsHeader& header, const std::string& checkpoint_name,
                               const std::string& file_sha256_hex);

// The size of a file of `file_size` bytes with its header stamped: the same
// for every checkpoint and file hash, whose hex forms have fixed lengths, so
// it can be computed once, at indexing, and stored.
uint64_t StampedFileSize(const SafetensorsHeader& header, uint64_t file_size);

}  // namespace ckptfs
