// FileServer without FUSE: the bytes of real source files, hashed for real,
// served through the chunk path across chunk boundaries and the end of the
// file, from the copy fill=wait makes at open (the source then read once),
// never from a source that changed since it was indexed (a refused copy is
// not read again), and in the stamped form with stamp_headers.
#include "ckptfs/file_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <utime.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <memory>
#include <string>
#include <vector>

#include "header_stamper.h"
#include "ckptfs/thread_pool.h"
#include "indexed_source_file.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using testing::MakeSafetensors;
using testing::RandomBytes;
using testing::Tensor;
using testing::WriteFile;

const std::string kDigest = "sha256-" + std::string(64, 'c');

// A safetensors shard on disk and its indexed node.
struct IndexedShard {
  std::string bytes;
  View::NodePtr node;
};

// The bytes a read returned, joined.
std::string Joined(const ServedBytes& b) {
  std::string out;
  for (const iovec& v : b.iov) out.append(static_cast<const char*>(v.iov_base), v.iov_len);
  return out;
}

// A server over caches of its own, so that a copy one case of a test made
// does not serve the next; checked as `verify` asks, filling as `fill` says.
struct OwnServer {
  static FileServer::Options OptionsOf(Verify verify, FillPolicy fill) {
    FileServer::Options o;
    o.fill = fill;
    o.verify = verify;
    return o;
  }
  OwnServer(SourceReader& reader, Verify verify, FillPolicy fill)
      : server(FileServer::Parts{.cache = &cache, .files = &files, .reader = &reader, .proven = &proven},
               OptionsOf(verify, fill), {}) {}
  FileCache files{16 * kChunkSize};
  ChunkCache cache{ChunkCache::Options{.capacity = 8 * kChunkSize}};
  ProvenChunkTables proven{1024};
  FileServer server;  // last: made after the caches it uses, gone before them
};

class FileServerTest : public ::testing::Test {
 protected:
  // The file at `rel` as the view holds it once indexed.
  View::NodePtr Indexed(const std::string& rel, const std::string& bytes) {
    return testing::IndexedFileNode(src_ / rel, bytes, kDigest, &pool_);
  }

  // `n` shards of one checkpoint, each a file (an inode) of its own.
  std::vector<IndexedShard> Shards(int n) {
    std::vector<IndexedShard> out;
    for (int i = 0; i < n; ++i) {
      IndexedShard shard;
      shard.bytes = RandomBytes(3 * kChunkSize + 1 + i, 40 + i);
      auto node = std::make_shared<View::Node>(*Indexed("m/model-" + std::to_string(i) + ".safetensors", shard.bytes));
      node->ino = 100 + i;
      shard.node = node;
      out.push_back(std::move(shard));
    }
    return out;
  }

  std::unique_ptr<FileServer> Server(FillPolicy fill, bool stamp_headers = false) {
    FileServer::Options o;
    o.fill = fill;
    o.stamp_headers = stamp_headers;
    FileServer::Reports reports;
    reports.source_changed = [this] { ++source_changes_; };
    return std::make_unique<FileServer>(
        FileServer::Parts{.cache = &cache_, .files = &files_, .reader = &reader_, .readahead_pool = &pool_}, o,
        reports);
  }

  // A verify=auto server over the fixture's caches, chunk path only, that
  // notes each copy reported damaged: "withdrawn: PATH", or "kept: PATH"
  // when the digest stays (another copy may serve).
  std::unique_ptr<FileServer> AutoServer(ProvenChunkTables& proven, std::vector<std::string>& reported) {
    FileServer::Reports reports;
    reports.corrupt_chunk = [&reported](const View::Node&, const SourceCopy& copy, const Status&, bool withdraw) {
      reported.push_back((withdraw ? "withdrawn: " : "kept: ") + copy.path);
    };
    FileServer::Options o;
    o.fill = FillPolicy::kOff;
    o.verify = Verify::kAuto;
    return std::make_unique<FileServer>(
        FileServer::Parts{.cache = &cache_, .files = &files_, .reader = &reader_, .proven = &proven}, o, reports);
  }

