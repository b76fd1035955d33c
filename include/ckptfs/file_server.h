// FileServer: serves the bytes of a view's files, so that the FUSE layer
// only translates requests. It owns how a file is served: the fill policy
// at open (a copy made in the host tier, waited for or begun), reads from a
// resident copy, from a copy being made, or from the verified chunk path
// (ChunkCache, filled by the SourceReader after checking the stamp and the
// chunk's XXH3-128) with read-ahead, and the stamped form of a safetensors
// file (stamp_headers). Which copy the kernel is handed for passthrough is
// the FUSE layer's business (OpenModes); which bytes are served is this
// class's, and a byte that does not belong to a name is never served under it.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/chunk_cache.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/mutex.h"
#include "ckptfs/proven_chunk_tables.h"
#include "ckptfs/refused_files.h"
#include "ckptfs/serving_policy.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/status.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/view.h"

namespace ckptfs {

class FileFiller;
class HeaderScans;
class HeaderStamper;

// How a file is served: its host-tier key, its size as served, and (with
// stamp_headers) the stamped header that replaces the source's.
struct ServedForm {
  FileKey key;
  uint64_t size = 0;
  std::shared_ptr<const std::string> prefix;  // stamped header; null when served as in the source
  uint64_t source_prefix_len = 0;             // the source header it replaces
};

// One open of a file, as the server reads it. On the chunk path it holds
// where the last read ended, to spot a sequential reader, and how far ahead
// chunks have been requested.
struct ServedFile {
  View::NodePtr node;
  FileKey key;              // its host-tier key in the form it is served
  FileCache::CopyPtr copy;  // a resident copy it reads from (or passthrough's backing)
  pid_t opener = 0;  // the thread that opened it, as FUSE gives it (0: not known)
  std::chrono::steady_clock::time_point answered{};  // when the open was done, after any wait for a copy
  std::atomic<uint64_t> next_offset{0};
  std::atomic<uint64_t> readahead_until{0};  // chunks below this were requested
};

// The bytes of one read, as iovecs over memory that `holds` keeps alive
// until the reply has been written (chunks, a copy, its mapping).
struct ServedBytes {
  std::vector<iovec> iov;
  std::vector<std::shared_ptr<const void>> holds;
  std::vector<ChunkCache::Ref> chunks;
  size_t size() const;
};

class FileServer {
 public:
  // What the server reads from; none is owned. `files` may be null (no host
  // tier of whole files), `proven` is set with verify=sha256 and auto only.
  struct Parts {
    View* view = nullptr;
    ChunkCache* cache = nullptr;
    FileCache* files = nullptr;
    SourceReader* reader = nullptr;
    ThreadPool* readahead_pool = nullptr;  // null: no read-ahead
    ProvenChunkTables* proven = nullptr;
  };
  struct Options {
    FillPolicy fill = kDefaultFillPolicy;
    Verify verify = Verify::kXxh3;
    bool stamp_headers = false;
    unsigned fill_depth = 4;  // chunk reads in flight for all fills together
    SourceReader::Io fill_io = SourceReader::Io::kBuffered;
    // Chunks filled ahead of a sequential reader.
    unsigned readahead_chunks = 4;
    // Read-ahead chunks in flight for all readers together, at most: what is
    // read ahead must still be in the cache when the reader gets there (the
    // daemon gives a quarter of the chunk tier).
    uint64_t readahead_budget_chunks = 16;
    // Chunks the chunk tier holds: each reader's window shrinks so that every
    // open file's current chunk and its read-ahead fit in it together.
    uint64_t cache_chunks = 64;
    // Opens that may wait for a copy at once under fill=wait (the daemon
    // gives half its FUSE threads): each holds a FUSE thread until its copy
    // is made, so that many opens of a large file, whoever makes them,
    // would leave no thread for anyone else's requests. An open beyond
    // them does not wait: its reads are served from the copy as it is made.
    unsigned max_waiting_opens = 2;
  };
  // A read found a copy's chunk that does not match the index although its
  // stamp does: hash that copy again, and withdraw the digest when no other
  // copy served the read (`withdraw`). Called on a reader's thread: it must
  // not wait for the index or the view.
  using CorruptChunkReport =
      std::function<void(const View::Node& file, const SourceCopy& copy, const Status& why, bool withdraw)>;
  // A pass over the whole file proved the chain of its bytes (for a file
  // whose index rows have none): the rows of its copies may keep it, so
  // that no such pass is needed after a restart. Called on a reader's
  // thread: it must not wait for the index.
  using ChainProvenReport = std::function<void(const View::Node& file, std::shared_ptr<const ChunkChain> chain)>;
  // What a failed source read, or a proof, leads to, outside the server.
  struct Reports {
    // A fill found the source changed: rescan.
    std::function<void()> source_changed;
    CorruptChunkReport corrupt_chunk;
    ChainProvenReport chain_proven;
  };

