// FileFiller's background queue: fills one file at a time on a thread of
// its own (fill=open, and the shards beside one that was opened).
#include <algorithm>

#include <spdlog/spdlog.h>

#include "ckptfs/catalog.h"
#include "file_filler.h"
#include "ckptfs/mutex.h"

namespace ckptfs {

namespace {
constexpr size_t kMaxQueued = 4096;  // an open storm must not grow memory without bound
}  // namespace

void FileFiller::Enqueue(const View::NodePtr& file, const FileKey& key) {
  {
    MutexLock lock(mu_);
    if (stopping_ || queued_.count(key) || queue_.size() >= kMaxQueued) return;
    queued_.insert(key);
    queue_.emplace_back(file, key);
  }
  wake_.NotifyOne();
}

void FileFiller::EnqueueSiblings(const View::NodePtr& file) {
  {
    MutexLock lock(mu_);
    if (stopping_ || sibling_requests_.size() >= kMaxQueued) return;
    sibling_requests_.push_back(file);
  }
  wake_.NotifyOne();
}

void FileFiller::QueueSiblingsOf(const View::NodePtr& file) {
  const std::string_view path = file->source_path;
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  if (!IsWeightFileName(path.substr(slash + 1)) || dot == std::string_view::npos) return;
  const View* view = server_.parts().view;
  if (view == nullptr) return;  // a server of loose files: no digest directory to look in
  const std::string_view dir = path.substr(0, slash + 1), suffix = path.substr(dot);
  const auto root = view->Get(kRootInode);
  const auto digest_dir = root ? root->children.find(file->digest) : std::map<std::string, InodeId>::const_iterator{};
  if (!root || digest_dir == root->children.end()) return;
  std::vector<View::NodePtr> siblings;
  for (auto& f : view->FilesUnder(view->Get(digest_dir->second))) {
    const std::string_view p = f->source_path;
    if (f->sha256 != file->sha256 && p.size() > dir.size() + suffix.size() && p.substr(0, dir.size()) == dir &&
        p.find('/', dir.size()) == std::string_view::npos && p.substr(p.size() - suffix.size()) == suffix) {
      siblings.push_back(std::move(f));
    }
  }
  std::sort(siblings.begin(), siblings.end(), [](const auto& a, const auto& b) { return a->source_path < b->source_path; });
  const FileCache::Stats tier = server_.parts().files->GetStats();
  uint64_t room = tier.capacity - std::min(tier.capacity, tier.used + tier.filling + tier.held_by_readers);
  for (const auto& f : siblings) {
    auto form = server_.FormOf(f);
    if (!form.ok() || server_.parts().files->Find(form->key, /*use=*/false)) continue;
    if (PageBytes(form->size) > room) break;
    room -= PageBytes(form->size);
    Enqueue(f, form->key);
  }
}

void FileFiller::RunQueue() {
  for (;;) {
    std::pair<View::NodePtr, FileKey> job;
    View::NodePtr siblings_of;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty() && sibling_requests_.empty()) wake_.Wait(mu_);
      if (stopping_) return;
      // Sibling requests first: they only queue fills, behind any queued before.
      if (!sibling_requests_.empty()) {
        siblings_of = std::move(sibling_requests_.front());
        sibling_requests_.pop_front();
      } else {
        job = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (siblings_of) {
      QueueSiblingsOf(siblings_of);
      continue;
    }
    if (!server_.parts().files->Find(job.second, /*use=*/false)) {
      auto filled = Fill(job.first, /*pin=*/false);
      if (!filled.ok() && filled.status().code() == Status::Code::kFull) {
        ++skipped_;
        spdlog::debug("{}: not copied into the host tier: {}", job.first->source_path, filled.status().message());
      }
    }
    MutexLock lock(mu_);
    queued_.erase(job.second);
  }
}

}  // namespace ckptfs
