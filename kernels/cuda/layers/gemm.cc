// cuBLASLt behind Gemm (gemm.h): descriptors, heuristics and their cache.
#include "kernels/cuda/layers/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/device/cuda_check.h"

namespace kvserve::cuda {
namespace {

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat("Gemm: ", what, ": ", cublasLtGetStatusName(s), " (",
                                           cublasLtGetStatusString(s), ")");
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (s == CUBLAS_STATUS_INVALID_VALUE) return absl::InvalidArgumentError(message);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

#define KV_LT_RETURN_IF_ERROR(expr) KV_RETURN_IF_ERROR(LtStatus((expr), #expr))

cudaDataType_t CudaType(ActDtype d) {
  switch (d) {
    case ActDtype::kFp16:
      return CUDA_R_16F;
    case ActDtype::kBf16:
      return CUDA_R_16BF;
    case ActDtype::kFp32:
    default:
      return CUDA_R_32F;
  }
}

// The fp8 path's A and B type, and the scale mode of both.
constexpr cudaDataType_t kFp8Type = CUDA_R_8F_E4M3;
constexpr int32_t kFp8ScaleMode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;

// Sets the scale pointers of an fp8 descriptor (attributes, read at each
// call like the bias pointer).
absl::Status SetScales(cublasLtMatmulDesc_t op, const float* w_scale, const float* x_scale) {
  KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &w_scale, sizeof(w_scale)));
  KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                       &x_scale, sizeof(x_scale)));
  return absl::OkStatus();
}

// Largest power of two <= 256 that divides the address.
int AlignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("Gemm: ", field, " must be ", rule, ", got ", value));
}

// The process's tuning choices: which of the heuristic's candidates won for
// a (device, dtype, compute type, shape key), so every Gemm of the process
// runs the same algorithm for a shape (two runners of one model give the
// same bits) and times it once.
struct TuneMemo {
  absl::Mutex mu;
  std::map<std::string, int> choice ABSL_GUARDED_BY(mu);
};
TuneMemo& Memo() {
  static TuneMemo* memo = new TuneMemo;
  return *memo;
}

int CurrentDevice() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  return device;
}

}  // namespace

// One algorithm per shape without the row count; the row-count layouts
// (x and y) it has run with, each checked against it once.
struct Gemm::PlanRows {
  cublasLtMatrixLayout_t b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;  // the plan's, unless the check refused it
};
struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatmulAlgo_t algo;
  // The heuristic's candidates while the plan is tuned (Fastest), then none.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  std::map<int64_t, PlanRows> rows;
  ~Plan() {
    for (auto& [_, r] : rows) {
      if (r.c != nullptr) cublasLtMatrixLayoutDestroy(r.c);
      if (r.b != nullptr) cublasLtMatrixLayoutDestroy(r.b);
    }
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(ActDtype dtype, int64_t workspace_bytes) {
  if (workspace_bytes < 0) return Bad("workspace_bytes", ">= 0", workspace_bytes);
  cublasLtHandle_t handle = nullptr;
  KV_LT_RETURN_IF_ERROR(cublasLtCreate(&handle));
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    if (absl::Status s = CudaStatus(cudaMalloc(&workspace, workspace_bytes), "Gemm workspace");
        !s.ok()) {
      cublasLtDestroy(handle);
      return s;
    }
  }
  return std::unique_ptr<Gemm>(new Gemm(dtype, handle, workspace, workspace_bytes));
}

Gemm::Gemm(ActDtype dtype, void* handle, void* workspace, int64_t workspace_bytes)
    : dtype_(dtype), handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

Gemm::~Gemm() {
  plans_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::StatusOr<Gemm::Plan*> Gemm::PlanFor(const Key& key, const GemmParams& params,
                                          cudaStream_t stream) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<Plan>> plan;
  if (dtype_ == ActDtype::kFp32 && !std::get<10>(key)) {
    // Pedantic fp32 where cuBLASLt offers it; plain CUBLAS_COMPUTE_32F is
    // fp32 too (TF32 only ever comes with the _FAST_TF32 compute type).
    plan = MakePlan(key, CUBLAS_COMPUTE_32F_PEDANTIC, params, stream);
    if (!plan.ok()) plan = MakePlan(key, CUBLAS_COMPUTE_32F, params, stream);
  } else {
    plan = MakePlan(key, CUBLAS_COMPUTE_32F, params, stream);
  }
  if (!plan.ok()) return plan.status();
  Plan* p = plan->get();
  plans_.emplace(key, *std::move(plan));
  return p;
}

