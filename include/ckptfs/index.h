// Index: the SQLite database (WAL mode) in the state directory that remembers
// what has been hashed, so a file is read again only when its stamp changes.
//
//   files        (dev, ino) -> stamp, SHA-256, chunk table, path
//   checkpoints  checkpoint name -> canonical manifest, size
//   sources      (source root, checkpoint path) -> checkpoint name
//
// Every write is one SQLite transaction (PutBatch: many rows in one), so a
// crash (even kill -9) leaves a database that opens and is correct for what
// it holds. On open the file is
// checked (application id, schema version, quick_check); a damaged or foreign
// file is renamed aside with a warning and a new index is built. Rows read
// back are validated before use: an index is never trusted blindly.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"

namespace ckptfs {

// The default state directory: /var/lib/ckptfs for root,
// $XDG_STATE_HOME/ckptfs (or ~/.local/state/ckptfs) for everyone else.
std::string DefaultStateDir();

// Creates the state directory (mode 0700) if needed and checks that it can be
// written, without opening the index.
Status PrepareStateDir(const std::string& dir);

class Index {
 public:
  static constexpr const char* kFileName = "index.db";

  // Opens (creating if needed) STATE_DIR/index.db. Problems that were
  // repaired, such as a corrupt file set aside, are appended to `warnings`.
  static Result<std::unique_ptr<Index>> Open(const std::string& state_dir, std::vector<std::string>* warnings);
  ~Index();
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  const std::string& path() const { return path_; }

  // Lookups answer nullopt when nothing usable is stored (a damaged row
  // counts as absent: its file is hashed again and the row rewritten), and
  // fail, naming the index and SQLite's reason, when the index cannot be
  // read: a broken index is an error to report, not a reason to re-hash
  // every file in silence.

  // The stored hashes of the file with exactly this stamp, if any.
  Result<std::optional<FileHashes>> LookupFile(const FileStamp& stamp);
  // The same for many files, in one read transaction (answers in order).
  Result<std::vector<std::optional<FileHashes>>> LookupFiles(const std::vector<FileStamp>& stamps);

  struct StoredFile {
    FileStamp stamp;
    FileHashes hashes;
    std::string path;
  };
  // Whatever is stored for (dev, ino), whatever its stamp (used by verify).
  Result<std::optional<StoredFile>> LookupInode(uint64_t dev, uint64_t ino);

  Status PutFile(const FileStamp& stamp, const std::string& path, const FileHashes& hashes);
  // Gives the row of `stamp`, whose SHA-256 is `sha256`, the chain a pass
  // over the file's bytes proved (one whose SHA-256 matched `sha256`),
  // when it has none: a row from before the chain then needs no such pass
  // after a restart. Nothing is written when the row is gone, is of
  // another stamp or SHA-256, or has a chain already.
  Status AddChain(const FileStamp& stamp, const Sha256Digest& sha256, const ChunkChain& chain);
  struct FileRow {
    FileStamp stamp;
    std::string path;
    FileHashes hashes;
  };
  struct CheckpointRow {
    std::string name, manifest;
    uint64_t total_size = 0, file_count = 0;
    std::string real_root, rel_path;  // its source (PutSource)
  };
  // Files, then checkpoints with their sources, in one transaction: a crash
  // leaves all of them or none, and 20,000 small files cost one commit, not
  // 20,000.
  Status PutBatch(const std::vector<FileRow>& files, const std::vector<CheckpointRow>& checkpoints);
  // Drops what is known of (dev, ino), so the next scan hashes it again.
  Status ForgetFile(uint64_t dev, uint64_t ino);
  // The size a *.safetensors file with this content is served with under
  // stamp_headers (its own size when its header is served unstamped), kept
  // so that stat never reads a header (one can be 100 MB). A property of
  // the bytes alone, so it is keyed by the file's SHA-256.
  Result<std::optional<uint64_t>> LookupStampedSize(const Sha256Digest& file);
  Status PutStampedSize(const Sha256Digest& file, uint64_t size);

  Status PutCheckpoint(const std::string& name, const std::string& manifest, uint64_t total_size,
                       uint64_t file_count);
  Status PutSource(const std::string& real_root, const std::string& rel_path, const std::string& name);

  // The name last recorded for a checkpoint path, if any.
  Result<std::optional<std::string>> LookupSource(const std::string& real_root, const std::string& rel_path);
  // The stored manifest of a checkpoint name, if any.
  Result<std::optional<std::string>> LookupManifest(const std::string& name);
  // When a checkpoint name was first recorded (seconds since the epoch).
  std::optional<int64_t> CheckpointIndexedAt(const std::string& name);

 private:
  Index(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  Status Exec(const char* sql);
  // Gives an index made before the chain its `chain` and `chain_sum`
  // columns; ChainColumns counts those it has.
  Result<int> ChainColumns();
  Status AddChainColumns();
  // The prepared statement of `sql` (a literal: cached by its address),
  // prepared once; null when it cannot be. With mu_ held.
  sqlite3_stmt* Cached(const char* sql) REQUIRES(mu_);
  // The statements of one row each, with mu_ held (PutFile, PutBatch...).
  Status PutFileLocked(const FileStamp& stamp, const std::string& path, const FileHashes& hashes) REQUIRES(mu_);
  Status PutCheckpointLocked(const std::string& name, const std::string& manifest, uint64_t total_size,
                             uint64_t file_count) REQUIRES(mu_);
  Status PutSourceLocked(const std::string& real_root, const std::string& rel_path, const std::string& name)
      REQUIRES(mu_);
  // "index PATH: WHAT: SQLite's message" (call with mu_ held).
  Status SqlError(const std::string& what) const;

  mutable Mutex mu_;  // one connection, used by many indexer threads
  sqlite3* db_;
  std::map<const char*, sqlite3_stmt*> cached_ GUARDED_BY(mu_);
  std::string path_;
};

}  // namespace ckptfs
