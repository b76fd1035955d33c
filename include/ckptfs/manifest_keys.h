// Ed25519 keys for manifest records (OpenSSL EVP, EVP_PKEY_ED25519).
//
// Files are OpenSSL's own PEM forms, so `openssl genpkey -algorithm ed25519`
// and `openssl pkey -pubout` make and read the same files:
//   private key  "-----BEGIN PRIVATE KEY-----" (PKCS#8), mode 0600
//   keyring      one or more "-----BEGIN PUBLIC KEY-----" blocks (SPKI),
//                concatenated; text outside the blocks is ignored (comments)
// A key is named by its key id: the 64 hex digits of its raw 32-byte public
// key, which every record carries next to its signature.
#pragma once

#include <openssl/evp.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/status.h"

namespace ckptfs {

using EvpKey = std::shared_ptr<EVP_PKEY>;  // freed with EVP_PKEY_free

class SigningKey {
 public:
  static Result<SigningKey> Generate();
  // Reads a PEM private key; fails unless it is an Ed25519 key. Sets
  // *loose_mode_warning when the file is readable by group or others.
  static Result<SigningKey> Load(const std::string& path, std::string* loose_mode_warning = nullptr);

  const std::string& key_id() const { return key_id_; }
  // The 64-byte Ed25519 signature of `message` (Ed25519 hashes internally:
  // EVP_DigestSign with no digest).
  Result<std::string> Sign(std::string_view message) const;
  std::string PrivatePem() const;
  std::string PublicPem() const;
  EvpKey key() const { return key_; }

 private:
  SigningKey(EvpKey key, std::string key_id) : key_(std::move(key)), key_id_(std::move(key_id)) {}
  EvpKey key_;
  std::string key_id_;
};

// The public keys a node trusts.
class Keyring {
 public:
  // Every PUBLIC KEY block of the file; fails on a block that is not an
  // Ed25519 key and on a file with none.
  static Result<Keyring> Load(const std::string& path);
  // Trusts the public half of `key` (a node trusts what it signs itself).
  void Add(const SigningKey& key) { keys_[key.key_id()] = key.key(); }

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }
  std::vector<std::string> key_ids() const;
  bool Has(const std::string& key_id) const { return keys_.count(key_id) != 0; }
  // Ok when `signature` is `key_id`'s valid signature of `message`; NotFound
  // for a key not in the ring; Corrupt for a bad signature.
  Status Verify(const std::string& key_id, std::string_view message, std::string_view signature) const;

 private:
  std::map<std::string, EvpKey> keys_;
};

// The key id (hex raw public key) of an Ed25519 key; empty for another type.
std::string KeyIdOf(EVP_PKEY* key);

}  // namespace ckptfs
