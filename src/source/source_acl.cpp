#include "source_acl.h"

#include <acl/libacl.h>
#include <sys/acl.h>
#include <sys/xattr.h>

#include <cerrno>
#include <memory>

#include "retry_eintr.h"

namespace ckptfs {

namespace {

// The name the kernel keeps access ACLs under; asked for only to learn
// whether there is one (libacl parses it).
constexpr const char* kAccessAclXattr = "system.posix_acl_access";

struct AclFree {
  void operator()(void* p) const { acl_free(p); }
};

uint8_t PermBits(acl_entry_t entry) {
  acl_permset_t set;
  if (acl_get_permset(entry, &set) != 0) return 0;
  return static_cast<uint8_t>((acl_get_perm(set, ACL_READ) == 1 ? 4 : 0) |
                              (acl_get_perm(set, ACL_WRITE) == 1 ? 2 : 0) |
                              (acl_get_perm(set, ACL_EXECUTE) == 1 ? 1 : 0));
}

Ownership FailClosed(Ownership o) {
  o.mode &= ~static_cast<mode_t>(077);
  o.acl = std::make_shared<const ExtendedAcl>();
  return o;
}

}  // namespace

Ownership ReadOwnership(const std::string& path, const struct stat& st) {
  Ownership o = Ownership::FromStat(st);
  if (S_ISLNK(st.st_mode)) return o;
  if (::lgetxattr(path.c_str(), kAccessAclXattr, nullptr, 0) < 0) {
    // No ACL, or a filesystem without them: the mode bits are the whole answer.
    if (errno == ENODATA || errno == ENOTSUP || errno == EOPNOTSUPP) return o;
    // Gone meanwhile: the next walk finds out what it is now.
    if (errno == ENOENT || errno == ENOTDIR) return o;
    return FailClosed(o);
  }
  std::unique_ptr<struct __acl_ext, AclFree> acl(acl_get_file(path.c_str(), ACL_TYPE_ACCESS));
  if (!acl) return errno == ENOENT ? o : FailClosed(o);
  // The ACL is read by path after the walk's lstat: a file swapped in
  // meanwhile (a rename by the directory's writer) would lend its ACL to the
  // inode, owner and mode of `st`. The same inode, unchanged, or nothing.
  struct stat now {};
  if (RetryOnEintr([&] { return ::lstat(path.c_str(), &now); }) != 0 || now.st_dev != st.st_dev ||
      now.st_ino != st.st_ino ||
      now.st_ctim.tv_sec != st.st_ctim.tv_sec || now.st_ctim.tv_nsec != st.st_ctim.tv_nsec) {
    return FailClosed(o);
  }
  ExtendedAcl ext;
  acl_entry_t entry;
  for (int which = ACL_FIRST_ENTRY; acl_get_entry(acl.get(), which, &entry) == 1; which = ACL_NEXT_ENTRY) {
    acl_tag_t tag;
    if (acl_get_tag_type(entry, &tag) != 0) return FailClosed(o);
    if (tag == ACL_GROUP_OBJ) {
      ext.group_obj = PermBits(entry);
    } else if (tag == ACL_USER || tag == ACL_GROUP) {
      std::unique_ptr<id_t, AclFree> id(static_cast<id_t*>(acl_get_qualifier(entry)));
      if (!id) return FailClosed(o);
      ext.named.push_back({tag == ACL_USER ? ExtendedAcl::Entry::Tag::kUser : ExtendedAcl::Entry::Tag::kGroup,
                           static_cast<uint32_t>(*id), PermBits(entry)});
    }
    // ACL_USER_OBJ, ACL_MASK and ACL_OTHER are the mode's owner, group and
    // other bits, which `st` already holds.
  }
  // A minimal ACL says nothing the mode does not.
  if (ext.named.empty() && ext.group_obj == ((o.mode >> 3) & 7u)) return o;
  ext.named.shrink_to_fit();  // kept for as long as the view shows the file: not the growth's slack
  o.acl = std::make_shared<const ExtendedAcl>(std::move(ext));
  return o;
}

}  // namespace ckptfs
