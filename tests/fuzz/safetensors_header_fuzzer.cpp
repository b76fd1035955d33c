// libFuzzer target for the safetensors header parser. Each input is a whole
// file. Beyond "no crash, no sanitizer report", it checks the stamping
// invariant: the stamped form of any accepted file is itself accepted, keeps
// the data section, and grows the header by a multiple of 8.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ckptfs/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  auto header = ckptfs::ParseSafetensorsHeader(file, size);
  if (!header.ok()) return 0;
  const std::string stamped = ckptfs::StampedHeaderBytes(
      *header, "sha256-" + std::string(64, 'c'), std::string(64, 'd'));
  if (stamped.size() - 8 > ckptfs::kMaxSafetensorsHeader) return 0;  // grew past the limit: nothing to check
  const std::string restamped = stamped + std::string(file.substr(8 + header->header_len));
  auto again = ckptfs::ParseSafetensorsHeader(restamped, restamped.size());
  if (!again.ok() || again->data_len != header->data_len || again->tensors != header->tensors ||
      (again->header_len - header->header_len) % 8 != 0 ||
      restamped.substr(8 + again->header_len) != file.substr(8 + header->header_len)) {
    std::abort();
  }
  return 0;
}
