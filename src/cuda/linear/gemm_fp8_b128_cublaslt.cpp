#include "cuda/linear/gemm_fp8_b128_cublaslt.h"

#include <algorithm>
#include <climits>

#include "cuda/quantize/quantize_act.h"
#include "format/formats.h"

namespace mxq::cuda {

namespace {
int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }
}  // namespace

int64_t fp8_b128_scale_offset(int64_t nb, int64_t kb, int64_t /*n*/, int64_t k) {
  return nb * round4(cdiv(k, 128)) + kb;
}
int64_t fp8_b128_scale_floats(int64_t n, int64_t k) { return cdiv(n, 128) * round4(cdiv(k, 128)); }
ScaleStrides fp8_b128_scale_strides(int64_t /*n*/, int64_t k) { return {round4(cdiv(k, 128)), 1}; }
int64_t fp8_b128_padded_m(int64_t m) { return round4(m); }

Status check_fp8_b128_gemm_shape(int64_t n, int64_t k) {
  if (n < 8 || k < 16 || n % 8 != 0 || k % 16 != 0)
    return fail(
        "fp8-b128 cuBLASLt GEMM: weight shape [{}, {}] (expected N a positive multiple of 8 and K of 16: "
        "cuBLASLt FP8 needs 16-byte leading dimensions)",
        n, k);
  if (n > INT_MAX || k > INT_MAX)
    return fail("fp8-b128 cuBLASLt GEMM: weight shape [{}, {}] too large", n, k);
  return {};
}

struct Fp8B128Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  detail::LtRoles roles = detail::kRoles;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // note: teardown has no caller left to tell about a failing destroy
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// Points the plan's descriptor at this call's scale tensors (A's and B's, by role).
Status set_scales(Fp8B128Gemm::Plan& p, const float* w_scales, const float* x_scales) {
  const bool weight_a = p.roles == detail::LtRoles::kWeightA;
  const void* a_scale = weight_a ? static_cast<const void*>(w_scales) : x_scales;
  const void* b_scale = weight_a ? static_cast<const void*>(x_scales) : w_scales;
  MXQ_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                sizeof(a_scale)));
  MXQ_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                sizeof(b_scale)));
  return {};
}

// Descriptors and the heuristic's algorithm number `index` (0: its first) for (roles, m, n, k).
// note: the scale pointers are set before the heuristic: it refuses block scale modes without them.
Status build_plan(cublasLtHandle_t handle, Fp8B128Gemm::Plan& p, int64_t m, const Fp8B128Weights& w,
                  const float* xs, size_t workspace_bytes, int index = 0) {
  const int64_t n = w.n, k = w.k;
  const bool weight_a = p.roles == detail::LtRoles::kWeightA;
  MXQ_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                    vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const cublasLtMatmulMatrixScale_t a_mode = weight_a ? blk : vec, b_mode = weight_a ? vec : blk;
  MXQ_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MXQ_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MXQ_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
  MXQ_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  if (Status st = set_scales(p, w.scales, xs); !st) return st;
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const int64_t a_cols = weight_a ? n : m, b_cols = weight_a ? m : n;
  MXQ_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, u(k), u(a_cols), k));
  MXQ_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, u(k), u(b_cols), k));
  if (weight_a) {
    MXQ_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, u(n), u(m), n));
  } else if (p.roles == detail::LtRoles::kActARowD) {
    MXQ_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, u(m), u(n), n));
    const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
    MXQ_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(p.d, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof(row)));
  } else {
    MXQ_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, u(m), u(n), m));
  }
  cublasLtMatmulPreference_t pref = nullptr;
  MXQ_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t results[Fp8B128Gemm::kMaxHeuristics] = {};
  const int want = std::clamp(index + 1, 1, Fp8B128Gemm::kMaxHeuristics);
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes, sizeof(workspace_bytes));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, want, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS)
    return fail("fp8-b128 cuBLASLt GEMM ({}): heuristic for m = {}, n = {}, k = {}: {}",
                detail::lt_roles_name(p.roles), m, n, k, cublasGetStatusName(st));
  if (found == 0)
    return fail(
        "fp8-b128 cuBLASLt GEMM ({}): no algorithm for m = {}, n = {}, k = {} (block-scaled FP8 needs "
        "sm_90)",
        detail::lt_roles_name(p.roles), m, n, k);
  if (index < 0 || index >= found)
    return fail(
        "fp8-b128 cuBLASLt GEMM ({}): algorithm {} asked for m = {}, n = {}, k = {}; the heuristic gave {}",
        detail::lt_roles_name(p.roles), index, m, n, k, found);
  p.algo = results[index].algo;
  return {};
}

