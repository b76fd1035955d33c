// Helpers that build real checkpoint trees on disk for tests, benchmarks and
// the demo: safetensors shards, configs, Hugging Face cache layouts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckptfs::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it
// when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ckptfs-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

void MakeDirs(const std::string& path);
void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);
void Symlink(const std::string& target, const std::string& link_path);
void RemoveTree(const std::string& path);
// `cp -a` of a whole tree.
void CopyTree(const std::string& from, const std::string& to);

// Deterministic pseudo-random bytes.
std::string RandomBytes(size_t n, uint64_t seed);

struct Tensor {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "U8", ...
  std::vector<uint64_t> shape;
  std::string data;            // product(shape) * dtype size bytes
};

// A complete safetensors file: 8-byte little-endian header length, the JSON
// header (padded with spaces to a multiple of 8), then the tensor bytes.
std::string MakeSafetensors(const std::vector<Tensor>& tensors, const std::string& metadata_json = "");
// The length-prefixed header of a safetensors file (its first 8+N bytes).
std::string SafetensorsHeader(const std::string& file_bytes);

struct ModelSpec {
  uint64_t seed = 1;
  int shards = 2;
  int tensors_per_shard = 3;
  uint64_t tensor_bytes = 2048;  // each tensor is F32 of tensor_bytes/4 elements
};

// Writes a small model checkpoint into `dir`: config.json, tokenizer.json and
// `shards` model-XXXXX-of-YYYYY.safetensors files.
void WriteModel(const std::string& dir, const ModelSpec& spec);

// One snapshot of a Hugging Face hub cache repository (repo_dir is
// HUB/models--org--name), written the way huggingface_hub writes it: each
// file's bytes in blobs/<its SHA-256>, and snapshots/<commit>/<name> a
// relative link to ../../blobs/<sha> (more ../ for deeper names).
void WriteHubSnapshot(const std::string& repo_dir, const std::string& commit,
                      const std::vector<std::pair<std::string, std::string>>& files);
// refs/<revision> holding `commit`, without a newline, as huggingface_hub
// writes it.
void WriteHubRef(const std::string& repo_dir, const std::string& revision, const std::string& commit);

// Zeroes the bytes of tensor `tensor_index` in a safetensors file in place,
// keeping the header (and so the file's size and names) unchanged.
void ZeroTensor(const std::string& safetensors_path, size_t tensor_index);

// DESIGN.md section 1's coreutils command, run in `dir`: "sha256-<hex>".
// `also_prune` adds a find(1) -name pattern for nested checkpoints, which
// the plain command does not know to leave out.
std::string CoreutilsDigest(const std::string& dir, const std::string& also_prune = "");

struct CommandResult {
  int exit_code = -1;
  std::string out;  // standard output (standard error too when merged)
};
// Runs `command` with /bin/sh; stderr is merged into `out` when merge_stderr.
CommandResult RunCommand(const std::string& command, bool merge_stderr = false);
std::string ShellQuote(const std::string& s);

}  // namespace ckptfs::testing
