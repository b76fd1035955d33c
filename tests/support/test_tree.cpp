#include "test_tree.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ckptfs::testing {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp " + templ + ": " + std::strerror(errno));
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests chmod things to 000; give them back so the tree can be removed.
  for (auto it = fs::recursive_directory_iterator(path_, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) ::chmod(it->path().c_str(), 0755);
  }
  // A daemon that mount(8) started and umount stopped may still be closing
  // its index in state/ for a moment (it is not the test's child to wait
  // for): try again briefly rather than leave the tree behind.
  for (int attempt = 0; attempt < 20; ++attempt) {
    fs::remove_all(path_, ec);
    if (!fs::exists(path_, ec)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void MakeDirs(const std::string& path) { fs::create_directories(path); }

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::string ReadFile(const std::string& path) {
  errno = 0;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Symlink(const std::string& target, const std::string& link_path) {
  fs::create_directories(fs::path(link_path).parent_path());
  if (::symlink(target.c_str(), link_path.c_str()) != 0) {
    throw std::runtime_error("symlink " + link_path + ": " + std::strerror(errno));
  }
}

void RemoveTree(const std::string& path) { fs::remove_all(path); }

void CopyTree(const std::string& from, const std::string& to) {
  fs::create_directories(fs::path(to).parent_path());
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<char>(rng());
  return out;
}

std::string MakeSafetensors(const std::vector<Tensor>& tensors, const std::string& metadata_json) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_json.empty()) header["__metadata__"] = nlohmann::ordered_json::parse(metadata_json);
  uint64_t offset = 0;
  std::string data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
    data += t.data;
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + json + data;
}

std::string SafetensorsHeader(const std::string& file_bytes) {
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = len << 8 | static_cast<uint8_t>(file_bytes[static_cast<size_t>(i)]);
  return file_bytes.substr(0, 8 + len);
}

void WriteModel(const std::string& dir, const ModelSpec& spec) {
  MakeDirs(dir);
  WriteFile(dir + "/config.json", R"({"architectures": ["DemoForCausalLM"], "hidden_size": 256, "num_layers": )" +
                                      std::to_string(spec.shards * spec.tensors_per_shard) + "}\n");
  WriteFile(dir + "/tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})" "\n");
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (int s = 0; s < spec.shards; ++s) {
    char shard_name[64];
    std::snprintf(shard_name, sizeof shard_name, "model-%05d-of-%05d.safetensors", s + 1, spec.shards);
    std::vector<Tensor> tensors;
    for (int t = 0; t < spec.tensors_per_shard; ++t) {
      Tensor tensor;
      tensor.name = "layers." + std::to_string(s * spec.tensors_per_shard + t) + ".weight";
      tensor.dtype = "F32";
      tensor.shape = {spec.tensor_bytes / 4};
      tensor.data = RandomBytes(spec.tensor_bytes, spec.seed * 1000003 + static_cast<uint64_t>(s * 1000 + t));
      weight_map[tensor.name] = shard_name;
      tensors.push_back(std::move(tensor));
    }
    WriteFile(dir + "/" + shard_name, MakeSafetensors(tensors, R"({"format": "pt"})"));
  }
  WriteFile(dir + "/model.safetensors.index.json",
            nlohmann::ordered_json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2) + "\n");
}

void WriteHubSnapshot(const std::string& repo_dir, const std::string& commit,
                      const std::vector<std::pair<std::string, std::string>>& files) {
  for (const auto& [name, bytes] : files) {
    const std::string tmp = repo_dir + "/blobs/.incoming";
    WriteFile(tmp, bytes);
    const std::string sha = RunCommand("sha256sum " + ShellQuote(tmp)).out.substr(0, 64);
    // As huggingface_hub does: a blob already there is not written again
    // (replacing it would change the files of every snapshot that links it).
    if (fs::exists(repo_dir + "/blobs/" + sha)) {
      fs::remove(tmp);
    } else {
      fs::rename(tmp, repo_dir + "/blobs/" + sha);
    }
    std::string up = "../../";
    for (char c : name) up += c == '/' ? "../" : "";
    Symlink(up + "blobs/" + sha, repo_dir + "/snapshots/" + commit + "/" + name);
  }
}

void WriteHubRef(const std::string& repo_dir, const std::string& revision, const std::string& commit) {
  WriteFile(repo_dir + "/refs/" + revision, commit);
}

void ZeroTensor(const std::string& safetensors_path, size_t tensor_index) {
  std::string bytes = ReadFile(safetensors_path);
  std::string header = SafetensorsHeader(bytes);
  auto j = nlohmann::ordered_json::parse(header.substr(8));
  size_t seen = 0;
  for (auto& [name, value] : j.items()) {
    if (name == "__metadata__") continue;
    if (seen++ != tensor_index) continue;
    uint64_t begin = value["data_offsets"][0], end = value["data_offsets"][1];
    std::memset(&bytes[header.size() + begin], 0, end - begin);
    // Rewrite in place so the inode stays; only content (and so mtime) moves.
    std::fstream f(safetensors_path, std::ios::binary | std::ios::in | std::ios::out);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return;
  }
  throw std::runtime_error("no tensor " + std::to_string(tensor_index) + " in " + safetensors_path);
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

CommandResult RunCommand(const std::string& command, bool merge_stderr) {
  std::string cmd = merge_stderr ? "(" + command + ") 2>&1" : command;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen: " + command);
  CommandResult r;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string CoreutilsDigest(const std::string& dir, const std::string& also_prune) {
  std::string prune = "-name '.*'";
  if (!also_prune.empty()) prune = "\\( -name '.*' -o -name " + ShellQuote(also_prune) + " \\)";
  CommandResult r = RunCommand("cd " + ShellQuote(dir) + " && find -L . -mindepth 1 " + prune +
                               " -prune -o -type f -printf '%P\\n'"
                               " | LC_ALL=C sort | xargs -r -d '\\n' sha256sum | sha256sum");
  if (r.exit_code != 0 || r.out.size() < 64) throw std::runtime_error("coreutils digest failed in " + dir);
  return "sha256-" + r.out.substr(0, 64);
}

}  // namespace ckptfs::testing
