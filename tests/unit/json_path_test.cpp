// Paths in JSON (json_path.h): any bytes survive a trip through a JSON line,
// and a message of valid UTF-8 is left exactly as it was.
#include "ckptfs/json_path.h"

#include <gtest/gtest.h>

#include <random>

namespace ckptfs {
namespace {

using Json = nlohmann::json;

// Random byte strings that are often, but not always, valid UTF-8.
std::string RandomPath(std::mt19937_64& rng) {
  static const std::vector<std::string> kPieces = {"a", "/", "é", "€", "𝄞", "\xe9", "\xff", "\xc3", "\xed\xa0\x80",
                                                   "\xf4\x90\x80\x80", "\xe0\x80\xaf", "\\x", "\"", std::string(1, '\0')};
  std::string out;
  const size_t n = rng() % 12;
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 3 == 0) {
      out += static_cast<char>(rng() & 0xFF);
    } else {
      out += kPieces[rng() % kPieces.size()];
    }
  }
  return out;
}

bool DumpAccepts(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::type_error&) {
    return false;
  }
}

TEST(JsonPathTest, Utf8CheckAgreesWithWhatDumpAccepts) {
  for (const std::string s : {"", "café", "caf\xe9", "\xc0\xaf", "\xed\xa0\x80", "\xed\x9f\xbf", "\xf4\x8f\xbf\xbf",
                              "\xf4\x90\x80\x80", "\xf0\x9d\x84\x9e", "\xf0\x9d\x84", "\xe2\x82", "\x80", "\xfe"}) {
    EXPECT_EQ(IsValidUtf8(s), DumpAccepts(s)) << DisplayBytes(s);
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 50000; ++i) {
    const std::string s = RandomPath(rng);
    ASSERT_EQ(IsValidUtf8(s), DumpAccepts(s)) << DisplayBytes(s);
  }
}

TEST(JsonPathTest, DisplayShowsOnlyInvalidBytesEscaped) {
  EXPECT_EQ(DisplayBytes("caf\xe9/model"), "caf\\xe9/model");
  EXPECT_EQ(DisplayBytes("café/€"), "café/€");
  EXPECT_EQ(DisplayBytes("\xc3"), "\\xc3");  // a sequence cut short
  EXPECT_TRUE(IsValidUtf8(DisplayBytes("\xff\xfe\xed\xa0\x80")));
}

TEST(JsonPathTest, Base64MatchesRfc4648AndRoundTrips) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    auto back = Base64Decode(encoded);
    ASSERT_TRUE(back.ok()) << encoded;
    EXPECT_EQ(*back, plain);
  }
  std::mt19937_64 rng(5);
  for (size_t n = 0; n < 200; ++n) {
    std::string bytes(n, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() & 0xFF);
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, bytes);
  }
  for (const char* bad : {"Zg=", "Z===", "Zg=a", "Zm 9", "Zm9v\n", "=Zm9"}) EXPECT_FALSE(Base64Decode(bad).ok()) << bad;
}

TEST(JsonPathTest, ValidUtf8MessagesAreUntouched) {
  Json j = {{"ok", true}, {"path", "/srv/café/run7"}, {"sources", {"a", "b/€"}},
            {"checkpoints", {{{"path", "x"}, {"files", 3}}}}, {"nested", {{"deep", {"a", {"b"}}}}}};
  const Json before = j;
  ASSERT_TRUE(EncodeJsonPaths(j).ok());
  EXPECT_EQ(j, before);
  ASSERT_TRUE(DecodeJsonPaths(j).ok());
  EXPECT_EQ(j, before);
}

TEST(JsonPathTest, NonUtf8StringsGetADisplayFormAndTheirExactBytes) {
  Json j = {{"path", "/srv/caf\xe9"}, {"by_name", {"ok", "caf\xe9/x", 7}}};
  ASSERT_TRUE(EncodeJsonPaths(j).ok());
  EXPECT_EQ(j["path"], "/srv/caf\\xe9");
  EXPECT_EQ(j["path_b64"], Base64Encode("/srv/caf\xe9"));
  EXPECT_EQ(j["by_name"], Json({"ok", "caf\\xe9/x", 7}));
  EXPECT_EQ(j["by_name_b64"], Json({Base64Encode("ok"), Base64Encode("caf\xe9/x"), nullptr}));
}

TEST(JsonPathTest, ArbitraryBytesRoundTripThroughAJsonLine) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const Json original = {
        {"ok", true},
        {"path", RandomPath(rng)},
        {"list", {RandomPath(rng), {RandomPath(rng), RandomPath(rng)}, 3}},
        {"checkpoints", {{{"path", RandomPath(rng)}, {"reason", RandomPath(rng)}}, {{"by_name", {RandomPath(rng)}}}}}};
    Json j = original;
    ASSERT_TRUE(EncodeJsonPaths(j).ok());
    std::string line;
    ASSERT_NO_THROW(line = j.dump());
    Json back = Json::parse(line);
    ASSERT_TRUE(DecodeJsonPaths(back).ok());
    ASSERT_EQ(back, original) << line;
  }
}

TEST(JsonPathTest, RequestsMayCarryOnlyTheExactBytes) {
  Json j = {{"cmd", "preload"}, {"path_b64", Base64Encode("sha256-x/tok\xe9")}};
  ASSERT_TRUE(DecodeJsonPaths(j).ok());
  EXPECT_EQ(j, Json({{"cmd", "preload"}, {"path", "sha256-x/tok\xe9"}}));
}

TEST(JsonPathTest, WhatCannotBeEncodedOrDecodedIsAnErrorNotAThrow) {
  Json bad_key = {{std::string("caf\xe9"), 1}};
  EXPECT_FALSE(EncodeJsonPaths(bad_key).ok());
  Json bare = Json::array({"caf\xe9"});
  EXPECT_FALSE(EncodeJsonPaths(bare).ok());
  Json deep = "x";
  for (int i = 0; i < 200; ++i) deep = Json::array({std::move(deep)});
  Json in_object = {{"deep", deep}};
  EXPECT_FALSE(EncodeJsonPaths(in_object).ok());
  EXPECT_FALSE(DecodeJsonPaths(in_object).ok());
  for (Json j : {Json{{"path_b64", "%%%%"}}, Json{{"path", {1, 2}}, {"path_b64", {"Zg=="}}},
                 Json{{"path", 5}, {"path_b64", "Zg=="}}, Json{{"path_b64", 5}}}) {
    EXPECT_FALSE(DecodeJsonPaths(j).ok()) << j.dump();
  }
}

}  // namespace
}  // namespace ckptfs
