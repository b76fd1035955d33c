#include "header_stamper.h"

#include <spdlog/spdlog.h>

#include "ckptfs/mutex.h"
#include "ckptfs/safetensors_header.h"

namespace ckptfs {

namespace {

// Bytes [0, len) of `file`, through the verified cache.
Result<std::string> ReadPrefix(FileServer& server, const View::NodePtr& file, uint64_t len) {
  std::string out;
  out.reserve(static_cast<size_t>(len));
  for (uint64_t c = 0; c * kChunkSize < len; ++c) {
    auto ref = server.FetchChunk(file, c, /*readahead=*/false);
    if (!ref.ok()) return ref.status();
    const uint64_t take = std::min<uint64_t>(ref->size(), len - c * kChunkSize);
    out.append(reinterpret_cast<const char*>(ref->data()), static_cast<size_t>(take));
  }
  return out;
}

}  // namespace

Result<std::optional<StampedFile>> HeaderStamper::For(FileServer& server, const View::NodePtr& file) {
  if (!file->safetensors) return std::optional<StampedFile>();
  const std::string key = file->digest + "/" + ToHex(file->sha256);
  {
    MutexLock lock(mu_);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  }
  std::string why;
  auto header = ReadSafetensorsHeader(
      file->size, [&](uint64_t len) { return ReadPrefix(server, file, len); }, &why);
  if (!header.ok()) return header.status();
  std::optional<StampedFile> result;
  if (*header) {
    StampedFile s;
    s.prefix = std::make_shared<const std::string>(StampedHeaderBytes(**header, file->digest, ToHex(file->sha256)));
    s.source_prefix_len = 8 + (*header)->header_len;
    s.size = file->size - s.source_prefix_len + s.prefix->size();
    result = std::move(s);
  } else {
    spdlog::warn("{}: {} is served unstamped: {}", file->digest, file->source_path, why);
  }
  // stat answered with the size stored at indexing; the bytes must agree
  // with it, or a reader would get a file cut short or padded.
  const uint64_t served = result ? result->size : file->size;
  if (file->stamped_size && *file->stamped_size != served) {
    spdlog::error("{}: {}: stamped size {} differs from the {} stored at indexing; refusing to serve it",
                  file->digest, file->source_path, served, *file->stamped_size);
    return Status::Corrupt(file->source_path + ": stamped size differs from the index");
  }
  MutexLock lock(mu_);
  memo_[key] = result;
  return result;
}

}  // namespace ckptfs
