// The manifest store: keys, the record format, and the store's refusals,
// with real files and real OpenSSL keys.
#include "ckptfs/manifest_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "ckptfs/file_hasher.h"
#include "test_helpers.h"

namespace ckptfs::testing {
namespace {

// A record of `size` bytes of made-up hashes.
ManifestRecord SomeRecord(const std::string& path, uint64_t size, int64_t mtime_ns) {
  ManifestRecord r;
  r.path = path;
  r.size = size;
  r.mtime_ns = mtime_ns;
  r.hashes.size = size;
  r.hashes.sha256 = Sha256Of(path);
  for (uint64_t i = 0; i < ChunkCount(size); ++i) r.hashes.chunks.push_back(HashChunk(&i, sizeof i));
  return r;
}

FileStamp StampOf(uint64_t size, int64_t mtime_ns) {
  FileStamp s;
  s.dev = 1;
  s.ino = 2;
  s.size = size;
  s.mtime_ns = mtime_ns;
  s.ctime_ns = 3;
  return s;
}

SigningKey NewKey() {
  auto key = SigningKey::Generate();
  EXPECT_TRUE(key.ok()) << key.status().message();
  return std::move(*key);
}

std::unique_ptr<ManifestStore> OpenStore(const std::string& dir, Keyring ring, std::optional<SigningKey> signer) {
  auto store = ManifestStore::Open(dir, std::move(ring), std::move(signer));
  EXPECT_TRUE(store.ok()) << store.status().message();
  return store.ok() ? std::move(*store) : nullptr;
}

std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().filename());
  }
  return out;
}

constexpr int64_t kMtime = 1'700'000'000'123'456'789;

TEST(ManifestKeysTest, KeysWrittenAsPemLoadBackAndOpensslReadsThem) {
  TempDir dir;
  SigningKey key = NewKey();
  WriteFile(dir / "k", key.PrivatePem());
  ::chmod((dir / "k").c_str(), 0600);
  WriteFile(dir / "ring", "# fleet signers\n" + key.PublicPem() + "second:\n" + NewKey().PublicPem());
  std::string loose;
  auto loaded = SigningKey::Load(dir / "k", &loose);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->key_id(), key.key_id());
  EXPECT_TRUE(loose.empty());
  auto ring = Keyring::Load(dir / "ring");
  ASSERT_TRUE(ring.ok()) << ring.status().message();
  EXPECT_EQ(ring->size(), 2u);
  EXPECT_TRUE(ring->Has(key.key_id()));
  auto sig = loaded->Sign("message");
  ASSERT_TRUE(sig.ok());
  EXPECT_TRUE(ring->Verify(key.key_id(), "message", *sig).ok());
  EXPECT_EQ(ring->Verify(key.key_id(), "messagf", *sig).code(), Status::Code::kCorrupt);
  // OpenSSL's own tools agree on the format both ways.
  EXPECT_EQ(RunCommand("openssl pkey -in " + ShellQuote(dir / "k") + " -pubout").out, key.PublicPem());
  ASSERT_EQ(RunCommand("openssl genpkey -algorithm ed25519 -out " + ShellQuote(dir / "o")).exit_code, 0);
  EXPECT_TRUE(SigningKey::Load(dir / "o").ok());
  ::chmod((dir / "k").c_str(), 0644);
  ASSERT_TRUE(SigningKey::Load(dir / "k", &loose).ok());
  EXPECT_NE(loose.find("readable by group or others"), std::string::npos) << loose;
}

TEST(ManifestKeysTest, WrongKeyFilesAreRefusedSayingWhy) {
  TempDir dir;
  SigningKey key = NewKey();
  WriteFile(dir / "private-as-ring", key.PrivatePem());
  WriteFile(dir / "empty", "nothing here\n");
  ASSERT_EQ(RunCommand("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out " + ShellQuote(dir / "ec") +
                       " && openssl pkey -in " + ShellQuote(dir / "ec") + " -pubout -out " + ShellQuote(dir / "ec.pub"))
                .exit_code,
            0);
  EXPECT_NE(Keyring::Load(dir / "private-as-ring").status().message().find("not a PUBLIC KEY"), std::string::npos);
  EXPECT_NE(Keyring::Load(dir / "empty").status().message().find("no PUBLIC KEY"), std::string::npos);
  EXPECT_NE(Keyring::Load(dir / "ec.pub").status().message().find("not an Ed25519"), std::string::npos);
  EXPECT_NE(SigningKey::Load(dir / "ec").status().message().find("not an Ed25519"), std::string::npos);
  EXPECT_NE(SigningKey::Load(dir / "missing").status().message().find("No such file"), std::string::npos);
}