  testing::TempDir src_{"ckptfs-file-server"};
  ThreadPool pool_{2};
  FileCache files_{64 * kChunkSize};
  ChunkCache cache_{ChunkCache::Options{.capacity = 16 * kChunkSize}};
  SourceReader reader_;
  std::atomic<int> source_changes_{0};  // reported by read-ahead threads too
};

TEST_F(FileServerTest, TheChunkPathServesTheSourceBytesAcrossChunksAndStopsAtTheEnd) {
  const std::string bytes = RandomBytes(2 * kChunkSize + 12345, 7);
  const auto file = Indexed("m/model.bin", bytes);
  auto server = Server(FillPolicy::kOff);
  auto opened = server->Open(file, O_RDONLY, /*inode_open=*/false);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  EXPECT_EQ(server->Resident((*opened)->key), nullptr);  // fill=off: no copy

  const uint64_t across = kChunkSize - 100;
  auto middle = server->Read(**opened, across, 200 + kChunkSize);
  ASSERT_TRUE(middle.ok()) << middle.status().message();
  EXPECT_EQ(middle->iov.size(), 3u);  // one iovec a chunk it touches, no copy between them
  EXPECT_EQ(Joined(*middle), bytes.substr(across, 200 + kChunkSize));

  auto tail = server->Read(**opened, bytes.size() - 10, 4096);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(Joined(*tail), bytes.substr(bytes.size() - 10));
  auto past = server->Read(**opened, bytes.size() + 1, 4096);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(past->size(), 0u);
  EXPECT_EQ(server->bytes_read(), 200 + kChunkSize + 10);
}

TEST_F(FileServerTest, FillWaitCopiesTheFileAtOpenAndReadsComeFromTheCopy) {
  const std::string bytes = RandomBytes(3 * kChunkSize + 1, 8);
  const auto file = Indexed("m/model.safetensors.bin", bytes);
  auto server = Server(FillPolicy::kWait);
  auto opened = server->Open(file, O_RDONLY, /*inode_open=*/false);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  ASSERT_NE(server->Resident((*opened)->key), nullptr);
  const uint64_t source_bytes = reader_.bytes_read();
  EXPECT_EQ(source_bytes, bytes.size());  // the copy read the source once

  auto all = server->Read(**opened, 0, bytes.size());
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(Joined(*all), bytes);
  EXPECT_EQ(all->iov.size(), 1u);             // one span of the sealed copy
  EXPECT_EQ(reader_.bytes_read(), source_bytes);  // and no source read for it
  EXPECT_TRUE(server->Closed(**opened));          // resident: the next open passes through
}

TEST_F(FileServerTest, AnOpenOfAnInodeOpenAlreadyMakesNoCopy) {
  const auto file = Indexed("m/model.bin", RandomBytes(kChunkSize, 9));
  auto server = Server(FillPolicy::kWait);
  auto opened = server->Open(file, O_RDONLY, /*inode_open=*/true);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(server->Resident((*opened)->key), nullptr);
  EXPECT_EQ(reader_.bytes_read(), 0u);
}