  FileServer(Parts parts, Options options, Reports reports);
  // Waits for its read-ahead tasks to be done with: run, or dropped by the
  // pool (ThreadPool::Cancel), which must outlive the server.
  ~FileServer();
  FileServer(const FileServer&) = delete;
  FileServer& operator=(const FileServer&) = delete;

  // The form `file` is served in; fails only when a stamped header could
  // not be read (then with that read's error).
  Result<ServedForm> FormOf(const View::NodePtr& file);
  // Its size as served (stat): a stamped safetensors file is longer than its
  // source by the header's growth.
  Result<uint64_t> ServedSize(const View::NodePtr& file);

  // The open of `file` (a member of a digest directory) with `open_flags`,
  // before the FUSE layer chooses how the kernel serves it: the fill policy
  // runs here (fill=wait: the copy is made now, or begun for an O_DIRECT
  // reader whose reads are then served from it as it is made).
  // `inode_open`: the inode is open already, so this open is served the way
  // the first one chose and a copy made now could not help it. `opener`:
  // the requesting thread, whose earlier opens tell whether it is scanning
  // the shards' headers (HeaderScans: then the copy is begun, not waited
  // for).
  Result<std::shared_ptr<ServedFile>> Open(const View::NodePtr& file, int open_flags, bool inode_open,
                                           pid_t opener = 0);
  // A file the FUSE layer rebuilt from its inode (opened by a daemon this one
  // took over from).
  Result<std::shared_ptr<ServedFile>> Adopt(const View::NodePtr& file);
  // An open (or an adopted one) the FUSE layer now holds, and its release:
  // open files share the chunk tier's read-ahead. Closed is true when the
  // file is resident now (its next open can pass through).
  // `alone`: the open was answered and no other open of its inode
  // overlapped it, so its close may be a sign of a header scan (not so for
  // an interrupted open, nor for transformers, which opens a shard twice to
  // map it, when a passthrough map holds neither open).
  void Opened(const ServedFile& f);
  bool Closed(const ServedFile& f, bool alone = false);
  // The open was answered on the chunk path without a copy: fill=open copies
  // it in the background.
  void OpenedOnChunkPath(const ServedFile& f);
  // The resident copy of `key`, or null; `use` counts as a use (LRU).
  FileCache::CopyPtr Resident(const FileKey& key, bool use = true) const;

  // When its bytes are proven (Proves) and no chain of them is known
  // (ChainOf), a read of `f` may wait for a whole file to be read and
  // hashed: nothing of it is served before its SHA-256 passed (no copy of
  // it resident). Such reads are served
  // off the FUSE threads (FsContext::proving_reads), so that one user's
  // reads of large files cannot hold every thread.
  bool MayWaitForAProof(const ServedFile& f) const;
  // A read of `f` may read the source (no copy of it resident, nor the
  // daemon's own bytes): it may take as long as the source does.
  bool MayReadTheSource(const ServedFile& f) const;

  // Bytes [offset, offset + size) of an open file, as served: from its copy,
  // a copy being made, the daemon's own content (a hub ref), or the verified
  // chunk path (with read-ahead for a sequential reader). Fewer at the end
  // of the file; none past it.
  Result<ServedBytes> Read(ServedFile& f, uint64_t offset, size_t size);

