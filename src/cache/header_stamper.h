// HeaderStamper: with stamp_headers, serves every *.safetensors member with
// its header's __metadata__ extended by "ckptfs.checkpoint" and
// "ckptfs.sha256", so that a cache keyed on shard names plus raw headers sees
// a different key wherever the content differs. The header is read through
// the verified chunk cache (FileServer::FetchChunk); the stamped bytes are
// kept per (digest, file).
// Tensor bytes are served unchanged, shifted by the header's growth.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "ckptfs/file_server.h"
#include "ckptfs/mutex.h"

namespace ckptfs {

struct StampedFile {
  std::shared_ptr<const std::string> prefix;  // 8-byte length + stamped JSON
  uint64_t source_prefix_len = 0;             // 8 + the original header length
  uint64_t size = 0;                          // the file's size as served
};

class HeaderStamper {
 public:
  // The stamped form of `file`, or nullopt to serve it unstamped (not a
  // safetensors file, or a header that breaks the format: warned once).
  // Fails only when the header could not be read (e.g. EIO from the source).
  Result<std::optional<StampedFile>> For(FileServer& server, const View::NodePtr& file);

 private:
  Mutex mu_;
  // By digest + "/" + file sha.
  std::map<std::string, std::optional<StampedFile>> memo_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
