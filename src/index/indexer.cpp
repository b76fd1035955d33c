#include "ckptfs/indexer.h"

#include <future>

#include "ckptfs/index_scheduler.h"
#include "indexing_job.h"

namespace ckptfs {

namespace {

// What a run reads of a scan: its checkpoints (not the walked tree).
std::shared_ptr<const CatalogScan> CheckpointsOf(const CatalogScan& scan) {
  auto out = std::make_shared<CatalogScan>();
  out->root = scan.root;
  out->real_root = scan.real_root;
  out->checkpoints = scan.checkpoints;
  return out;
}

}  // namespace

IndexReport Indexer::Run(const CatalogScan& scan) {
  if (options_.lookup_only) {
    // Nothing to hash: the lookups on this thread, no workers.
    indexing::RowBatch rows(index_);
    auto ctx = std::make_shared<indexing::JobContext>(index_, options_, scan.real_root,
                                                      FileHasher::OpenSourceRoot(scan.real_root), nullptr, &rows);
    indexing::IndexingJob job(CheckpointsOf(scan), ctx);
    job.Prepare(EffectiveThreads(options_.threads));
    return job.Finish();
  }
  IndexScheduler scheduler(index_, options_.threads);
  std::promise<IndexReport> report;
  scheduler.Submit(CheckpointsOf(scan), options_, [&report](IndexReport r) { report.set_value(std::move(r)); });
  return report.get_future().get();
}

}  // namespace ckptfs
