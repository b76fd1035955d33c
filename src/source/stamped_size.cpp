#include "ckptfs/stamped_size.h"

#include "ckptfs/safetensors_header.h"

namespace ckptfs {

Result<uint64_t> ServedStampedSize(SourceReader& reader, const std::string& path, const FileStamp& stamp,
                                   const FileHashes& hashes) {
  if (!hashes.chain) return Status::NotFound(path + ": no SHA-256 chain to check its header against");
  std::string prefix;  // whole verified chunks, as many as asked for so far
  const PrefixReader read_prefix = [&](uint64_t len) -> Result<std::string> {
    while (prefix.size() < len && prefix.size() < stamp.size) {
      const uint64_t index = prefix.size() / kChunkSize;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkSize, stamp.size - index * kChunkSize));
      const size_t at = prefix.size();
      prefix.resize(at + n);
      uint8_t* data = reinterpret_cast<uint8_t*>(prefix.data() + at);
      Status s = reader.ReadChunk(path, stamp, hashes.chunks, index, data, n);
      if (!s.ok()) return s;
      if (!ChunkFitsChain(hashes.sha256, stamp.size, *hashes.chain, index, data, n)) {
        return Status::Corrupt(path + ": chunk " + std::to_string(index) +
                               " of its header passes its XXH3-128 but not the file's SHA-256 (its chain)");
      }
    }
    return prefix.substr(0, static_cast<size_t>(std::min<uint64_t>(len, prefix.size())));
  };
  auto header = ReadSafetensorsHeader(stamp.size, read_prefix, nullptr);
  if (!header.ok()) return header.status();
  return *header ? StampedFileSize(**header, stamp.size) : stamp.size;
}

}  // namespace ckptfs
