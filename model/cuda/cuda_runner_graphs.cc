// CudaModelRunner: one CUDA graph per decode batch bucket, captured at Create
// (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/paged_view.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "model/cuda/cuda_runner_impl.h"
#include "model/cuda/host/batch_staging.h"
#include "model/cuda/host/graph_buckets.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::CudaStatus;

}  // namespace

// ---- Graphs ------------------------------------------------------------------

absl::Status CudaModelRunner::Impl::CaptureGraphs() {
  for (int32_t bucket : buckets) {
    const GraphAttention ga = GraphAttentionFor(attn_shape, eager_options, bucket,
                                                int64_t{max_blocks_per_seq} * format.block_size());
    GraphStep g;
    g.bucket = bucket;
    g.options = ga.options;
    g.launch = ga.launch;
    g.layout = PlanStaging(
        PaddedDecodeShape(bucket, max_blocks_per_seq, static_cast<int32_t>(ga.max_words)));
    auto fail = [&](const absl::Status& s) {
      return absl::Status(s.code(),
                          absl::StrCat("model.cuda_graphs: capturing the decode step of ", bucket,
                                       " sequences failed: ", std::string(s.message()),
                                       " (model.cuda_graphs: false runs it eagerly)"));
    };
    // A warm-up at the bucket's shape (all rows padding: no K/V written, no
    // attention work), so the capture itself makes no first-use calls.
    BatchInput empty;
    empty.Clear();
    absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(empty), attn_shape, g.options);
    if (!plan.ok()) return fail(plan.status());
    if (absl::Status s = Upload(empty, plan->words(), g.layout); !s.ok()) return fail(s);
    if (absl::Status s = RunForward(g.layout, g.launch); !s.ok()) return fail(s);
    if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream), "warm-up"); !s.ok()) {
      return fail(s);
    }
    cudaGraph_t graph = nullptr;
    absl::Status s = CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                                "cudaStreamBeginCapture");
    if (!s.ok()) return fail(s);
    const absl::Status run = RunForward(g.layout, g.launch);
    s = CudaStatus(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    if (!run.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return fail(run);
    }
    if (!s.ok()) return fail(s);
    s = CudaStatus(cudaGraphInstantiate(&g.exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    if (!s.ok()) return fail(s);
    graphs.emplace(bucket, g);
  }
  return absl::OkStatus();
}

}  // namespace kvserve
