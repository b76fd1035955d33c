#include "ckptfs/refused_files.h"

#include <tuple>

namespace ckptfs {

bool RefusedFiles::Less::operator()(const Key& a, const Key& b) const {
  const FileStamp &x = a.second, &y = b.second;
  return std::tie(a.first, x.dev, x.ino, x.size, x.mtime_ns, x.ctime_ns) <
         std::tie(b.first, y.dev, y.ino, y.size, y.mtime_ns, y.ctime_ns);
}

bool RefusedFiles::Add(const Sha256Digest& sha256, const FileStamp& stamp) {
  std::lock_guard lock(mu_);
  Key key{sha256, stamp};
  if (!keys_.insert(key).second) return false;
  any_ = true;
  order_.push_back(key);
  while (order_.size() > capacity_) {
    keys_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

bool RefusedFiles::Contains(const Sha256Digest& sha256, const FileStamp& stamp) const {
  if (!any_.load(std::memory_order_acquire)) return false;
  std::lock_guard lock(mu_);
  return keys_.count({sha256, stamp}) != 0;
}

}  // namespace ckptfs
