// The view's snapshots: inode numbers that are the same in every snapshot and
// every process, nodes the kernel holds kept past their withdrawal, the
// changes a publish reports, and lookups that never wait for a publish.
#include "ckptfs/view.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "ckptfs/catalog_watcher.h"
#include "ckptfs/index.h"
#include "test_tree.h"
#include "view_builder.h"

namespace ckptfs {
namespace {

const Ownership kOwner{0, 0, 0755};

ExposedCheckpoint MakeCheckpoint(const std::string& rel, const std::string& digest_name,
                                 const std::vector<std::string>& files) {
  ExposedCheckpoint cp;
  cp.rel_path = rel;
  cp.abs_path = "/src/" + rel;
  cp.name = digest_name;
  cp.dir_access = {nullptr, kOwner};
  for (const auto& f : files) {
    ExposedCheckpoint::File file;
    file.rel_path = f;
    file.source_path = cp.abs_path + "/" + f;
    file.stamp.size = f.size();
    file.sha256 = Sha256Of(f);
    file.owner = {0, 0, 0644};
    file.access = {nullptr, file.owner};
    cp.files.push_back(file);
    auto slash = f.rfind('/');
    if (slash != std::string::npos) cp.subdirs[f.substr(0, slash)] = {nullptr, kOwner};
  }
  return cp;
}

std::string Digest(char c) { return "sha256-" + std::string(64, c); }

// Every path below the root with its (inode, generation), walked through Lookup.
std::map<std::string, std::pair<InodeId, uint64_t>> Numbers(const View& view) {
  std::map<std::string, std::pair<InodeId, uint64_t>> out;
  std::vector<std::pair<std::string, View::NodePtr>> stack{{"", view.Get(kRootInode)}};
  while (!stack.empty()) {
    auto [path, n] = stack.back();
    stack.pop_back();
    out[path] = {n->ino, n->generation};
    for (const auto& [name, ino] : n->children) {
      auto child = view.Lookup(n->ino, name);
      EXPECT_NE(child, nullptr) << path << "/" << name;
      if (child) stack.emplace_back(path + "/" + name, child);
    }
  }
  return out;
}

const std::vector<ExposedCheckpoint> kTree = {
    MakeCheckpoint("base", Digest('a'), {"config.json", "model.safetensors", "sub/tokenizer.json"}),
    MakeCheckpoint("run7", Digest('b'), {"model.safetensors"}),
    MakeCheckpoint("run7/checkpoint-500", Digest('c'), {"model.safetensors"}),
};

TEST(ViewTest, TwoViewsOfOneTreeGiveEveryNodeTheSameNumbers) {
  // What a restarted daemon relies on: the kernel's inode numbers mean the
  // same nodes in a new process.
  // The second view has another history, as a daemon started later would.
  View first("/src", kOwner), second("/src", kOwner);
  first.Publish(kTree, {}, {});
  second.Publish({kTree[2]}, {}, {});
  second.Publish({MakeCheckpoint("other", Digest('e'), {"x.bin"})}, {}, {});
  second.Publish({kTree[2], kTree[0], kTree[1]}, {}, {});
  const auto a = Numbers(first), b = Numbers(second);
  EXPECT_EQ(a, b);
  EXPECT_GT(a.size(), 12u);
  std::set<InodeId> distinct;
  for (const auto& [path, numbers] : a) distinct.insert(numbers.first);
  EXPECT_EQ(distinct.size(), a.size()) << "two nodes share an inode";
}

TEST(ViewTest, ANewCheckpointLeavesTheOthersNumbersAlone) {
  View view("/src", kOwner);
  view.Publish({kTree[0]}, {}, {});
  const auto before = Numbers(view);
  view.Publish(kTree, {}, {});
  const auto after = Numbers(view);
  for (const auto& [path, numbers] : before) {
    ASSERT_TRUE(after.count(path)) << path;
    EXPECT_EQ(after.at(path), numbers) << path;
  }
  EXPECT_GT(after.size(), before.size());
}

TEST(ViewTest, AMovedLinkIsANewNodeAndIsReportedAsAChangedEntry) {
  View view("/src", kOwner);
  view.Publish({kTree[0]}, {}, {});
  auto by_name = view.Resolve("by-name");
  auto link_before = view.Lookup(by_name->ino, "base");
  ASSERT_NE(link_before, nullptr);

  auto changed = MakeCheckpoint("base", Digest('d'), {"config.json"});
  auto changes = view.Publish({changed}, {}, {});
  auto link_after = view.Lookup(by_name->ino, "base");
  ASSERT_NE(link_after, nullptr);
  EXPECT_NE(link_after->ino, link_before->ino);
  EXPECT_NE(link_after->link_target, link_before->link_target);
  auto has = [&](InodeId parent, const std::string& name) {
    return std::find(changes.entries.begin(), changes.entries.end(), std::make_pair(parent, name)) !=
           changes.entries.end();
  };
  EXPECT_TRUE(has(by_name->ino, "base"));
  EXPECT_TRUE(has(kRootInode, Digest('a')));  // withdrawn from the root
  EXPECT_TRUE(has(kRootInode, Digest('d')));  // appeared
}

TEST(ViewTest, AHeldNodeOutlivesItsWithdrawalUntilTheKernelForgetsIt) {
  View view("/src", kOwner);
  view.Publish({kTree[0]}, {}, {});
  auto file = view.Resolve(Digest('a') + "/model.safetensors");
  ASSERT_NE(file, nullptr);
  view.Remember(file);
  view.Remember(file);
  const size_t with_base = view.NodeCount();

  view.Publish({kTree[1]}, {}, {});
  EXPECT_EQ(view.Resolve(Digest('a')), nullptr);  // gone from the listing
  ASSERT_NE(view.Get(file->ino), nullptr);        // but an open file still finds it
  EXPECT_EQ(view.Get(file->ino)->source_path, file->source_path);

  view.Forget(file->ino, 1);
  EXPECT_NE(view.Get(file->ino), nullptr);
  // A forget for an inode this process never handed out (meant for an
  // earlier daemon of the mount) changes nothing.
  view.Forget(file->ino + 12345, 7);
  view.Forget(file->ino, 1);
  EXPECT_EQ(view.Get(file->ino), nullptr);
  EXPECT_LT(view.NodeCount(), with_base);
}

TEST(ViewTest, AnUnchangedDigestKeepsItsNodesAndAChangedOneIsRebuilt) {
  View view("/src", kOwner);
  view.Publish(kTree, {}, {});
  auto kept = view.Resolve(Digest('a') + "/sub/tokenizer.json");
  auto other = view.Resolve(Digest('b') + "/model.safetensors");
  ASSERT_TRUE(kept && other);

  // run7's file changes owner (a chown in SRC): same digest, other inputs.
  auto changed = kTree;
  changed[1].files[0].owner = {1000, 1000, 0644};
  changed[1].files[0].access.self = changed[1].files[0].owner;
  auto changes = view.Publish(changed, {}, {});
  EXPECT_EQ(view.Resolve(Digest('a') + "/sub/tokenizer.json"), kept);  // the very same node
  auto rebuilt = view.Resolve(Digest('b') + "/model.safetensors");
  ASSERT_NE(rebuilt, nullptr);
  EXPECT_NE(rebuilt, other);
  EXPECT_EQ(rebuilt->ino, other->ino);
  EXPECT_EQ(rebuilt->owner.uid, 1000u);
  EXPECT_NE(std::find(changes.inodes.begin(), changes.inodes.end(), other->ino), changes.inodes.end());
  EXPECT_GE(view.LastPublish().reused, 5u);  // digest a's directory, subdirectory and files, digest c's
  EXPECT_GT(view.LastPublish().built, 0u);
}

TEST(ViewTest, LookupsGoOnWhileAPublishBuildsItsSnapshot) {
  // A publish of a large tree takes a while to build. Lookups made after it
  // began must complete before it ends: they read the current snapshot
  // rather than wait for the publish (under one view-wide lock they could
  // not).
  std::vector<ExposedCheckpoint> big{kTree[0]};
  for (int c = 0; c < 20; ++c) {
    std::vector<std::string> files;
    for (int f = 0; f < 5000; ++f) files.push_back("dir" + std::to_string(f % 50) + "/f" + std::to_string(f));
    char name[65];
    std::snprintf(name, sizeof name, "%064x", c);
    big.push_back(MakeCheckpoint("cp" + std::to_string(c), "sha256-" + std::string(name), files));
  }
  View view("/src", kOwner);
  view.Publish({kTree[0]}, {}, {});
  auto by_name = view.Resolve("by-name");

  // The reader starts once the publish has begun building, and looks up
  // until it sees the new snapshot. Under a view-wide lock its first lookup
  // would wait for the publish to end and see the new snapshot at once;
  // with snapshots it goes on answering from the old one meanwhile.
  const std::string last = big.back().name;
  long answered_from_old = 0;
  const uint64_t begun = view.PublishesBegun();
  std::thread reader([&] {
    while (view.PublishesBegun() == begun) std::this_thread::yield();
    while (!view.Lookup(kRootInode, last)) {
      EXPECT_NE(view.Lookup(by_name->ino, "base"), nullptr);
      ++answered_from_old;
    }
  });
  view.Publish(big, {}, {});
  reader.join();
  EXPECT_GT(answered_from_old, 0) << "lookups waited for the publish";
}


// A file node carries every copy of its digest's file, most trusted first:
// copies whose file and directories root owns, then the mount's owner's,
// then anyone else's (path order within each), so that reads never try a
// copy its owner could truncate before one nobody but root can change. A
// file its group or others may write counts as anyone's. Only root's and
// the mount owner's copies are trusted (verify=auto reads the others only
// against the file's SHA-256).
TEST(ViewTest, AFileNodeCarriesEveryCopyMostTrustedFirst) {
  const uid_t mount_owner = ::geteuid() == 0 ? 4242 : ::geteuid();  // never root's rank for the test
  auto owned = [](ExposedCheckpoint cp, uid_t file_uid, uid_t dir_uid, mode_t mode = 0644, mode_t dir_mode = 0755,
                  uint64_t dev = 0) {
    auto dirs = DirChain::Extend(nullptr, {dir_uid, dir_uid, dir_mode});
    for (auto& f : cp.files) {
      f.stamp.dev = dev;  // SRC's is 0 here
      f.owner.uid = file_uid;
      f.owner.mode = mode;
      f.access = {dirs, f.owner};
      f.stamp.ino = file_uid * 1000 + dir_uid + mode;  // tells the copies apart
    }
    return cp;
  };
  const std::vector<ExposedCheckpoint> copies = {
      owned(MakeCheckpoint("a-user", Digest('d'), {"model.bin"}), 2003, 2003),
      owned(MakeCheckpoint("b-root-file-user-dir", Digest('d'), {"model.bin"}), 0, 2003),
      owned(MakeCheckpoint("c-owner", Digest('d'), {"model.bin"}), mount_owner, 0),
      owned(MakeCheckpoint("d-root", Digest('d'), {"model.bin"}), 0, 0),
      owned(MakeCheckpoint("e-root-group-writable", Digest('d'), {"model.bin"}), 0, 0, 0664),
      owned(MakeCheckpoint("f-root-others-write", Digest('d'), {"model.bin"}), 0, 0, 0646),
      owned(MakeCheckpoint("g-root-in-a-group-writable-dir", Digest('d'), {"model.bin"}), 0, 0, 0644, 02775),
      owned(MakeCheckpoint("h-root-on-another-filesystem", Digest('d'), {"model.bin"}), 0, 0, 0644, 0755, 77),
  };
  ViewBuilder::Inputs in{"/src", kOwner, {}, {}, nullptr};
  in.mount_owner = mount_owner;
  auto snap = ViewBuilder(in, copies, {}, {}).Build();
  View::NodePtr file;
  for (const auto& [ino, n] : snap->nodes) {
    if (n->kind == View::Kind::kFile && n->digest == Digest('d')) file = n;
  }
  ASSERT_TRUE(file);
  std::vector<std::string> order;
  for (const auto& c : file->copies) order.push_back(c.path);
  EXPECT_EQ(order, (std::vector<std::string>{"/src/d-root/model.bin", "/src/c-owner/model.bin",
                                             "/src/a-user/model.bin", "/src/b-root-file-user-dir/model.bin",
                                             "/src/e-root-group-writable/model.bin",
                                             "/src/f-root-others-write/model.bin",
                                             "/src/g-root-in-a-group-writable-dir/model.bin",
                                             "/src/h-root-on-another-filesystem/model.bin"}));
  std::vector<bool> trusted;
  for (const auto& c : file->copies) trusted.push_back(c.trusted);
  EXPECT_EQ(trusted, (std::vector<bool>{true, true, false, false, false, false, false, false}));
  EXPECT_EQ(file->source_path, "/src/d-root/model.bin");

  // A trusted_writers= user ranks with the mount's owner, and its copy is
  // trusted unless others may write it.
  in.trusted_writers = {2003};
  snap = ViewBuilder(in, copies, {}, {}).Build();
  for (const auto& [ino, n] : snap->nodes) {
    if (n->kind == View::Kind::kFile && n->digest == Digest('d')) file = n;
  }
  order.clear();
  trusted.clear();
  for (const auto& c : file->copies) {
    order.push_back(c.path);
    trusted.push_back(c.trusted);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"/src/d-root/model.bin", "/src/a-user/model.bin",
                                             "/src/b-root-file-user-dir/model.bin", "/src/c-owner/model.bin",
                                             "/src/e-root-group-writable/model.bin",
                                             "/src/f-root-others-write/model.bin",
                                             "/src/g-root-in-a-group-writable-dir/model.bin",
                                             "/src/h-root-on-another-filesystem/model.bin"}));
  EXPECT_EQ(trusted, (std::vector<bool>{true, true, true, true, false, false, false, false}));
  EXPECT_EQ(file->stamp, file->copies.front().stamp);
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

// What FUSE workers post to the watcher (reports of damaged files) is
// bounded: past kMaxPosted waiting, Post refuses, and the worker does the
// work itself (daemon.cpp), so a flood of reports cannot grow the queue.
TEST(CatalogWatcherPostTest, AtMostKMaxPostedTasksWait) {
  testing::TempDir dir{"ckptfs-post"};
  const std::string src = dir.path() + "/src";
  std::filesystem::create_directories(src);
  auto index = Index::Open(dir.path() + "/state", nullptr);
  ASSERT_TRUE(index.ok()) << index.status().message();
  View view(src, kOwner);
  CatalogWatcher::Options options;
  options.source = src;
  CatalogWatcher watcher(options, index->get(), &view, nullptr);  // not started: nothing runs the tasks
  int ran = 0;
  for (size_t i = 0; i < CatalogWatcher::kMaxPosted; ++i) ASSERT_TRUE(watcher.Post([&] { ++ran; })) << i;
  EXPECT_FALSE(watcher.Post([&] { ++ran; }));
  EXPECT_EQ(ran, 0);
}

}  // namespace
}  // namespace ckptfs
