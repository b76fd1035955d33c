// Paths in JSON. A path is a string of bytes; a JSON string is Unicode, and
// nlohmann's dump() throws on a string that is not UTF-8. A directory named
// with a Latin-1 byte ("caf\xe9") is a valid path all the same, so every
// JSON message of the control socket goes through this encoding:
//
// - a string that is valid UTF-8 is sent as it is;
// - an object member "K" whose string is not valid UTF-8 is sent as a display
//   form (each byte that is not part of a valid UTF-8 sequence written as the
//   four characters \xNN), and a member "K_b64" is added beside it with the
//   standard base64 (RFC 4648, padded) of the exact bytes;
// - an object member "K" holding an array that contains such a string (at any
//   depth of nested arrays) is sent with every string in display form, and
//   "K_b64" mirrors the array: the base64 of every string at the same
//   position, null for anything that is not a string or an array;
// - objects, wherever they are, follow the same rules for their own members.
//
// So a message without odd bytes is unchanged, a reader that ignores "_b64"
// members still gets a readable string, and one that applies them gets the
// exact bytes. Object keys must be UTF-8 (no message uses a path as a key).
// packaging/man/ckptfsctl.8 documents this for other clients.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ckptfs/status.h"

namespace ckptfs {

// The suffix of the member that carries a member's exact bytes.
inline constexpr std::string_view kExactBytesSuffix = "_b64";

// True when `s` is well-formed UTF-8 per RFC 3629 (no overlong forms, no
// surrogates, nothing above U+10FFFF): exactly what dump() accepts.
bool IsValidUtf8(std::string_view s);

// `s` for a person to read: its valid UTF-8 as it is, other bytes as \xNN.
std::string DisplayBytes(std::string_view s);

std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

// Rewrites `j` in place as described above, so that j.dump() cannot throw.
// Fails, naming the member, on a key that is not UTF-8, on a non-UTF-8
// string with no object member to sit beside, or on nesting deeper than
// kMaxJsonPathDepth (the walk is recursive and must stay bounded).
Status EncodeJsonPaths(nlohmann::json& j);

// The inverse: every "K_b64" member is applied to "K" and removed, so the
// strings hold the exact bytes again (and may no longer be dumpable).
// Fails on a "K_b64" that is not base64 or whose shape does not match "K".
Status DecodeJsonPaths(nlohmann::json& j);

inline constexpr int kMaxJsonPathDepth = 64;

}  // namespace ckptfs
