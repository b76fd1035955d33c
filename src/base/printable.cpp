#include "ckptfs/printable.h"

#include <cstdio>

namespace ckptfs {

namespace {

std::string Hex(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", c);
  return buf;
}

// The length of the valid UTF-8 sequence at `s[i]` (2 to 4), or 0.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = b(i);
  size_t len = lead >= 0xf0 && lead <= 0xf4 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 && lead < 0xe0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
  if ((lead == 0xe0 && b(i + 1) < 0xa0) || (lead == 0xed && b(i + 1) > 0x9f) || (lead == 0xf0 && b(i + 1) < 0x90) ||
      (lead == 0xf4 && b(i + 1) > 0x8f)) {
    return 0;
  }
  return len;
}

}  // namespace

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      out += Hex(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (const size_t len = Utf8Length(text, i); len > 0) {
      // U+0080 to U+009F are the C1 controls (U+009B is CSI).
      if (len == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) {
        out += Hex(c) + Hex(static_cast<unsigned char>(text[i + 1]));
      } else {
        out.append(text, i, len);
      }
      i += len;
      continue;
    }
    // A byte of a name that is not UTF-8: kept as it is (the exact bytes),
    // unless a terminal in an 8-bit locale would take it for a C1 control.
    out += c < 0xa0 ? Hex(c) : std::string(1, static_cast<char>(c));
    ++i;
  }
  return out;
}

}  // namespace ckptfs
