// vLLM Marlin weight-only layout for MX weights (reference_notes.md §5.3), per expert:
// - values: q = W^T [K, N]; 16x16 tiles laid out as rows of 16·N (tile (k/16, n/16) at column (n/16)·256,
//   element (k%16, n%16) at +(k%16)·16 + n%16); every 1024-element chunk gathered through
//   get_weight_perm(bits) (its interleave folded in); then packed little-endian into int32, so element q of
//   the stream is byte q (8-bit) or nibble q%2 of byte q/2 (4-bit).
// - scales: s = scales^T [K/32, N]; marlin_permute_scales gathers 64-wide chunks (32-wide "single" chunks
//   when K == 32, i.e. group size == K); then *_marlin_process_scales swaps positions 1 and 2 of every 4.
#include <array>

#include "layout/prepare.h"
#include "layout/prepare_checks.h"

namespace mxq {
namespace {

constexpr std::string_view kName = "marlin";
constexpr int64_t kChunk = 1024;  // elements per get_weight_perm block: four 16x16 tiles

// Position in the chunk that element `in` of the tiled stream moves to (the inverse of the gather perm).
std::array<int16_t, kChunk> weight_scatter(int bits) {
  std::array<int, kChunk> perm{};
  int n = 0;
  for (int i = 0; i < 32; ++i) {
    std::array<int, 8> perm1{};
    int m = 0;
    for (int block = 0; block < 2; ++block)
      for (int row : {2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1})
        perm1[m++] = 16 * row + i / 4 + 8 * block;
    for (int j = 0; j < 4; ++j)
      for (int p : perm1) perm[n++] = p + 256 * j;
  }
  // note: the interleave orders each int32's elements for the dequantizer: 8 nibbles or 4 bytes.
  constexpr std::array<int, 8> kInterleave4 = {0, 2, 4, 6, 1, 3, 5, 7};
  constexpr std::array<int, 4> kInterleave8 = {0, 2, 1, 3};
  const int group = bits == 4 ? 8 : 4;
  std::array<int16_t, kChunk> scatter{};
  for (int q = 0; q < kChunk; ++q) {
    const int t = q % group, base = q - t;
    const int src = perm[base + (bits == 4 ? kInterleave4[t] : kInterleave8[t])];
    scatter[src] = static_cast<int16_t>(q);
  }
  return scatter;
}

// marlin_permute_scales: out[c] = in[perm[c]] per chunk; returned inverted (in -> out).
std::vector<int> scale_scatter(bool single) {
  std::vector<int> perm;
  if (!single) {
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) perm.push_back(i + 8 * j);
  } else {
    for (int i = 0; i < 4; ++i)
      for (int j : {0, 1, 8, 9, 16, 17, 24, 25}) perm.push_back(2 * i + j);
  }
  std::vector<int> scatter(perm.size());
  for (size_t c = 0; c < perm.size(); ++c) scatter[perm[c]] = static_cast<int>(c);
  return scatter;
}

}  // namespace

Result<HostPlanes> prepare_marlin(const TensorGeometry& g, const HostPlanes& canonical) {
  if (auto s = check_mx(kName, g); !s) return tl::unexpected(s.error());
  if (auto s = check_planes(kName, g, canonical); !s) return tl::unexpected(s.error());
  // note: N % 64 keeps each 1024-element chunk (16 rows of K x 64 of N) and each 64-wide scale chunk
  // inside one tile row; K % 32 (MX) already gives K % 16.
  if (g.rows % 64 != 0) return fail("{}: N = {} (expected a multiple of 64)", kName, g.rows);
  const int bits = traits(g.format).element_bits;
  const int64_t n_size = g.rows, k_size = g.cols, row_elems = 16 * n_size;
  const auto wscatter = weight_scatter(bits);
  HostPlanes out;
  out.values.assign(canonical.values.size(), 0);
  const int64_t expert_bytes = g.values.bytes() / std::max<int64_t>(g.experts, 1);
  for (int64_t e = 0; e < g.experts; ++e) {
    const uint8_t* src = canonical.values.data() + e * expert_bytes;
    uint8_t* dst = out.values.data() + e * expert_bytes;
    for (int64_t n = 0; n < n_size; ++n)
      for (int64_t k = 0; k < k_size; ++k) {
        const int64_t tiled = k / 16 * row_elems + n / 16 * 256 + k % 16 * 16 + n % 16;
        const int64_t q = tiled / kChunk * kChunk + wscatter[tiled % kChunk];
        if (bits == 8) {
          dst[q] = src[n * k_size + k];
        } else {
          const uint8_t nibble = (src[(n * k_size + k) / 2] >> (4 * (k % 2))) & 0xF;
          dst[q / 2] |= static_cast<uint8_t>(nibble << (4 * (q % 2)));
        }
      }
  }
  const int64_t groups = g.scales.row_bytes;
  const std::vector<int> sscatter = scale_scatter(k_size == 32);
  const int64_t chunk = static_cast<int64_t>(sscatter.size());
  out.scales.assign(canonical.scales.size(), 0);
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t n = 0; n < n_size; ++n)
      for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t t = gi * n_size + n;
        int64_t p = t / chunk * chunk + sscatter[t % chunk];
        p = (p & ~int64_t{3}) | (p & 1) << 1 | (p & 2) >> 1;  // view(-1, 4)[:, [0, 2, 1, 3]]
        out.scales[e * groups * n_size + p] = canonical.scales[(e * n_size + n) * groups + gi];
      }
  return out;
}

}  // namespace mxq