// Issue 20 item 5: fastsafetensors reads every shard's header (a buffered
// open, closed at once) before any tensor. The first header open waits for
// its shard's copy; the same opener's next open begins its copy without
// waiting, on trial, and once that one is closed at once too, so do its
// first opens of the other shards, which are served from the copies as
// they are made. A second open of a shard (a loader that maps it now)
// waits again, and so does every open of another opener.
TEST_F(FileServerTest, AHeaderScanWaitsForTheFirstShardsCopyOnly) {
  const auto shards = Shards(4);
  auto server = Server(FillPolicy::kWait);
  constexpr pid_t kLoader = 4242, kOther = 4343;
  auto first = server->Open(shards[0].node, O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_NE(server->Resident((*first)->key), nullptr) << "the first header open did not wait";
  server->Closed(**first, /*alone=*/true);  // the header read: at once
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 0u);

  auto trial = server->Open(shards[1].node, O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(trial.ok()) << trial.status().message();
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 1u) << "the scan's second open waited";
  server->Closed(**trial, /*alone=*/true);

  auto third = server->Open(shards[2].node, O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 2u) << "the confirmed scan's third open waited";
  // One read at a time, each let go before the next: held, a read of a
  // copy being made keeps it from being sealed, and a second read of it
  // waits for the seal (the FUSE layer holds one until its reply is sent).
  {
    auto header = server->Read(**third, 0, 4096);
    ASSERT_TRUE(header.ok()) << header.status().message();
    EXPECT_EQ(Joined(*header), shards[2].bytes.substr(0, 4096));
  }
  {
    auto tail = server->Read(**third, shards[2].bytes.size() - 100, 100);
    ASSERT_TRUE(tail.ok()) << tail.status().message();
    EXPECT_EQ(Joined(*tail), shards[2].bytes.substr(shards[2].bytes.size() - 100));
  }
  server->Closed(**third, /*alone=*/true);

  // The loader opens shard 1 again (to map it): that open waits.
  auto again = server->Open(shards[1].node, O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(server->Resident((*again)->key), nullptr);
  auto all = server->Read(**again, 0, shards[1].bytes.size());
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(Joined(*all), shards[1].bytes);

  auto other = server->Open(shards[3].node, O_RDONLY, /*inode_open=*/false, kOther);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(server->Resident((*other)->key), nullptr) << "another opener's open did not wait";
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 2u);
}

// What is no header scan: a short open that another open of the same file
// overlapped (transformers maps each shard through two opens) or that was
// never answered (interrupted), a short open of a config file, and a trial
// whose open is held (a loader that maps each shard after one open: only
// its second shard goes without waiting). Nor, under verify=sha256, any
// open: a copy in progress is served there only once its SHA-256 passed.
TEST_F(FileServerTest, WhatIsNoHeaderScanWaitsForItsCopy) {
  const auto shards = Shards(8);
  auto server = Server(FillPolicy::kWait);
  auto waited = [&](const IndexedShard& shard, pid_t opener) {
    auto opened = server->Open(shard.node, O_RDONLY, /*inode_open=*/false, opener);
    EXPECT_TRUE(opened.ok());
    return opened.ok() && server->Resident((*opened)->key) != nullptr;
  };
  constexpr pid_t kTransformers = 4444, kConfigReader = 4545, kMapper = 4646;
  auto mapped = server->Open(shards[0].node, O_RDONLY, /*inode_open=*/false, kTransformers);
  ASSERT_TRUE(mapped.ok());
  server->Closed(**mapped);  // alone=false: overlapped, or interrupted
  EXPECT_TRUE(waited(shards[1], kTransformers)) << "an overlapped open was taken for a header read";

  auto config = std::make_shared<View::Node>(*Indexed("m/config.json", RandomBytes(kChunkSize + 3, 50)));
  config->ino = 200;
  auto read_config = server->Open(config, O_RDONLY, /*inode_open=*/false, kConfigReader);
  ASSERT_TRUE(read_config.ok());
  server->Closed(**read_config, /*alone=*/true);
  EXPECT_TRUE(waited(shards[2], kConfigReader)) << "a config.json read was taken for a header read";

  auto first = server->Open(shards[3].node, O_RDONLY, /*inode_open=*/false, kMapper);
  ASSERT_TRUE(first.ok());
  server->Closed(**first, /*alone=*/true);  // opened, mapped, closed: passthrough maps hold no open
  auto on_trial = server->Open(shards[4].node, O_RDONLY, /*inode_open=*/false, kMapper);  // its map holds it
  ASSERT_TRUE(on_trial.ok());
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 1u);
  EXPECT_TRUE(waited(shards[5], kMapper)) << "an unconfirmed trial let another open go without waiting";
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 1u);

  FileServer::Options o;
  o.fill = FillPolicy::kWait;
  o.verify = Verify::kSha256;
  FileServer sha256(FileServer::Parts{.cache = &cache_, .files = &files_, .reader = &reader_}, o, {});
  auto header = sha256.Open(shards[6].node, O_RDONLY, /*inode_open=*/false, kMapper + 1);
  ASSERT_TRUE(header.ok());
  sha256.Closed(**header, /*alone=*/true);
  auto next = sha256.Open(shards[7].node, O_RDONLY, /*inode_open=*/false, kMapper + 1);
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_NE(sha256.Resident((*next)->key), nullptr) << "a header scan went without waiting under verify=sha256";
  EXPECT_EQ(sha256.GetFillStats().header_scan_opens, 0u);
}

