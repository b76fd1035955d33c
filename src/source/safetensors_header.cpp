#include "ckptfs/safetensors_header.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace ckptfs {

namespace {

Status Broken(const std::string& rule) { return Status::Error("invalid safetensors header: " + rule); }

uint64_t ReadLe64(std::string_view b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(b[static_cast<size_t>(i)]);
  return v;
}

}  // namespace

uint64_t DtypeSize(std::string_view dtype) {
  static constexpr std::pair<std::string_view, uint64_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"F64", 8}, {"I64", 8},
      {"U64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size,
                                                 uint64_t* need_bytes) {
  if (file_size < 8) return Broken("file is shorter than the 8-byte header length");
  if (prefix.size() < 8) {
    if (need_bytes) *need_bytes = 8;
    return Status::NeedMore("need the first 8 bytes");
  }
  SafetensorsHeader h;
  h.header_len = ReadLe64(prefix);
  if (h.header_len > kMaxSafetensorsHeader) {
    return Broken("header length " + std::to_string(h.header_len) + " exceeds the limit of " +
                  std::to_string(kMaxSafetensorsHeader) + " bytes");
  }
  if (h.header_len > file_size - 8) {
    return Broken("header length " + std::to_string(h.header_len) + " runs past the end of the " +
                  std::to_string(file_size) + "-byte file");
  }
  if (prefix.size() < 8 + h.header_len) {
    if (need_bytes) *need_bytes = 8 + h.header_len;
    return Status::NeedMore("need " + std::to_string(8 + h.header_len) + " bytes");
  }
  const std::string_view text = prefix.substr(8, h.header_len);
  // nlohmann rejects invalid UTF-8 in strings, so this also enforces UTF-8.
  h.json = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (h.json.is_discarded()) return Broken("header is not valid UTF-8 JSON");
  if (!h.json.is_object()) return Broken("header's top level is not a JSON object");

  struct Extent {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Extent> extents;
  for (const auto& [name, value] : h.json.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Broken("__metadata__ is not a map");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) return Broken("__metadata__ value of \"" + k + "\" is not a string");
      }
      continue;
    }
    if (!value.is_object()) return Broken("tensor \"" + name + "\" is not an object");
    if (!value.contains("dtype") || !value["dtype"].is_string()) {
      return Broken("tensor \"" + name + "\" has no dtype");
    }
    const uint64_t elem = DtypeSize(value["dtype"].get<std::string>());
    if (elem == 0) return Broken("tensor \"" + name + "\" has unknown dtype " + value["dtype"].get<std::string>());
    if (!value.contains("shape") || !value["shape"].is_array()) {
      return Broken("tensor \"" + name + "\" has no shape");
    }
    uint64_t count = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) return Broken("tensor \"" + name + "\" has a shape entry that is not a count");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && count > UINT64_MAX / dim) return Broken("tensor \"" + name + "\" shape overflows");
      count *= dim;
    }
    if (count > UINT64_MAX / elem) return Broken("tensor \"" + name + "\" size overflows");
    const auto& off = value.contains("data_offsets") ? value["data_offsets"] : nlohmann::ordered_json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Broken("tensor \"" + name + "\" has no data_offsets [begin, end]");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (end < begin) return Broken("tensor \"" + name + "\" data_offsets end before they begin");
    if (end - begin != count * elem) {
      return Broken("tensor \"" + name + "\" holds " + std::to_string(end - begin) + " bytes but its shape and dtype need " +
                    std::to_string(count * elem));
    }
    extents.push_back({begin, end, name});
  }
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expect = 0;
  for (const auto& e : extents) {
    if (e.begin < expect) return Broken("tensor \"" + e.name + "\" overlaps the tensor before it");
    if (e.begin > expect) return Broken("a hole of " + std::to_string(e.begin - expect) + " bytes before tensor \"" + e.name + "\"");
    expect = e.end;
  }
  if (8 + h.header_len + expect != file_size) {
    return Broken("the tensors end at byte " + std::to_string(8 + h.header_len + expect) + " but the file has " +
                  std::to_string(file_size));
  }
  h.data_len = expect;
  h.tensors = extents.size();
  return h;
}

std::string StampedHeaderBytes(const SafetensorsHeader& header, const std::string& checkpoint_name,
                               const std::string& file_sha256_hex) {
  nlohmann::ordered_json j = header.json;
  if (!j.contains("__metadata__")) {
    // Created first, where readers expect it.
    nlohmann::ordered_json with = nlohmann::ordered_json::object();
    with["__metadata__"] = nlohmann::ordered_json::object();
    for (auto& [k, v] : j.items()) with[k] = std::move(v);
    j = std::move(with);
  }
  j["__metadata__"]["ckptfs.checkpoint"] = checkpoint_name;
  j["__metadata__"]["ckptfs.sha256"] = file_sha256_hex;
  std::string text = j.dump();
  // Keep the data section's alignment: grow by a multiple of 8.
  uint64_t len = header.header_len;
  while (len < text.size()) len += 8;
  text.append(static_cast<size_t>(len - text.size()), ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace ckptfs
