// The access matrix of DESIGN.md section 2, checked both ways against the
// kernel's own answer in SRC: for every cell, a user can open, list or read
// the xattrs of an entry through the mount exactly when they can open or
// list at least one source copy of it. The oracle is not a table written
// here but the same probe run in SRC as the same user, so every cell asserts
// both "allowed when SRC allows" and "refused when SRC refuses".
#include <iostream>

#include "security_fixture.h"

namespace ckptfs::testing {
namespace {

struct Cell {
  std::string name;
  mode_t file_mode;
  std::string parent;  // "open" 0755, "0700", "0750", "0705x" (0705 with excluded group 5000)
  bool two_copies;     // a second, identical copy owned by `other` in its own 0700 directory
  bool via_link;       // data.txt is a contained symlink into a 0700 directory of the owner
  // POSIX ACLs (setfacl -m), on the first copy's files (for a link: its
  // target) and on the cell's parent directory; "" for none.
  std::string file_acl = "";
  std::string parent_acl = "";
};

std::vector<Cell> AllCells() {
  std::vector<Cell> cells;
  for (mode_t mode : {0600, 0640, 0644}) {
    for (const char* parent : {"open", "0700", "0750", "0705x"}) {
      for (bool two : {false, true}) {
        for (bool link : {false, true}) {
          char name[64];
          std::snprintf(name, sizeof name, "m%o-%s-%s-%s", static_cast<unsigned>(mode), parent, two ? "two" : "one",
                        link ? "link" : "file");
          cells.push_back({name, mode, parent, two, link});
        }
      }
    }
  }
  return cells;
}

const std::vector<User> kUsers = {kRoot, kOwner, kMember, kOther, kExcluded};

class AccessMatrixTest : public SecurityTest {
 protected:
  void Build(const Cell& c) {
    const std::string base = src_ + "/" + c.name, ck = base + "/ck";
    WriteFile(ck + "/model.bin", c.name + "-model");
    Own(ck + "/model.bin", 2001, 3001, c.file_mode);
    if (c.via_link) {
      const std::string priv = src_ + "/private/" + c.name;
      WriteFile(priv + "/data.txt", c.name + "-data");
      Own(src_ + "/private", 0, 0, 0755);
      Own(priv, 2001, 3001, 0700);
      Own(priv + "/data.txt", 2001, 3001, c.file_mode);
      Symlink("../../private/" + c.name + "/data.txt", ck + "/data.txt");
    } else {
      WriteFile(ck + "/data.txt", c.name + "-data");
      Own(ck + "/data.txt", 2001, 3001, c.file_mode);
    }
    Own(ck, 2001, 3001, 0755);
    if (c.parent == "open") Own(base, 2001, 3001, 0755);
    if (c.parent == "0700") Own(base, 2001, 3001, 0700);
    if (c.parent == "0750") Own(base, 2001, 3001, 0750);
    if (c.parent == "0705x") Own(base, 2001, 5000, 0705);
    if (!c.file_acl.empty()) {
      const std::string data = c.via_link ? src_ + "/private/" + c.name + "/data.txt" : ck + "/data.txt";
      SetAcl(c.file_acl, data);
      SetAcl(c.file_acl, ck + "/model.bin");
    }
    if (!c.parent_acl.empty()) SetAcl(c.parent_acl, base);
    if (c.two_copies) {
      const std::string copy = src_ + "/" + c.name + "-copy", cck = copy + "/ck";
      WriteFile(cck + "/model.bin", c.name + "-model");
      WriteFile(cck + "/data.txt", c.name + "-data");
      Own(cck + "/model.bin", 2003, 2003, c.file_mode);
      Own(cck + "/data.txt", 2003, 2003, c.file_mode);
      Own(cck, 2003, 2003, 0755);
      Own(copy, 2003, 2003, 0700);
    }
  }

