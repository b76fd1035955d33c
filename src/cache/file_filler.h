// FileFiller: makes files resident in the host tier (FileCache). A copy is
// read from the source chunk by chunk through FileServer::ReadSourceChunk, so every
// 4 MiB chunk is checked exactly as on the chunk path (the copy's stamp
// before and after the read, the chunk's XXH3-128; a copy that fails is
// left for the next copy of the file), and for a file whose bytes are proven
// (FileServer::Proves: verify=sha256, or auto and a copy not trusted) each
// chunk against the file's SHA-256 chain (FileServer::ChainOf), or where none
// is known the whole copy's SHA-256 against the index's before it is sealed
// (taking the chain on the way). With
// stamp_headers a safetensors file is copied in its stamped form (the
// stamped header, then the source's bytes after the original header), so a
// passthrough reader sees what the chunk path serves. Only when every chunk
// passed is the memfd sealed and published; a chunk that fails (the source
// changed, does not match, or cannot be read) abandons the fill, and the
// copy is never handed to the kernel.
//
// Fills share one set of `depth` reading threads, which take chunks from
// every fill in flight in turn (so that three shards opened at once are
// copied together, at the depth the disk needs, rather than one after the
// other) and, first of all, the chunks a reader is waiting for. A reader of
// a file whose copy is in progress (Stream) is served from the copy, chunk
// by chunk as each is verified, instead of reading the source a second
// time; when only the whole copy's SHA-256 proves it, only once that passed.
//
// Background fills (fill=open, the shards beside an opened one) run one file
// at a time on a thread of their own; Start begins a fill at once without
// waiting for it (an open that must not wait: its reads Stream).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "ckptfs/file_cache.h"
#include "ckptfs/file_server.h"
#include "ckptfs/mutex.h"
#include "ckptfs/source_reader.h"

namespace ckptfs {

class FillJob;

class FileFiller {
 public:
  // `depth`: chunk reads in flight for all fills together; `io`: how the
  // source is read. Chunks are read through `server` (ReadSourceChunk).
  FileFiller(FileServer& server, unsigned depth, SourceReader::Io io = SourceReader::Io::kBuffered);
  ~FileFiller();
  FileFiller(const FileFiller&) = delete;
  FileFiller& operator=(const FileFiller&) = delete;

  // The resident copy of `file`, filled now if needed (waiting for a fill of
  // it already in flight). `progress(bytes)` is called on this thread about
  // five times a second; returning false cancels the fill.
  Result<FileCache::CopyPtr> Fill(const View::NodePtr& file, bool pin,
                                  const std::function<bool(uint64_t)>& progress = nullptr);
  // Begins a fill of `file` and returns without waiting for it (no-op when
  // it is resident or being filled, or does not fit: then the chunk path
  // serves it). Takes no lock that a fill holds while it reads.
  void Start(const View::NodePtr& file);

  // Bytes [offset, offset + len) of `key`'s copy in progress, served form,
  // once verified (this call asks for their chunks first and waits for
  // them), with the copy they lie in. nullopt when no fill of `key` is in
  // flight, or it failed or ended meanwhile, or it is proving the copy
  // (a whole-file SHA-256 first) for a reader whose bytes need no proof
  // (`wait_for_proof` false: another digest's copy of the same bytes that
  // needs one is being made): the caller then reads the way it would have
  // without it.
  struct Streamed {
    std::shared_ptr<const SealedCopy> copy;
    SealedCopy::MappingHold mapping;  // until the reply has been sent
    const uint8_t* data = nullptr;
    size_t len = 0;
  };
  std::optional<Streamed> Stream(const FileKey& key, uint64_t offset, size_t len, bool wait_for_proof);

  // The SHA-256 chain of `file`'s bytes, for a file whose index row has none
  // (FileServer::ChainOf), proven by the whole file's SHA-256: one kept
  // from an earlier fill or pass, else taken now by reading and checking the
  // whole file once (one pass per file at a time; others wait for it).
  Result<ProvenChunkTables::Table> Prove(const View::NodePtr& file);

  // Queues a background fill of `file` (no-op if one is queued or running).
  void Enqueue(const View::NodePtr& file, const FileKey& key);
  // Queues background fills of the weight files beside `file` (same source
  // directory, same suffix: the other shards), in name order, as long as
  // they fit in the tier's free room. An engine that opens one shard opens
  // the others next; their copies then fill while it loads this one. Only
  // free room is used, so this never evicts what is resident. The siblings
  // are looked for on the background thread, not on the caller's (an open).
  void EnqueueSiblings(const View::NodePtr& file);
  // Stops the background thread and the readers; fills in flight give up.
  void Stop();

  uint64_t fills_skipped() const { return skipped_.load(); }
  uint64_t fills_failed() const { return failed_.load(); }
  uint64_t streamed_reads() const { return streamed_.load(); }
  uint64_t fills_proven() const { return proven_.load(); }
  unsigned depth() const { return static_cast<unsigned>(readers_.size()); }
  SourceReader::Io io() const { return io_; }

 private:
  // A new fill of `file` in `form` (registered, its chunks offered to the
  // readers), or the one in flight, or null with why not in `refused`.
  std::shared_ptr<FillJob> Begin(const View::NodePtr& file, const ServedForm& form, bool pin, bool wait,
                                 FileCache::CopyPtr* resident, Status* refused);
  void ReadChunks();
  std::pair<std::shared_ptr<FillJob>, uint64_t> NextChunk() EXCLUDES(jobs_mu_);
  bool StreamReady(const FillJob& job, bool none, uint64_t first, uint64_t last) const REQUIRES(jobs_mu_);
  Status CopyChunk(FillJob& job, uint64_t chunk, uint8_t* buf);
  void ChunkDone(const std::shared_ptr<FillJob>& job, uint64_t chunk, const Status& s);
  // `cancelled`: given up by the caller or at a stop, not worth a warning.
  void Finish(const std::shared_ptr<FillJob>& job, Status s, bool cancelled = false);
  std::shared_ptr<FillJob> InFlight(const FileKey& key);
  Result<ProvenChunkTables::Table> ProveByReading(const View::NodePtr& file);
  void QueueSiblingsOf(const View::NodePtr& file);
  void RunQueue();

  FileServer& server_;
  const SourceReader::Io io_;

  // Fills in flight, and the threads that read their chunks.
  Mutex jobs_mu_;
  CondVar work_;
  std::map<FileKey, std::shared_ptr<FillJob>> jobs_ GUARDED_BY(jobs_mu_);
  // Whose chunk comes next, round-robin.
  std::deque<std::shared_ptr<FillJob>> turns_ GUARDED_BY(jobs_mu_);
  bool readers_stopping_ GUARDED_BY(jobs_mu_) = false;
  std::vector<std::thread> readers_;

  // Proving passes in flight, by file.
  Mutex prove_mu_;
  CondVar proved_;
  std::set<Sha256Digest> proving_ GUARDED_BY(prove_mu_);

  // The background queue.
  Mutex mu_;
  CondVar wake_;
  std::deque<std::pair<View::NodePtr, FileKey>> queue_ GUARDED_BY(mu_);
  std::set<FileKey> queued_ GUARDED_BY(mu_);
  // Files whose siblings are to be queued.
  std::deque<View::NodePtr> sibling_requests_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> skipped_{0}, failed_{0}, streamed_{0}, proven_{0};
  std::thread worker_;
};

}  // namespace ckptfs
