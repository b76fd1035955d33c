#include "ckptfs/handover_protocol.h"

#include <sys/socket.h>

#include <cerrno>

namespace ckptfs::handover {

Status Send(int fd, const nlohmann::json& message, bool wait) {
  const std::string text = message.dump();
  if (text.size() > kMaxMessage) return Status::Error("handover message too long");
  ssize_t n;
  do {
    n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(text.size())) return Status::FromErrno("send to the supervisor link", errno);
  return Status::Ok();
}

Result<nlohmann::json> Receive(int fd) {
  std::string buf(kMaxMessage, '\0');
  ssize_t n;
  do {
    n = ::recv(fd, buf.data(), buf.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno("receive from the supervisor link", errno);
  if (n == 0) return Status::Error("the other end of the supervisor link closed it");
  buf.resize(static_cast<size_t>(n));
  auto j = nlohmann::json::parse(buf, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return Status::Error("malformed message on the supervisor link");
  }
  return j;
}

std::string ToHex(const std::vector<uint8_t>& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::vector<uint8_t> FromHex(const std::string& hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<uint8_t> out;
  if (hex.size() % 2 != 0) return out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return {};
    out.push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  return out;
}

}  // namespace ckptfs::handover
