#include "ckptfs/safetensors_header.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace ckptfs {

namespace {

using Json = nlohmann::ordered_json;

Status Broken(const std::string& rule) { return Status::Error("invalid safetensors header: " + rule); }

uint64_t ReadLe64(std::string_view b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(b[static_cast<size_t>(i)]);
  return v;
}

// Builds the header's JSON from nlohmann's SAX events in one linear pass.
// nlohmann's own DOM builder inserts every key through ordered_map's linear
// lookup, so an object of n keys cost O(n^2): a 1 MB header of 80,000
// metadata keys took 7 s, 4 MB 80 s. Here a key is appended to its object's
// vector, and repeats are found by sorting each object's keys once it closes.
// Depth is checked as each array or object opens; nlohmann's SAX parser is
// iterative, so no recursion ever sees a deeper document.
class HeaderBuilder {
 public:
  explicit HeaderBuilder(Json* root) : root_(root) {}

  bool null() { return Put(nullptr); }
  bool boolean(bool v) { return Put(v); }
  bool number_integer(Json::number_integer_t v) { return Put(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return Put(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& /*text*/) { return Put(v); }
  bool string(Json::string_t& v) { return Put(std::move(v)); }
  bool binary(Json::binary_t& /*v*/) { return Fail("header holds binary data"); }  // JSON text never does
  bool start_object(size_t /*len*/) { return Open(Json::object()); }
  bool start_array(size_t /*len*/) { return Open(Json::array()); }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool key(Json::string_t& k) {
    auto& members = open_.back()->get_ref<Json::object_t&>();
    // The vector's emplace_back: ordered_map's own emplace scans for the key.
    members.Json::object_t::Container::emplace_back(std::move(k), nullptr);
    slot_ = &members.back().second;
    return true;
  }
  bool end_object();
  bool parse_error(size_t position, const std::string& /*token*/, const nlohmann::detail::exception& /*e*/) {
    return Fail("header is not valid UTF-8 JSON (at byte " + std::to_string(position) + ")");
  }

  // Why the parse stopped; empty if it did not.
  const std::string& failure() const { return failure_; }

 private:
  bool Fail(std::string why) {
    if (failure_.empty()) failure_ = std::move(why);
    return false;
  }
  // Stores `v` where the document expects the next value; returns it.
  Json* Place(Json&& v) {
    if (open_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    if (open_.back()->is_array()) {
      auto& items = open_.back()->get_ref<Json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *slot_ = std::move(v);  // the value of the key just read
    return slot_;
  }
  template <typename T>
  bool Put(T&& v) {
    Place(Json(std::forward<T>(v)));
    return true;
  }
  bool Open(Json&& container) {
    if (open_.size() >= kMaxSafetensorsHeaderDepth) {
      return Fail("header nests arrays and objects more than " + std::to_string(kMaxSafetensorsHeaderDepth) +
                  " deep");
    }
    // The pointer stays valid: a container's parent does not grow while it is open.
    open_.push_back(Place(std::move(container)));
    return true;
  }

  Json* root_;
  std::vector<Json*> open_;  // the arrays and objects not yet closed, outermost first
  Json* slot_ = nullptr;
  std::string failure_;
};

bool HeaderBuilder::end_object() {
  const auto& members = open_.back()->get_ref<const Json::object_t&>();
  if (members.size() > 1) {
    std::vector<const std::string*> keys;
    keys.reserve(members.size());
    for (const auto& member : members) keys.push_back(&member.first);
    std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    auto repeat = std::adjacent_find(keys.begin(), keys.end(),
                                     [](const std::string* a, const std::string* b) { return *a == *b; });
    if (repeat != keys.end()) return Fail("repeated key \"" + **repeat + "\" in one object");
  }
  open_.pop_back();
  return true;
}

}  // namespace

Result<Json> ParseHeaderJson(std::string_view text) {
  Json root;
  HeaderBuilder builder(&root);
  // nlohmann rejects invalid UTF-8 in strings, so this also enforces UTF-8.
  if (!Json::sax_parse(text.begin(), text.end(), &builder) || !builder.failure().empty()) {
    return Broken(builder.failure().empty() ? "header is not valid UTF-8 JSON" : builder.failure());
  }
  return root;
}

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

namespace {

// Where one tensor's bytes lie in the data section.
struct Extent {
  uint64_t begin, end;
  std::string name;
};

Status CheckMetadata(const Json& value) {
  if (!value.is_object()) return Broken("__metadata__ is not a map");
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) return Broken("__metadata__ value of \"" + k + "\" is not a string");
  }
  return Status::Ok();
}

// A tensor's entry: a known dtype, a shape of counts, and data_offsets that
// hold exactly shape x dtype bytes. Extra keys are allowed (and ignored).
Result<Extent> CheckTensor(const std::string& name, const Json& value) {
  if (!value.is_object()) return Broken("tensor \"" + name + "\" is not an object");
  if (!value.contains("dtype") || !value["dtype"].is_string()) return Broken("tensor \"" + name + "\" has no dtype");
  const std::string& dtype = value["dtype"].get_ref<const std::string&>();
  const uint64_t elem = DtypeSize(dtype);
  if (elem == 0) return Broken("tensor \"" + name + "\" has unknown dtype " + dtype);
  if (!value.contains("shape") || !value["shape"].is_array()) return Broken("tensor \"" + name + "\" has no shape");
  uint64_t count = 1;
  for (const auto& d : value["shape"]) {
    if (!d.is_number_unsigned()) return Broken("tensor \"" + name + "\" has a shape entry that is not a count");
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && count > UINT64_MAX / dim) return Broken("tensor \"" + name + "\" shape overflows");
    count *= dim;
  }
  if (count > UINT64_MAX / elem) return Broken("tensor \"" + name + "\" size overflows");
  const auto& off = value.contains("data_offsets") ? value["data_offsets"] : Json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return Broken("tensor \"" + name + "\" has no data_offsets [begin, end]");
  }
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (end < begin) return Broken("tensor \"" + name + "\" data_offsets end before they begin");
  if (end - begin != count * elem) {
    return Broken("tensor \"" + name + "\" holds " + std::to_string(end - begin) +
                  " bytes but its shape and dtype need " + std::to_string(count * elem));
  }
  return Extent{begin, end, name};
}

// The tensors must tile the data section from its first byte to the file's
// end: no overlap, no hole. Returns the data section's length.
Result<uint64_t> CheckTiling(std::vector<Extent> extents, uint64_t header_len, uint64_t file_size) {
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expect = 0;
  for (const auto& e : extents) {
    if (e.begin < expect) return Broken("tensor \"" + e.name + "\" overlaps the tensor before it");
    if (e.begin > expect) {
      return Broken("a hole of " + std::to_string(e.begin - expect) + " bytes before tensor \"" + e.name + "\"");
    }
    expect = e.end;
  }
  if (8 + header_len + expect != file_size) {
    return Broken("the tensors end at byte " + std::to_string(8 + header_len + expect) + " but the file has " +
                  std::to_string(file_size));
  }
  return expect;
}

}  // namespace

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
  auto json = ParseHeaderJson(prefix.substr(8, h.header_len));
  if (!json.ok()) return json.status();
  h.json = std::move(*json);
  if (!h.json.is_object()) return Broken("header's top level is not a JSON object");
  std::vector<Extent> extents;
  for (const auto& [name, value] : h.json.get_ref<const Json::object_t&>()) {
    if (name == "__metadata__") {
      if (Status s = CheckMetadata(value); !s.ok()) return s;
      continue;
    }
    auto extent = CheckTensor(name, value);
    if (!extent.ok()) return extent.status();
    extents.push_back(std::move(*extent));
  }
  h.tensors = extents.size();
  auto data_len = CheckTiling(std::move(extents), h.header_len, file_size);
  if (!data_len.ok()) return data_len.status();
  h.data_len = *data_len;
  return h;
}