// A read of a copy in progress that arrives while the copy is being sealed
// waits for the seal, which waits for the replies still sending from the
// copy. It must wait alone: the fills of other files, and reads of them,
// go on meanwhile (the FUSE layer lets a reply go only once it is sent, and
// the fill threads must not wait for that).
TEST_F(FileServerTest, AReadWaitingForACopysSealHoldsUpNoOtherFill) {
  auto server = Server(FillPolicy::kWait);
  const std::string big = RandomBytes(24 * kChunkSize + 5, 60);
  auto sealing = std::make_shared<View::Node>(*Indexed("m/big.safetensors", big));
  sealing->ino = 300;
  // The copy is in progress when the read of its last chunk is asked for
  // (an O_DIRECT open begins it without waiting): that read keeps the copy
  // from being sealed for as long as the test holds it.
  auto opened = server->Open(sealing, O_RDONLY | O_DIRECT, /*inode_open=*/false, 4747);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  auto held = server->Read(**opened, big.size() - 100, 100);
  ASSERT_TRUE(held.ok()) << held.status().message();
  ASSERT_EQ(Joined(*held), big.substr(big.size() - 100));
  ASSERT_EQ(server->GetFillStats().streamed_reads, 1u) << "the copy was done before its read: make it larger";

  // A second read of the copy: served at once until the whole copy is
  // verified, then it waits, as the seal does for the held read.
  std::atomic<bool> second_done{false};
  std::string second_bytes;
  std::thread second;
  for (int attempt = 1;; ++attempt) {
    second_done = false;
    second = std::thread([&] {
      auto r = server->Read(**opened, 0, 4096);
      second_bytes = r.ok() ? Joined(*r) : r.status().message();
      second_done = true;  // its reply sent: its hold let go
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!second_done) break;
    second.join();
    ASSERT_LT(attempt, 100) << "the copy's seal never began";
  }

  // Another file's copy is made and read meanwhile.
  const auto shards = Shards(1);
  auto other = std::async(std::launch::async, [&] {
    auto o = server->Open(shards[0].node, O_RDONLY | O_DIRECT, /*inode_open=*/false, 4848);
    if (!o.ok()) return std::string("open failed: ") + o.status().message();
    auto r = server->Read(**o, 0, shards[0].bytes.size());
    if (!r.ok()) return std::string("read failed: ") + r.status().message();
    return Joined(*r);
  });
  const bool went_on = other.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  held->holds.clear();  // the held reply is sent: the seal goes on, whichever way the test ends
  second.join();
  EXPECT_TRUE(went_on) << "another file's fill and read waited for a seal that waited for a reply";
  EXPECT_EQ(other.get(), shards[0].bytes);
  EXPECT_EQ(second_bytes, big.substr(0, 4096));
  // Published right after its seal, on the fill's thread.
  bool published = false;
  for (int i = 0; i < 1000 && !published; ++i) {
    published = server->Resident((*opened)->key) != nullptr;
    if (!published) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(published) << "the copy was not sealed and published";
}

TEST_F(FileServerTest, ASourceChangedSinceIndexingIsNeverServedAndNotReadAgain) {
  const std::string bytes = RandomBytes(kChunkSize + 5, 10);
  const auto file = Indexed("m/model.bin", bytes);
  std::string other = bytes;
  other[17] ^= 0x55;
  WriteFile(file->source_path, other);  // same size, other bytes, new stamp
  auto server = Server(FillPolicy::kOff);
  auto opened = server->Open(file, O_RDONLY, false);
  ASSERT_TRUE(opened.ok());
  auto read = server->Read(**opened, 0, 100);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), Status::Code::kChanged) << read.status().message();
  EXPECT_EQ(source_changes_.load(), 1);
  EXPECT_TRUE(server->AllCopiesRefused(*file));
  const uint64_t chunks_read = reader_.chunks_read();
  auto again = server->Read(**opened, kChunkSize, 5);
  ASSERT_FALSE(again.ok());
  // The read that found the copy refused says why it was (a fill's later
  // chunk, or a second preload, would otherwise only learn "no copy left").
  EXPECT_NE(again.status().message().find("source changed"), std::string::npos) << again.status().message();
  EXPECT_EQ(reader_.chunks_read(), chunks_read);  // refused: the source is not read again
  EXPECT_EQ(source_changes_.load(), 1);                  // and reported once
  EXPECT_EQ(server->failed_reads(), 2u);
}

