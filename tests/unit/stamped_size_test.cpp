// The size a *.safetensors member is served with under stamp_headers,
// computed at indexing from its header's chunks. It is stored per SHA-256
// and served for every copy of those bytes, so it comes only from the
// bytes hashed: each header chunk read is checked against the file's
// SHA-256 chain, not only against its XXH3-128, which a user who may write
// a copy could craft bytes to pass.
#include "ckptfs/stamped_size.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <string>

#include "ckptfs/file_hasher.h"
#include "ckptfs/safetensors_header.h"
#include "indexed_source_file.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using testing::MakeSafetensors;
using testing::RandomBytes;
using testing::Tensor;

// A file of two chunks, its header holding `metadata`.
std::string Shard(const std::string& metadata) {
  return MakeSafetensors({Tensor{"w", "U8", {kChunkSize + 100}, RandomBytes(kChunkSize + 100, 3)}}, metadata);
}

TEST(StampedSizeTest, ComesOnlyFromTheBytesHashed) {
  testing::TempDir dir;
  const std::string path = dir / "model.safetensors";
  const std::string real = Shard(R"({"a": "1"})");
  const std::string other = Shard(R"({"a": "a longer value, and so a longer header"})");
  testing::WriteFile(path, other);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const FileStamp stamp = FileStamp::FromStat(st);
  auto on_disk = FileHasher(nullptr).Hash(path, stamp);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status().message();
  SourceReader reader;

  // The bytes read are those hashed: their size.
  auto header = ParseSafetensorsHeader(testing::SafetensorsHeader(other), other.size());
  ASSERT_TRUE(header.ok()) << header.status().message();
  auto honest = ServedStampedSize(reader, path, stamp, *on_disk);
  ASSERT_TRUE(honest.ok()) << honest.status().message();
  EXPECT_EQ(*honest, StampedFileSize(*header, other.size()));
  EXPECT_NE(*honest, other.size());

  // The index says other bytes were hashed (the real file's SHA-256 and
  // chain) while the chunks on disk pass their XXH3-128s, as bytes crafted
  // behind an intact stamp would: no size is made of them.
  FileHashes vouched = *on_disk;
  vouched.sha256 = Sha256Of(real);
  vouched.chain = testing::ChainOfBytes(real);
  auto forged = ServedStampedSize(reader, path, stamp, vouched);
  ASSERT_FALSE(forged.ok()) << *forged;
  EXPECT_EQ(forged.status().code(), Status::Code::kCorrupt) << forged.status().message();

  // Hashes without a chain (a manifest's): nothing to check the header
  // against here, so no size is made; stat reads the header through the
  // mount's own checks.
  FileHashes unchained = *on_disk;
  unchained.chain.reset();
  auto unknown = ServedStampedSize(reader, path, stamp, unchained);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Status::Code::kNotFound);
}

}  // namespace
}  // namespace ckptfs
