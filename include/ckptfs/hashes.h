// The two hashes ckptfs keeps for every file: the plain SHA-256 of its bytes
// (what names content; equal to sha256sum's output) and XXH3-128 of every
// 4 MiB chunk (what checks a chunk read back later, cheaply).
#pragma once

#include <openssl/evp.h>

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

// Incremental SHA-256 through OpenSSL EVP, which picks the CPU's SHA
// instructions when it has them.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t len);
  Sha256Digest Finish();

 private:
  EVP_MD_CTX* ctx_;
};

Sha256Digest Sha256Of(std::string_view bytes);
ChunkHash HashChunk(const void* data, size_t len);

// Number of chunks of a file of `size` bytes (an empty file has none).
inline uint64_t ChunkCount(uint64_t size) { return (size + kChunkSize - 1) / kChunkSize; }

// What the indexer learns about one file in its single read pass.
struct FileHashes {
  uint64_t size = 0;
  Sha256Digest sha256{};
  std::vector<ChunkHash> chunks;  // ChunkCount(size) entries
};

std::string ToHex(std::span<const uint8_t> bytes);
// Parses exactly out.size()*2 hex digits (either case); false on anything else.
bool FromHex(std::string_view hex, std::span<uint8_t> out);

}  // namespace ckptfs