Status run_plan(cublasLtHandle_t handle, Fp8B128Gemm::Plan& p, const uint8_t* xq, const Fp8B128Weights& w,
                uint16_t* y, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const bool weight_a = p.roles == detail::LtRoles::kWeightA;
  const void* a = weight_a ? static_cast<const void*>(w.values) : xq;
  const void* b = weight_a ? static_cast<const void*>(xq) : w.values;
  const float alpha = 1.0f, beta = 0.0f;
  MXQ_CUDA_CHECK(cublasLtMatmul(handle, p.desc, &alpha, a, p.a, b, p.b, &beta, y, p.d, y, p.d, &p.algo,
                                workspace, workspace_bytes, stream));
  return {};
}

}  // namespace

std::string_view detail::lt_roles_name(LtRoles r) {
  switch (r) {
    case LtRoles::kWeightA:
      return "A = W blk128x128, B = x vec128, D = y col N x M";
    case LtRoles::kActARowD:
      return "A = x vec128, B = W blk128x128, D = y row-order M x N";
    case LtRoles::kActAColD:
      return "A = x vec128, B = W blk128x128, D = y^T col M x N";
  }
  return "?";
}

Status detail::probe_matmul(LtRoles roles, const uint8_t* xq, const float* xs, int64_t m,
                            const Fp8B128Weights& w, uint16_t* y, cudaStream_t stream) {
  if (Status st = check_fp8_b128_gemm_shape(w.n, w.k); !st) return st;
  cublasLtHandle_t handle = nullptr;
  MXQ_CUDA_CHECK(cublasLtCreate(&handle));
  auto ws = DeviceBuffer::alloc(32u << 20);
  Status st = ws ? Status{} : Status{tl::unexpected(ws.error())};
  {
    Fp8B128Gemm::Plan p;
    p.roles = roles;
    if (st) st = build_plan(handle, p, m, w, xs, ws->bytes());
    if (st) st = run_plan(handle, p, xq, w, y, ws->as(), ws->bytes(), stream);
    if (st && cudaStreamSynchronize(stream) != cudaSuccess) st = fail("probe_matmul: stream failed");
  }
  cublasLtDestroy(handle);
  return st;
}

Result<std::unique_ptr<Fp8B128Gemm>> Fp8B128Gemm::create(size_t workspace_bytes) {
  std::unique_ptr<Fp8B128Gemm> g(new Fp8B128Gemm());
  MXQ_CUDA_CHECK(cublasLtCreate(&g->handle_));
  auto ws = DeviceBuffer::alloc(workspace_bytes);
  if (!ws) return tl::unexpected(ws.error());
  g->workspace_ = std::move(*ws);
  return g;
}

Fp8B128Gemm::~Fp8B128Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

Status Fp8B128Gemm::reserve(int64_t max_m, int64_t max_n, int64_t max_k) {
  const int64_t mp = fp8_b128_padded_m(max_m);
  const size_t vbytes = static_cast<size_t>(mp * max_k);
  const size_t sbytes = static_cast<size_t>(cdiv(max_k, 128) * mp) * sizeof(float);
  const size_t obytes = static_cast<size_t>(mp * max_n) * 2;
  auto grow = [](DeviceBuffer& b, size_t bytes) -> Status {
    if (b.bytes() >= bytes) return {};
    auto nb = DeviceBuffer::alloc(bytes);
    if (!nb) return tl::unexpected(nb.error());
    b = std::move(*nb);
    return {};
  };
  if (Status st = grow(act_values_, vbytes); !st) return st;
  if (Status st = grow(act_scales_, sbytes); !st) return st;
  // note: the padded D is needed only when max_m % 4 != 0 for some call; sized for the worst case.
  return grow(out_pad_, obytes);
}

