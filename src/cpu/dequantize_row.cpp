#include "cpu/dequantize_row.h"

#include <immintrin.h>

#include <cassert>
#include <cstring>

#include "format/codec.h"

namespace mxq {
namespace {

constexpr int64_t kBlock = 32;  // elements decoded per vector step (= the MX block)

// ---- one 32-element block into four __m256, times `scale` --------------------------------------------
inline void store_scaled(float* out, __m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 scale) {
  _mm256_storeu_ps(out, _mm256_mul_ps(v0, scale));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(v1, scale));
  _mm256_storeu_ps(out + 16, _mm256_mul_ps(v2, scale));
  _mm256_storeu_ps(out + 24, _mm256_mul_ps(v3, scale));
}

inline __m256 bf16x8(const uint8_t* p) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// note: E4M3 bits placed as f16 bits (sign << 15 | exponent-mantissa << 7) give exactly value · 2^-8 for
// every finite code, subnormals included (the biases differ by 8). NaN codes (x111 1111) become 0xFFFF,
// an f16 NaN. This replaces a 256-entry gather LUT: vgatherdps is microcoded and ~4x slower here.
inline void e4m3x16(const uint8_t* p, __m256* lo, __m256* hi) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i nan =
      _mm256_cvtepi8_epi16(_mm_cmpeq_epi8(_mm_and_si128(bytes, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F)));
  const __m256i c = _mm256_cvtepu8_epi16(bytes);
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8);
  const __m256i body = _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7F)), 7);
  const __m256i h = _mm256_or_si256(_mm256_or_si256(sign, body), nan);
  const __m256 unbias = _mm256_set1_ps(256.0f);  // exact: multiplies by a power of two
  *lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), unbias);
  *hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), unbias);
}
// note: an E5M2 code is exactly the high byte of the f16 with the same value, so F16C converts it exactly.
inline void e5m2x16(const uint8_t* p, __m256* lo, __m256* hi) {
  const __m256i h =
      _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 8);
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
// note: the 16-entry E2M1 table is held as 8 magnitudes in one register (vpermps reads index bits 2:0)
// plus the code's bit 3 moved to the f32 sign bit, so -0 (code 8) decodes to -0.0f as the table says.
inline __m256 e2m1x8(__m128i codes, __m256 magnitudes) {
  const __m256i idx = _mm256_cvtepu8_epi32(codes);
  const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, idx);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
  return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

template <Format kElement>
inline void block_to_f32(const uint8_t* p, __m256 scale, float* out) {
  if constexpr (kElement == Format::kBF16) {
    store_scaled(out, bf16x8(p), bf16x8(p + 16), bf16x8(p + 32), bf16x8(p + 48), scale);
  } else if constexpr (kElement == Format::kF16) {
    store_scaled(out, f16x8(p), f16x8(p + 16), f16x8(p + 32), f16x8(p + 48), scale);
  } else if constexpr (kElement == Format::kF32) {
    const auto* f = reinterpret_cast<const float*>(p);  // loadu: no alignment assumed
    store_scaled(out, _mm256_loadu_ps(f), _mm256_loadu_ps(f + 8), _mm256_loadu_ps(f + 16),
                 _mm256_loadu_ps(f + 24), scale);
  } else if constexpr (kElement == Format::kE4M3) {
    __m256 v[4];
    e4m3x16(p, &v[0], &v[1]);
    e4m3x16(p + 16, &v[2], &v[3]);
    store_scaled(out, v[0], v[1], v[2], v[3], scale);
  } else if constexpr (kElement == Format::kE5M2) {
    __m256 v[4];
    e5m2x16(p, &v[0], &v[1]);
    e5m2x16(p + 16, &v[2], &v[3]);
    store_scaled(out, v[0], v[1], v[2], v[3], scale);
  } else {
    static_assert(kElement == Format::kE2M1);
    const __m256 magnitudes = _mm256_loadu_ps(kE2M1Values);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(packed, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    const __m128i first = _mm_unpacklo_epi8(lo, hi);   // elements 0..15: byte j -> 2j (lo), 2j+1 (hi)
    const __m128i second = _mm_unpackhi_epi8(lo, hi);  // elements 16..31
    store_scaled(out, e2m1x8(first, magnitudes), e2m1x8(_mm_srli_si128(first, 8), magnitudes),
                 e2m1x8(second, magnitudes), e2m1x8(_mm_srli_si128(second, 8), magnitudes), scale);
  }
}

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

// Multiplier of the scale block holding element (row, k); 1 for unscaled formats.
float block_scale(const WeightView& w, int64_t row, int64_t k) {
  const FormatTraits& t = traits(w.format);
  switch (t.scale) {
    case ScaleKind::kNone:
      return 1.0f;
    case ScaleKind::kE8M0:
      return e8m0_to_f32(w.scales[row * (w.cols / t.block_cols) + k / t.block_cols]);
    case ScaleKind::kF32: {
      const int64_t col_blocks = cdiv(w.cols, t.block_cols);
      float s;
      std::memcpy(&s, w.scales + 4 * ((row / t.block_rows) * col_blocks + k / t.block_cols), 4);
      return s;
    }
  }
  return 1.0f;
}

// The whole blocks of a segment, with the element decoder fixed at compile time.
template <Format kElement>
void blocks_to_f32(const WeightView& w, const uint8_t* values, int64_t row, int64_t k0, int64_t blocks,
                   float* out) {
  constexpr int64_t kBitsPerBlock = kBlock * (kElement == Format::kE2M1                               ? 4
                                              : kElement == Format::kF32                              ? 32
                                              : kElement == Format::kBF16 || kElement == Format::kF16 ? 16
                                                                                                      : 8);
  const uint8_t* p = values + k0 * (kBitsPerBlock / kBlock) / 8;
  const FormatTraits& t = traits(w.format);
  if (t.scale == ScaleKind::kE8M0) {
    const uint8_t* scale_row = w.scales + row * (w.cols / kBlock) + k0 / kBlock;
    for (int64_t b = 0; b < blocks; ++b, p += kBitsPerBlock / 8, out += kBlock)
      block_to_f32<kElement>(p, _mm256_set1_ps(e8m0_to_f32(scale_row[b])), out);
  } else {
    for (int64_t b = 0; b < blocks; ++b, p += kBitsPerBlock / 8, out += kBlock)
      block_to_f32<kElement>(p, _mm256_set1_ps(block_scale(w, row, k0 + b * kBlock)), out);
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
  for (int64_t k = k0 + blocks * kBlock; k < k0 + len; ++k)
    out[k - k0] = element_to_f32(t.element, values, k) * block_scale(w, row, k);
}

}  // namespace mxq
