// The fleet (issue 15): nodes that share a source tree and a manifest store.
// Every node is a real daemon with its own state directory and mount; the
// store is a real directory; keys are real Ed25519 keys from ckptfsctl.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckptfs/manifest_store.h"
#include "file_reads.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

// A field of /proc/PID/io: rchar counts every byte the process's read(2),
// pread(2) and friends returned, whatever the filesystem.
uint64_t ProcIo(pid_t pid, const std::string& field) {
  std::ifstream io("/proc/" + std::to_string(pid) + "/io");
  std::string name;
  uint64_t value = 0;
  while (io >> name >> value) {
    if (name == field + ":") return value;
  }
  ADD_FAILURE() << "no " << field << " in /proc/" << pid << "/io";
  return 0;
}

FileStamp StatStamp(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return FileStamp::FromStat(st);
}

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeDirs(store_);
    CommandResult k = RunCommand(kCtl + " keygen " + ShellQuote(key_), true);
    ASSERT_EQ(k.exit_code, 0) << k.out;
  }
  // Node N: its own state directory and mount point, the shared store.
  std::unique_ptr<MountedCkptfs> Node(int n, const std::string& extra) {
    const std::string name = "node" + std::to_string(n);
    auto m = std::make_unique<MountedCkptfs>(
        kDaemon, src_, tmp_ / (name + "-mnt"),
        "state=" + tmp_ / (name + "-state") + ",settle=0,rescan=0,manifests=" + store_ + "," + extra,
        tmp_ / (name + ".log"));
    EXPECT_TRUE(m->ok()) << m->Log();
    return m;
  }
  std::string Link(const MountedCkptfs& m, const std::string& rel) {
    std::error_code ec;
    return fs::read_symlink(m.mountpoint() + "/by-name/" + rel, ec).filename();
  }
  bool AllLinked(const MountedCkptfs& m, const std::vector<std::string>& rels) {
    for (const auto& r : rels) {
      if (Link(m, r).empty()) return false;
    }
    return true;
  }
  // Record files and anything else (temporary files) in the store.
  std::pair<std::vector<std::string>, std::vector<std::string>> StoreFiles() {
    std::vector<std::string> records, others;
    for (const auto& e : fs::recursive_directory_iterator(store_)) {
      if (!e.is_regular_file()) continue;
      (e.path().extension() == ".rec" && e.path().filename().string()[0] != '.' ? records : others)
          .push_back(e.path());
    }
    return {records, others};
  }
  std::unique_ptr<ManifestStore> Store(bool sign) {
    auto key = SigningKey::Load(key_);
    EXPECT_TRUE(key.ok()) << key.status().message();
    Keyring ring;
    ring.Add(*key);
    auto store = ManifestStore::Open(store_, ring, sign ? std::optional<SigningKey>(*key) : std::nullopt);
    EXPECT_TRUE(store.ok()) << store.status().message();
    return std::move(*store);
  }

  TempDir tmp_{"ckptfs-fleet"};
  std::string src_ = tmp_ / "src";
  std::string store_ = tmp_ / "manifests";
  std::string key_ = tmp_ / "fleet.key";
};

