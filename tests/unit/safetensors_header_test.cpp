// The safetensors header parser, rule by rule, and the stamped header.
#include "ckptfs/safetensors_header.h"

#include <gtest/gtest.h>

#include "test_tree.h"

namespace ckptfs::testing {
namespace {

// A file from a raw header text and a data section of `data_len` bytes.
std::string FileWith(const std::string& header, size_t data_len) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_len, 'x');
}

Status Parse(const std::string& file) {
  auto r = ParseSafetensorsHeader(file, file.size());
  return r.ok() ? Status::Ok() : r.status();
}

void ExpectBroken(const std::string& file, const std::string& rule) {
  Status s = Parse(file);
  ASSERT_FALSE(s.ok()) << "accepted a file that breaks: " << rule;
  EXPECT_NE(s.message().find(rule), std::string::npos) << s.message();
}

TEST(SafetensorsHeaderTest, ValidFilesParse) {
  std::vector<Tensor> tensors = {{"a", "F32", {2, 3}, std::string(24, '\1')}, {"b", "BF16", {4}, std::string(8, '\2')},
                                 {"empty", "U8", {0}, ""}};
  const std::string file = MakeSafetensors(tensors, R"({"format": "pt"})");
  auto h = ParseSafetensorsHeader(file, file.size());
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->tensors, 3u);
  EXPECT_EQ(h->data_len, 32u);
  EXPECT_TRUE(Parse(FileWith("{}", 0)).ok());  // no tensors at all
  EXPECT_TRUE(Parse(FileWith(R"({"__metadata__": {}})", 0)).ok());
}

TEST(SafetensorsHeaderTest, AsksForMoreBytesUntilItHasTheHeader) {
  const std::string file = MakeSafetensors({{"a", "U8", {3}, "abc"}});
  uint64_t need = 0;
  auto first = ParseSafetensorsHeader(file.substr(0, 8), file.size(), &need);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), Status::Code::kNeedMore);
  EXPECT_EQ(need, file.size() - 3);
  EXPECT_TRUE(ParseSafetensorsHeader(file.substr(0, need), file.size()).ok());
}

TEST(SafetensorsHeaderTest, EveryRuleIsEnforced) {
  ExpectBroken("1234567", "shorter than the 8-byte header length");
  ExpectBroken(FileWith("{}", 0).substr(0, 8) + "{", "runs past the end");
  ExpectBroken(FileWith("{\"a\": \"\xff\xfe\"}", 0), "not valid UTF-8 JSON");
  ExpectBroken(FileWith("{\"a\": ", 0), "not valid UTF-8 JSON");
  ExpectBroken(FileWith("[1, 2]", 0), "top level is not a JSON object");
  ExpectBroken(FileWith(R"({"__metadata__": ["x"]})", 0), "__metadata__ is not a map");
  ExpectBroken(FileWith(R"({"__metadata__": {"k": 1}})", 0), "__metadata__ value of \"k\" is not a string");
  ExpectBroken(FileWith(R"({"t": 5})", 0), "tensor \"t\" is not an object");
  ExpectBroken(FileWith(R"({"t": {"shape": [1], "data_offsets": [0, 1]}})", 1), "has no dtype");
  ExpectBroken(FileWith(R"({"t": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4), "unknown dtype F33");
  ExpectBroken(FileWith(R"({"t": {"dtype": "U8", "data_offsets": [0, 1]}})", 1), "has no shape");
  ExpectBroken(FileWith(R"({"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", 1),
               "shape entry that is not a count");
  ExpectBroken(FileWith(R"({"t": {"dtype": "U8", "shape": [1]}})", 1), "has no data_offsets");
  ExpectBroken(FileWith(R"({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", 1), "has no data_offsets");
  ExpectBroken(FileWith(R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [1, 0]}})", 1), "end before they begin");
  ExpectBroken(FileWith(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
               "holds 4 bytes but its shape and dtype need 8");
  ExpectBroken(FileWith(R"({"t": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
               "shape overflows");
  ExpectBroken(FileWith(R"({"t": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 8]}})", 8),
               "size overflows");
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                            "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}})", 5),
               "a hole of 1 bytes before tensor \"b\"");
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})", 3),
               "a hole of 1 bytes before tensor \"a\"");
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                            "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})", 4),
               "tensor \"b\" overlaps the tensor before it");
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", 3),
               "the tensors end at byte");
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", 1), "the tensors end at byte");
}

