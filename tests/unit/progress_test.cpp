#include "progress.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "test_tree.h"

namespace ckptfs::testing {
namespace {

TEST(ProgressTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(3ull << 30), "3.00 GiB");
}

TEST(ProgressTest, LineShowsDoneTotalRateAndEta) {
  // 1 GiB of 4 GiB in 2 s: 512 MiB/s, 6 s left.
  std::string line = FormatProgressLine("hashing", 1ull << 30, 4ull << 30, 2.0, 100);
  EXPECT_NE(line.find("hashing  1.00 GiB / 4.00 GiB"), std::string::npos) << line;
  EXPECT_NE(line.find(" 25%"), std::string::npos) << line;
  EXPECT_NE(line.find("512.00 MiB/s"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 0:06"), std::string::npos) << line;
  EXPECT_NE(line.find("[#########....."), std::string::npos) << line;  // a quarter of 39 columns
  EXPECT_LE(line.size(), 100u);
  // Narrow terminals lose the bar, never the numbers.
  std::string narrow = FormatProgressLine("hashing", 1ull << 30, 4ull << 30, 2.0, 40);
  EXPECT_EQ(narrow.find('['), std::string::npos);
  EXPECT_NE(narrow.find("ETA"), std::string::npos);
}

// Draws to stderr when enabled, and erases itself at the end; silent when not.
TEST(ProgressTest, DrawsOnlyWhenEnabled) {
  TempDir dir;
  for (bool enabled : {true, false}) {
    const std::string path = dir / (enabled ? "on" : "off");
    std::fflush(stderr);
    int saved = ::dup(STDERR_FILENO);
    FILE* f = std::fopen(path.c_str(), "w");
    ::dup2(::fileno(f), STDERR_FILENO);
    {
      ProgressBar bar("hashing", enabled);
      bar.SetTotal(100);
      bar.Add(40);
      // The first draw comes 500 ms after the bar starts; wait for it (up to
      // 10 s on a loaded machine) where it is on, and as long where it is off.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(enabled ? 10000 : 900);
      auto drawn = [&] { return ReadFile(path).find("40 B") != std::string::npos; };
      while (std::chrono::steady_clock::now() < deadline && (!enabled || !drawn())) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    std::fflush(stderr);
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    std::fclose(f);
    std::string out = ReadFile(path);
    if (enabled) {
      EXPECT_NE(out.find("\r\033[Khashing  40 B / 100 B"), std::string::npos) << out;
      EXPECT_EQ(out.substr(out.size() - 4), "\r\033[K");
    } else {
      EXPECT_EQ(out, "");
    }
  }
}

}  // namespace
}  // namespace ckptfs::testing