// A copy whose chunks pass their XXH3-128 while the whole file's SHA-256 is
// not the index's: what a user who may write the file could serve by
// crafting chunks that collide (a second write into a dirty shared page
// keeps its stamp). The test tells the index another SHA-256, which is the
// same to the server. Under verify=auto no such byte is served from a copy
// that anyone but root and the mount's owner may write, by the chunk path,
// a copy waited for, or a copy streamed to an O_DIRECT reader; under xxh3
// it was. A trusted copy pays no proof.
TEST_F(FileServerTest, VerifyAutoServesNoCraftedBytesFromACopyAUserMayWrite) {
  const std::string crafted = RandomBytes(3 * kChunkSize + 7, 70);
  auto file = std::make_shared<View::Node>(*Indexed("m/model.safetensors", crafted));
  file->ino = 400;
  file->sha256 = Sha256Of(std::string_view("the bytes the digest names"));
  auto serve = [&](Verify verify, FillPolicy fill, int open_flags, bool trusted) {
    file->copies = {SourceCopy{file->source_path, file->stamp, file->chunks, trusted}};
    OwnServer own(reader_, verify, fill);
    FileServer& server = own.server;
    auto opened = server.Open(file, open_flags, /*inode_open=*/false, 5000);
    if (!opened.ok()) return "open: " + opened.status().message();
    auto read = server.Read(**opened, kChunkSize, 4096);
    const std::string got = read.ok() ? Joined(*read) : "read: " + read.status().message();
    if (server.GetFillStats().proven != 0) return "a proof passed: " + got;
    return got;
  };
  const std::string forged = crafted.substr(kChunkSize, 4096);
  EXPECT_EQ(serve(Verify::kXxh3, FillPolicy::kOff, O_RDONLY, false), forged) << "the hole verify=auto closes";
  for (FillPolicy fill : {FillPolicy::kOff, FillPolicy::kWait}) {
    for (int flags : {O_RDONLY, O_RDONLY | O_DIRECT}) {
      const std::string got = serve(Verify::kAuto, fill, flags, /*trusted=*/false);
      EXPECT_NE(got, forged) << "fill=" << WordOf(kFillPolicyWords, fill) << (flags & O_DIRECT ? ", O_DIRECT" : "");
      EXPECT_NE(got.find("SHA-256 is not the index's"), std::string::npos) << got;
    }
  }
  // Root's or the mount owner's copy is read on its XXH3-128s alone, as
  // under xxh3: no whole-file pass first.
  const uint64_t before = reader_.chunks_read();
  EXPECT_EQ(serve(Verify::kAuto, FillPolicy::kOff, O_RDONLY, /*trusted=*/true), forged);
  EXPECT_EQ(reader_.chunks_read() - before, 1u);
}

