#include "ckptfs/mount_table.h"

#include <sys/sysmacros.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ckptfs {

namespace {

// mountinfo writes space, tab, newline and backslash in paths as \ooo.
std::string DecodeOctalEscapes(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](size_t k, char max) { return field[k] >= '0' && field[k] <= max; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1, '3') && octal(i + 2, '7') && octal(i + 3, '7')) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
std::optional<MountEntry> ParseLine(const std::string& line) {
  std::istringstream ss(line);
  std::string id, parent, devno, root, point;
  if (!(ss >> id >> parent >> devno >> root >> point)) return std::nullopt;
  const size_t dash = line.find(" - ");
  if (dash == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(dash + 3));
  MountEntry e;
  if (!(rest >> e.fstype >> e.source)) return std::nullopt;
  rest >> e.super_options;
  unsigned major_no = 0, minor_no = 0;
  if (std::sscanf(devno.c_str(), "%u:%u", &major_no, &minor_no) != 2) return std::nullopt;
  e.device = makedev(major_no, minor_no);
  e.device_text = devno;
  e.mount_point = DecodeOctalEscapes(point);
  e.source = DecodeOctalEscapes(e.source);
  return e;
}

// `ancestor` is `path` or a directory above it (both canonical).
bool AtOrAbove(const std::string& ancestor, const std::string& path) {
  if (ancestor == "/" || ancestor == path) return true;
  return path.size() > ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 &&
         path[ancestor.size()] == '/';
}

}  // namespace

std::vector<MountEntry> ReadMountTable() {
  std::vector<MountEntry> out;
  std::ifstream info("/proc/self/mountinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (auto e = ParseLine(line)) out.push_back(std::move(*e));
  }
  return out;
}

std::optional<MountEntry> MountAt(const std::string& path) {
  std::optional<MountEntry> found;
  for (auto& e : ReadMountTable()) {
    if (e.mount_point == path) found = std::move(e);
  }
  return found;
}

std::optional<MountEntry> MountHolding(const std::string& path) {
  std::optional<MountEntry> found;
  for (auto& e : ReadMountTable()) {
    if (!AtOrAbove(e.mount_point, path)) continue;
    if (!found || e.mount_point.size() >= found->mount_point.size()) found = std::move(e);
  }
  return found;
}

std::optional<MountEntry> MountOfDevice(dev_t device) {
  std::optional<MountEntry> found;
  for (auto& e : ReadMountTable()) {
    if (e.device == device) found = std::move(e);
  }
  return found;
}

std::optional<unsigned long> SuperOption(const MountEntry& mount, const std::string& key) {
  std::istringstream ss(mount.super_options);
  std::string opt;
  while (std::getline(ss, opt, ',')) {
    if (opt.size() <= key.size() + 1 || opt.compare(0, key.size(), key) != 0 || opt[key.size()] != '=') continue;
    char* end = nullptr;
    const unsigned long v = std::strtoul(opt.c_str() + key.size() + 1, &end, 10);
    if (*end == '\0') return v;
  }
  return std::nullopt;
}

}  // namespace ckptfs
