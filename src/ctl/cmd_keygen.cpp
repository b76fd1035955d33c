// ckptfsctl keygen: makes the Ed25519 key pair that signs manifest records.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <tuple>

#include "ckptfs/manifest_keys.h"
#include "ckptfs/unique_fd.h"
#include "ctl.h"

namespace ckptfs::ctl {

namespace {

// Creates `path` with `mode` (refusing to replace a file unless `force`)
// and writes `text` to it.
Status WriteNewFile(const std::string& path, const std::string& text, mode_t mode, bool force) {
  if (force && ::unlink(path.c_str()) != 0 && errno != ENOENT) return Status::FromErrno("cannot replace " + path, errno);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd.valid()) {
    if (errno == EEXIST) return Status::Error(path + " already exists (--force replaces it)");
    return Status::FromErrno("cannot create " + path, errno);
  }
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(fd.get()) != 0) {
    return Status::FromErrno("cannot write " + path, errno);
  }
  return Status::Ok();
}

}  // namespace

int RunKeygen(const KeygenArgs& args) {
  auto key = SigningKey::Generate();
  if (!key.ok()) {
    PrintError(key.status().message());
    return kExitFatal;
  }
  const std::string pub_path = args.key_path + ".pub";
  for (const auto& [path, text, mode] : {std::tuple{args.key_path, key->PrivatePem(), mode_t{0600}},
                                         std::tuple{pub_path, key->PublicPem(), mode_t{0644}}}) {
    if (Status s = WriteNewFile(path, text, mode, args.force); !s.ok()) {
      PrintError(s.message());
      return kExitFatal;
    }
  }
  std::printf("key %s\nprivate key (sign with it: manifest_sign=, publish --sign): %s\n"
              "public key (trust it: manifest_keys=, one or more concatenated): %s\n",
              key->key_id().c_str(), args.key_path.c_str(), pub_path.c_str());
  return kExitOk;
}

}  // namespace ckptfs::ctl