TEST_F(FleetTest, SecondNodeReadsNoFileContentAndServesTheSameBytes) {
  WriteFile(src_ + "/base/model.safetensors", RandomBytes(6 * kMiB + 1, 1));
  WriteFile(src_ + "/base/config.json", "{\"layers\": 2}");
  WriteFile(src_ + "/tune/model-00001-of-00002.safetensors", RandomBytes(6 * kMiB, 2));
  WriteFile(src_ + "/tune/model-00002-of-00002.safetensors", RandomBytes(5 * kMiB + 7, 3));
  WriteFile(src_ + "/gguf/m.gguf", RandomBytes(5 * kMiB + 3, 4));
  const std::vector<std::string> rels = {"base", "tune", "gguf"};
  const uint64_t content = 22 * kMiB + 11 + 13;
  const size_t files = 5;

  auto first = Node(1, "manifest_sign=" + key_);
  ASSERT_TRUE(WaitFor([&] { return AllLinked(*first, rels); })) << first->Log();
  ASSERT_TRUE(WaitFor([&] {
    return QueryMount(kCtl, "status", first->mountpoint())["manifests"]["records_published"] == files;
  })) << QueryMount(kCtl, "status", first->mountpoint()).dump();
  EXPECT_GE(ProcIo(first->ServingPid(), "rchar"), content);  // the first node read every byte
  EXPECT_EQ(StoreFiles().first.size(), files);

  // The second node: another state directory, only the public key. When its
  // mount is up, every checkpoint is there, and it has read no file's content.
  auto second = Node(2, "manifest_keys=" + key_ + ".pub");
  for (const auto& r : rels) EXPECT_FALSE(Link(*second, r).empty()) << r << " not visible at mount";
  const uint64_t rchar = ProcIo(second->ServingPid(), "rchar");
  EXPECT_LT(rchar, 1 * kMiB) << "the smallest file is 5 MiB; records, the index and /proc are a few KiB";
  const auto status = QueryMount(kCtl, "status", second->mountpoint());
  EXPECT_EQ(status["manifests"]["records_used"], files) << status.dump();
  EXPECT_EQ(status["manifests"]["records_ignored"], 0) << status.dump();
  EXPECT_EQ(QueryMount(kCtl, "stats", second->mountpoint())["source_bytes_read"], 0);
  EXPECT_EQ(status["source_filesystem"]["inotify"], true) << "a local temporary directory";
  EXPECT_NE(RunCommand(kCtl + " status " + second->mountpoint()).out.find("records used 5, ignored 0"),
            std::string::npos);
  std::cout << "second node at mount: rchar " << rchar << " bytes, against " << content << " bytes of content\n";

  for (const auto& r : rels) {
    EXPECT_EQ(Link(*second, r), Link(*first, r)) << r;
    EXPECT_EQ(Link(*second, r), CoreutilsDigest(src_ + "/" + r)) << r;
  }
  size_t compared = 0;
  EXPECT_EQ(CompareTree(src_, second->mountpoint() + "/by-name", &compared), "");
  EXPECT_EQ(compared, files);
}

// A record names its file's path, size, times and hashes, and whoever can
// read the store can read it (records are 0644, for every node's daemon):
// only files that every user may read in SRC are published, and a private
// checkpoint is hashed on each node. Found attacking the daemon: a record
// told any local user the paths and hashes of files in a 0700 home.
TEST_F(FleetTest, FilesNotEveryUserMayReadArePublishedToNoRecord) {
  WriteFile(src_ + "/pub/model.safetensors", RandomBytes(kMiB, 5));
  WriteFile(src_ + "/home/alice/ft/model.safetensors", RandomBytes(kMiB, 6));
  WriteFile(src_ + "/home/alice/ft/config.json", "{\"secret\": 1}");
  ASSERT_EQ(::chmod((src_ + "/home/alice").c_str(), 0700), 0);
  // Readable by everyone, but in a directory others may enter and not list
  // (0711): a record would tell everyone a name that ls would not.
  WriteFile(src_ + "/home/bob/secret-project-name/model.safetensors", RandomBytes(kMiB, 7));
  ASSERT_EQ(::chmod((src_ + "/home/bob").c_str(), 0711), 0);
  auto first = Node(1, "manifest_sign=" + key_);
  // All shown: every file of each was hashed, and recorded or not, by then.
  ASSERT_TRUE(WaitFor([&] { return AllLinked(*first, {"pub", "home/alice/ft", "home/bob/secret-project-name"}); }))
      << first->Log();
  const auto manifests = QueryMount(kCtl, "status", first->mountpoint())["manifests"];
  EXPECT_EQ(manifests["records_published"], 1);
  EXPECT_EQ(manifests["records_withheld"], 3) << manifests.dump();  // alice's two files and bob's one, counted
  const auto records = StoreFiles().first;
  EXPECT_EQ(records.size(), 1u);
  for (const auto& r : records) {
    const std::string text = ReadFile(r);
    EXPECT_NE(text.find("pub/model.safetensors"), std::string::npos) << text;
    EXPECT_EQ(text.find("alice"), std::string::npos) << text;
    EXPECT_EQ(text.find("secret-project-name"), std::string::npos) << text;
  }
}