// With the file's SHA-256 chain (what its index row holds once this daemon
// hashed it), each chunk read from a copy that must be proven is checked
// alone: a chunk is served without a pass over the whole file, and a
// crafted one (it passes its XXH3-128) is refused, whether read on the
// chunk path, by a copy waited for, or streamed to an O_DIRECT reader.
TEST_F(FileServerTest, WithTheFilesChainEachChunkIsProvenAlone) {
  const std::string real = RandomBytes(3 * kChunkSize + 7, 72);
  std::string crafted = real;
  for (size_t i = kChunkSize; i < kChunkSize + 64; ++i) crafted[i] = static_cast<char>(~crafted[i]);
  auto file = std::make_shared<View::Node>(*Indexed("m/model.safetensors", crafted));
  file->ino = 401;
  file->sha256 = Sha256Of(real);
  file->chain = std::make_shared<const ChunkChain>(testing::ChainOfBytes(real));
  file->copies = {SourceCopy{file->source_path, file->stamp, file->chunks, /*trusted=*/false}};
  struct Served {
    std::string first, second;  // of chunk 0, then of chunk 1
    uint64_t chunks_read = 0;   // from the source, for the first
    bool may_wait = true;       // MayWaitForAProof after the open
  };
  auto serve = [&](Verify verify, FillPolicy fill, int open_flags) {
    OwnServer own(reader_, verify, fill);
    FileServer& server = own.server;
    Served out;
    const uint64_t before = reader_.chunks_read();
    auto opened = server.Open(file, open_flags, /*inode_open=*/false, 5001);
    if (!opened.ok()) return Served{"open: " + opened.status().message(), "", 0, true};
    out.may_wait = server.MayWaitForAProof(**opened);
    for (std::string* got : {&out.first, &out.second}) {
      const uint64_t at = got == &out.first ? 0 : kChunkSize;
      auto read = server.Read(**opened, at, 4096);
      *got = read.ok() ? Joined(*read) : "read: " + read.status().message();
      if (got == &out.first) out.chunks_read = reader_.chunks_read() - before;
    }
    return out;
  };
  for (Verify verify : {Verify::kSha256, Verify::kAuto}) {
    SCOPED_TRACE(WordOf(kVerifyWords, verify));
    const Served chunk_path = serve(verify, FillPolicy::kOff, O_RDONLY);
    EXPECT_EQ(chunk_path.first, real.substr(0, 4096));
    EXPECT_EQ(chunk_path.chunks_read, 1u);  // the chunk asked for, and no other
    EXPECT_FALSE(chunk_path.may_wait);      // nor is a read sent off the FUSE threads to wait for a pass
    EXPECT_NE(chunk_path.second.find("its chain"), std::string::npos) << chunk_path.second.substr(0, 80);
    for (int flags : {O_RDONLY, O_RDONLY | O_DIRECT}) {
      const Served copy = serve(verify, FillPolicy::kWait, flags);
      EXPECT_NE(copy.second, crafted.substr(kChunkSize, 4096)) << (flags & O_DIRECT ? "O_DIRECT" : "buffered");
      EXPECT_EQ(copy.second.rfind("read: ", 0), 0u) << copy.second.substr(0, 80);
    }
  }
}

// Under verify=auto a read goes first to the trusted copy, on its XXH3-128s
// alone; when that copy fails (here: a damaged chunk behind an intact
// stamp), a copy it does not trust still serves the read, once the whole
// file's SHA-256 passed from it, and the digest is not withdrawn while that
// copy is there: one bad copy costs no reader an EIO.
TEST_F(FileServerTest, VerifyAutoServesFromACopyNotTrustedOnceProvenWhenTheTrustedOneFails) {
  const std::string bytes = RandomBytes(3 * kChunkSize + 11, 71);
  auto trusted = Indexed("a/model.bin", bytes);
  auto other = Indexed("b/model.bin", bytes);
  auto damaged = std::make_shared<std::vector<ChunkHash>>(*trusted->chunks);
  (*damaged)[1] = HashChunk("not these bytes", 15);
  auto file = std::make_shared<View::Node>(*trusted);
  file->copies = {SourceCopy{trusted->source_path, trusted->stamp, damaged, /*trusted=*/true},
                  SourceCopy{other->source_path, other->stamp, other->chunks, /*trusted=*/false}};
  ProvenChunkTables proven(1024);
  std::vector<std::string> withdrawn;
  auto server_ptr = AutoServer(proven, withdrawn);
  FileServer& server = *server_ptr;
  EXPECT_FALSE(server.Proves(*file));
  auto opened = server.Open(file, O_RDONLY, /*inode_open=*/false);
  ASSERT_TRUE(opened.ok());
  auto read = server.Read(**opened, kChunkSize - 10, 20);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(Joined(*read), bytes.substr(kChunkSize - 10, 20));
  EXPECT_EQ(withdrawn, std::vector<std::string>{"kept: " + trusted->source_path})
      << "the digest was withdrawn while a copy still held its bytes";
  EXPECT_TRUE(server.Proves(*file));  // the trusted copy is refused now
  EXPECT_NE(proven.Find(file->sha256), nullptr);
}