TEST(SafetensorsHeaderTest, HeaderSizeLimit) {
  // Exactly at the limit: accepted.
  std::string at_limit = R"({"__metadata__": {}})";
  at_limit.append(kMaxSafetensorsHeader - at_limit.size(), ' ');
  EXPECT_TRUE(Parse(FileWith(at_limit, 0)).ok());
  // One byte past it: refused from the length alone, before reading the header.
  std::string past(8, '\0');
  const uint64_t n = kMaxSafetensorsHeader + 1;
  for (int i = 0; i < 8; ++i) past[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  auto r = ParseSafetensorsHeader(past, n + 8);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("exceeds the limit of 100000000 bytes"), std::string::npos);
}

TEST(SafetensorsHeaderTest, StampKeepsOrderContentAndAlignment) {
  const std::string file = MakeSafetensors({{"z.weight", "F32", {2}, std::string(8, '\3')},
                                            {"a.weight", "U8", {3}, "abc"}},
                                           R"({"format": "pt", "note": "x"})");
  auto h = ParseSafetensorsHeader(file, file.size());
  ASSERT_TRUE(h.ok());
  const std::string name = "sha256-" + std::string(64, 'a');
  const std::string sha = std::string(64, 'b');
  const std::string stamped = StampedHeaderBytes(*h, name, sha);
  const std::string restamped_file = stamped + file.substr(8 + h->header_len);
  auto s = ParseSafetensorsHeader(restamped_file, restamped_file.size());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ((s->header_len - h->header_len) % 8, 0u);
  EXPECT_EQ(s->data_len, h->data_len);
  EXPECT_EQ(s->json["__metadata__"]["ckptfs.checkpoint"], name);
  EXPECT_EQ(s->json["__metadata__"]["ckptfs.sha256"], sha);
  std::vector<std::string> keys, meta_keys;
  for (const auto& [k, v] : s->json.items()) keys.push_back(k);
  for (const auto& [k, v] : s->json["__metadata__"].items()) meta_keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "z.weight", "a.weight"}));
  EXPECT_EQ(meta_keys, (std::vector<std::string>{"format", "note", "ckptfs.checkpoint", "ckptfs.sha256"}));
  nlohmann::ordered_json without = s->json;
  without["__metadata__"].erase("ckptfs.checkpoint");
  without["__metadata__"].erase("ckptfs.sha256");
  EXPECT_EQ(without, h->json);  // nothing else changed
  EXPECT_EQ(restamped_file.substr(8 + s->header_len), file.substr(8 + h->header_len));
}

TEST(SafetensorsHeaderTest, StampCreatesMetadataFirstWhenAbsent) {
  const std::string file = MakeSafetensors({{"w", "U8", {1}, "q"}});
  auto h = ParseSafetensorsHeader(file, file.size());
  ASSERT_TRUE(h.ok());
  ASSERT_FALSE(h->json.contains("__metadata__"));
  const std::string stamped = StampedHeaderBytes(*h, "sha256-x", "y");
  auto j = nlohmann::ordered_json::parse(stamped.substr(8));
  EXPECT_EQ(j.begin().key(), "__metadata__");
  EXPECT_EQ(j["__metadata__"].size(), 2u);
  EXPECT_EQ(j["w"], h->json["w"]);
}

