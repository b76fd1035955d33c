// SHA256_Init and its kin are deprecated in OpenSSL 3 in favour of EVP,
// which does not show the state that ChunkChain needs. They stay in
// OpenSSL 3's API and run the same code (SHA instructions included).
#define OPENSSL_SUPPRESS_DEPRECATED
#include "ckptfs/hashes.h"

#include <xxhash.h>

#include <algorithm>

namespace ckptfs {

Sha256::Sha256() { SHA256_Init(&ctx_); }

void Sha256::Update(const void* data, size_t len) { SHA256_Update(&ctx_, data, len); }

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  SHA256_Final(out.data(), &ctx_);
  return out;
}

Sha256State Sha256::State() const {
  Sha256State out{};
  if (ctx_.num != 0) return out;  // not at a block boundary: all zeros, which no chunk reaches
  for (size_t i = 0; i < 8; ++i) {
    for (size_t b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(ctx_.h[i] >> (24 - 8 * b));
  }
  return out;
}

bool Sha256::Resume(const Sha256State& state, uint64_t bytes) {
  if (bytes % SHA256_CBLOCK != 0) return false;
  SHA256_Init(&ctx_);
  for (size_t i = 0; i < 8; ++i) {
    ctx_.h[i] = static_cast<SHA_LONG>(state[4 * i]) << 24 | static_cast<SHA_LONG>(state[4 * i + 1]) << 16 |
                static_cast<SHA_LONG>(state[4 * i + 2]) << 8 | static_cast<SHA_LONG>(state[4 * i + 3]);
  }
  // The message length in bits, split as OpenSSL keeps it.
  const uint64_t bits = bytes * 8;
  ctx_.Nl = static_cast<SHA_LONG>(bits);
  ctx_.Nh = static_cast<SHA_LONG>(bits >> 32);
  return true;
}

bool ChunkFitsChain(const Sha256Digest& sha256, uint64_t size, const ChunkChain& chain, uint64_t index,
                    const void* data, size_t len) {
  const uint64_t chunks = ChunkCount(size);
  if (index >= chunks || chain.size() + 1 != chunks) return false;
  if (len != std::min<uint64_t>(kChunkSize, size - index * kChunkSize)) return false;
  Sha256 h;
  if (index > 0 && !h.Resume(chain[index - 1], index * kChunkSize)) return false;
  h.Update(data, len);
  return index + 1 < chunks ? h.State() == chain[index] : h.Finish() == sha256;
}

Sha256Digest Sha256Of(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes.data(), bytes.size());
  return h.Finish();
}

ChunkHash HashChunk(const void* data, size_t len) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(data, len));
  ChunkHash out;
  static_assert(sizeof(canon.digest) == out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = canon.digest[i];
  return out;
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool FromHex(std::string_view hex, std::span<uint8_t> out) {
  if (hex.size() != out.size() * 2) return false;
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexValue(hex[2 * i]);
    int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace ckptfs
