#include "cuda/linear/linear.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>

#include "cuda/common/check.h"
#include "cuda/linear/gemm_mx.h"
#include "cuda/linear/gemv_fp8_b128.h"
#include "cuda/linear/gemv_fp8_b128_launch.h"
#include "cuda/linear/gemv_layout.h"
#include "cuda/linear/gemv_mx.h"
#include "cuda/linear/gemv_mx_launch.h"
#include "cuda/quantize/quantize_act.h"

namespace mxq::cuda {
namespace {

enum class Kernel : uint8_t {
  kCublasBf16,
  kGemvMxfp8,
  kGemvMxfp4,
  kGemvFp8B128,
  kCublasLtFp8B128,
  kGemmMxfp8,
  kGemmMxfp4
};

struct Entry {
  Format format;
  Arch arch;
  int64_t m_lo, m_hi;
  Kernel kernel;
  std::string_view name;
};

constexpr int64_t kAnyM = std::numeric_limits<int>::max();
// note: the MX GEMVs serve M <= 32 on both arches: at M 24 and 32 they measured 1.5-2.3x faster in sum
// than gemm_mx on the Qwen3-8B shapes (gate_up alone: gemm_mx 7% faster at M = 32). cuBLASLt FP8-B128
// (M padded to 4) measured faster than the FP8-B128 GEMV in sum from M = 16 on (90.9 vs 120.7 µs at M = 16,
// a tie at M = 8 where the GEMV wins q/o and qkv), so sm_90a's GEMV stops at M = 8 (its 2-n-tile kernel
// serves M 9..16 at the M = 16 cost); sm_80, which has no cuBLASLt entry, takes the GEMV to M = 32
// (bench/history/RESULTS-log.md, "GEMV at M <= 32: read-only ceiling").
constexpr int64_t kFp8GemvMaxMSm90 = 8;
// note: with split-K and 32/64-row activation tiles, sm_90a's MX GEMM is flat at ~15-80 µs for M = 8..48 on
// the Qwen3-8B shapes (sum 158 µs MXFP8) while the GEMV grows with M (sum 126 µs at M = 16, 231 at 32); per
// shape the crossovers fall at M 19.5..22.6, so sm_90a's MX GEMV stops at 20 (bench/RESULTS.md, GEMV at
// M <= 32).
constexpr int64_t kMxGemvMaxMSm90 = 20;
// note: the closed table (see linear.h); a (format, arch, M) with no entry is refused as missing. gemm_mx
// picks its wgmma (sm_90a) or mma.sync (sm_80) kernel itself; both read the GEMV's native layout.
constexpr Entry kTable[] = {
    {Format::kBF16, Arch::kSm90a, 1, kAnyM, Kernel::kCublasBf16, "cublas_bf16"},
    {Format::kBF16, Arch::kSm80, 1, kAnyM, Kernel::kCublasBf16, "cublas_bf16"},
    {Format::kMXFP8, Arch::kSm90a, 1, kMxGemvMaxMSm90, Kernel::kGemvMxfp8, "gemv_mxfp8"},
    {Format::kMXFP8, Arch::kSm80, 1, kGemvMaxM, Kernel::kGemvMxfp8, "gemv_mxfp8"},
    {Format::kMXFP8, Arch::kSm90a, kMxGemvMaxMSm90 + 1, kAnyM, Kernel::kGemmMxfp8, "gemm_mxfp8"},
    {Format::kMXFP8, Arch::kSm80, kGemvMaxM + 1, kAnyM, Kernel::kGemmMxfp8, "gemm_mxfp8"},
    {Format::kMXFP4, Arch::kSm90a, 1, kMxGemvMaxMSm90, Kernel::kGemvMxfp4, "gemv_mxfp4"},
    {Format::kMXFP4, Arch::kSm80, 1, kGemvMaxM, Kernel::kGemvMxfp4, "gemv_mxfp4"},
    {Format::kMXFP4, Arch::kSm90a, kMxGemvMaxMSm90 + 1, kAnyM, Kernel::kGemmMxfp4, "gemm_mxfp4"},
    {Format::kMXFP4, Arch::kSm80, kGemvMaxM + 1, kAnyM, Kernel::kGemmMxfp4, "gemm_mxfp4"},
    {Format::kFP8_B128, Arch::kSm90a, 1, kFp8GemvMaxMSm90, Kernel::kGemvFp8B128, "gemv_fp8_b128"},
    {Format::kFP8_B128, Arch::kSm80, 1, kGemvFp8B128MaxM, Kernel::kGemvFp8B128, "gemv_fp8_b128"},
    {Format::kFP8_B128, Arch::kSm90a, kFp8GemvMaxMSm90 + 1, kAnyM, Kernel::kCublasLtFp8B128,
     "cublaslt_fp8_b128"},
};

Result<const Entry*> find_entry(Format f, Arch arch, int64_t m) {
  for (const Entry& e : kTable) {
    if (e.format != f || e.arch != arch || m < e.m_lo || m > e.m_hi) continue;
    return &e;
  }
  return fail("no {} linear kernel on {} for M = {} (the dispatch table has no entry)", traits(f).name,
              arch_name(arch), m);
}

// Shape rule of one kernel, as a refusal naming [n, k].
Status check_shape(Kernel kernel, int64_t n, int64_t k) {
  switch (kernel) {
    case Kernel::kCublasBf16:
      if (n < 1 || k < 1 || n > INT_MAX || k > INT_MAX)
        return fail("cublas_bf16: weight shape [{}, {}] (expected 1..{} each)", n, k, INT_MAX);
      return {};
    case Kernel::kGemvMxfp8:
    case Kernel::kGemvMxfp4:
    case Kernel::kGemmMxfp8:
    case Kernel::kGemmMxfp4:
      if (n < 1 || k < 32 || k % 32 != 0 || n > INT_MAX || k > INT_MAX / 2)
        return fail("gemv_mx: weight shape [{}, {}] (expected N >= 1, K a positive multiple of 32)", n, k);
      return {};
    case Kernel::kGemvFp8B128:
      if (n < 1 || k < 16 || k % 16 != 0 || n > INT_MAX || k > INT_MAX / 2)
        return fail("gemv_fp8_b128: weight shape [{}, {}] (expected N >= 1, K a positive multiple of 16)", n,
                    k);
      return {};
    case Kernel::kCublasLtFp8B128:
      return check_fp8_b128_gemm_shape(n, k);
  }
  return fail("linear: kernel without a shape rule");  // not reached: every kind has one
}

}  // namespace

std::string_view arch_name(Arch a) { return a == Arch::kSm90a ? "sm_90a" : "sm_80"; }

Result<Arch> device_arch(int device) {
  int major = 0, minor = 0;
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major == 9 && minor == 0) return Arch::kSm90a;
  if (major == 8) return Arch::kSm80;
  return fail("device {}: compute capability {}.{} (expected 9.0 or 8.x: mxq builds sm_90a and sm_80)",
              device, major, minor);
}