// Options that cannot work are refused before mounting, naming the cause.
TEST_F(FleetTest, ManifestOptionsThatCannotWorkAreRefused) {
  MakeDirs(src_);
  MakeDirs(tmp_ / "mnt");
  WriteFile(tmp_ / "not-keys", "hello\n");
  const std::string base = kDaemon + " " + src_ + " " + tmp_ / "mnt" + " -f -o state=" + tmp_ / "state" + ",";
  const std::pair<std::string, std::string> cases[] = {
      {"manifests=" + store_, "needs manifest_keys=FILE"},
      {"manifest_keys=" + key_ + ".pub", "need manifests=DIR"},
      {"manifests=relative/dir,manifest_keys=" + key_ + ".pub", "must be an absolute path"},
      {"manifests=" + tmp_ / "missing" + ",manifest_keys=" + key_ + ".pub", "No such file or directory"},
      {"manifests=" + store_ + ",manifest_keys=" + tmp_ / "not-keys", "no PUBLIC KEY block"},
      {"manifests=" + store_ + ",manifest_sign=" + key_ + ".pub", "not a PEM private key"},
  };
  for (const auto& [options, why] : cases) {
    CommandResult r = RunCommand(base + options, true);
    EXPECT_NE(r.exit_code, 0) << options;
    EXPECT_NE(r.out.find(why), std::string::npos) << options << ": " << r.out;
  }
  EXPECT_FALSE(IsMounted(tmp_ / "mnt"));
}

// Records that must not be trusted: each file's checkpoint is still shown,
// with the right digest, because the node hashes it itself, and says why.
TEST_F(FleetTest, UnsignedForeignTornAndMisplacedRecordsAreIgnoredWithAWarning) {
  const std::vector<std::string> rels = {"unsigned", "stranger", "torn", "misplaced"};
  for (size_t i = 0; i < rels.size(); ++i) WriteFile(src_ + "/" + rels[i] + "/w.bin", RandomBytes(kMiB + i, 10 + i));
  ASSERT_EQ(RunCommand(kCtl + " publish -q " + src_ + " --manifests " + store_ + " --sign " + key_).exit_code, 0);
  auto store = Store(false);
  auto record_of = [&](const std::string& rel) { return store->RecordPath(rel + "/w.bin", StatStamp(src_ + "/" + rel + "/w.bin")); };
  auto parsed = ParseRecord(ReadFile(record_of("unsigned")));
  ASSERT_TRUE(parsed.ok());
  WriteFile(record_of("unsigned"), RecordSignedPart(parsed->record, ""));
  auto stranger = SigningKey::Generate();
  WriteFile(record_of("stranger"), *SignRecord(ParseRecord(ReadFile(record_of("stranger")))->record, *stranger));
  const std::string torn = ReadFile(record_of("torn"));
  WriteFile(record_of("torn"), torn.substr(0, torn.size() - 40));
  WriteFile(record_of("misplaced"), torn);  // torn/w.bin's good record, under another file's name

  auto node = Node(1, "manifest_keys=" + key_ + ".pub");
  ASSERT_TRUE(WaitFor([&] { return AllLinked(*node, rels); })) << node->Log();
  for (const auto& r : rels) EXPECT_EQ(Link(*node, r), CoreutilsDigest(src_ + "/" + r)) << r;
  EXPECT_EQ(CompareTree(src_, node->mountpoint() + "/by-name"), "");
  const std::string log = node->Log();
  for (const char* why : {"it is not signed", "which is not in the keyring", "not a complete record", "describes torn/w.bin"}) {
    EXPECT_NE(log.find(why), std::string::npos) << why << " not in the log:\n" << log;
  }
  const auto status = QueryMount(kCtl, "status", node->mountpoint());
  EXPECT_EQ(status["manifests"]["records_used"], 0) << status.dump();
  EXPECT_GE(status["manifests"]["records_ignored"], 4) << status.dump();
}