TEST(ManifestRecordTest, SignedRecordRoundTripsWithAnyPathBytes) {
  SigningKey key = NewKey();
  ManifestRecord r = SomeRecord("run 7/odd%name\n\xff.bin", 3 * kChunkSize + 5, kMtime);
  auto text = SignRecord(r, key);
  ASSERT_TRUE(text.ok());
  auto parsed = ParseRecord(*text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->record.path, r.path);
  EXPECT_EQ(parsed->record.size, r.size);
  EXPECT_EQ(parsed->record.mtime_ns, r.mtime_ns);
  EXPECT_EQ(parsed->record.hashes.sha256, r.hashes.sha256);
  EXPECT_EQ(parsed->record.hashes.chunks, r.hashes.chunks);
  EXPECT_EQ(parsed->key_id, key.key_id());
  Keyring ring;
  ring.Add(key);
  EXPECT_TRUE(ring.Verify(parsed->key_id, parsed->signed_part, parsed->signature).ok());
  EXPECT_EQ(*SignRecord(r, key), *text) << "Ed25519 signatures are deterministic, so records are too";
}

TEST(ManifestRecordTest, EveryTruncationIsRejectedOrUnsigned) {
  SigningKey key = NewKey();
  const std::string text = *SignRecord(SomeRecord("m/w.bin", 2 * kChunkSize, kMtime), key);
  for (size_t len = 0; len < text.size(); ++len) {
    auto parsed = ParseRecord(std::string_view(text).substr(0, len));
    EXPECT_TRUE(!parsed.ok() || parsed->key_id.empty()) << "a record cut at byte " << len << " parsed as signed";
  }
  EXPECT_FALSE(ParseRecord(text + "x").ok());
  EXPECT_FALSE(ParseRecord("PK\x03\x04 some zip").ok());
  std::string wrong_count = text;
  wrong_count.replace(wrong_count.find("chunks 2"), 8, "chunks 3");
  EXPECT_NE(ParseRecord(wrong_count).status().message().find("chunks"), std::string::npos);
}

// Issue 21 item 2: a store's writer claims an exabyte file in a few bytes;
// the count is refused before anything is allocated for it (it used to be
// a resize to 2^38 chunk hashes: bad_alloc, or the node's memory).
TEST(ManifestRecordTest, AChunkCountTheTextCannotHoldIsRefusedBeforeAnyAllocation) {
  const std::string sha(64, 'a');
  for (const uint64_t size : {uint64_t{1} << 60, (uint64_t{1} << 62) + 1, ~uint64_t{0}}) {
    const std::string text = "ckptfs-record 1\npath m/w.bin\nsize " + std::to_string(size) +
                             "\nmtime 1.000000000\nsha256 " + sha + "\nchunks " + std::to_string(ChunkCount(size)) +
                             "\n" + std::string(32, 'b') + "\n";
    auto parsed = ParseRecord(text);
    ASSERT_FALSE(parsed.ok()) << size;
    EXPECT_NE(parsed.status().message().find("chunks"), std::string::npos) << parsed.status().message();
  }
}

