#include "cuda/linear/moe_grouped_linear.h"

#include <algorithm>
#include <climits>

#include "cuda/linear/gemv_fp8_b128.h"
#include "cuda/linear/gemv_grouped_launch.h"

namespace mxq::cuda {

Result<MoeGroupedWeights> MoeGroupedWeights::create(std::string what, std::span<const LinearWeights> w,
                                                    int64_t parts) {
  if (parts < 1 || w.empty() || static_cast<int64_t>(w.size()) % parts != 0)
    return fail("{}: {} expert matrices for {} parts per expert", what, w.size(), parts);
  MoeGroupedWeights g;
  g.what_ = std::move(what);
  g.format_ = w[0].format;
  g.experts_ = static_cast<int64_t>(w.size()) / parts;
  g.parts_ = parts;
  g.n_ = w[0].n;
  g.k_ = w[0].k;
  g.act_ = w[0].act;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i].format != g.format_ || w[i].n != g.n_ || w[i].k != g.k_)
      return fail("{}: expert matrix {} is {} [{}, {}], expected {} [{}, {}] like matrix 0", g.what_, i,
                  traits(w[i].format).name, w[i].n, w[i].k, traits(g.format_).name, g.n_, g.k_);
    if (w[i].act != g.act_)
      return fail("{}: expert matrix {} takes {} activations, matrix 0 {}", g.what_, i, traits(w[i].act).name,
                  traits(g.act_).name);
    if (!w[i].values || (g.format_ != Format::kBF16 && !w[i].scales))
      return fail("{}: expert matrix {} has a null plane", g.what_, i);
  }
  // note: the grouped kernels' shape rules: the MX GEMV's K % 32, FP8-B128's K % 16, bf16's 16-byte rows
  // (K % 8); int indexing as the dense GEMVs
  int64_t k_mult = 0;
  switch (g.format_) {
    case Format::kMXFP8:
    case Format::kMXFP4:
      k_mult = 32;
      break;
    case Format::kFP8_B128:
      k_mult = 16;
      break;
    case Format::kBF16:
      k_mult = 8;
      break;
    default:
      return fail("{}: {} experts have no grouped linear kernel (bf16, mxfp8, mxfp4, fp8-b128)", g.what_,
                  traits(g.format_).name);
  }
  if (g.n_ < 1 || g.k_ < k_mult || g.k_ % k_mult != 0 || g.n_ > INT_MAX / 2 || g.k_ > INT_MAX / 2)
    return fail(
        "{}: expert shape [{}, {}] for the grouped {} kernel (expected N >= 1, K a positive multiple of {})",
        g.what_, g.n_, g.k_, traits(g.format_).name, k_mult);
  std::vector<const uint8_t*> table(w.size() * 2, nullptr);
  for (size_t i = 0; i < w.size(); ++i) table[i] = w[i].values, table[w.size() + i] = w[i].scales;
  auto d = DeviceBuffer::alloc(table.size() * sizeof(const uint8_t*));
  if (!d) return fail_in(g.what_, d.error());
  g.table_ = std::move(*d);
  MXQ_CUDA_CHECK(
      cudaMemcpy(g.table_.as(), table.data(), table.size() * sizeof(const uint8_t*), cudaMemcpyHostToDevice));
  return g;
}

Status moe_grouped_linear(const MoeGroupedWeights& w, const MoeGroups& g, bool gather, const uint16_t* x,
                          uint16_t* y, cudaStream_t stream) {
  if (!x || !y || !g.offsets || !g.active || (gather && !g.sorted_rows))
    return fail("{}: grouped linear: null device pointer", w.name());
  if (g.top_k < 1 || g.max_entries < 0 || g.max_entries > INT_MAX)
    return fail("{}: grouped linear: top_k {}, {} entries", w.name(), g.top_k, g.max_entries);
  GroupedGemvArgs a{};
  a.x = x;
  a.x_rows = gather ? g.sorted_rows : nullptr;
  a.x_div = static_cast<int>(g.top_k);
  a.offsets = g.offsets;
  a.active = g.active;
  a.values = w.values();
  a.scales = w.scales();
  a.y = y;
  a.part_stride = g.max_entries * w.n();
  a.n = static_cast<int>(w.n());
  a.k = static_cast<int>(w.k());
  a.parts = static_cast<int>(w.parts());
  a.slots = static_cast<int>(std::min(w.experts(), g.max_entries));
  a.max_ntiles = gemv_grouped_max_ntiles(g.max_entries / g.top_k);
  cudaError_t rc = cudaSuccess;
  switch (w.format()) {
    case Format::kMXFP8:
      rc = launch_gemv_grouped_mxfp8(a, stream);
      break;
    case Format::kMXFP4:
      rc = launch_gemv_grouped_mxfp4(a, stream);
      break;
    case Format::kFP8_B128: {
      const ScaleStrides s = fp8_b128_scale_strides(w.n(), w.k());
      a.s_row = s.row, a.s_col = s.col;
      rc = launch_gemv_grouped_fp8_b128(a, stream);
      break;
    }
    case Format::kBF16:
      rc = launch_gemv_grouped_bf16(a, stream);
      break;
    default:
      return fail("{}: {} experts have no grouped linear kernel", w.name(), traits(w.format()).name);
  }
  if (rc != cudaSuccess)
    return fail("{}: grouped {} linear [{}, {}] x {} parts: {}", w.name(), traits(w.format()).name, w.n(),
                w.k(), w.parts(), cudaGetErrorName(rc));
  return {};
}

}  // namespace mxq::cuda
