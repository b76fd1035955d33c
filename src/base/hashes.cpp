#include "ckptfs/hashes.h"

#include <xxhash.h>

#include <stdexcept>

namespace ckptfs {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    // Only allocation failure gets here; there is nothing sensible to return.
    throw std::runtime_error("OpenSSL: cannot initialise SHA-256");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Update(const void* data, size_t len) { EVP_DigestUpdate(ctx_, data, len); }

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_, out.data(), &len);
  return out;
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