  // The verified chunk `index` of `file`, from the cache or filled from the
  // source; failures are reported (see ReportSourceFailure).
  Result<ChunkCache::Ref> FetchChunk(const View::NodePtr& file, uint64_t index, bool readahead);
  // Chunk `index` of `file` (`len` bytes) into `dst`, from the first of its
  // source copies (most trusted first, see View::Node::copies) that is not
  // refused and passes every check: the stamp and the chunk's XXH3-128
  // (SourceReader::ReadChunk), and the file's SHA-256 chain when `chain` is
  // given (ChunkFitsChain). A copy that fails is reported and the next one tried, so that one
  // changed or damaged copy costs no reader an EIO while another still holds
  // the bytes. The error is the last copy's. Under verify=auto only trusted
  // copies (SourceCopy::trusted) are read, unless the bytes are checked
  // against a SHA-256: `chain`, or `whole_file_proven` (the caller
  // serves nothing of the file before its whole SHA-256 passed).
  // `served_by`, when given, is set to the copy that served the chunk
  // (null for a node made without copies).
  Status ReadSourceChunk(const View::Node& file, uint64_t index, uint8_t* dst, size_t len,
                         SourceReader::Io io = SourceReader::Io::kBuffered, const ChunkChain* chain = nullptr,
                         bool whole_file_proven = false, const SourceCopy** served_by = nullptr);
  // The same, checked as the mount's verify= asks: when the file's bytes are
  // proven (Proves), each chunk against the file's chain (ChainOf), proven
  // first by a pass over the whole file when none is known yet, except
  // with `no_proof_here` (read-ahead; a chunk's fill in the chunk tier,
  // which proves outside the chunk's slot), which then fails with
  // kNotFound rather than start one.
  Status ReadVerifiedChunk(const View::NodePtr& file, uint64_t index, uint8_t* dst, size_t len,
                           bool no_proof_here = false);
  // Called with every failed read of `copy` of `file`: the first failure of
  // a copy is logged and reported (a damaged chunk has the copy hashed again
  // and, unless `served_by_another` copy, withdraws the digest; a changed
  // source asks for a rescan), later ones only counted, and the copy is
  // refused from then on (see RefusedFiles).
  void ReportSourceFailure(const View::Node& file, const SourceCopy& copy, const Status& s, bool served_by_another);
  // Every copy of `file` was refused: nothing of it can be read from the source.
  bool AllCopiesRefused(const View::Node& file) const;
  // The error of a read that found every copy refused: it names the cause
  // of the first refusal, so that a reader that came second (another chunk
  // of the same fill, a later preload) learns why, not only that.
  Status NoCopyLeft(const View::Node& file) const;
  // Whether what is served of `file` is checked against its SHA-256 (a
  // copy's whole, a chunk's against the chain) and not only against
  // XXH3-128s: always under verify=sha256; under verify=auto when the copy
  // it would be read from first is not trusted (SourceCopy::trusted), or
  // none is left.
  bool Proves(const View::Node& file) const;
  // The SHA-256 chain of `file`'s bytes when one is known: its index row's
  // (View::Node::chain), one a pass over the whole file proved
  // (ProvenChunkTables), or the empty chain of a file of one chunk (whose
  // chunk is checked against the file's SHA-256 itself); null otherwise.
  std::shared_ptr<const ChunkChain> ChainOf(const View::Node& file) const;
  // A pass over the whole of `file` proved `chain` (FileFiller): kept for
  // the chunk path (ProvenChunkTables) and reported (Reports::chain_proven).
  void KeepProvenChain(const View::Node& file, std::shared_ptr<const ChunkChain> chain);
  // Proves(file), and no chain of its bytes is known: only a pass over the
  // whole file can prove them, and nothing of a copy of it is served
  // before its whole SHA-256 passed.
  bool ProvesOnlyWhole(const View::Node& file) const { return Proves(file) && !ChainOf(file); }
  // The copy ReadSourceChunk reads first now, or null when all are refused.
  const SourceCopy* FirstUsableCopy(const View::Node& file) const;

