// FlashInfer trtllm-gen fused-MoE weight layout (reference_notes.md §5.2). Row maps are gathers,
// out[j] = in[f(j)], composed in the order vLLM applies them: swap_w13_to_w31, then
// reorder_rows_for_gated_act_gemm, then shuffle_matrix_a(·, 128); scales take the same rows and then
// block_scale_interleave (the 128x4 swizzle).
#include <algorithm>

#include "layout/prepare.h"
#include "layout/prepare_checks.h"

namespace mxq {
namespace {

// note: shuffle_matrix_sf_a asserts M % 128 == 0; that also covers the 32-row shuffle and the even split.
constexpr int64_t kRowMultiple = 128;

std::vector<int64_t> shuffled_rows(int64_t m, bool gated) {
  std::vector<int64_t> src(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) src[j] = j;
  const auto gather = [&](auto f) {
    std::vector<int64_t> next(src.size());
    for (int64_t j = 0; j < m; ++j) next[j] = src[f(j)];
    src.swap(next);
  };
  if (gated) {
    const int64_t half = m / 2;
    gather([&](int64_t j) { return (j + half) % m; });                     // [gate; up] -> [up; gate]
    gather([&](int64_t j) { return j % 2 == 0 ? j / 2 : half + j / 2; });  // interleave the halves
  }
  // note: srcToDstBlk32RowMap[i] = (i%4)·8 + i/4 places old row i; as a gather f(j) = (j%8)·4 + j/8.
  gather([](int64_t j) { return j / 32 * 32 + j % 8 * 4 + j % 32 / 8; });
  return src;
}

Result<HostPlanes> prepare_trtllm_moe(std::string_view name, bool gated, const TensorGeometry& g,
                                      const HostPlanes& canonical) {
  if (auto s = check_mx(name, g); !s) return tl::unexpected(s.error());
  if (auto s = check_planes(name, g, canonical); !s) return tl::unexpected(s.error());
  if (g.rows % kRowMultiple != 0)
    return fail("{}: {} rows per expert (expected a multiple of {})", name, g.rows, kRowMultiple);
  // note: get_shuffle_matrix_sf_a_row_indices asserts scale columns % 4 == 0, i.e. K % 128 == 0.
  if (g.scales.row_bytes % 4 != 0)
    return fail("{}: K = {} (expected a multiple of 128: 4 scale columns per swizzle tile)", name, g.cols);
  const std::vector<int64_t> src = shuffled_rows(g.rows, gated);
  const int64_t w = g.values.row_bytes;
  HostPlanes out;
  out.values.resize(canonical.values.size());
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t j = 0; j < g.rows; ++j)
      std::copy_n(canonical.values.begin() + (e * g.rows + src[j]) * w, w,
                  out.values.begin() + (e * g.rows + j) * w);
  out.scales = swizzle_scales(g, canonical.scales, src);
  return out;
}

}  // namespace

Result<HostPlanes> prepare_trtllm_moe_w13(const TensorGeometry& g, const HostPlanes& canonical) {
  return prepare_trtllm_moe("trtllm_moe_w13", true, g, canonical);
}

Result<HostPlanes> prepare_trtllm_moe_w2(const TensorGeometry& g, const HostPlanes& canonical) {
  return prepare_trtllm_moe("trtllm_moe_w2", false, g, canonical);
}

}  // namespace mxq