absl::StatusOr<std::unique_ptr<Gemm::Plan>> Gemm::MakePlan(const Key& key, int compute_type,
                                                           const GemmParams& p,
                                                           cudaStream_t stream) {
  const void* bias = p.bias;
  const auto [in, out, ldx, ldy, y_dtype_int, has_bias, align_x, align_w, align_y, align_bias,
              fp8] = key;
  (void)align_bias;  // the bias pointer itself is set for the heuristic
  const int64_t rows = kPlanRows;
  const ActDtype y_dtype = static_cast<ActDtype>(y_dtype_int);
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = static_cast<cublasComputeType_t>(compute_type);
  KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                       &trans_a, sizeof(trans_a)));
  KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                       &trans_b, sizeof(trans_b)));
  if (has_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &epilogue, sizeof(epilogue)));
    const cudaDataType_t bias_type = CudaType(y_dtype);
    KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    // The heuristic reads the pointer's alignment (the key holds it).
    KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (fp8) {
    for (auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE}) {
      KV_LT_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(plan->op, attr, &kFp8ScaleMode, sizeof(kFp8ScaleMode)));
    }
    KV_RETURN_IF_ERROR(SetScales(plan->op, p.w_scale, p.x_scale));
  }
  const cudaDataType_t ab = fp8 ? kFp8Type : CudaType(dtype_);
  // A = W: column-major [in x out], ld in (transposed to out x in).
  KV_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, ab, in, out, in));
  // B = x: column-major [in x rows], ld ldx; C = D = y: column-major
  // [out x rows], ld ldy. The heuristic is asked at kPlanRows rows.
  PlanRows& at = plan->rows[rows];
  KV_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&at.b, ab, in, rows, ldx));
  KV_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&at.c, CudaType(y_dtype), out, rows, ldy));

  cublasLtMatmulPreference_t pref = nullptr;
  KV_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  auto destroy_pref = [&pref] { cublasLtMatmulPreferenceDestroy(pref); };
  const uint64_t ws = static_cast<uint64_t>(workspace_bytes_);
  const uint32_t ax = align_x, aw = align_w, ay = align_y;
  absl::Status s = LtStatus(cublasLtMatmulPreferenceSetAttribute(
                                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                            "workspace preference");
  if (s.ok()) {
    s = LtStatus(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw)),
                 "alignment of w");
  }
  if (s.ok()) {
    s = LtStatus(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax)),
                 "alignment of x");
  }
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (s.ok()) {
      s = LtStatus(cublasLtMatmulPreferenceSetAttribute(pref, attr, &ay, sizeof(ay)),
                   "alignment of y");
    }
  }
  if (s.ok()) {
    // No split-K reduction (nor bf16/fp16 in-place reductions): the
    // algorithm sums a row's k in one kernel, in its own order.
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    s = LtStatus(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof(none)),
                 "reduction scheme");
  }
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  if (s.ok()) {
    s = LtStatus(
        cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op, plan->a,
                                       at.b, at.c, at.c, pref, kTuneCandidates, results, &found),
        "heuristic");
  }
  destroy_pref();
  KV_RETURN_IF_ERROR(s);
  if (found == 0) {
    return absl::NotFoundError(absl::StrCat("Gemm: cuBLASLt has no algorithm for rows ", rows,
                                            ", in ", in, ", out ", out, " (ldx ", ldx, ", ldy ",
                                            ldy, ")"));
  }
  int pick = 0;
  if (found > 1) {
    const std::string memo_key =
        absl::StrCat(CurrentDevice(), "/", static_cast<int>(dtype_), "/", compute_type, "/", in,
                     "/", out, "/", ldx, "/", ldy, "/", y_dtype_int, "/", has_bias, "/", align_x,
                     "/", align_w, "/", align_y, "/", align_bias, "/", fp8, "/", workspace_bytes_);
    TuneMemo& memo = Memo();
    absl::MutexLock lock(&memo.mu);
    if (auto it = memo.choice.find(memo_key); it != memo.choice.end() && it->second < found) {
      pick = it->second;
      ++memo_hits_;
    } else {
      for (int i = 0; i < found; ++i) plan->candidates.push_back(results[i].algo);
      if (std::optional<int> fastest = Fastest(*plan, key, p, stream)) {
        pick = *fastest;
        memo.choice[memo_key] = pick;
        ++tuned_plans_;
      }
      plan->candidates.clear();
    }
  }
  plan->algo = results[pick].algo;
  at.algo = results[pick].algo;
  return plan;
}