  void SetAcl(const std::string& acl, const std::string& path) {
    CommandResult r = RunCommand("setfacl -m " + ShellQuote(acl) + " " + ShellQuote(path), true);
    ASSERT_EQ(r.exit_code, 0) << "setfacl -m " << acl << " " << path << ": " << r.out;
  }

  // Source copies of a cell's checkpoint directory.
  std::vector<std::string> Copies(const Cell& c) {
    std::vector<std::string> out{src_ + "/" + c.name + "/ck"};
    if (c.two_copies) out.push_back(src_ + "/" + c.name + "-copy/ck");
    return out;
  }

  // Every cell built and mounted, once each cell's checkpoint is shown;
  // null (the mount's log printed) when one is not.
  std::unique_ptr<MountedCkptfs> BuildAndMount(const std::vector<Cell>& cells) {
    for (const Cell& c : cells) Build(c);
    auto m = Mount();
    const bool shown = WaitFor([&] {
      for (const Cell& c : cells) {
        if (DigestOf(c.name + "/ck").empty()) return false;
      }
      return true;
    });
    if (!shown) {
      ADD_FAILURE() << m->Log();
      return nullptr;
    }
    return m;
  }

  // Runs the matrix once; returns the number of cells checked.
  size_t Check(const std::vector<Cell>& cells, const std::string& phase) {
    std::vector<Attempt> through, oracle;
    std::vector<std::pair<size_t, size_t>> oracle_range;  // per mount attempt: [first, count) in `oracle`
    std::vector<std::string> labels;
    for (const Cell& c : cells) {
      const std::string digest = DigestOf(c.name + "/ck");
      EXPECT_FALSE(digest.empty()) << c.name << " has no by-name link";
      const std::string dir = mnt_ + "/" + digest;
      const struct {
        Probe probe;
        std::string rel;  // "" for the directory itself
      } probes[] = {{Probe::kRead, "data.txt"}, {Probe::kRead, "model.bin"}, {Probe::kList, ""},
                    {Probe::kXattr, "data.txt"}};
      for (const auto& p : probes) {
        through.push_back({p.probe, p.rel.empty() ? dir : dir + "/" + p.rel});
        const size_t first = oracle.size();
        for (const std::string& copy : Copies(c)) {
          // Reading a user.* xattr needs the right to read the file.
          const Probe in_source = p.probe == Probe::kXattr ? Probe::kRead : p.probe;
          oracle.push_back({in_source, p.rel.empty() ? copy : copy + "/" + p.rel});
        }
        oracle_range.emplace_back(first, oracle.size() - first);
        labels.push_back(phase + " " + c.name + " " + (p.rel.empty() ? "<list dir>" : p.rel) +
                         (p.probe == Probe::kXattr ? " <xattr>" : ""));
      }
    }
    size_t checked = 0, allowed = 0, refused = 0;
    for (const User& u : kUsers) {
      const std::vector<bool> got = TryAs(u, through), want = TryAs(u, oracle);
      EXPECT_EQ(got.size(), through.size());
      EXPECT_EQ(want.size(), oracle.size());
      if (got.size() != through.size() || want.size() != oracle.size()) continue;
      for (size_t i = 0; i < through.size(); ++i) {
        bool any = false;
        for (size_t k = 0; k < oracle_range[i].second; ++k) any = any || want[oracle_range[i].first + k];
        EXPECT_EQ(got[i], any) << labels[i] << " as " << u.name << ": through the mount "
                               << (got[i] ? "allowed" : "refused") << ", in SRC " << (any ? "allowed" : "refused");
        ++checked;
        (any ? allowed : refused)++;
      }
    }
    // A matrix that only allows, or only refuses, would prove nothing.
    EXPECT_GT(allowed, checked / 10);
    EXPECT_GT(refused, checked / 10);
    return checked;
  }
};

TEST_F(AccessMatrixTest, MountGrantsExactlyWhatSomeSourceCopyGrants) {
  const std::vector<Cell> cells = AllCells();
  auto m = BuildAndMount(cells);
  ASSERT_TRUE(m) << "not every cell's checkpoint was shown";
  size_t checked = Check(cells, "initial");

  // Revocation and changes in SRC reach the kernel: close every open parent,
  // take group and other read off every linked target, give the second
  // copies' model.bin to the group member. Warm the kernel's caches first.
  Check(cells, "warm");
  for (const Cell& c : cells) {
    if (c.parent == "open") {
      ASSERT_EQ(::chmod((src_ + "/" + c.name).c_str(), 0700), 0);
    }
    if (c.via_link) {
      ASSERT_EQ(::chmod((src_ + "/private/" + c.name + "/data.txt").c_str(), 0600), 0);
    }
    if (c.two_copies) {
      ASSERT_EQ(::chown((src_ + "/" + c.name + "-copy/ck/model.bin").c_str(), 2002, 2002), 0);
      ASSERT_EQ(::chmod((src_ + "/" + c.name + "-copy").c_str(), 0755), 0);
    }
  }
  ASSERT_TRUE(RescanAndSettle()) << m->Log();
  checked += Check(cells, "after chmod/chown");
  std::cout << "[ access matrix ] " << cells.size() << " cells x " << kUsers.size()
            << " users x 4 probes, checked " << checked << " times (both directions each)\n";
}

// POSIX ACL cells (issue 21): each ACL below is refused or granted in SRC by
// the kernel, and the mount must agree for every user, both ways.
std::vector<Cell> AclCells() {
  struct Acl {
    const char* name;
    mode_t mode;
    const char* parent;
    const char* file_acl;
    const char* parent_acl;
  };
  const Acl acls[] = {
      {"file-shuts-out-other", 0644, "open", "u:2003:---", ""},
      {"parent-shuts-out-other", 0644, "open", "", "u:2003:---"},
      // g::--- with a named user: the group bits become the mask (r), the
      // owning group itself gets nothing, the named user gets r.
      {"mask-from-group-bits", 0644, "open", "g::---,u:2004:r", ""},
      {"file-grants-other", 0600, "open", "u:2003:r", ""},
      {"file-grants-group", 0600, "open", "g:5000:r", ""},
      {"mask-limits-grant", 0600, "open", "u:2003:rw,m::-", ""},
      {"parent-grants-member", 0644, "0700", "", "u:2002:x"},
      {"parent-named-group-no-x", 0644, "0750", "", "g:2003:r"},
      {"parent-grants-group-only", 0644, "0700", "", "g:5000:rx"},
  };
  std::vector<Cell> cells;
  for (const Acl& a : acls) {
    for (bool two : {false, true}) {
      for (bool link : {false, true}) {
        cells.push_back({std::string("acl-") + a.name + (two ? "-two" : "-one") + (link ? "-link" : "-file"), a.mode,
                         a.parent, two, link, a.file_acl, a.parent_acl});
      }
    }
  }
  return cells;
}

TEST_F(AccessMatrixTest, AclsCountAsTheKernelCountsThem) {
  const std::vector<Cell> cells = AclCells();
  auto m = BuildAndMount(cells);
  ASSERT_TRUE(m) << "not every cell's checkpoint was shown";
  size_t checked = Check(cells, "acl");
  Check(cells, "acl warm");

  // Revocation by setfacl applies like chmod: every user but the owner is
  // shut out of every cell's parent by a named entry, the group member of
  // every file by another.
  for (const Cell& c : cells) {
    SetAcl("u:2002:---,u:2003:---,u:2004:---", src_ + "/" + c.name);
    SetAcl("u:2002:---", src_ + "/" + c.name + "/ck/model.bin");
  }
  ASSERT_TRUE(RescanAndSettle()) << m->Log();
  checked += Check(cells, "acl after setfacl");
  std::cout << "[ access matrix ] " << cells.size() << " ACL cells x " << kUsers.size()
            << " users x 4 probes, checked " << checked << " times (both directions each)\n";
}

}  // namespace
}  // namespace ckptfs::testing