Result<std::string_view> linear_kernel_name(Format f, Arch arch, int64_t m) {
  auto e = find_entry(f, arch, m);
  if (!e) return tl::unexpected(e.error());
  return (*e)->name;
}

Status check_linear_supported(Format f, Arch arch, std::string_view tensor, int64_t n, int64_t k,
                              int64_t max_m) {
  if (max_m < 1) return fail("{}: max M = {} (expected >= 1)", tensor, max_m);
  // Walk the M axis range by range: every M in 1..max_m must land on an entry whose shape rule holds.
  for (int64_t m = 1; m <= max_m;) {
    auto e = find_entry(f, arch, m);
    if (!e) return fail_in(tensor, e.error());
    if (Status st = check_shape((*e)->kernel, n, k); !st)
      return fail("{}: {} on {} for M {}..{}: {}", tensor, traits(f).name, arch_name(arch), m,
                  std::min((*e)->m_hi, max_m), st.error().message);
    m = (*e)->m_hi + 1;
  }
  return {};
}

std::string_view linear_layout_name(Format f) {
  switch (f) {
    case Format::kMXFP8:
    case Format::kMXFP4:
      return "cuda_gemv_mx";
    case Format::kFP8_B128:
      return "cuda_fp8_b128";
    default:
      return "row_major";
  }
}