TEST(ManifestRecordTest, MtimeMatchesExactlyOrToTheSecondWhenOneSideHasWholeSeconds) {
  ManifestRecord r = SomeRecord("a", 10, kMtime);
  EXPECT_TRUE(r.Describes("a", StampOf(10, kMtime)));
  EXPECT_TRUE(r.Describes("a", StampOf(10, kMtime / 1'000'000'000 * 1'000'000'000)));  // SFTP: whole seconds
  EXPECT_FALSE(r.Describes("a", StampOf(10, kMtime + 1)));
  EXPECT_FALSE(r.Describes("a", StampOf(11, kMtime)));
  EXPECT_FALSE(r.Describes("b", StampOf(10, kMtime)));
  EXPECT_FALSE(r.Describes("a", StampOf(10, kMtime + 1'000'000'000 - 123'456'789)));  // next second
}

class ManifestStoreTest : public ::testing::Test {
 protected:
  TempDir dir_{"ckptfs-manifests"};
  SigningKey key_ = NewKey();
  Keyring ring_ = [this] {
    Keyring r;
    r.Add(key_);
    return r;
  }();
};

TEST_F(ManifestStoreTest, PublishedRecordIsFoundByPathSizeAndMtimeOnly) {
  auto writer = OpenStore(dir_.path(), {}, key_);
  auto reader = OpenStore(dir_.path(), ring_, std::nullopt);
  ManifestRecord r = SomeRecord("m/w.bin", kChunkSize + 1, kMtime);
  r.hashes.chain = ChunkChain(1);  // as the indexer's hashes have one
  ASSERT_TRUE(writer->Publish(r.path, StampOf(r.size, kMtime), r.hashes).ok());
  FileStamp other_node = StampOf(r.size, kMtime);
  other_node.dev = 77;  // another client: its own device, inode and ctime
  other_node.ino = 88;
  other_node.ctime_ns = 99;
  auto found = reader->Lookup(r.path, other_node);
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(found->chunks, r.hashes.chunks);
  EXPECT_EQ(found->sha256, r.hashes.sha256);
  // A chain is trusted only where this daemon took it (ChunkChain): none
  // comes from the store, whose writers could make one pass forged chunks.
  EXPECT_FALSE(found->chain.has_value());
  EXPECT_EQ(reader->Lookup(r.path, StampOf(r.size + 1, kMtime)).status().code(), Status::Code::kNotFound);
  EXPECT_EQ(reader->Lookup("m/x.bin", StampOf(r.size, kMtime)).status().code(), Status::Code::kNotFound);
  // A second publish of the same record writes nothing; no temporary file is left.
  ASSERT_TRUE(writer->Publish(r.path, StampOf(r.size, kMtime), r.hashes).ok());
  EXPECT_EQ(writer->GetStats().published, 1u);
  EXPECT_EQ(writer->GetStats().already, 1u);
  const auto files = FilesUnder(dir_.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(dir_.path() + "/v1/" + files[0].substr(0, 2) + "/" + files[0], writer->RecordPath(r.path, other_node));
  EXPECT_EQ(reader->GetStats().used, 1u);
}

TEST_F(ManifestStoreTest, UntrustedTornForeignAndMisplacedRecordsAreIgnoredSayingWhy) {
  auto reader = OpenStore(dir_.path(), ring_, std::nullopt);
  SigningKey stranger = NewKey();
  const FileStamp stamp = StampOf(100, kMtime);
  auto place = [&](const std::string& rel, const std::string& bytes) {
    const std::string path = reader->RecordPath(rel, stamp);
    MakeDirs(path.substr(0, path.rfind('/')));
    WriteFile(path, bytes);
  };
  const ManifestRecord good = SomeRecord("good", 100, kMtime);
  const std::string signed_text = *SignRecord(good, key_);
  place("unsigned", RecordSignedPart(SomeRecord("unsigned", 100, kMtime), ""));
  place("stranger", *SignRecord(SomeRecord("stranger", 100, kMtime), stranger));
  place("torn", signed_text.substr(0, signed_text.size() / 2));
  place("foreign", "{\"not\": \"a record\"}\n");
  place("misplaced", signed_text);  // a valid record of "good", copied to another file's name
  std::string forged = *SignRecord(SomeRecord("forged", 100, kMtime), key_);
  forged[forged.find("sha256 ") + 7] ^= 1;
  place("forged", forged);
  const std::pair<const char*, const char*> cases[] = {
      {"unsigned", "not signed"},         {"stranger", "not in the keyring"}, {"torn", "not a complete record"},
      {"foreign", "not a ckptfs record"}, {"misplaced", "describes good"},    {"forged", "bad signature"}};
  for (const auto& [rel, why] : cases) {
    auto found = reader->Lookup(rel, stamp);
    ASSERT_FALSE(found.ok()) << rel;
    EXPECT_NE(found.status().code(), Status::Code::kNotFound) << rel;
    EXPECT_NE(found.status().message().find(why), std::string::npos) << rel << ": " << found.status().message();
    EXPECT_NE(found.status().message().find(reader->RecordPath(rel, stamp)), std::string::npos);
  }
  EXPECT_EQ(reader->GetStats().ignored, 6u);
  EXPECT_EQ(reader->GetStats().used, 0u);
}

TEST_F(ManifestStoreTest, DistrustedRecordIsPassedOverUntilTheFileChanges) {
  auto store = OpenStore(dir_.path(), {}, key_);
  ManifestRecord r = SomeRecord("w.bin", 10, kMtime);
  ASSERT_TRUE(store->Publish(r.path, StampOf(10, kMtime), r.hashes).ok());
  store->Distrust(r.path, StampOf(10, kMtime));
  EXPECT_EQ(store->Lookup(r.path, StampOf(10, kMtime)).status().code(), Status::Code::kNotFound);
  ASSERT_TRUE(store->Publish(r.path, StampOf(10, kMtime + 1'000'000'000), r.hashes).ok());
  EXPECT_TRUE(store->Lookup(r.path, StampOf(10, kMtime + 1'000'000'000)).ok());
  EXPECT_EQ(store->GetStats().distrusted, 1u);
}

TEST_F(ManifestStoreTest, StoreNeedsADirectoryAndAKeyToTrust) {
  EXPECT_FALSE(ManifestStore::Open(dir_ / "missing", ring_, std::nullopt).ok());
  EXPECT_NE(ManifestStore::Open(dir_.path(), {}, std::nullopt).status().message().find("no key to trust"),
            std::string::npos);
  auto reader = OpenStore(dir_.path(), ring_, std::nullopt);
  EXPECT_NE(reader->Publish("a", StampOf(1, 1), SomeRecord("a", 1, 1).hashes).message().find("no signing key"),
            std::string::npos);
}

// Node A indexes a tree and publishes; node B, with its own index and only
// the public key, gets every digest without opening a single file.
TEST_F(ManifestStoreTest, SecondIndexerHashesNothing) {
  TempDir src("ckptfs-src"), state_a("ckptfs-state"), state_b("ckptfs-state");
  ::chmod(src.path().c_str(), 0755);  // records are published of what every user may read
  WriteModel(src / "base", {.seed = 1});
  WriteModel(src / "tune", {.seed = 2});
  auto publisher = OpenStore(dir_.path(), {}, key_);
  IndexerOptions a;
  a.manifests = publisher.get();
  auto index_a = OpenIndex(state_a.path());
  IndexReport first = Indexer(index_a.get(), a).Run(ScanOk(src.path()));
  ASSERT_GT(first.files_hashed, 0u);
  EXPECT_EQ(first.records_published, first.files_hashed);

  auto reader = OpenStore(dir_.path(), ring_, std::nullopt);
  IndexerOptions b;
  b.manifests = reader.get();
  b.lookup_only = true;  // as the daemon's first pass, before it mounts
  auto index_b = OpenIndex(state_b.path());
  const uint64_t opened = FileHasher::files_opened();
  IndexReport second = Indexer(index_b.get(), b).Run(ScanOk(src.path()));
  EXPECT_EQ(FileHasher::files_opened(), opened);
  EXPECT_EQ(second.files_hashed, 0u);
  EXPECT_EQ(second.files_from_manifests, first.files_hashed);
  EXPECT_EQ(Find(second, "base").name, Find(first, "base").name);
  EXPECT_EQ(Find(second, "tune").name, CoreutilsDigest(src / "tune"));
  // What B took from the store is in B's own index now.
  IndexReport third = Indexer(index_b.get(), {}).Run(ScanOk(src.path()));
  EXPECT_EQ(third.files_hashed, 0u);
  EXPECT_EQ(third.files_from_index, first.files_hashed);
}

}  // namespace
}  // namespace ckptfs::testing
