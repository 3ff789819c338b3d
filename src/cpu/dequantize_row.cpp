#include "cpu/dequantize_row.h"

#include <cassert>
#include <cstring>

#include "cpu/block_decode.h"
#include "format/codec.h"

namespace mxq {
namespace {

using cpu_detail::kBlock;

float element_to_f32(Format element, const uint8_t* row, int64_t k) {
  switch (element) {
    case Format::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return bf16_to_f32(h);
    }
    case Format::kF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return f16_to_f32(h);
    }
    case Format::kF32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case Format::kE4M3:
      return e4m3_to_f32(row[k]);
    case Format::kE5M2:
      return e5m2_to_f32(row[k]);
    case Format::kE2M1:
      return e2m1_to_f32(static_cast<uint8_t>(row[k / 2] >> (4 * (k % 2))));
    default:
      assert(false && "element_to_f32: element format outside cpu_linear_supports");
      return 0.0f;
  }
}

// The whole blocks of a segment, with the element decoder fixed at compile time.
template <Format kElement>
void blocks_to_f32(const WeightView& w, const uint8_t* values, int64_t row, int64_t k0, int64_t blocks,
                   float* out) {
  const uint8_t* p = values + (k0 / kBlock) * cpu_detail::kBlockBytes<kElement>;
  const cpu_detail::RowScales scale_of(w, row);
  for (int64_t b = 0; b < blocks; ++b, p += cpu_detail::kBlockBytes<kElement>, out += kBlock) {
    __m256 v[4];
    cpu_detail::decode_block<kElement>(p, v);
    const __m256 scale = _mm256_set1_ps(scale_of(k0 / kBlock + b));
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(v[i], scale));
  }
}

}  // namespace

void dequantize_row(const WeightView& w, int64_t row, int64_t k0, int64_t len, float* out) {
  assert(k0 % kBlock == 0 && k0 + len <= w.cols && row < w.rows);
  const FormatTraits& t = traits(w.format);
  const uint8_t* values = w.values + values_bytes(w.format, row, w.cols);  // start of this row
  const int64_t blocks = len / kBlock;
  switch (t.element) {
    case Format::kBF16:
      blocks_to_f32<Format::kBF16>(w, values, row, k0, blocks, out);
      break;
    case Format::kF16:
      blocks_to_f32<Format::kF16>(w, values, row, k0, blocks, out);
      break;
    case Format::kF32:
      blocks_to_f32<Format::kF32>(w, values, row, k0, blocks, out);
      break;
    case Format::kE4M3:
      blocks_to_f32<Format::kE4M3>(w, values, row, k0, blocks, out);
      break;
    case Format::kE5M2:
      blocks_to_f32<Format::kE5M2>(w, values, row, k0, blocks, out);
      break;
    case Format::kE2M1:
      blocks_to_f32<Format::kE2M1>(w, values, row, k0, blocks, out);
      break;
    default:
      assert(false && "dequantize_row: element format outside cpu_linear_supports");
  }
  const cpu_detail::RowScales scale_of(w, row);
  for (int64_t k = k0 + blocks * kBlock; k < k0 + len; ++k)
    out[k - k0] = element_to_f32(t.element, values, k) * scale_of(k / kBlock);
}

}  // namespace mxq