  // A read the FUSE layer failed before it reached the server, for stats.
  void CountFailedRead() { ++failed_reads_; }

  // Whole-file copies into the host tier (FileFiller): false without one.
  bool fills_whole_files() const { return filler_ != nullptr; }
  // The resident copy of `file`, made now if needed (ckptfsctl preload),
  // waiting for a fill of it already in flight. `progress(bytes)` is called
  // about five times a second; returning false cancels the fill.
  Result<FileCache::CopyPtr> Fill(const View::NodePtr& file, bool pin,
                                  const std::function<bool(uint64_t)>& progress = nullptr);
  // Fills in flight give up; none starts after this.
  void StopFills();
  struct FillStats {
    unsigned depth = 0;           // chunk reads in flight for all fills together
    uint64_t failed = 0;          // fills a source failure abandoned
    uint64_t skipped = 0;         // background fills that found no room
    uint64_t streamed_reads = 0;  // reads served from a copy while it was made
    uint64_t proven = 0;          // copies sealed once their SHA-256 passed, whole or chunk by chunk (Proves)
    uint64_t header_scan_opens = 0;  // fill=wait opens that began the copy without waiting (HeaderScans)
    SourceReader::Io io = SourceReader::Io::kBuffered;
  };
  FillStats GetFillStats() const;

  const Parts& parts() const { return parts_; }
  // The cache's tiers, upper first: the host tier (whole files, when there
  // is one), then the chunk tier.
  std::vector<CacheTier*> tiers() const;
  const Options& options() const { return options_; }
  uint64_t open_files() const { return open_files_.load(); }
  uint64_t reads() const { return reads_.load(); }
  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t failed_reads() const { return failed_reads_.load(); }
  // Opens under fill=wait that did not wait for their copy, because
  // max_waiting_opens others were waiting already.
  uint64_t opens_not_waiting() const { return opens_not_waiting_.load(); }

 private:
  Result<std::shared_ptr<ServedFile>> Served(const View::NodePtr& file);
  bool StreamsWhileFilling(const View::Node& file, int open_flags, pid_t opener);
  // Under verify=auto, a copy of `file` not refused and not trusted is left
  // (it may serve a read once proven).
  bool UntrustedCopyLeft(const View::Node& file) const;
  // One of max_waiting_opens places for an open to wait for its copy; false when all are taken.
  bool TakeWaitingPlace();
  void ReadAhead(ServedFile& f, uint64_t last_chunk);
  void EndReadAhead();
  Status AppendSourceRange(const View::NodePtr& file, uint64_t begin, uint64_t end, ServedBytes& out);
  Status ReadChunkOf(const SourceCopy& c, uint64_t index, uint8_t* dst, size_t len, SourceReader::Io io);
  ServedBytes FromCopy(const FileCache::CopyPtr& copy, uint64_t offset, size_t size);
  Result<ServedBytes> FromChunkPath(ServedFile& f, uint64_t offset, size_t size);

  const Parts parts_;
  const Options options_;
  const Reports reports_;
  RefusedFiles refused_;  // files found changed or damaged: fail fast
  std::unique_ptr<HeaderStamper> stamper_;  // with stamp_headers
  std::unique_ptr<FileFiller> filler_;
  std::unique_ptr<HeaderScans> header_scans_;  // with filler_
  std::atomic<uint64_t> readahead_in_flight_{0};
  Mutex readahead_mu_;
  CondVar readahead_done_;  // readahead_in_flight_ fell to 0
  std::atomic<uint64_t> open_files_{0};
  std::atomic<uint64_t> reads_{0}, bytes_read_{0}, failed_reads_{0};
  std::atomic<unsigned> waiting_opens_{0};      // opens waiting for a copy now
  std::atomic<uint64_t> opens_not_waiting_{0};  // opens that found every waiting place taken
};

}  // namespace ckptfs
