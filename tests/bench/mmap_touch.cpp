// ckptfs-bench-mmap FILE: maps FILE and reads one byte of every page, the way
// a safetensors loader faults a shard in; prints the seconds it took.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ckptfs-bench-mmap FILE\n");
    return 2;
  }
  int fd = ::open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    std::perror(argv[1]);
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t size = static_cast<size_t>(st.st_size);
  auto* p = static_cast<const volatile unsigned char*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
  if (p == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  unsigned sum = 0;
  for (size_t off = 0; off < size; off += 4096) sum += p[off];
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::munmap(const_cast<unsigned char*>(p), size);
  std::printf("%.6f\n", s);
  return sum == 0xffffffff ? 1 : 0;  // keeps the loop from being optimised away
}