// A record signed by a trusted key whose chunk table is wrong: reads of the
// chunks it gets wrong fail with EIO (never other bytes), the node reports
// it, stops trusting that record, hashes the file itself and serves it.
TEST_F(FleetTest, TrustedRecordWithAWrongChunkTableGivesEioThenTheFileIsHashed) {
  const std::string bytes = RandomBytes(2 * kChunkSize + 100, 7);
  WriteFile(src_ + "/m/model.safetensors", bytes);
  ASSERT_EQ(RunCommand(kCtl + " publish -q " + src_ + " --manifests " + store_ + " --sign " + key_).exit_code, 0);
  auto store = Store(true);
  const std::string path = store->RecordPath("m/model.safetensors", StatStamp(src_ + "/m/model.safetensors"));
  auto parsed = ParseRecord(ReadFile(path));
  ASSERT_TRUE(parsed.ok());
  parsed->record.hashes.chunks[1][0] ^= 1;  // chunk 1 (bytes 4 MiB to 8 MiB) misdescribed
  WriteFile(path, *SignRecord(parsed->record, *SigningKey::Load(key_)));

  auto node = Node(1, "manifest_keys=" + key_ + ".pub,fill=off");
  const std::string name = Link(*node, "m");
  ASSERT_EQ(name, CoreutilsDigest(src_ + "/m")) << node->Log();  // trusted: shown at mount
  const std::string file = node->mountpoint() + "/" + name + "/model.safetensors";
  // The first read of chunk 1 finds the mismatch; from then on the file is
  // refused (every read EIO) until it is hashed again.
  const std::string bad = ReadDirect(file, kChunkSize, kChunkSize);
  EXPECT_EQ(bad, "<read: Input/output error>") << bad.substr(0, 80);
  ASSERT_TRUE(WaitFor([&] {
    return QueryMount(kCtl, "status", node->mountpoint())["manifests"]["records_distrusted"] == 1;
  })) << node->Log();
  // Re-hashed here: the same digest comes back, and every byte reads right.
  ASSERT_TRUE(WaitFor([&] {
    return Link(*node, "m") == name && ReadDirect(node->mountpoint() + "/by-name/m/model.safetensors") == bytes;
  })) << node->Log();
  EXPECT_NE(node->Log().find("model.safetensors"), std::string::npos);
  EXPECT_GE(ProcIo(node->ServingPid(), "rchar"), bytes.size());  // it did read the file this time
}

// Eight nodes index the same tree at once and publish into one store: one
// record per file, each valid and true to its file, no temporary leftovers.
TEST_F(FleetTest, EightNodesPublishingAtOnceLeaveOneValidRecordPerFile) {
  std::map<std::string, std::string> files;  // path relative to SRC -> bytes
  for (int c = 0; c < 4; ++c) {
    for (int f = 0; f < 3; ++f) {
      const std::string rel = "ckpt" + std::to_string(c) + "/model-" + std::to_string(f) + ".safetensors";
      files[rel] = RandomBytes((f + 1) * 3 * kMiB + static_cast<size_t>(c), static_cast<uint64_t>(100 + c * 3 + f));
      WriteFile(src_ + "/" + rel, files[rel]);
    }
  }
  std::vector<std::unique_ptr<MountedCkptfs>> nodes;
  for (int n = 1; n <= 8; ++n) nodes.push_back(Node(n, "manifest_sign=" + key_ + ",threads=1"));
  for (auto& n : nodes) {
    ASSERT_TRUE(WaitFor([&] { return AllLinked(*n, {"ckpt0", "ckpt1", "ckpt2", "ckpt3"}); }, std::chrono::seconds(60)))
        << n->Log();
    EXPECT_EQ(Link(*n, "ckpt2"), Link(*nodes[0], "ckpt2"));
  }
  uint64_t written = 0;
  for (auto& n : nodes) written += QueryMount(kCtl, "status", n->mountpoint())["manifests"]["records_published"].get<uint64_t>();
  std::cout << "8 nodes wrote " << written << " record files for " << files.size() << " files\n";

  auto [records, others] = StoreFiles();
  EXPECT_EQ(records.size(), files.size());
  EXPECT_TRUE(others.empty()) << others.front();
  auto store = Store(false);
  std::set<std::string> seen;
  for (const auto& [rel, bytes] : files) {
    const FileStamp stamp = StatStamp(src_ + "/" + rel);
    auto found = store->Lookup(rel, stamp);
    ASSERT_TRUE(found.ok()) << rel << ": " << found.status().message();
    EXPECT_EQ(ToHex(found->sha256), ToHex(Sha256Of(bytes))) << rel;
    ASSERT_EQ(found->chunks.size(), ChunkCount(bytes.size()));
    for (size_t i = 0; i < found->chunks.size(); ++i) {
      const std::string chunk = bytes.substr(i * kChunkSize, kChunkSize);
      EXPECT_EQ(found->chunks[i], HashChunk(chunk.data(), chunk.size())) << rel << " chunk " << i;
    }
    seen.insert(store->RecordPath(rel, stamp));
  }
  EXPECT_EQ(seen.size(), files.size());
}

}  // namespace
}  // namespace ckptfs::testing