// Two copies a proof must check, the first crafted (its chunks pass their
// XXH3-128, its whole SHA-256 is not the index's): the pass read from it
// fails and refuses it, and a second pass, from the other copy, serves
// the read. Before, the reader got EIO.
TEST_F(FileServerTest, AProofThatFailsFromOneCopyIsTakenAgainFromTheNext) {
  const std::string bytes = RandomBytes(2 * kChunkSize + 9, 72);
  std::string crafted = bytes;
  crafted[kChunkSize + 5] ^= 0x40;
  auto forged = Indexed("x/model.bin", crafted);  // its own chunk table: what a collision gives
  auto intact = Indexed("y/model.bin", bytes);
  auto file = std::make_shared<View::Node>(*intact);
  file->copies = {SourceCopy{forged->source_path, forged->stamp, forged->chunks, /*trusted=*/false},
                  SourceCopy{intact->source_path, intact->stamp, intact->chunks, /*trusted=*/false}};
  ProvenChunkTables proven(1024);
  std::vector<std::string> withdrawn;
  auto server_ptr = AutoServer(proven, withdrawn);
  FileServer& server = *server_ptr;
  auto opened = server.Open(file, O_RDONLY, /*inode_open=*/false);
  ASSERT_TRUE(opened.ok());
  auto read = server.Read(**opened, kChunkSize, 4096);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(Joined(*read), bytes.substr(kChunkSize, 4096));
  EXPECT_EQ(withdrawn, std::vector<std::string>{"kept: " + forged->source_path});
}

TEST_F(FileServerTest, StampHeadersServesTheStampedHeaderThenTheTensorBytesShifted) {
  const std::string bytes = MakeSafetensors({{"w", "U8", {4096}, RandomBytes(4096, 11)}}, R"({"format": "pt"})");
  const auto file = Indexed("m/model.safetensors", bytes);
  auto server = Server(FillPolicy::kOff, /*stamp_headers=*/true);
  auto form = server->FormOf(file);
  ASSERT_TRUE(form.ok()) << form.status().message();
  ASSERT_NE(form->prefix, nullptr);
  auto size = server->ServedSize(file);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, form->size);
  EXPECT_EQ(*size, bytes.size() - form->source_prefix_len + form->prefix->size());

  auto opened = server->Open(file, O_RDONLY, false);
  ASSERT_TRUE(opened.ok());
  auto all = server->Read(**opened, 0, *size);
  ASSERT_TRUE(all.ok()) << all.status().message();
  const std::string served = Joined(*all);
  EXPECT_EQ(served.substr(0, form->prefix->size()), *form->prefix);
  EXPECT_NE(served.find("ckptfs.sha256"), std::string::npos);
  EXPECT_EQ(served.substr(form->prefix->size()), bytes.substr(form->source_prefix_len));
  // A read that starts in the header and ends in the tensor bytes.
  const uint64_t at = form->prefix->size() - 3;
  auto straddle = server->Read(**opened, at, 10);
  ASSERT_TRUE(straddle.ok());
  EXPECT_EQ(Joined(*straddle), served.substr(at, 10));
}

TEST_F(FileServerTest, AFileTheDaemonHoldsItselfIsServedFromItsContent) {
  auto node = std::make_shared<View::Node>();
  node->kind = View::Kind::kFile;
  node->content = "main-revision-sha\n";
  node->size = node->content->size();
  auto server = Server(FillPolicy::kWait);
  auto opened = server->Open(node, O_RDONLY, false);
  ASSERT_TRUE(opened.ok());
  auto read = server->Read(**opened, 5, 100);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(Joined(*read), "revision-sha\n");
  EXPECT_EQ(reader_.bytes_read(), 0u);
}

}  // namespace
}  // namespace ckptfs