Result<HostPlanes> linear_prepare(Format f, Arch arch, const TensorGeometry& g, const HostPlanes& canonical) {
  if (canonical.values.size() != static_cast<size_t>(g.values.bytes()) ||
      canonical.scales.size() != static_cast<size_t>(g.scales.bytes()))
    return fail("linear_prepare: planes of {} and {} bytes (expected {} and {})", canonical.values.size(),
                canonical.scales.size(), g.values.bytes(), g.scales.bytes());
  // note: every kernel of the table reads the same layout for a format on either arch; `arch` keys the
  // refusal of formats with no entry.
  if (auto e = find_entry(f, arch, 1); !e) return fail_in("linear_prepare", e.error());
  const int64_t rows = g.experts * g.rows;
  switch (f) {
    case Format::kBF16:
      return canonical;
    case Format::kMXFP8:
    case Format::kMXFP4: {
      HostPlanes out{std::vector<uint8_t>(canonical.values.size()), canonical.scales};
      if (Status st = prepare_gemv_values(f, canonical.values.data(), out.values.data(), rows, g.cols); !st)
        return tl::unexpected(st.error());
      return out;
    }
    case Format::kFP8_B128: {
      const int64_t sr = cdiv(g.rows, 128), sc = cdiv(g.cols, 128),
                    per_expert = fp8_b128_scale_floats(g.rows, g.cols);
      HostPlanes out{canonical.values,
                     std::vector<uint8_t>(static_cast<size_t>(g.experts * per_expert * 4), 0)};
      for (int64_t e = 0; e < g.experts; ++e)
        for (int64_t nb = 0; nb < sr; ++nb)
          for (int64_t kb = 0; kb < sc; ++kb)
            std::memcpy(
                out.scales.data() + (e * per_expert + fp8_b128_scale_offset(nb, kb, g.rows, g.cols)) * 4,
                canonical.scales.data() + ((e * sr + nb) * sc + kb) * 4, 4);
      return out;
    }
    default:
      return fail("linear_prepare: format {} has no linear kernel", traits(f).name);
  }
}

Result<LinearWeights> linear_weights(std::string_view tensor, Format f, std::span<const int64_t> shape,
                                     std::span<const uint8_t> values, std::span<const uint8_t> scales,
                                     int64_t expert) {
  auto g = tensor_geometry(tensor, f, shape);
  if (!g) return tl::unexpected(g.error());
  if (expert >= 0 ? (shape.size() != 3 || expert >= g->experts) : shape.size() != 2)
    return fail("{}: shape of rank {} with {} experts used as {}", tensor, shape.size(), g->experts,
                expert >= 0 ? fmt::format("expert {}", expert) : std::string("one matrix"));
  const int64_t n = g->rows, k = g->cols, e = std::max<int64_t>(expert, 0);
  // Native plane sizes and the byte offset of expert e in each (see linear_prepare).
  int64_t values_bytes = 0, scales_bytes = 0, values_at = 0, scales_at = 0;
  switch (f) {
    case Format::kBF16:
      values_bytes = g->experts * n * k * 2, values_at = e * n * k * 2;
      break;
    case Format::kMXFP8:
    case Format::kMXFP4: {
      // note: the GEMV layout permutes bytes inside a row only, so expert e's rows start at e·n·row_bytes
      const int64_t row_bytes = f == Format::kMXFP8 ? k : k / 2;
      values_bytes = g->experts * n * row_bytes, values_at = e * n * row_bytes;
      scales_bytes = g->experts * n * (k / 32), scales_at = e * n * (k / 32);
      break;
    }
    case Format::kFP8_B128: {
      const int64_t per_expert = fp8_b128_scale_floats(n, k) * 4;
      values_bytes = g->experts * n * k, values_at = e * n * k;
      scales_bytes = g->experts * per_expert, scales_at = e * per_expert;
      break;
    }
    default:
      return fail("{}: format {} has no linear kernel", tensor, traits(f).name);
  }
  if (static_cast<int64_t>(values.size()) != values_bytes ||
      static_cast<int64_t>(scales.size()) != scales_bytes)
    return fail("{}: native planes of {} and {} bytes, expected {} and {} ({} layout)", tensor, values.size(),
                scales.size(), values_bytes, scales_bytes, linear_layout_name(f));
  return LinearWeights{f, values.data() + values_at, f == Format::kBF16 ? nullptr : scales.data() + scales_at,
                       n, k};
}

