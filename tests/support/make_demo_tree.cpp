// ckptfs-make-demo-tree DIR: writes the quick-start demo's source tree.
//
//   DIR/base/              a small two-shard model
//   DIR/finetune/          the same files, names and safetensors headers, with
//                          one 2,048-byte tensor zeroed: what a header-keyed
//                          cache cannot tell from base
//   DIR/base-copy/         a byte-identical copy of base (same digest)
//   DIR/run7/              a trainer's output: a final model and nested
//   DIR/run7/checkpoint-500/, DIR/run7/checkpoint-1000/
#include <cstdio>
#include <exception>

#include "test_tree.h"

using namespace ckptfs::testing;

int main(int argc, char** argv) {
  if (argc != 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: ckptfs-make-demo-tree DIR\n");
    return 2;
  }
  try {
    const std::string dir = argv[1];
    ModelSpec spec;
    WriteModel(dir + "/base", spec);
    WriteModel(dir + "/finetune", spec);
    ZeroTensor(dir + "/finetune/model-00002-of-00002.safetensors", 1);
    CopyTree(dir + "/base", dir + "/base-copy");
    for (uint64_t step : {500, 1000}) {
      ModelSpec s = spec;
      s.seed = step;
      WriteModel(dir + "/run7/checkpoint-" + std::to_string(step), s);
    }
    ModelSpec final_spec = spec;
    final_spec.seed = 7;
    WriteModel(dir + "/run7", final_spec);
    WriteFile(dir + "/run7/.git/HEAD", "ref: refs/heads/main\n");  // dot-paths are not members
    WriteFile(dir + "/README.md", "ckptfs demo tree\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptfs-make-demo-tree: %s\n", e.what());
    return 1;
  }
  return 0;
}
