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

// The bytes a read returned, joined.
std::string Joined(const ServedBytes& b) {
  std::string out;
  for (const iovec& v : b.iov) out.append(static_cast<const char*>(v.iov_base), v.iov_len);
  return out;
}

class FileServerTest : public ::testing::Test {
 protected:
  // The file at `rel` as the view holds it once indexed.
  View::NodePtr Indexed(const std::string& rel, const std::string& bytes) {
    return testing::IndexedFileNode(src_ / rel, bytes, kDigest, &pool_);
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
// its shard's copy; the same opener's first opens of the other shards then
// begin their copies without waiting, and are served from them; a second
// open of such a shard (a loader that maps it now) waits again, and so does
// every open of another opener, of one whose short open another open of
// the same file overlapped (transformers), and of one whose short open was
// of a config file.
TEST_F(FileServerTest, AHeaderScanWaitsForTheFirstShardsCopyOnly) {
  std::vector<std::string> bytes;
  std::vector<View::NodePtr> shards;
  for (int i = 0; i < 7; ++i) {
    bytes.push_back(RandomBytes(3 * kChunkSize + 1 + i, 40 + i));
    auto shard = std::make_shared<View::Node>(*Indexed("m/model-" + std::to_string(i) + ".safetensors", bytes.back()));
    shard->ino = 100 + i;  // a file of its own for the scan
    shards.push_back(shard);
  }
  auto server = Server(FillPolicy::kWait);
  constexpr pid_t kLoader = 4242, kOther = 4343;
  auto first = server->Open(shards[0], O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_NE(server->Resident((*first)->key), nullptr) << "the first header open did not wait";
  server->Closed(**first);  // the header read: at once
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 0u);

  auto second = server->Open(shards[1], O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 1u) << "the scan's second open waited";
  {
    // Held, a read of a copy being made would keep it from being sealed
    // (the FUSE layer holds one until its reply is sent).
    auto header = server->Read(**second, 0, 4096);
    ASSERT_TRUE(header.ok()) << header.status().message();
    EXPECT_EQ(Joined(*header), bytes[1].substr(0, 4096));
  }
  server->Closed(**second);

  // The loader opens shard 1 again (to map it): that open waits.
  auto again = server->Open(shards[1], O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(server->Resident((*again)->key), nullptr);
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 1u);
  auto all = server->Read(**again, 0, bytes[1].size());
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(Joined(*all), bytes[1]);

  auto other = server->Open(shards[2], O_RDONLY, /*inode_open=*/false, kOther);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(server->Resident((*other)->key), nullptr) << "another opener's open did not wait";
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 1u);

  auto third = server->Open(shards[3], O_RDONLY, /*inode_open=*/false, kLoader);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 2u);
  {
    auto tail = server->Read(**third, bytes[3].size() - 100, 100);
    ASSERT_TRUE(tail.ok()) << tail.status().message();
    EXPECT_EQ(Joined(*tail), bytes[3].substr(bytes[3].size() - 100));
  }

  // transformers: a short open that another open of the same file
  // overlapped (to map it) is no header read; its next shard's open waits.
  constexpr pid_t kMapper = 4444;
  auto mapped = server->Open(shards[4], O_RDONLY, /*inode_open=*/false, kMapper);
  ASSERT_TRUE(mapped.ok());
  server->Closed(**mapped, /*shared=*/true);
  auto next = server->Open(shards[5], O_RDONLY, /*inode_open=*/false, kMapper);
  ASSERT_TRUE(next.ok());
  EXPECT_NE(server->Resident((*next)->key), nullptr) << "a mapper's open was taken for a header scan";
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 2u);

  // Nor is a short open of a file that is not a safetensors file (the
  // config.json a loader reads before it maps the shards).
  constexpr pid_t kConfigReader = 4545;
  auto config = std::make_shared<View::Node>(*Indexed("m/config.json", RandomBytes(kChunkSize + 3, 50)));
  config->ino = 200;
  auto read_config = server->Open(config, O_RDONLY, /*inode_open=*/false, kConfigReader);
  ASSERT_TRUE(read_config.ok());
  server->Closed(**read_config);
  auto shard = server->Open(shards[6], O_RDONLY, /*inode_open=*/false, kConfigReader);
  ASSERT_TRUE(shard.ok());
  EXPECT_NE(server->Resident((*shard)->key), nullptr) << "a config.json read was taken for a header scan";
  EXPECT_EQ(server->GetFillStats().header_scan_opens, 2u);
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
  EXPECT_EQ(reader_.chunks_read(), chunks_read);  // refused: the source is not read again
  EXPECT_EQ(source_changes_.load(), 1);                  // and reported once
  EXPECT_EQ(server->failed_reads(), 2u);
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
