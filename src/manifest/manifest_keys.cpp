#include "ckptfs/manifest_keys.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "ckptfs/hashes.h"

namespace ckptfs {

namespace {

constexpr size_t kEd25519PublicBytes = 32;
constexpr size_t kEd25519SignatureBytes = 64;

EvpKey Own(EVP_PKEY* key) { return EvpKey(key, EVP_PKEY_free); }

// The reason OpenSSL gives for its last failure, and clears its queue.
std::string OpensslReason() {
  const unsigned long err = ERR_get_error();
  ERR_clear_error();
  if (err == 0) return "no reason given by OpenSSL";
  char buf[256];
  ERR_error_string_n(err, buf, sizeof buf);
  return buf;
}

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno("cannot open " + path, errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::FromErrno("cannot read " + path, errno);
  return ss.str();
}

using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

// A read-only BIO over `text`, which must outlive it (no copy is made).
BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  return len > 0 ? std::string(data, static_cast<size_t>(len)) : std::string();
}

}  // namespace

std::string KeyIdOf(EVP_PKEY* key) {
  if (key == nullptr || EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) return "";
  std::array<uint8_t, kEd25519PublicBytes> raw{};
  size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(key, raw.data(), &len) != 1 || len != raw.size()) return "";
  return ToHex(raw);
}

Result<SigningKey> SigningKey::Generate() {
  EVP_PKEY* raw = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (raw == nullptr) return Status::Error("cannot generate an Ed25519 key: " + OpensslReason());
  EvpKey key = Own(raw);
  std::string id = KeyIdOf(key.get());
  return SigningKey(std::move(key), std::move(id));
}

Result<SigningKey> SigningKey::Load(const std::string& path, std::string* loose_mode_warning) {
  auto text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  struct stat st {};
  if (loose_mode_warning != nullptr && ::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    *loose_mode_warning = "signing key " + path + " is readable by group or others (mode " + mode + "); chmod 600 it";
  }
  BioPtr bio = MemoryBio(*text);
  EVP_PKEY* raw = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (raw == nullptr) return Status::Error(path + ": not a PEM private key (" + OpensslReason() + ")");
  EvpKey key = Own(raw);
  std::string id = KeyIdOf(key.get());
  if (id.empty()) return Status::Error(path + ": not an Ed25519 key (make one with ckptfsctl keygen)");
  return SigningKey(std::move(key), std::move(id));
}

Result<std::string> SigningKey::Sign(std::string_view message) const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  std::string sig(kEd25519SignatureBytes, '\0');
  size_t len = sig.size();
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_.get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      len != kEd25519SignatureBytes) {
    return Status::Error("cannot sign with key " + key_id_ + ": " + OpensslReason());
  }
  return sig;
}

std::string SigningKey::PrivatePem() const {
  BioPtr bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PrivateKey(bio.get(), key_.get(), nullptr, nullptr, 0, nullptr, nullptr);
  return BioText(bio.get());
}

std::string SigningKey::PublicPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PUBKEY(bio.get(), key_.get());
  return BioText(bio.get());
}

Result<Keyring> Keyring::Load(const std::string& path) {
  auto text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  constexpr std::string_view kBegin = "-----BEGIN ", kPublic = "-----BEGIN PUBLIC KEY-----",
                             kEnd = "-----END PUBLIC KEY-----";
  Keyring ring;
  size_t pos = 0;
  for (int n = 1; (pos = text->find(kBegin, pos)) != std::string::npos; ++n) {
    // One block at a time, so that the text around blocks can be comments
    // and a block of another kind is named as such.
    if (text->compare(pos, kPublic.size(), kPublic) != 0) {
      return Status::Error(path + ": block " + std::to_string(n) + " is not a PUBLIC KEY (" +
                           text->substr(pos, text->find('\n', pos) - pos) + "); give the public keys (KEY.pub)");
    }
    const size_t end = text->find(kEnd, pos);
    if (end == std::string::npos) return Status::Error(path + ": public key " + std::to_string(n) + " has no END line");
    const std::string block = text->substr(pos, end + kEnd.size() - pos) + "\n";
    BioPtr bio = MemoryBio(block);  // reads `block` in place
    pos = end + kEnd.size();
    EVP_PKEY* raw = PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr);
    if (raw == nullptr) {
      return Status::Error(path + ": public key " + std::to_string(n) + " does not parse (" + OpensslReason() + ")");
    }
    EvpKey key = Own(raw);
    std::string id = KeyIdOf(key.get());
    if (id.empty()) return Status::Error(path + ": public key " + std::to_string(n) + " is not an Ed25519 key");
    ring.keys_[id] = std::move(key);
  }
  if (ring.keys_.empty()) return Status::Error(path + ": no PUBLIC KEY block (make keys with ckptfsctl keygen)");
  return ring;
}

std::vector<std::string> Keyring::key_ids() const {
  std::vector<std::string> out;
  for (const auto& [id, key] : keys_) out.push_back(id);
  return out;
}

Status Keyring::Verify(const std::string& key_id, std::string_view message, std::string_view signature) const {
  auto it = keys_.find(key_id);
  if (it == keys_.end()) return Status::NotFound("signed by key " + key_id + ", which is not in the keyring");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, it->second.get()) != 1) {
    return Status::Error("cannot verify with key " + key_id + ": " + OpensslReason());
  }
  const int rc = EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                                  signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                                  message.size());
  ERR_clear_error();
  if (rc != 1) return Status::Corrupt("bad signature by key " + key_id);
  return Status::Ok();
}

}  // namespace ckptfs