std::optional<int> Gemm::Fastest(Plan& plan, const Key& key, const GemmParams& p,
                                 cudaStream_t stream) {
  // Timing needs a synchronous stream: a capture takes the heuristic's first.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return std::nullopt;
  }
  const auto [in, out, ldx, ldy, y_dtype_int, has_bias, align_x, align_w, align_y, align_bias,
              fp8] = key;
  const ActDtype y_dtype = static_cast<ActDtype>(y_dtype_int);
  const cudaDataType_t x_type = fp8 ? kFp8Type : CudaType(dtype_);
  // The row counts timed: kTuneRows, the prefill-sized last cut to what
  // fits kTuneScratchBytes (the LM head's fp32 logits are wide).
  const int64_t x_size = fp8 ? 1 : ActDtypeSize(dtype_), y_size = ActDtypeSize(y_dtype);
  const int64_t fit = kTuneScratchBytes / std::max(ldx * x_size, ldy * y_size);
  std::vector<int64_t> tune_rows;
  for (int64_t r : kTuneRows) {
    const int64_t rows = std::max<int64_t>(1, std::min(r, std::max<int64_t>(fit, 64)));
    if (tune_rows.empty() || rows > tune_rows.back()) tune_rows.push_back(rows);
  }
  // Scratch x, y (and fp8 row scales) of the most rows timed; the real
  // weights, bias and weight scales. y is written with beta 0.
  const int64_t max_rows = tune_rows.back();
  const size_t x_bytes = static_cast<size_t>(max_rows * ldx) * (fp8 ? 1 : ActDtypeSize(dtype_));
  const size_t y_bytes = static_cast<size_t>(max_rows * ldy) * ActDtypeSize(y_dtype);
  void* x = nullptr;
  void* y = nullptr;
  float* x_scale = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<cublasLtMatrixLayout_t> layouts;
  auto cleanup = [&] {
    for (cublasLtMatrixLayout_t l : layouts) cublasLtMatrixLayoutDestroy(l);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    cudaStreamSynchronize(stream);
    for (void* ptr : {x, y, static_cast<void*>(x_scale)}) {
      if (ptr != nullptr) cudaFree(ptr);
    }
    cudaGetLastError();
  };
  bool ok =
      cudaMalloc(&x, x_bytes) == cudaSuccess && cudaMalloc(&y, y_bytes) == cudaSuccess &&
      (!fp8 ||
       cudaMalloc(reinterpret_cast<void**>(&x_scale), max_rows * sizeof(float)) == cudaSuccess) &&
      cudaMemsetAsync(x, 0, x_bytes, stream) == cudaSuccess &&
      (!fp8 || cudaMemsetAsync(x_scale, 0, max_rows * sizeof(float), stream) == cudaSuccess) &&
      cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
  if (ok && fp8) ok = SetScales(plan.op, p.w_scale, x_scale).ok();
  std::vector<std::pair<cublasLtMatrixLayout_t, cublasLtMatrixLayout_t>> shapes;
  for (int64_t rows : tune_rows) {
    cublasLtMatrixLayout_t b = nullptr, c = nullptr;
    ok = ok && cublasLtMatrixLayoutCreate(&b, x_type, in, rows, ldx) == CUBLAS_STATUS_SUCCESS;
    if (b != nullptr) layouts.push_back(b);
    ok = ok &&
         cublasLtMatrixLayoutCreate(&c, CudaType(y_dtype), out, rows, ldy) == CUBLAS_STATUS_SUCCESS;
    if (c != nullptr) layouts.push_back(c);
    shapes.emplace_back(b, c);
  }
  if (!ok) {
    cleanup();
    return std::nullopt;
  }
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const float alpha = 1.0f, beta = 0.0f;
  const int n = static_cast<int>(plan.candidates.size());
  std::vector<std::vector<float>> times(n);  // [candidate][row count]; empty: cannot run
  for (int i = 0; i < n; ++i) {
    bool runs = true;
    for (const auto& [b, c] : shapes) {
      cublasLtMatmulHeuristicResult_t check{};
      runs = runs && cublasLtMatmulAlgoCheck(handle, plan.op, plan.a, b, c, c, &plan.candidates[i],
                                             &check) == CUBLAS_STATUS_SUCCESS;
      auto matmul = [&] {
        return cublasLtMatmul(handle, plan.op, &alpha, p.w, plan.a, x, b, &beta, y, c, y, c,
                              &plan.candidates[i], workspace_,
                              static_cast<size_t>(workspace_bytes_),
                              stream) == CUBLAS_STATUS_SUCCESS;
      };
      runs = runs && matmul() && cudaEventRecord(start, stream) == cudaSuccess;
      for (int k = 0; runs && k < kTuneRuns; ++k) runs = matmul();
      float ms = 0;
      runs = runs && cudaEventRecord(stop, stream) == cudaSuccess &&
             cudaEventSynchronize(stop) == cudaSuccess &&
             cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
      times[i].push_back(ms);
    }
    if (!runs) {
      cudaGetLastError();
      times[i].clear();
    }
  }
  cleanup();
  // The least sum over the row counts of each time against the fastest
  // candidate's at that count: decode rows weigh as much as prefill rows,
  // whose times are larger.
  std::vector<float> fastest(shapes.size(), 0.0f);
  for (const std::vector<float>& t : times) {
    for (size_t r = 0; r < t.size(); ++r) {
      if (fastest[r] == 0.0f || t[r] < fastest[r]) fastest[r] = t[r];
    }
  }
  std::optional<int> best;
  double best_score = 0;
  for (int i = 0; i < n; ++i) {
    if (times[i].size() != shapes.size()) continue;
    double score = 0;
    for (size_t r = 0; r < shapes.size(); ++r) {
      score += fastest[r] > 0 ? times[i][r] / fastest[r] : 1.0;
    }
    if (!best || score < best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

absl::StatusOr<const Gemm::PlanRows*> Gemm::RowsFor(Plan& plan, const Key& key, int64_t rows) {
  if (auto it = plan.rows.find(rows); it != plan.rows.end()) return &it->second;
  const auto [in, out, ldx, ldy, y_dtype_int, has_bias, align_x, align_w, align_y, align_bias,
              fp8] = key;
  PlanRows r;
  absl::Status s =
      LtStatus(cublasLtMatrixLayoutCreate(&r.b, fp8 ? kFp8Type : CudaType(dtype_), in, rows, ldx),
               "layout of x");
  if (s.ok()) {
    s = LtStatus(cublasLtMatrixLayoutCreate(&r.c, CudaType(static_cast<ActDtype>(y_dtype_int)), out,
                                            rows, ldy),
                 "layout of y");
  }
  cublasLtMatmulHeuristicResult_t check{};
  if (s.ok() &&
      cublasLtMatmulAlgoCheck(static_cast<cublasLtHandle_t>(handle_), plan.op, plan.a, r.b, r.c,
                              r.c, &plan.algo, &check) == CUBLAS_STATUS_SUCCESS) {
    r.algo = plan.algo;
  } else if (s.ok()) {
    // The plan's algorithm cannot run this many rows (cuBLASLt's check):
    // this row count gets its own, and loses batch invariance against
    // the others; counted so a test or benchmark can see it.
    ++invariance_fallbacks_;
    cublasLtMatmulPreference_t pref = nullptr;
    s = LtStatus(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws = static_cast<uint64_t>(workspace_bytes_);
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    const uint32_t ax = align_x, aw = align_w, ay = align_y;
    if (s.ok()) {
      const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> attrs[] = {
          {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay},
          {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none}};
      for (const auto& [attr, value] : attrs) {
        if (!s.ok()) break;
        const size_t size = attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? 8 : 4;
        s = LtStatus(cublasLtMatmulPreferenceSetAttribute(pref, attr, value, size), "preference");
      }
    }
    int found = 0;
    if (s.ok()) {
      s = LtStatus(cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan.op,
                                                  plan.a, r.b, r.c, r.c, pref, 1, &check, &found),
                   "heuristic");
    }
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (s.ok() && found == 0) {
      s = absl::NotFoundError(absl::StrCat("Gemm: cuBLASLt has no algorithm for rows ", rows,
                                           ", in ", in, ", out ", out));
    }
    if (s.ok()) r.algo = check.algo;
  }
  (void)has_bias;
  (void)align_bias;
  if (!s.ok()) {
    if (r.c != nullptr) cublasLtMatrixLayoutDestroy(r.c);
    if (r.b != nullptr) cublasLtMatrixLayoutDestroy(r.b);
    return s;
  }
  return &plan.rows.emplace(rows, r).first->second;
}

absl::Status Gemm::Linear(const GemmParams& params, cudaStream_t stream) {
  GemmParams p = params;
  if (p.ldx == 0) p.ldx = p.in;
  if (p.ldy == 0) p.ldy = p.out;
  if (p.rows < 0 || p.rows > (int64_t{1} << 31)) return Bad("rows", "in [0, 2^31]", p.rows);
  if (p.in <= 0) return Bad("in", "> 0", p.in);
  if (p.out <= 0) return Bad("out", "> 0", p.out);
  if (p.ldx < p.in) return Bad("ldx", ">= in", p.ldx);
  if (p.ldy < p.out) return Bad("ldy", ">= out", p.ldy);
  if (p.y_dtype != dtype_ && p.y_dtype != ActDtype::kFp32) {
    return Bad("y_dtype", "the Gemm's dtype or fp32", static_cast<int64_t>(p.y_dtype));
  }
  const bool fp8 = p.w_scale != nullptr;
  if (fp8) {
    if (dtype_ == ActDtype::kFp32) {
      return absl::InvalidArgumentError(
          "Gemm: fp8 weights need a bf16 or fp16 Gemm (cuBLASLt's fp8 GEMMs take no fp32 "
          "activations)");
    }
    if (p.in % 16 != 0) return Bad("in (fp8)", "a multiple of 16", p.in);
    if (p.ldx % 16 != 0) return Bad("ldx (fp8)", "a multiple of 16", p.ldx);
    if (p.rows > 0 && p.x_scale == nullptr) {
      return absl::InvalidArgumentError("Gemm: x_scale is null (fp8 weights)");
    }
  } else if (p.x_scale != nullptr) {
    return absl::InvalidArgumentError("Gemm: x_scale without w_scale");
  }
  if (p.rows == 0) return absl::OkStatus();
  if (p.x == nullptr) return absl::InvalidArgumentError("Gemm: x is null");
  if (p.w == nullptr) return absl::InvalidArgumentError("Gemm: w is null");
  if (p.y == nullptr) return absl::InvalidArgumentError("Gemm: y is null");
  const Key key{p.in,
                p.out,
                p.ldx,
                p.ldy,
                static_cast<int>(p.y_dtype),
                p.bias != nullptr,
                AlignmentOf(p.x),
                AlignmentOf(p.w),
                AlignmentOf(p.y),
                p.bias != nullptr ? AlignmentOf(p.bias) : 0,
                fp8};
  KV_ASSIGN_OR_RETURN(Plan * plan, PlanFor(key, p, stream));
  KV_ASSIGN_OR_RETURN(const PlanRows* r, RowsFor(*plan, key, p.rows));
  if (p.bias != nullptr) {
    // The pointer is an attribute of the (cached) descriptor; set per call.
    KV_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
  // Every call sets its scales (tuning pointed them at scratch ones).
  if (fp8) KV_RETURN_IF_ERROR(SetScales(plan->op, p.w_scale, p.x_scale));
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  return LtStatus(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->op, &alpha, p.w,
                                 plan->a, p.x, r->b, &beta, p.y, r->c, p.y, r->c, &r->algo,
                                 workspace_, static_cast<size_t>(workspace_bytes_), stream),
                  "matmul");
}

}  // namespace kvserve::cuda
