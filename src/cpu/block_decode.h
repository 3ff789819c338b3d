// AVX2 decoders of one 32-element block of a weight row into four __m256 (elements 0-7, 8-15, ...), and
// the scale of each block. Shared by dequantize_row and linear's fused M = 1 path; .cpp files in src/cpu
// only (needs -march=x86-64-v3).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/weight_view.h"
#include "format/codec.h"

namespace mxq::cpu_detail {

constexpr int64_t kBlock = 32;  // elements decoded per vector step (= the MX block)

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
constexpr int64_t kBlockBytes = kBlock*(kElement == Format::kE2M1                               ? 4
                                        : kElement == Format::kF32                              ? 32
                                        : kElement == Format::kBF16 || kElement == Format::kF16 ? 16
                                                                                                : 8) /
                                8;

template <Format kElement>
inline void decode_block(const uint8_t* p, __m256 v[4]) {
  if constexpr (kElement == Format::kBF16) {
    for (int i = 0; i < 4; ++i) v[i] = bf16x8(p + 16 * i);
  } else if constexpr (kElement == Format::kF16) {
    for (int i = 0; i < 4; ++i) v[i] = f16x8(p + 16 * i);
  } else if constexpr (kElement == Format::kF32) {
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * i);
  } else if constexpr (kElement == Format::kE4M3) {
    e4m3x16(p, &v[0], &v[1]);
    e4m3x16(p + 16, &v[2], &v[3]);
  } else if constexpr (kElement == Format::kE5M2) {
    e5m2x16(p, &v[0], &v[1]);
    e5m2x16(p + 16, &v[2], &v[3]);
  } else {
    static_assert(kElement == Format::kE2M1);
    const __m256 magnitudes = _mm256_loadu_ps(kE2M1Values);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(packed, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    const __m128i first = _mm_unpacklo_epi8(lo, hi);   // elements 0..15: byte j -> 2j (lo), 2j+1 (hi)
    const __m128i second = _mm_unpackhi_epi8(lo, hi);  // elements 16..31
    v[0] = e2m1x8(first, magnitudes);
    v[1] = e2m1x8(_mm_srli_si128(first, 8), magnitudes);
    v[2] = e2m1x8(second, magnitudes);
    v[3] = e2m1x8(_mm_srli_si128(second, 8), magnitudes);
  }
}

// Multiplier of the 32-block `b` (counted from the row start) of one row; 1 for unscaled formats.
class RowScales {
 public:
  RowScales(const WeightView& w, int64_t row) : kind_(traits(w.format).scale) {
    const FormatTraits& t = traits(w.format);
    if (kind_ == ScaleKind::kE8M0) base_ = w.scales + row * (w.cols / kBlock);
    // note: FP8-B128 scales are f32 [cdiv(N,128), cdiv(K,128)]; four 32-blocks share one entry.
    if (kind_ == ScaleKind::kF32) base_ = w.scales + 4 * ((row / t.block_rows) * cdiv(w.cols, t.block_cols));
  }
  float operator()(int64_t b) const {
    if (kind_ == ScaleKind::kE8M0) return e8m0_to_f32(base_[b]);
    if (kind_ == ScaleKind::kNone) return 1.0f;
    float s;
    std::memcpy(&s, base_ + 4 * (b / 4), 4);
    return s;
  }

 private:
  ScaleKind kind_;
  const uint8_t* base_ = nullptr;
};

}  // namespace mxq::cpu_detail
