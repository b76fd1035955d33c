#include "ckptfs/manifest_record.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>

namespace ckptfs {

namespace {

constexpr std::string_view kMagic = "ckptfs-record 1";
constexpr int64_t kNanos = 1'000'000'000;
// No file is larger (2^62 bytes); beyond it ChunkCount would overflow.
constexpr uint64_t kMaxRecordFileSize = uint64_t{1} << 62;

// The whole-seconds rule of the header comment.
bool SameMtime(int64_t a, int64_t b) {
  if (a == b) return true;
  const bool whole_a = a % kNanos == 0, whole_b = b % kNanos == 0;
  return (whole_a || whole_b) && MtimeSeconds(a) == MtimeSeconds(b);
}

std::string MtimeText(int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%" PRId64 ".%09" PRId64, ns / kNanos, ns % kNanos);
  return buf;
}

// Reads "PREFIX VALUE\n" at *pos; false if the line is not there.
bool TakeLine(std::string_view text, size_t* pos, std::string_view prefix, std::string_view* value) {
  const size_t end = text.find('\n', *pos);
  if (end == std::string_view::npos) return false;
  std::string_view line = text.substr(*pos, end - *pos);
  if (line.substr(0, prefix.size()) != prefix) return false;
  *value = line.substr(prefix.size());
  *pos = end + 1;
  return true;
}

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return false;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && p == text.data() + text.size();
}

bool ParseMtime(std::string_view text, int64_t* ns) {
  const size_t dot = text.find('.');
  int64_t sec = 0, frac = 0;
  if (dot == std::string_view::npos || text.size() - dot - 1 != 9) return false;
  std::string_view frac_text = text.substr(dot + 1);
  auto [p, ec] = std::from_chars(frac_text.data(), frac_text.data() + 9, frac);
  if (ec != std::errc() || p != frac_text.data() + 9 || frac < 0) return false;
  if (!ParseNumber(text.substr(0, dot), &sec) || sec > INT64_MAX / kNanos - 1) return false;
  *ns = sec * kNanos + frac;
  return true;
}

Status Torn(std::string_view what) { return Status::Corrupt("not a complete record: " + std::string(what)); }

}  // namespace

bool ManifestRecord::Describes(const std::string& rel_path, const FileStamp& stamp) const {
  return path == rel_path && size == stamp.size && SameMtime(mtime_ns, stamp.mtime_ns);
}

std::string EscapeRecordPath(std::string_view path) {
  std::string out;
  for (unsigned char c : path) {
    if (c > ' ' && c < 0x7f && c != '%') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

Result<std::string> UnescapeRecordPath(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    uint8_t byte;
    if (i + 2 >= text.size() || !FromHex(text.substr(i + 1, 2), {&byte, 1})) return Status::Corrupt("bad escape in path");
    out += static_cast<char>(byte);
    i += 2;
  }
  return out;
}

std::string RecordSignedPart(const ManifestRecord& record, const std::string& key_id) {
  std::string out;
  out.reserve(160 + record.hashes.chunks.size() * 33);
  out += kMagic;
  out += "\npath " + EscapeRecordPath(record.path);
  out += "\nsize " + std::to_string(record.size);
  out += "\nmtime " + MtimeText(record.mtime_ns);
  out += "\nsha256 " + ToHex(record.hashes.sha256);
  out += "\nchunks " + std::to_string(record.hashes.chunks.size()) + "\n";
  for (const auto& c : record.hashes.chunks) out += ToHex(c) + "\n";
  if (!key_id.empty()) out += "key " + key_id + "\n";
  return out;
}

Result<std::string> SignRecord(const ManifestRecord& record, const SigningKey& key) {
  std::string text = RecordSignedPart(record, key.key_id());
  auto sig = key.Sign(text);
  if (!sig.ok()) return sig.status();
  text += "sig " + ToHex({reinterpret_cast<const uint8_t*>(sig->data()), sig->size()}) + "\n";
  return text;
}

Result<ParsedRecord> ParseRecord(std::string_view text) {
  ParsedRecord out;
  ManifestRecord& r = out.record;
  size_t pos = 0;
  std::string_view v;
  if (!TakeLine(text, &pos, kMagic, &v) || !v.empty()) return Status::Corrupt("not a ckptfs record (no '" + std::string(kMagic) + "' line)");
  if (!TakeLine(text, &pos, "path ", &v)) return Torn("no path line");
  auto path = UnescapeRecordPath(v);
  if (!path.ok() || path->empty()) return Torn("bad path line");
  r.path = std::move(*path);
  if (!TakeLine(text, &pos, "size ", &v) || !ParseNumber(v, &r.size)) return Torn("bad size line");
  if (!TakeLine(text, &pos, "mtime ", &v) || !ParseMtime(v, &r.mtime_ns)) return Torn("bad mtime line");
  if (!TakeLine(text, &pos, "sha256 ", &v) || !FromHex(v, r.hashes.sha256)) return Torn("bad sha256 line");
  uint64_t count = 0;
  if (!TakeLine(text, &pos, "chunks ", &v) || !ParseNumber(v, &count) || count != ChunkCount(r.size)) {
    return Torn("bad chunks line (it must be the chunk count of the size)");
  }
  // Each chunk line is 33 bytes: a count the text cannot hold is refused
  // before anything is allocated for it (a store's writer could otherwise
  // claim an exabyte file in a 100-byte record).
  if (r.size > kMaxRecordFileSize || count > (text.size() - pos) / 33) {
    return Torn("chunks line claims " + std::to_string(count) + " chunks, more than the record holds");
  }
  r.hashes.size = r.size;
  r.hashes.chunks.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (!TakeLine(text, &pos, "", &v) || !FromHex(v, r.hashes.chunks[i])) {
      return Torn("chunk line " + std::to_string(i + 1) + " of " + std::to_string(count) + " is missing or bad");
    }
  }
  if (pos == text.size()) {
    out.signed_part = std::string(text);
    return out;  // unsigned
  }
  if (!TakeLine(text, &pos, "key ", &v) || v.size() != 64) return Torn("bad key line");
  uint8_t id[32];
  if (!FromHex(v, id)) return Torn("bad key line");
  out.key_id = ToHex(id);
  out.signed_part = std::string(text.substr(0, pos));
  uint8_t sig[64];
  if (!TakeLine(text, &pos, "sig ", &v) || !FromHex(v, sig)) return Torn("bad or missing sig line");
  out.signature.assign(reinterpret_cast<const char*>(sig), sizeof sig);
  if (pos != text.size()) return Torn("bytes after the signature");
  return out;
}

}  // namespace ckptfs
