// SourceReader: fills a cache chunk from the source file and proves it is the
// chunk the index knows before anyone sees it: the file's stamp must still be
// the one it was hashed under, and the chunk's XXH3-128 must equal the chunk
// table's entry.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/option_words.h"
#include "ckptfs/status.h"

namespace ckptfs {

class KeptSourceFile;
class OpenSourceFiles;

class SourceReader {
 public:
  // Files kept open between chunks, at most, and how long one nobody reads
  // stays open (see OpenSourceFiles).
  static constexpr size_t kKeptOpen = 32;
  static constexpr std::chrono::milliseconds kIdleClose{5000};

  // `root`: the canonical source root every path read lies in (see
  // OpenSourceFile); empty in tests that read loose files.
  explicit SourceReader(std::string root = "", size_t kept_open = kKeptOpen,
                        std::chrono::milliseconds idle_close = kIdleClose);
  ~SourceReader();
  SourceReader(const SourceReader&) = delete;
  SourceReader& operator=(const SourceReader&) = delete;

  // How the source is read. kDirect (O_DIRECT) bypasses the source's page
  // cache, for fills that would otherwise keep every byte twice in memory.
  // kAuto reads a chunk that is mostly in the page cache from it and one
  // that mostly is not with O_DIRECT (cachestat says which): a cached
  // source is copied at memory speed, an uncached one at the disk's,
  // without being cached twice. Direct reads need `dst`
  // aligned to kDirectAlignment and room there for `len` rounded up to it;
  // a read that cannot be direct (a misaligned buffer, a filesystem that
  // refuses O_DIRECT, a short read) is made buffered.
  enum class Io { kBuffered, kDirect, kAuto };
  static constexpr size_t kDirectAlignment = 4096;

  // kChanged: the file's stamp moved (rescan it); kCorrupt: the chunk does
  // not match the index although the stamp does; kError: an I/O error.
  Status ReadChunk(const std::string& path, const FileStamp& stamp, const std::vector<ChunkHash>& chunks,
                   uint64_t index, uint8_t* dst, size_t len, Io io = Io::kBuffered);

  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t chunks_read() const { return chunks_read_.load(); }
  // Bytes read with O_DIRECT, and direct reads that had to be buffered;
  // bytes kAuto read from the page cache because cachestat said they were
  // there (not those read buffered because the kernel could not say).
  uint64_t direct_bytes_read() const { return direct_bytes_read_.load(); }
  uint64_t cached_bytes_read() const { return cached_bytes_read_.load(); }
  uint64_t direct_reads_refused() const { return direct_reads_refused_.load(); }
  // Opens of a source file by path (a file read chunk after chunk is opened
  // once), and the files kept open now.
  uint64_t source_opens() const;
  size_t source_files_open() const;

 private:
  Status ReadFrom(KeptSourceFile& file, const std::string& path, const FileStamp& stamp,
                  const std::vector<ChunkHash>& chunks, uint64_t index, uint8_t* dst, size_t len, Io io);

  const std::unique_ptr<OpenSourceFiles> files_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> chunks_read_{0};
  std::atomic<uint64_t> direct_bytes_read_{0};
  std::atomic<uint64_t> direct_reads_refused_{0};
  std::atomic<uint64_t> cached_bytes_read_{0};
};

// SourceReader::Io as the fill_io= option spells it.
inline constexpr OptionWord<SourceReader::Io> kSourceIoWords[] = {
    {SourceReader::Io::kBuffered, "buffered"}, {SourceReader::Io::kDirect, "direct"}, {SourceReader::Io::kAuto, "auto"}};

}  // namespace ckptfs
