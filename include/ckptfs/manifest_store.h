// ManifestStore: records of hashed files (manifest_record.h) shared between
// nodes through a directory on the shared filesystem that holds the source.
//
// Layout, so that no lookup ever lists a directory:
//
//   DIR/v1/<first 2 hex of K>/<K>.rec
//   K = hex SHA-256 of "ckptfs-record-key 1\0" PATH "\0" SIZE "\0" MTIME_SECONDS
//
// (PATH relative to SRC; the key holds whole seconds so that clients that
// see whole-second mtimes find the record too). A lookup is one open of a
// computed name; a miss is one failed lookup on the server.
//
// Records are immutable once renamed into place (atomic_file.h) and
// deterministic (Ed25519 signatures are), so nodes that publish the same file
// concurrently write byte-identical files and the last rename changes
// nothing. Only records signed by a key of the keyring are trusted; every
// other file at a record's name is ignored and the lookup says why.
//
// Whoever may write the store is not trusted with anything else: every path
// below DIR is resolved beneath DIR's descriptor with no symlink followed
// (open_beneath.h), for reads and writes alike, so that a link swapped in
// for v1/ or v1/<xx>/ cannot make a signing node (often root) create or
// read files elsewhere; a record is read only when it is a regular file of
// a size its file can have, and parsed strictly (manifest_record.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/manifest_keys.h"
#include "ckptfs/manifest_record.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

class ManifestStore {
 public:
  // `dir` must be an existing directory. With a signer, the signer's own
  // public key is trusted too.
  static Result<std::unique_ptr<ManifestStore>> Open(const std::string& dir, Keyring trusted,
                                                     std::optional<SigningKey> signer);

  const std::string& dir() const { return dir_; }
  const Keyring& keyring() const { return keyring_; }
  bool can_sign() const { return signer_.has_value(); }
  std::string signer_key_id() const { return signer_ ? signer_->key_id() : ""; }

  // Where the record of this version of this file lives.
  std::string RecordPath(const std::string& rel_path, const FileStamp& stamp) const;

  // The hashes of a trusted record that describes this file. NotFound (to be
  // passed over in silence): no record, or one this store was told not to
  // trust. Any other status: a record is there but was ignored; the message
  // names it and says why (torn, foreign, unsigned, unknown key, bad
  // signature, another file).
  Result<FileHashes> Lookup(const std::string& rel_path, const FileStamp& stamp);

  // Signs and writes the record of a file this node hashed itself, unless an
  // identical trusted record is already there. Fails without a signing key.
  Status Publish(const std::string& rel_path, const FileStamp& stamp, const FileHashes& hashes);

  // A file this signing node hashed and did not publish: not every user may
  // read it, or find its path by listing (a record names it, and everyone
  // who can read the store reads the record). Counted, so that an operator
  // sees why a store stays empty (a 0711 SRC publishes nothing).
  void Withheld() { ++withheld_; }

  // The record found for this version of this file did not match the file's
  // bytes: it is never trusted again by this store for this version, so the
  // indexer hashes the file itself (and its Publish replaces the record).
  void Distrust(const std::string& rel_path, const FileStamp& stamp);

  struct Stats {
    uint64_t used = 0;        // lookups answered by a trusted record
    uint64_t ignored = 0;     // records found and ignored (with a warning)
    uint64_t published = 0;   // records written
    uint64_t already = 0;     // publishes that found the same record there
    uint64_t distrusted = 0;  // records that did not match their file
    uint64_t withheld = 0;    // files hashed here and not published (Withheld)
  };
  Stats GetStats() const;

 private:
  ManifestStore(std::string dir, UniqueFd root, Keyring trusted, std::optional<SigningKey> signer)
      : dir_(std::move(dir)), root_(std::move(root)), keyring_(std::move(trusted)), signer_(std::move(signer)) {}
  // Reads and checks the record file at `rel` below the root (`path` in
  // messages) against the keyring.
  Result<ManifestRecord> ReadTrusted(const std::string& rel, const std::string& path, uint64_t max_bytes) const;

  const std::string dir_;
  const UniqueFd root_;  // the store's directory; every record is opened beneath it
  Keyring keyring_;
  const std::optional<SigningKey> signer_;

  mutable Mutex mu_;
  std::set<std::tuple<std::string, uint64_t, int64_t>> distrusted_ GUARDED_BY(mu_);
  std::atomic<uint64_t> used_{0}, ignored_{0}, published_{0}, already_{0}, distrusted_count_{0}, withheld_{0};
};

}  // namespace ckptfs
