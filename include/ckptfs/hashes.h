// The two hashes ckptfs keeps for every file: the plain SHA-256 of its bytes
// (what names content; equal to sha256sum's output) and XXH3-128 of every
// 4 MiB chunk (what checks a chunk read back later, cheaply).
#pragma once

#include <openssl/sha.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs {

inline constexpr uint64_t kChunkSize = 4ull << 20;

using Sha256Digest = std::array<uint8_t, 32>;
// XXH3-128 in its canonical (big-endian) byte form.
using ChunkHash = std::array<uint8_t, 16>;

// SHA-256's chaining value: its eight 32-bit state words, big-endian, as
// they stand after a whole number of 64-byte blocks.
using Sha256State = std::array<uint8_t, 32>;

// A file's SHA-256 chain: the state after each of its 4 MiB chunks but the
// last (ChunkCount(size) - 1 entries), taken in the very pass that computed
// its SHA-256. It lets one chunk be checked alone as strongly as the whole
// file's SHA-256 checks the file: chunk i must take the state from entry
// i-1 (the initial state for chunk 0) to entry i (for the last chunk: to
// the file's SHA-256 itself). Other bytes that did so would make the file,
// with only that chunk replaced, a second preimage of its SHA-256. A chain
// proves nothing of itself (only its last link meets the SHA-256), so it
// is trusted only where it was taken here, in the very pass that computed
// or matched the file's SHA-256 (the indexer, a whole-file proof), never
// from a manifest or any other hand.
using ChunkChain = std::vector<Sha256State>;

// Incremental SHA-256 through OpenSSL's SHA-256 (the CPU's SHA instructions
// when it has them), whose state can be read and set at block boundaries:
// EVP hides it, and the chain needs it.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t len);
  Sha256Digest Finish();

  // The state after the bytes so far, which must be a multiple of 64 (at
  // any other point: all zeros, which no chunk checked against it reaches).
  Sha256State State() const;
  // Goes on from `state`, the state after the first `bytes` bytes of a
  // message, as if those had just been hashed; false (and nothing changed)
  // when `bytes` is not a multiple of 64, where there is no such state.
  [[nodiscard]] bool Resume(const Sha256State& state, uint64_t bytes);

 private:
  SHA256_CTX ctx_;
};

Sha256Digest Sha256Of(std::string_view bytes);
ChunkHash HashChunk(const void* data, size_t len);

// Number of chunks of a file of `size` bytes (an empty file has none).
inline uint64_t ChunkCount(uint64_t size) { return (size + kChunkSize - 1) / kChunkSize; }

// Whether `data` (`len` bytes) is chunk `index` of the file of `size` bytes
// whose SHA-256 is `sha256` and whose chain is `chain` (see ChunkChain).
bool ChunkFitsChain(const Sha256Digest& sha256, uint64_t size, const ChunkChain& chain, uint64_t index,
                    const void* data, size_t len);

// What the indexer learns about one file in its single read pass.
struct FileHashes {
  uint64_t size = 0;
  Sha256Digest sha256{};
  std::vector<ChunkHash> chunks;  // ChunkCount(size) entries
  // Unknown (nullopt) where the hashes did not come from reading the bytes
  // here: a manifest's, or an index row older than the chain.
  std::optional<ChunkChain> chain;
};

std::string ToHex(std::span<const uint8_t> bytes);
// Parses exactly out.size()*2 hex digits (either case); false on anything else.
bool FromHex(std::string_view hex, std::span<uint8_t> out);

}  // namespace ckptfs