Result<Fp8B128Gemm::Plan*> Fp8B128Gemm::plan_for(int64_t m, const Fp8B128Weights& w, const float* xs) {
  const auto key = std::make_tuple(m, w.n, w.k);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  p->roles = choice_.roles;
  const Status st = build_plan(handle_, *p, m, w, xs, workspace_.bytes(), choice_.index);
  if (!st) return tl::unexpected(st.error());
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

void Fp8B128Gemm::set_choice(Choice c) {
  choice_ = c;
  plans_.clear();
}

Result<std::string> Fp8B128Gemm::plan_algo(int64_t m, int64_t n, int64_t k) const {
  const auto it = plans_.find(std::make_tuple(m, n, k));
  if (it == plans_.end()) return fail("fp8-b128 cuBLASLt GEMM: no plan for m = {}, n = {}, k = {}", m, n, k);
  const cublasLtMatmulAlgo_t& a = it->second->algo;
  int32_t id = 0, splitk = 1;
  uint32_t tile = 0, stages = 0, swizzle = 0;
  uint16_t cluster = 0;
  size_t written = 0;
  MXQ_CUDA_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written));
  MXQ_CUDA_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written));
  MXQ_CUDA_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                      sizeof(stages), &written));
  MXQ_CUDA_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                      sizeof(splitk), &written));
  MXQ_CUDA_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle,
                                                      sizeof(swizzle), &written));
  MXQ_CUDA_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                      sizeof(cluster), &written));
  return fmt::format("id {} tile {} stages {} splitk {} swz {} cluster {}", id, tile, stages, splitk, swizzle,
                     cluster);
}

Status Fp8B128Gemm::matmul(const uint8_t* xq, const float* xs, int64_t m, const Fp8B128Weights& w,
                           uint16_t* y, cudaStream_t stream) {
  if (Status st = check_fp8_b128_gemm_shape(w.n, w.k); !st) return st;
  if (m < 4 || m > INT_MAX || m % 4 != 0)
    return fail(
        "fp8-b128 cuBLASLt GEMM: m = {} (expected a positive multiple of 4: cuBLASLt block scaling; run() "
        "pads)",
        m);
  if (!xq || !xs || !w.values || !w.scales || !y) return fail("fp8-b128 cuBLASLt GEMM: null device pointer");
  auto plan = plan_for(m, w, xs);
  if (!plan) return tl::unexpected(plan.error());
  // note: the scale pointers change per call; setting them on the cached descriptor is a host-side write.
  if (Status st = set_scales(**plan, w.scales, xs); !st) return st;
  return run_plan(handle_, **plan, xq, w, y, workspace_.as(), workspace_.bytes(), stream);
}

Result<Fp8B128Gemm::QuantizedAct> Fp8B128Gemm::quantize(const uint16_t* x, int64_t m, int64_t n, int64_t k,
                                                        cudaStream_t stream) {
  const int64_t mp = fp8_b128_padded_m(m);
  if (act_values_.bytes() < static_cast<size_t>(mp * k) ||
      act_scales_.bytes() < static_cast<size_t>(cdiv(k, 128) * mp) * sizeof(float) ||
      (mp != m && out_pad_.bytes() < static_cast<size_t>(mp * n) * 2)) {
    auto capturing = stream_capturing(stream);
    if (!capturing) return tl::unexpected(capturing.error());
    if (*capturing)
      return fail(
          "fp8-b128 GEMM: scratch too small for m = {}, n = {}, k = {} while capturing a CUDA graph (call "
          "reserve() first)",
          m, n, k);
    if (Status st = reserve(m, n, k); !st) return tl::unexpected(st.error());
  }
  auto* xq = act_values_.as<uint8_t>();
  auto* xs = act_scales_.as<float>();
  // note: pad rows m..mp-1 of x_q and their scales are left as they are: each row of D depends on its own
  // row of x only, and the pad rows of D are never copied out.
  if (Status st = quantize_act_fp8_b128(x, m, k, xq, xs, mp, stream); !st) return tl::unexpected(st.error());
  return QuantizedAct{xq, xs, mp};
}

Status Fp8B128Gemm::run(const uint16_t* x, int64_t m, const Fp8B128Weights& w, uint16_t* y,
                        cudaStream_t stream) {
  if (Status st = check_fp8_b128_gemm_shape(w.n, w.k); !st) return st;
  if (m < 1) return fail("fp8-b128 cuBLASLt GEMM: m = {} (expected >= 1)", m);
  if (!x || !y) return fail("fp8-b128 cuBLASLt GEMM: null device pointer");
  auto q = quantize(x, m, w.n, w.k, stream);
  if (!q) return tl::unexpected(q.error());
  const int64_t mp = q->scale_ld;
  if (mp == m) return matmul(q->values, q->scales, m, w, y, stream);
  auto* ypad = out_pad_.as<uint16_t>();
  if (Status st = matmul(q->values, q->scales, mp, w, ypad, stream); !st) return st;
  // note: D is row-major [mp, n], so its first m rows are one contiguous run.
  MXQ_CUDA_CHECK(
      cudaMemcpyAsync(y, ypad, static_cast<size_t>(m * w.n) * 2, cudaMemcpyDeviceToDevice, stream));
  return {};
}

}  // namespace mxq::cuda
