// CudaModelRunner: sampling on the device (gathered and masked rows, chunks of
// max_num_seqs) and the logits read back (model/cuda/cuda_runner_impl.h).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/layers/embedding.h"
#include "kernels/cuda/sampling/sample.h"
#include "kernels/cuda/sampling/token_mask.h"
#include "kernels/plan/sampling_batch.h"
#include "kernels/sample_rows.h"
#include "model/cuda/cuda_runner_impl.h"
#include "model/sampling/host_sampling.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

using cuda::ActDtype;
using cuda::CudaStatus;

}  // namespace

// ---- Sampling ----------------------------------------------------------------

absl::Status CudaModelRunner::Impl::SampleRows(std::span<const SampleRow> rows,
                                               std::span<SampledToken> out) {
  KV_RETURN_IF_ERROR(ValidateSampleRows(rows, out.size(), std::max(0, last_logits_rows),
                                        /*masks_supported=*/true));
  const int32_t vocab = config.vocab_size;
  const int64_t mask_words = cuda::TokenMaskWords(vocab);
  for (size_t begin = 0; begin < rows.size(); begin += sample_chunk) {
    const size_t n = std::min(rows.size() - begin, static_cast<size_t>(sample_chunk));
    sampling->Clear();
    bool identity = true;
    gather_index.clear();
    for (size_t i = 0; i < n; ++i) {
      const SampleRow& r = rows[begin + i];
      const SamplingParams& sp = *r.params;
      SampleRowParams p;
      p.temperature = sp.temperature;
      p.top_k = sp.top_k;
      p.top_p = sp.top_p;
      p.min_p = sp.min_p;
      p.repetition_penalty = sp.repetition_penalty;
      p.frequency_penalty = sp.frequency_penalty;
      p.presence_penalty = sp.presence_penalty;
      p.num_top_logprobs = r.num_logprobs;
      p.seed = r.seed;
      p.step = r.output.size();
      if (absl::Status s =
              sampling->AddRow(p, absl::Span<const int32_t>(r.prompt.data(), r.prompt.size()),
                               absl::Span<const int32_t>(r.output.data(), r.output.size()));
          !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Sample: rows[", begin + i, "]: ", std::string(s.message())));
      }
      gather_index.push_back(r.logits_index);
      identity = identity && r.logits_index == static_cast<int32_t>(begin + i);
    }
    // Masked rows (constrained decoding) are masked in a private copy: the
    // gather path, with the masks uploaded after the gather index (all ones
    // for a row without one).
    bool masked = false;
    for (size_t i = 0; i < n; ++i) masked = masked || !rows[begin + i].allowed.empty();
    identity = identity && !masked;
    const int64_t packed = sampling->PackedBytes();
    const int64_t index_offset = Align16(packed);
    const int64_t mask_offset = Align16(index_offset + static_cast<int64_t>(n) * 4);
    const int64_t upload = masked ? mask_offset + static_cast<int64_t>(n) * mask_words * 4
                                  : index_offset + static_cast<int64_t>(n) * 4;
    KV_RETURN_IF_ERROR(EnsureSampleCapacity(upload));
    sampling->PackInto(sample_host.get());
    std::memcpy(sample_host.get() + index_offset, gather_index.data(), n * 4);
    if (masked) {
      auto* words = reinterpret_cast<uint32_t*>(sample_host.get() + mask_offset);
      for (size_t i = 0; i < n; ++i) {
        const std::span<const uint32_t> allowed = rows[begin + i].allowed;
        uint32_t* dst = words + static_cast<int64_t>(i) * mask_words;
        if (allowed.empty()) {
          std::fill(dst, dst + mask_words, ~uint32_t{0});
        } else {
          std::memcpy(dst, allowed.data(), static_cast<size_t>(mask_words) * 4);
        }
      }
    }
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_dev.get(), sample_host.get(), upload,
                                            cudaMemcpyHostToDevice, stream));
    const float* row_logits =
        reinterpret_cast<const float*>(logits.get()) + static_cast<int64_t>(begin) * vocab;
    if (!identity) {
      // Samples that share a logits row (a fresh fork) each get a copy.
      cuda::EmbeddingParams gather;
      gather.table = logits.get();
      gather.ids = reinterpret_cast<const int32_t*>(sample_dev.get() + index_offset);
      gather.out = gathered.get();
      gather.vocab = std::max(1, last_logits_rows);
      gather.dim = vocab;
      gather.num_tokens = static_cast<int64_t>(n);
      gather.dtype = ActDtype::kFp32;
      KV_RETURN_IF_ERROR(cuda::Embedding(gather, stream));
      row_logits = reinterpret_cast<const float*>(gathered.get());
      if (masked) {
        cuda::TokenMaskParams tm;
        tm.logits = reinterpret_cast<float*>(gathered.get());
        tm.masks = reinterpret_cast<const uint32_t*>(sample_dev.get() + mask_offset);
        tm.vocab = vocab;
        tm.num_rows = static_cast<int32_t>(n);
        KV_RETURN_IF_ERROR(cuda::ApplyTokenMasks(tm, stream));
      }
    }
    cuda::SampleParams sp;
    sp.logits = row_logits;
    sp.dtype = ActDtype::kFp32;
    sp.vocab = vocab;
    sp.num_rows = static_cast<int32_t>(n);
    sp.rows = reinterpret_cast<const SampleRowParams*>(sample_dev.get());
    sp.history =
        sampling->history().empty()
            ? nullptr
            : reinterpret_cast<const int32_t*>(sample_dev.get() + sampling->HistoryByteOffset());
    sp.processed =
        reinterpret_cast<float*>(sample_workspace.get() + sample_ws_layout.processed_offset);
    sp.counts = reinterpret_cast<int32_t*>(sample_workspace.get() + sample_ws_layout.counts_offset);
    sp.results = reinterpret_cast<SampleRowResult*>(results_dev.get());
    KV_RETURN_IF_ERROR(cuda::SampleTokens(sp, stream));
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(results_host.get(), results_dev.get(),
                                            n * sizeof(SampleRowResult), cudaMemcpyDeviceToHost,
                                            stream));
    KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const SampleRowResult* results = reinterpret_cast<const SampleRowResult*>(results_host.get());
    for (size_t i = 0; i < n; ++i) {
      const SampleRow& r = rows[begin + i];
      const SampleRowResult& res = results[i];
      SampledToken& o = out[begin + i];
      o.token = res.token;
      o.logprob = r.num_logprobs >= 0 ? res.logprob : 0.0f;
      o.top.clear();
      for (int32_t k = 0; k < r.num_logprobs; ++k) {
        if (res.top_ids[k] < 0) break;
        o.top.emplace_back(res.top_ids[k], res.top_logprobs[k]);
      }
      if (o.token < 0 || o.token >= vocab) {
        return absl::InternalError(absl::StrCat("Sample: the device sampler returned token ",
                                                o.token, " for rows[", begin + i, "]"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Sample(std::span<const SampleRow> rows, std::span<SampledToken> out) {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return impl_->SampleRows(rows, out);
}

absl::Status CudaModelRunner::ReadLogits(std::span<float> out) {
  Impl& m = *impl_;
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  const int64_t want = int64_t{std::max(0, m.last_logits_rows)} * m.config.vocab_size;
  if (static_cast<int64_t>(out.size()) < want) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits buffer has ", out.size(), " floats, the batch needs ", want));
  }
  if (want == 0) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), m.logits.get(), want * 4, cudaMemcpyDeviceToHost, m.stream));
  return CudaStatus(cudaStreamSynchronize(m.stream), "ReadLogits");
}

}  // namespace kvserve
