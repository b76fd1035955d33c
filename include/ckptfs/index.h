// Index: the SQLite database (WAL mode) in the state directory that remembers
// what has been hashed, so a file is read again only when its stamp changes.
//
//   files        (dev, ino) -> stamp, SHA-256, chunk table, path
//   checkpoints  checkpoint name -> canonical manifest, size
//   sources      (source root, checkpoint path) -> checkpoint name
//
// Every write is one SQLite transaction, so a crash (even kill -9) leaves a
// database that opens and is correct for what it holds. On open the file is
// checked (application id, schema version, quick_check); a damaged or foreign
// file is renamed aside with a warning and a new index is built. Rows read
// back are validated before use: an index is never trusted blindly.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
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

  // The stored hashes of the file with exactly this stamp, if any.
  std::optional<FileHashes> LookupFile(const FileStamp& stamp);

  struct StoredFile {
    FileStamp stamp;
    FileHashes hashes;
    std::string path;
  };
  // Whatever is stored for (dev, ino), whatever its stamp (used by verify).
  std::optional<StoredFile> LookupInode(uint64_t dev, uint64_t ino);

  Status PutFile(const FileStamp& stamp, const std::string& path, const FileHashes& hashes);
  // Drops what is known of (dev, ino), so the next scan hashes it again.
  Status ForgetFile(uint64_t dev, uint64_t ino);
  // The size a *.safetensors file with this content is served with under
  // stamp_headers (its own size when its header is served unstamped), kept
  // so that stat never reads a header (one can be 100 MB). A property of
  // the bytes alone, so it is keyed by the file's SHA-256.
  std::optional<uint64_t> LookupStampedSize(const Sha256Digest& file);
  Status PutStampedSize(const Sha256Digest& file, uint64_t size);

  Status PutCheckpoint(const std::string& name, const std::string& manifest, uint64_t total_size,
                       uint64_t file_count);
  Status PutSource(const std::string& real_root, const std::string& rel_path, const std::string& name);

  // The name last recorded for a checkpoint path, if any.
  std::optional<std::string> LookupSource(const std::string& real_root, const std::string& rel_path);
  // The stored manifest of a checkpoint name, if any.
  std::optional<std::string> LookupManifest(const std::string& name);
  // When a checkpoint name was first recorded (seconds since the epoch).
  std::optional<int64_t> CheckpointIndexedAt(const std::string& name);

 private:
  Index(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  Status Exec(const char* sql);

  std::mutex mu_;  // one connection, used by many indexer threads
  sqlite3* db_;
  std::string path_;
};

}  // namespace ckptfs