Result<std::unique_ptr<LinearContext>> LinearContext::create(Arch arch) {
  std::unique_ptr<LinearContext> c(new LinearContext());
  c->arch_ = arch;
  MXQ_CUDA_CHECK(cublasCreate(&c->blas_));
  // note: a fixed workspace keeps cuBLAS graph-capturable
  auto ws = DeviceBuffer::alloc(32u << 20);
  if (!ws) return tl::unexpected(ws.error());
  c->blas_workspace_ = std::move(*ws);
  MXQ_CUDA_CHECK(cublasSetWorkspace(c->blas_, c->blas_workspace_.as(), c->blas_workspace_.bytes()));
  auto splitk = DeviceBuffer::alloc(static_cast<size_t>(kGemmSplitKFloats) * sizeof(float));
  if (!splitk) return tl::unexpected(splitk.error());
  c->splitk_ = std::move(*splitk);
  auto fp8 = Fp8B128Gemm::create();
  if (!fp8) return tl::unexpected(fp8.error());
  c->fp8_ = std::move(*fp8);
  return c;
}

LinearContext::~LinearContext() {
  if (blas_) cublasDestroy(blas_);
}

Status LinearContext::reserve(int64_t max_m, int64_t max_n, int64_t max_k, bool act_quant) {
  if (act_quant && act_.bytes() < static_cast<size_t>(max_m * max_k) * 2) {
    auto b = DeviceBuffer::alloc(static_cast<size_t>(max_m * max_k) * 2);
    if (!b) return tl::unexpected(b.error());
    act_ = std::move(*b);
  }
  return fp8_->reserve(max_m, max_n, max_k);
}

Result<uint16_t*> LinearContext::act_scratch(int64_t m, int64_t k, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(m * k) * 2;
  if (act_.bytes() < bytes) {
    auto capturing = stream_capturing(stream);
    if (!capturing) return tl::unexpected(capturing.error());
    if (*capturing)
      return fail(
          "linear (W8A8): activation scratch too small for m = {}, k = {} while capturing a CUDA graph (call "
          "reserve() with act_quant first)",
          m, k);
    auto b = DeviceBuffer::alloc(bytes);
    if (!b) return tl::unexpected(b.error());
    act_ = std::move(*b);
  }
  return act_.as<uint16_t>();
}

// The W8A8 mode (linear.h): x quantize-dequantized into the context's scratch; x itself otherwise.
static Result<const uint16_t*> linear_input(LinearContext& ctx, Format wf, Format act, const uint16_t* x,
                                            int64_t m, int64_t k, cudaStream_t stream) {
  if (act == Format::kBF16) return x;
  if (act != Format::kMXFP8 || !is_mx(wf))
    return fail(
        "linear: {} activations with {} weights (expected mxfp8 activations with mxfp8 or mxfp4 weights)",
        traits(act).name, traits(wf).name);
  auto xq = ctx.act_scratch(m, k, stream);
  if (!xq) return tl::unexpected(xq.error());
  if (Status st = fake_quant_mxfp8(x, m, k, *xq, stream); !st) return tl::unexpected(st.error());
  return *xq;
}