std::string StampedHeaderBytes(const SafetensorsHeader& header, const std::string& checkpoint_name,
                               const std::string& file_sha256_hex) {
  const auto& members = header.json.get_ref<const Json::object_t&>();
  auto found = std::find_if(members.begin(), members.end(), [](const auto& m) { return m.first == "__metadata__"; });
  Json meta = found != members.end() ? found->second : Json::object();
  meta["ckptfs.checkpoint"] = checkpoint_name;
  meta["ckptfs.sha256"] = file_sha256_hex;
  // Written member by member exactly as dump() writes the whole object, so
  // the tensors are neither copied nor looked up; __metadata__ goes first
  // when it was absent, where readers expect it.
  std::string text = "{";
  const auto write = [&text](const std::string& key, const Json& value) {
    if (text.size() > 1) text += ',';
    text += Json(key).dump();
    text += ':';
    text += value.dump();
  };
  if (found == members.end()) write("__metadata__", meta);
  for (const auto& [key, value] : members) write(key, key == "__metadata__" ? meta : value);
  text += '}';
  // Keep the data section's alignment: grow by a multiple of 8.
  uint64_t len = header.header_len;
  while (len < text.size()) len += 8;
  text.append(static_cast<size_t>(len - text.size()), ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + text;
}

uint64_t StampedFileSize(const SafetensorsHeader& header, uint64_t file_size) {
  const std::string stamped = StampedHeaderBytes(header, "sha256-" + std::string(64, '0'), std::string(64, '0'));
  return file_size - (8 + header.header_len) + stamped.size();
}

Result<std::optional<SafetensorsHeader>> ReadSafetensorsHeader(uint64_t file_size, const PrefixReader& read_prefix,
                                                               std::string* why) {
  uint64_t need = std::min<uint64_t>(8, file_size);
  for (;;) {
    auto bytes = read_prefix(need);
    if (!bytes.ok()) return bytes.status();
    uint64_t more = 0;
    auto header = ParseSafetensorsHeader(*bytes, file_size, &more);
    if (header.ok()) return std::optional<SafetensorsHeader>(std::move(*header));
    // The parser asks for more only within the file and the format's bound,
    // and each round asks for strictly more: at most two rounds.
    if (header.status().code() == Status::Code::kNeedMore && more > need) {
      need = more;
      continue;
    }
    if (why != nullptr) *why = header.status().message();
    return std::optional<SafetensorsHeader>();
  }
}

}  // namespace ckptfs
