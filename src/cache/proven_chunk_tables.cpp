#include "ckptfs/proven_chunk_tables.h"

namespace ckptfs {

ProvenChunkTables::Table ProvenChunkTables::Find(const Sha256Digest& file) {
  MutexLock lock(mu_);
  auto it = tables_.find(file);
  if (it == tables_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.table;
}

void ProvenChunkTables::Put(const Sha256Digest& file, Table table) {
  if (!table || table->size() > max_chunks_) return;
  MutexLock lock(mu_);
  if (auto it = tables_.find(file); it != tables_.end()) {
    chunks_ -= it->second.table->size();
    lru_.erase(it->second.lru);
    tables_.erase(it);
  }
  while (chunks_ + table->size() > max_chunks_ && !lru_.empty()) {
    auto victim = tables_.find(lru_.back());
    chunks_ -= victim->second.table->size();
    tables_.erase(victim);
    lru_.pop_back();
  }
  chunks_ += table->size();
  lru_.push_front(file);
  tables_[file] = Entry{std::move(table), lru_.begin()};
}

uint64_t ProvenChunkTables::tables() const {
  MutexLock lock(mu_);
  return tables_.size();
}

}  // namespace ckptfs