// A header whose tensor "w" carries an extra key nested `depth` arrays deep
// (the whole header is then depth + 2 deep: top object, tensor object).
std::string NestedExtraKeyFile(size_t depth) {
  return FileWith(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": )" + std::string(depth, '[') +
                      std::string(depth, ']') + "}}",
                  1);
}

TEST(SafetensorsHeaderTest, DeeplyNestedExtraKeyIsRefusedWithoutRecursing) {
  // 100,000 arrays (200 KB): before the bound, stamping it overflowed the
  // stack in nlohmann's recursive copy and dump.
  ExpectBroken(NestedExtraKeyFile(100'000), "nests arrays and objects more than 128 deep");
  // Objects count as much as arrays, and so does nesting in __metadata__.
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += R"({"a":)";
  objects += "1" + std::string(100'000, '}');
  ExpectBroken(FileWith(R"({"__metadata__": {"k": )" + objects + "}}", 0), "more than 128 deep");
}

TEST(SafetensorsHeaderTest, DepthBoundIsExact) {
  // The format needs 3 levels (top object, tensor, shape); extra keys may go
  // on to the bound, as they may in the reference Rust parser.
  EXPECT_TRUE(Parse(FileWith(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", 1)).ok());
  auto at_bound = Parse(NestedExtraKeyFile(kMaxSafetensorsHeaderDepth - 2));
  EXPECT_TRUE(at_bound.ok()) << at_bound.message();
  ExpectBroken(NestedExtraKeyFile(kMaxSafetensorsHeaderDepth - 1), "more than 128 deep");
  // Brackets inside strings are text, escaped quotes included.
  const std::string brackets = R"(\"[[[[)" + std::string(1000, '[') + R"(\\)";
  auto in_string = Parse(FileWith(R"({"__metadata__": {"k": ")" + brackets + R"("}})", 0));
  EXPECT_TRUE(in_string.ok()) << in_string.message();
}

TEST(SafetensorsHeaderTest, RepeatedKeysAreRefused) {
  // JSON leaves a repeated key's meaning open (most readers keep the last);
  // a repeated tensor name would make two readers see different tensors.
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                            "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", 1),
               "repeated key \"a\"");
  ExpectBroken(FileWith(R"({"__metadata__": {"k": "1", "j": "2", "k": "3"}})", 0), "repeated key \"k\"");
  ExpectBroken(FileWith(R"({"a": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", 1),
               "repeated key \"dtype\"");
  // The same key in two different objects is no repeat.
  EXPECT_TRUE(Parse(FileWith(R"({"__metadata__": {"a": "x"}, "a": {"dtype": "U8", "shape": [1],
                                 "data_offsets": [0, 1]}})", 1)).ok());
}

// A header of `n` tensors (names as in a large MoE checkpoint), U8 [1] each.
std::string ManyTensorsFile(size_t n) {
  std::string h = R"({"__metadata__":{"format":"pt"})";
  for (size_t i = 0; i < n; ++i) {
    h += ",\"model.layers." + std::to_string(i / 3000) + ".mlp.experts." + std::to_string(i / 3 % 1000) + "." +
         "gud"[i % 3] + "_proj.weight\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) + "," +
         std::to_string(i + 1) + "]}";
  }
  return FileWith(h + "}", n);
}

TEST(SafetensorsHeaderTest, HundredsOfThousandsOfTensorsParseAndStamp) {
  // No clock here: the parser used to take time quadratic in the number of
  // keys (the two parses below took 254 s for 200,000 tensors and did not
  // finish in 300 s for these 300,000), so the test's TIMEOUT is the bound.
  const std::string file = ManyTensorsFile(300'000);
  ASSERT_GT(file.size(), 24u << 20);
  auto h = ParseSafetensorsHeader(file, file.size());
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->tensors, 300'000u);
  const std::string stamped = StampedHeaderBytes(*h, "sha256-x", "y");
  const std::string restamped = stamped + file.substr(8 + h->header_len);
  auto again = ParseSafetensorsHeader(restamped, restamped.size());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->tensors, 300'000u);
  EXPECT_EQ(again->json["__metadata__"]["ckptfs.checkpoint"], "sha256-x");
}

TEST(SafetensorsHeaderTest, ManyMetadataKeysParseAndStamp) {
  // 1,000,000 short keys in 12 MB: the shape that was slowest per byte.
  std::string h = R"({"__metadata__":{"format":"pt")";
  for (int i = 0; i < 1'000'000; ++i) h += ",\"k" + std::to_string(i) + "\":\"\"";
  const std::string file = FileWith(h + "}}", 0);
  auto parsed = ParseSafetensorsHeader(file, file.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const std::string stamped = StampedHeaderBytes(*parsed, "sha256-x", "y");
  EXPECT_NE(stamped.find(R"("k999999":"","ckptfs.checkpoint":"sha256-x","ckptfs.sha256":"y"}})"), std::string::npos);
}

// The stamping as it was before the parser became linear (nlohmann's own
// ordered parse, copy, dump), kept to prove the bytes did not change.
std::string StampedTheOldWay(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(file.substr(8, n));
  if (!j.contains("__metadata__")) {
    nlohmann::ordered_json with = nlohmann::ordered_json::object();
    with["__metadata__"] = nlohmann::ordered_json::object();
    for (auto& [k, v] : j.items()) with[k] = std::move(v);
    j = std::move(with);
  }
  j["__metadata__"]["ckptfs.checkpoint"] = "sha256-old";
  j["__metadata__"]["ckptfs.sha256"] = "cafe";
  std::string text = j.dump();
  uint64_t len = n;
  while (len < text.size()) len += 8;
  text.append(static_cast<size_t>(len - text.size()), ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + text;
}

TEST(SafetensorsHeaderTest, StampedBytesAreThoseOfTheOldStamper) {
  const std::string t = R"("dtype": "U8", "shape": [1], "data_offsets": )";
  const std::vector<std::string> headers = {
      "{}",
      R"({"__metadata__": {}})",
      // Python's json.dumps spacing, metadata last, escapes that dump rewrites.
      R"({"b\u00e9ta": {)" + t + R"([0, 1]}, "a\/b": {)" + t + R"([1, 2]}, "__metadata__": {"format": "pt", "q": "\"\\\n"}})",
      // Extra keys of every JSON type, numbers that dump reformats.
      R"({ "w" : { "dtype":"U8","shape":[1],"data_offsets":[0,1], "scale": 1.50e-3, "neg": -7, "big": 18446744073709551615,
           "f": 1E2, "t": true, "n": null, "o": {"x": [[], {}]} } })",
      // The ckptfs keys already there (a stamped file copied into SRC), and a scalar shape.
      R"({"__metadata__": {"ckptfs.sha256": "old", "format": "pt", "ckptfs.checkpoint": "old"}, "s": {"dtype": "U8",
          "shape": [], "data_offsets": [0, 1]}})",
      // Non-ASCII UTF-8 kept as is; padding that already exceeds the growth.
      "{\"\xce\xb1\": {" + t + "[0, 1]}, \"__metadata__\": {\"note\": \"\xe2\x9c\x93\"}}" + std::string(200, ' '),
  };
  const std::vector<size_t> data_len = {0, 0, 2, 1, 1, 1};
  for (size_t i = 0; i < headers.size(); ++i) {
    const std::string file = FileWith(headers[i], data_len[i]);
    auto h = ParseSafetensorsHeader(file, file.size());
    ASSERT_TRUE(h.ok()) << i << ": " << h.status().message();
    EXPECT_EQ(StampedHeaderBytes(*h, "sha256-old", "cafe"), StampedTheOldWay(file)) << headers[i];
  }
}

}  // namespace
}  // namespace ckptfs::testing
