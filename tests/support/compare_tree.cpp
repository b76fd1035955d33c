// ckptfs-test-compare-tree SRC MNT: compares every regular file below SRC
// with the same path below MNT, by read(2) and by mmap. Prints each
// difference and "N files equal" when there is none; exit status 0 when all
// agree. For tests that must read a mount from inside another namespace.
#include <cstdio>

#include "file_reads.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SRC MNT\n", argv[0]);
    return 2;
  }
  size_t files = 0;
  const std::string report = ckptfs::testing::CompareTree(argv[1], argv[2], &files);
  std::fputs(report.c_str(), stdout);
  if (!report.empty()) return 1;
  std::printf("%zu files equal\n", files);
  return 0;
}
