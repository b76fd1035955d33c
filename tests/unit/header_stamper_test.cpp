// HeaderStamper (stamp_headers): the header of a real safetensors file, read
// through the verified chunk cache from a real source file, stamped with its
// checkpoint's and its own digest; kept per (checkpoint, file); files that
// are not safetensors, or whose header breaks the format, are served as
// they are; a source that changed since indexing is an error, never a stamp
// of other bytes.
#include "header_stamper.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ckptfs/file_hasher.h"
#include "ckptfs/safetensors_header.h"
#include "ckptfs/thread_pool.h"
#include "indexed_source_file.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using testing::MakeSafetensors;
using testing::RandomBytes;
using testing::Tensor;
using testing::WriteFile;

const std::string kDigestA = "sha256-" + std::string(64, 'a');
const std::string kDigestB = "sha256-" + std::string(64, 'b');

class HeaderStamperTest : public ::testing::Test {
 protected:

  // The file at `rel` as the view holds it once indexed into `digest`.
  View::NodePtr Indexed(const std::string& rel, const std::string& bytes, const std::string& digest) {
    return testing::IndexedFileNode(src_ / rel, bytes, digest, &pool_);
  }

  testing::TempDir src_{"ckptfs-stamper"};
  ThreadPool pool_{2};
  ChunkCache cache_{ChunkCache::Options{.capacity = 64 * kChunkSize}};
  SourceReader reader_;
  FileServer server_{FileServer::Parts{.cache = &cache_, .reader = &reader_}, FileServer::Options{}, {}};
  HeaderStamper stamper_;
};

std::string Model(const std::string& metadata = R"({"format": "pt"})") {
  return MakeSafetensors({{"a", "F32", {4, 4}, RandomBytes(64, 1)}, {"b", "U8", {3}, RandomBytes(3, 2)}}, metadata);
}

TEST_F(HeaderStamperTest, StampsTheHeaderWithTheCheckpointAndFileDigests) {
  const std::string bytes = Model();
  const auto file = Indexed("m/model.safetensors", bytes, kDigestA);
  auto stamped = stamper_.For(server_, file);
  ASSERT_TRUE(stamped.ok()) << stamped.status().message();
  ASSERT_TRUE(stamped->has_value());
  const StampedFile& s = **stamped;

  auto original = ParseSafetensorsHeader(bytes, bytes.size());
  ASSERT_TRUE(original.ok());
  EXPECT_EQ(s.source_prefix_len, 8 + original->header_len);
  EXPECT_EQ(s.size, bytes.size() - s.source_prefix_len + s.prefix->size());
  EXPECT_EQ((s.prefix->size() - s.source_prefix_len) % 8, 0u) << "tensor data would lose its alignment";

  // The served file: stamped prefix, then the source's tensor bytes.
  const std::string served = *s.prefix + bytes.substr(s.source_prefix_len);
  auto header = ParseSafetensorsHeader(served, served.size());
  ASSERT_TRUE(header.ok()) << header.status().message();
  const auto& meta = header->json["__metadata__"];
  EXPECT_EQ(meta["ckptfs.checkpoint"], kDigestA);
  EXPECT_EQ(meta["ckptfs.sha256"], ToHex(file->sha256));
  EXPECT_EQ(meta["format"], "pt") << "the file's own metadata is kept";
  EXPECT_EQ(header->json["a"], original->json["a"]);
  EXPECT_EQ(header->json["b"], original->json["b"]);
}

TEST_F(HeaderStamperTest, OneStampPerCheckpointKeptForTheNextOpen) {
  const std::string bytes = Model();
  const auto in_a = Indexed("a/model.safetensors", bytes, kDigestA);
  const auto in_b = Indexed("b/model.safetensors", bytes, kDigestB);
  auto a = stamper_.For(server_, in_a), b = stamper_.For(server_, in_b), again = stamper_.For(server_, in_a);
  ASSERT_TRUE(a.ok() && b.ok() && again.ok());
  ASSERT_TRUE(a->has_value() && b->has_value() && again->has_value());
  EXPECT_NE(*(*a)->prefix, *(*b)->prefix) << "two checkpoints with one file must not share a header";
  EXPECT_EQ((*a)->prefix.get(), (*again)->prefix.get()) << "stamped again instead of kept";
}

TEST_F(HeaderStamperTest, AHeaderLongerThanAChunkIsReadWhole) {
  const std::string big = R"({"notes": ")" + std::string(kChunkSize + 1000, 'n') + R"("})";
  const std::string bytes = Model(big);
  ASSERT_GT(bytes.size(), kChunkSize);
  const auto file = Indexed("m/model.safetensors", bytes, kDigestA);
  auto stamped = stamper_.For(server_, file);
  ASSERT_TRUE(stamped.ok()) << stamped.status().message();
  ASSERT_TRUE(stamped->has_value());
  const std::string served = *(*stamped)->prefix + bytes.substr((*stamped)->source_prefix_len);
  auto header = ParseSafetensorsHeader(served, served.size());
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_EQ(header->json["__metadata__"]["ckptfs.checkpoint"], kDigestA);
  EXPECT_EQ(header->json["__metadata__"]["notes"].get<std::string>().size(), kChunkSize + 1000);
}

TEST_F(HeaderStamperTest, OtherFilesAndBrokenHeadersAreServedAsTheyAre) {
  EXPECT_FALSE(stamper_.For(server_, Indexed("m/config.json", R"({"a": 1})", kDigestA))->has_value());
  std::string broken = Model();
  broken[8] = '[';  // the header is no longer a JSON object
  auto stamped = stamper_.For(server_, Indexed("m/model.safetensors", broken, kDigestA));
  ASSERT_TRUE(stamped.ok()) << stamped.status().message();
  EXPECT_FALSE(stamped->has_value());
  auto tiny = stamper_.For(server_, Indexed("m/tiny.safetensors", "abc", kDigestA));
  ASSERT_TRUE(tiny.ok()) << tiny.status().message();
  EXPECT_FALSE(tiny->has_value());
}

TEST_F(HeaderStamperTest, ASourceChangedSinceIndexingIsAnErrorNotAStamp) {
  const std::string bytes = Model();
  const auto file = Indexed("m/model.safetensors", bytes, kDigestA);
  WriteFile(file->source_path, Model(R"({"format": "tf"})"));  // rewritten in place, same length
  auto stamped = stamper_.For(server_, file);
  EXPECT_FALSE(stamped.ok()) << "stamped bytes that are not the indexed file's";
}

}  // namespace
}  // namespace ckptfs
