// Fingerprint: a SHA-256 over a sequence of typed fields, each written with
// its length, so that two different sequences never feed the hash the same
// bytes. Used to tell "exactly as last time" cheaply: a rescan keeps a
// checkpoint whose walk fingerprint is unchanged without asking the index
// about every file, and a publish reuses the nodes of a digest directory
// whose inputs are unchanged instead of building them again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/ownership.h"

namespace ckptfs {

class Fingerprint {
 public:
  Fingerprint& Add(uint64_t v) { return Put(&v, sizeof v); }
  Fingerprint& Add(std::string_view s) {
    Add(static_cast<uint64_t>(s.size()));
    return Put(s.data(), s.size());
  }
  Fingerprint& Add(const Ownership& o) {
    Add(o.uid).Add(o.gid).Add(o.mode).Add(static_cast<uint64_t>(o.acl ? o.acl->named.size() + 1 : 0));
    if (o.acl) {
      Add(o.acl->group_obj);
      for (const auto& e : o.acl->named) Add(static_cast<uint64_t>(e.tag)).Add(e.id).Add(e.perm);
    }
    return *this;
  }
  Fingerprint& Add(const AccessPath& a) {
    Add(a.self);
    Add(static_cast<uint64_t>(a.dirs ? a.dirs->size() : 0));
    if (a.dirs) {
      a.dirs->AllOf([this](const Ownership& d) {  // last first: any fixed order of the same directories
        Add(d);
        return true;
      });
    }
    return *this;
  }
  Fingerprint& Add(const FileStamp& s) {
    return Add(s.dev).Add(s.ino).Add(s.size).Add(static_cast<uint64_t>(s.mtime_ns)).Add(static_cast<uint64_t>(s.ctime_ns));
  }
  Fingerprint& Add(const Sha256Digest& d) { return Put(d.data(), d.size()); }
  Sha256Digest Finish() {
    h_.Update(buf_.data(), buf_.size());
    return h_.Finish();
  }

 private:
  // Fields are small and many (a 100,000-file checkpoint has a million):
  // they are gathered and hashed 64 KiB at a time.
  Fingerprint& Put(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    if (buf_.size() >= (64u << 10)) {
      h_.Update(buf_.data(), buf_.size());
      buf_.clear();
    }
    return *this;
  }
  Sha256 h_;
  std::string buf_;
};

}  // namespace ckptfs