Result<cublasHandle_t> LinearContext::blas(cudaStream_t stream) {
  if (!blas_bound_ || stream != blas_stream_) {
    MXQ_CUDA_CHECK(cublasSetStream(blas_, stream));
    MXQ_CUDA_CHECK(cublasSetWorkspace(blas_, blas_workspace_.as(), blas_workspace_.bytes()));
    blas_stream_ = stream;
    blas_bound_ = true;
  }
  return blas_;
}

Status linear_f32(LinearContext& ctx, const LinearWeights& w, const uint16_t* x, int64_t m, float* y,
                  cudaStream_t stream) {
  if (w.format != Format::kBF16)
    return fail("linear with f32 output: {} weights (expected bf16: cuBLAS writes f32 from bf16 only)",
                traits(w.format).name);
  if (Status st = check_shape(Kernel::kCublasBf16, w.n, w.k); !st) return st;
  if (m < 1 || m > INT_MAX) return fail("linear with f32 output: M = {} (expected 1..{})", m, INT_MAX);
  if (!x || !y || !w.values) return fail("linear with f32 output: null device pointer");
  auto blas = ctx.blas(stream);
  if (!blas) return tl::unexpected(blas.error());
  const float alpha = 1.0f, beta = 0.0f;
  MXQ_CUDA_CHECK(cublasGemmEx(*blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n), static_cast<int>(m),
                              static_cast<int>(w.k), &alpha, w.values, CUDA_R_16BF, static_cast<int>(w.k), x,
                              CUDA_R_16BF, static_cast<int>(w.k), &beta, y, CUDA_R_32F, static_cast<int>(w.n),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return {};
}

Status linear(LinearContext& ctx, const LinearWeights& w, const uint16_t* x_in, int64_t m, uint16_t* y,
              cudaStream_t stream) {
  auto entry = find_entry(w.format, ctx.arch(), m);
  if (!entry) return tl::unexpected(entry.error());
  const Kernel kernel = (*entry)->kernel;
  if (Status st = check_shape(kernel, w.n, w.k); !st) return st;
  if (!x_in || !y || !w.values || (w.format != Format::kBF16 && !w.scales))
    return fail("linear {}: null device pointer", (*entry)->name);
  auto xa = linear_input(ctx, w.format, w.act, x_in, m, w.k, stream);
  if (!xa) return tl::unexpected(xa.error());
  const uint16_t* const x = *xa;
  switch (kernel) {
    case Kernel::kCublasBf16: {
      auto blas = ctx.blas(stream);
      if (!blas) return tl::unexpected(blas.error());
      const float alpha = 1.0f, beta = 0.0f;
      MXQ_CUDA_CHECK(cublasGemmEx(*blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n), static_cast<int>(m),
                                  static_cast<int>(w.k), &alpha, w.values, CUDA_R_16BF, static_cast<int>(w.k),
                                  x, CUDA_R_16BF, static_cast<int>(w.k), &beta, y, CUDA_R_16BF,
                                  static_cast<int>(w.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return {};
    }
    case Kernel::kGemvMxfp8:
      return gemv_mxfp8(x, m, MxGemvWeights{w.format, w.values, w.scales, w.n, w.k}, y, stream);
    case Kernel::kGemvMxfp4:
      return gemv_mxfp4(x, m, MxGemvWeights{w.format, w.values, w.scales, w.n, w.k}, y, stream);
    case Kernel::kGemvFp8B128:
      return gemv_fp8_b128(x, m, Fp8B128Weights{w.values, reinterpret_cast<const float*>(w.scales), w.n, w.k},
                           y, stream);
    case Kernel::kCublasLtFp8B128:
      return ctx.fp8().run(x, m, Fp8B128Weights{w.values, reinterpret_cast<const float*>(w.scales), w.n, w.k},
                           y, stream);
    case Kernel::kGemmMxfp8:
      return gemm_mxfp8(x, m, MxGemvWeights{w.format, w.values, w.scales, w.n, w.k}, y, stream, ctx.splitk());
    case Kernel::kGemmMxfp4:
      return gemm_mxfp4(x, m, MxGemvWeights{w.format, w.values, w.scales, w.n, w.k}, y, stream, ctx.splitk());
  }
  return fail("linear: unreachable kernel kind");  // not reached: the switch covers every kind
}

static_assert(kLinearMaxParts == kMaxGemvParts);

Status linear_parts(LinearContext& ctx, std::span<const LinearWeights> w, const uint16_t* x, int64_t m,
                    std::span<uint16_t* const> y, cudaStream_t stream) {
  if (w.empty() || w.size() != y.size())
    return fail("linear_parts: {} weights for {} outputs (expected as many, at least one)", w.size(),
                y.size());
  auto entry = find_entry(w[0].format, ctx.arch(), m);
  const Kernel kernel = entry ? (*entry)->kernel : Kernel::kCublasBf16;
  const bool gemv = entry && (kernel == Kernel::kGemvMxfp8 || kernel == Kernel::kGemvMxfp4 ||
                              kernel == Kernel::kGemvFp8B128);
  bool fused = gemv && w.size() > 1 && w.size() <= static_cast<size_t>(kMaxGemvParts) && x != nullptr;
  for (size_t i = 0; fused && i < w.size(); ++i)
    fused = w[i].format == w[0].format && w[i].k == w[0].k && w[i].values && w[i].scales && y[i] &&
            check_shape(kernel, w[i].n, w[i].k).has_value();
  for (size_t i = 1; i < w.size(); ++i)
    if (w[i].act != w[0].act)
      return fail("part {}: {} activations, part 0 {} (expected one act mode for the parts of one x)", i,
                  traits(w[i].act).name, traits(w[0].act).name);
  if (!fused) {
    for (size_t i = 0; i < w.size(); ++i)
      if (Status st = linear(ctx, w[i], x, m, y[i], stream); !st)
        return fail("part {}: {}", i, st.error().message);
    return {};
  }
  // note: the fused launch quantize-dequantizes x once for all parts (fused implies w[0].format is MX or
  // FP8-B128 and every part shares it; linear_input refuses act with FP8-B128 weights by name).
  auto xa = linear_input(ctx, w[0].format, w[0].act, x, m, w[0].k, stream);
  if (!xa) return fail("part 0: {}", xa.error().message);
  x = *xa;
  GemvParts p;
  p.count = static_cast<int>(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    p.values[i] = w[i].values, p.scales[i] = w[i].scales, p.y[i] = y[i], p.n[i] = static_cast<int>(w[i].n);
    if (kernel == Kernel::kGemvFp8B128) {
      const ScaleStrides s = fp8_b128_scale_strides(w[i].n, w[i].k);
      p.s_row[i] = s.row, p.s_col[i] = s.col;
    }
  }
  const int mi = static_cast<int>(m), k = static_cast<int>(w[0].k);
  switch (kernel) {
    case Kernel::kGemvMxfp8:
      MXQ_CUDA_CHECK(launch_gemv_parts_mxfp8(x, mi, p, k, stream));
      break;
    case Kernel::kGemvMxfp4:
      MXQ_CUDA_CHECK(launch_gemv_parts_mxfp4(x, mi, p, k, stream));
      break;
    default:
      MXQ_CUDA_CHECK(launch_gemv_parts_fp8_b128(x, mi, p, k, stream));
      break;
  }
  return {};
}

}  // namespace mxq::cuda
