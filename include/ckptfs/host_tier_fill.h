// HostTierFill: fill_on_index. The indexer's copies of the files it hashes
// (HashCopy), made in the host tier (FileCache), so that a new checkpoint's
// files are resident, verified by construction, when its digest appears, and
// the first open passes through at once: one read of the disk from arrival to
// loaded, instead of one to hash and another to fill.
//
// Policy when the tier is full: a copy is made only in free room (kFree).
// Nothing resident is evicted for it, pinned or not: every copy there was
// used more recently than a file nobody has opened yet. A file that does not
// fit is hashed as always, and filled at its first open (fill=).
//
// The room is claimed under a provisional key when hashing starts (the file's
// SHA-256 is not known yet) and the copy published under the SHA-256 once it
// is final and the file's stamp held through the read (FileCache::PublishAs);
// a copy of content another fill made resident meanwhile is dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ckptfs/file_cache.h"
#include "ckptfs/hash_copy.h"
#include "ckptfs/option_words.h"

namespace ckptfs {

class HostTierFill : public HashCopyMaker {
 public:
  enum class Policy { kOff, kFree };

  // `skip_safetensors`: with stamp_headers those files are served in a
  // stamped form, which a copy of the source's bytes is not.
  HostTierFill(FileCache* cache, Policy policy, bool skip_safetensors)
      : cache_(cache), policy_(policy), skip_safetensors_(skip_safetensors) {}

  std::unique_ptr<HashCopy> Begin(const std::string& rel_path, const FileStamp& stamp) override;

  Policy policy() const { return policy_; }
  struct Stats {
    uint64_t fills = 0, bytes = 0;  // published
    uint64_t skipped = 0;           // no free room (or no memfd to be had)
    uint64_t abandoned = 0;         // begun, not published (the file changed, hashing stopped)
    uint64_t reserve_bytes = 0;     // written into 2 MiB pages from the page reserve
  };
  Stats GetStats() const;

 private:
  class Copy;
  FileCache* const cache_;
  const Policy policy_;
  const bool skip_safetensors_;
  std::atomic<uint64_t> fills_{0}, bytes_{0}, skipped_{0}, abandoned_{0}, reserve_bytes_{0};
};

// HostTierFill::Policy as the fill_on_index= option spells it.
inline constexpr OptionWord<HostTierFill::Policy> kFillOnIndexWords[] = {{HostTierFill::Policy::kFree, "free"},
                                                                          {HostTierFill::Policy::kOff, "off"}};

}  // namespace ckptfs
