#include "ckptfs/stamped_size.h"

#include "ckptfs/safetensors_header.h"

namespace ckptfs {

Result<uint64_t> ServedStampedSize(SourceReader& reader, const std::string& path, const FileStamp& stamp,
                                   const std::vector<ChunkHash>& chunks) {
  std::string prefix;  // whole verified chunks, as many as asked for so far
  const PrefixReader read_prefix = [&](uint64_t len) -> Result<std::string> {
    while (prefix.size() < len && prefix.size() < stamp.size) {
      const uint64_t index = prefix.size() / kChunkSize;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkSize, stamp.size - index * kChunkSize));
      const size_t at = prefix.size();
      prefix.resize(at + n);
      Status s = reader.ReadChunk(path, stamp, chunks, index, reinterpret_cast<uint8_t*>(prefix.data() + at), n);
      if (!s.ok()) return s;
    }
    return prefix.substr(0, static_cast<size_t>(std::min<uint64_t>(len, prefix.size())));
  };
  auto header = ReadSafetensorsHeader(stamp.size, read_prefix, nullptr);
  if (!header.ok()) return header.status();
  return *header ? StampedFileSize(**header, stamp.size) : stamp.size;
}

}  // namespace ckptfs
