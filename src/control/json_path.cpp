#include "ckptfs/json_path.h"

#include <openssl/evp.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ckptfs {

namespace {

using Json = nlohmann::json;

// Length of the well-formed UTF-8 sequence that starts at s[i], or 0 when the
// byte there does not start one (RFC 3629, table 3-7 of the Unicode standard).
size_t Utf8SequenceAt(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = byte(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return len;
}

bool HasOddString(const Json& v, int depth);

// The "K_b64" mirror of `v`: base64 for strings, mirrored arrays, null else.
Json Mirror(const Json& v) {
  if (v.is_string()) return Base64Encode(v.get_ref<const std::string&>());
  if (!v.is_array()) return nullptr;
  Json out = Json::array();
  for (const auto& e : v) out.push_back(Mirror(e));
  return out;
}

// Puts the strings of `v` (and of arrays nested in it) in display form.
void ToDisplay(Json& v) {
  if (v.is_string()) {
    v = DisplayBytes(v.get_ref<const std::string&>());
  } else if (v.is_array()) {
    for (auto& e : v) ToDisplay(e);
  }
}

// True when `v` is, or is an array holding at any depth, a non-UTF-8 string.
bool HasOddString(const Json& v, int depth) {
  if (v.is_string()) return !IsValidUtf8(v.get_ref<const std::string&>());
  if (!v.is_array() || depth > kMaxJsonPathDepth) return false;
  for (const auto& e : v) {
    if (HasOddString(e, depth + 1)) return true;
  }
  return false;
}

Status EncodeValue(Json& v, int depth, const std::string& where);

Status EncodeObject(Json& obj, int depth, const std::string& where) {
  std::vector<std::pair<std::string, Json>> added;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!IsValidUtf8(it.key())) return Status::Error("JSON key is not UTF-8: " + DisplayBytes(it.key()));
    const std::string here = where + "." + it.key();
    if (HasOddString(it.value(), depth + 1)) {
      added.emplace_back(it.key() + std::string(kExactBytesSuffix), Mirror(it.value()));
      ToDisplay(it.value());
    }
    if (Status s = EncodeValue(it.value(), depth + 1, here); !s.ok()) return s;
  }
  for (auto& [key, mirror] : added) obj[key] = std::move(mirror);
  return Status::Ok();
}

// Walks `v` for objects to encode; a non-UTF-8 string met here has no
// member to sit beside (EncodeObject has already handled those that do).
Status EncodeValue(Json& v, int depth, const std::string& where) {
  if (depth > kMaxJsonPathDepth) return Status::Error("JSON nested too deeply at " + where);
  if (v.is_object()) return EncodeObject(v, depth, where);
  if (v.is_string() && !IsValidUtf8(v.get_ref<const std::string&>())) {
    return Status::Error("non-UTF-8 string outside an object member at " + where);
  }
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (Status s = EncodeValue(v[i], depth + 1, where + "[" + std::to_string(i) + "]"); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

// Applies a "K_b64" mirror to the value of "K" (null when K is absent).
Status ApplyMirror(Json& target, const Json& mirror, const std::string& where) {
  if (mirror.is_null()) return Status::Ok();
  if (mirror.is_string()) {
    if (!target.is_null() && !target.is_string()) return Status::Error(where + " is not a string");
    auto bytes = Base64Decode(mirror.get_ref<const std::string&>());
    if (!bytes.ok()) return Status::Error(where + ": " + bytes.status().message());
    target = std::move(*bytes);
    return Status::Ok();
  }
  if (!mirror.is_array()) return Status::Error(where + " must be a string, an array or null");
  if (target.is_null()) target = Json::array();
  if (target.empty()) target.get_ref<Json::array_t&>().resize(mirror.size());
  if (!target.is_array() || target.size() != mirror.size()) return Status::Error(where + " does not match its array");
  for (size_t i = 0; i < mirror.size(); ++i) {
    if (Status s = ApplyMirror(target[i], mirror[i], where + "[" + std::to_string(i) + "]"); !s.ok()) return s;
  }
  return Status::Ok();
}

Status DecodeValue(Json& v, int depth, const std::string& where) {
  if (depth > kMaxJsonPathDepth) return Status::Error("JSON nested too deeply at " + where);
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (Status s = DecodeValue(v[i], depth + 1, where + "[" + std::to_string(i) + "]"); !s.ok()) return s;
    }
  }
  if (!v.is_object()) return Status::Ok();
  std::vector<std::string> mirrors;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (Status s = DecodeValue(it.value(), depth + 1, where + "." + it.key()); !s.ok()) return s;
    const std::string& key = it.key();
    if (key.size() > kExactBytesSuffix.size() && key.ends_with(kExactBytesSuffix)) mirrors.push_back(key);
  }
  for (const auto& key : mirrors) {
    const std::string base = key.substr(0, key.size() - kExactBytesSuffix.size());
    if (Status s = ApplyMirror(v[base], v[key], where + "." + key); !s.ok()) return s;
    v.erase(key);
  }
  return Status::Ok();
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceAt(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string DisplayBytes(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t len = Utf8SequenceAt(s, i); len > 0) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    const auto c = static_cast<uint8_t>(s[i++]);
    out += {'\\', 'x', kHex[c >> 4], kHex[c & 0xF]};
  }
  return out;
}

std::string Base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');  // EVP_EncodeBlock adds a NUL
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  // EVP_DecodeBlock skips blanks and counts padding as zero bytes, so the
  // strict form is checked here and the padding taken off after.
  if (text.size() % 4 != 0) return Status::Error("base64 length is not a multiple of 4");
  size_t pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool digit = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
                       c == '/';
    if (c == '=' && i + 2 >= text.size()) {
      ++pad;
    } else if (!digit || pad > 0) {
      return Status::Error("not base64");
    }
  }
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return Status::Error("not base64");
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

Status EncodeJsonPaths(nlohmann::json& j) { return EncodeValue(j, 0, "$"); }

Status DecodeJsonPaths(nlohmann::json& j) { return DecodeValue(j, 0, "$"); }

}  // namespace ckptfs
