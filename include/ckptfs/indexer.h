// Indexer: turns the checkpoints a catalog scan found into digests.
//
// Every distinct member file (by device and inode, so links and copies shared
// between checkpoints are read once) is looked up in the index by its stamp;
// only files the index does not know are read, largest first, on `threads`
// workers, each hashing one file at a time with its reads and chunk hashes
// running ahead on an I/O pool (see FileHasher, and IndexScheduler, which runs
// many such runs at once). A file that changes while it is hashed is re-stat'ed and retried; if
// it keeps changing, the checkpoint that holds it is reported unsettled so
// the caller can come back to it later.
//
// With a manifest store, a file the index does not know is first looked up
// there (by path relative to the source root, size and mtime): a trusted
// record stands in for reading the file, and is remembered in the index
// under the file's local stamp. Files hashed here are published to the store
// when it can sign.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/checkpoint_digest.h"
#include "ckptfs/file_hasher.h"
#include "ckptfs/hash_copy.h"
#include "ckptfs/index.h"
#include "ckptfs/manifest_store.h"

namespace ckptfs {

struct IndexerOptions {
  unsigned threads = 0;  // 0: one per CPU
  // Read every file even when the index knows it (verify), and record nothing.
  bool ignore_index = false;
  int attempts = 3;  // per file, when it changes while being hashed
  // Read nothing: files the index does not know leave their checkpoint with
  // `unindexed` set (the daemon uses this to show known checkpoints at once).
  bool lookup_only = false;
  // Told the total bytes to hash before any is read, then each amount read.
  std::function<void(uint64_t total)> on_plan;
  FileHasher::BytesCallback on_bytes;
  FileHasher::ChunkReadHook chunk_read_hook;  // test seam, see FileHasher
  // Test seam: called with a file's path just before it is first opened for
  // hashing, so a test can change the tree between the walk and the open.
  std::function<void(const std::string& path)> before_hash;
  // Called before each file is hashed, on the worker that hashes it (so
  // from several threads at once): the daemon's watcher takes withdrawn
  // digests out of the view there, rather than after the whole checkpoint.
  std::function<void()> between_files;
  // Stops hashing at the next chunk and leaves the rest unhashed when it
  // turns true (unmount, SIGTERM).
  const std::atomic<bool>* cancel = nullptr;
  // Shared records of other nodes (see above); not consulted with
  // ignore_index.
  ManifestStore* manifests = nullptr;
  // fill_on_index: copies of the files hashed, filled from the very bytes
  // hashed (see hash_copy.h); null: none.
  HashCopyMaker* copies = nullptr;
};

struct IndexedFile {
  MemberFile member;  // with the stamp that was hashed
  FileHashes hashes;
  bool from_index = false;
  bool from_manifest = false;  // from a trusted record of the manifest store
  // *.safetensors members: the size served under stamp_headers (see
  // stamped_size.h); unset when a lookup-only pass found none stored.
  std::optional<uint64_t> stamped_size;
};

struct IndexedCheckpoint {
  std::string rel_path;
  std::string abs_path;
  // Set when no digest could be computed: the checkpoint was invalid already,
  // a member could not be read, or a member kept changing (`unsettled`).
  std::optional<std::string> error;
  bool unsettled = false;
  bool unindexed = false;  // lookup_only: some member is not in the index yet
  std::string name;      // "sha256-<hex>"
  std::string manifest;  // canonical manifest
  std::vector<IndexedFile> files;
  uint64_t total_size = 0;
};

struct IndexReport {
  std::vector<IndexedCheckpoint> checkpoints;  // same order as the input
  uint64_t files_hashed = 0;
  uint64_t bytes_hashed = 0;
  uint64_t files_from_index = 0;
  uint64_t files_from_manifests = 0;
  uint64_t records_published = 0;
  std::vector<std::string> warnings;  // e.g. index writes that failed
};

class Indexer {
 public:
  // `index` may be null only with options.ignore_index.
  Indexer(Index* index, IndexerOptions options) : index_(index), options_(std::move(options)) {}

  IndexReport Run(const CatalogScan& scan);

 private:
  Index* index_;
  IndexerOptions options_;
};

}  // namespace ckptfs
