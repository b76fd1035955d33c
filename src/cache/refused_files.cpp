#include "ckptfs/refused_files.h"

#include <tuple>

namespace ckptfs {

bool RefusedFiles::Less::operator()(const Key& a, const Key& b) const {
  const FileStamp &x = std::get<1>(a), &y = std::get<1>(b);
  return std::tie(std::get<0>(a), x.dev, x.ino, x.size, x.mtime_ns, x.ctime_ns, std::get<2>(a)) <
         std::tie(std::get<0>(b), y.dev, y.ino, y.size, y.mtime_ns, y.ctime_ns, std::get<2>(b));
}

bool RefusedFiles::Add(const Sha256Digest& sha256, const FileStamp& stamp, const ChunkTable& chunks,
                       std::string why) {
  // A source path is at most PATH_MAX; the cause after it is short. The cap
  // keeps a full set within a few MB whatever the messages.
  constexpr size_t kMaxWhy = 4096 + 256;
  if (why.size() > kMaxWhy) why.resize(kMaxWhy);
  MutexLock lock(mu_);
  Key key{sha256, stamp, chunks.get()};
  if (!keys_.emplace(key, std::move(why)).second) return false;
  any_ = true;
  order_.emplace_back(key, chunks);
  while (order_.size() > capacity_) {
    keys_.erase(order_.front().first);
    order_.pop_front();
  }
  return true;
}

bool RefusedFiles::Contains(const Sha256Digest& sha256, const FileStamp& stamp,
                            const std::vector<ChunkHash>* chunks) const {
  if (!any_.load(std::memory_order_acquire)) return false;
  MutexLock lock(mu_);
  return keys_.count({sha256, stamp, chunks}) != 0;
}

std::optional<std::string> RefusedFiles::Why(const Sha256Digest& sha256, const FileStamp& stamp,
                                             const std::vector<ChunkHash>* chunks) const {
  if (!any_.load(std::memory_order_acquire)) return std::nullopt;
  MutexLock lock(mu_);
  auto it = keys_.find({sha256, stamp, chunks});
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

}  // namespace ckptfs
