// Block quantize / dequantize on the CPU. Layout of the work: MX formats go block by block along each row
// (32 elements -> 1 scale byte); FP8-B128 goes by stripes of 128 rows, one pass for the block amaxes and one
// for the elements. Inner loops have a fixed trip count and no branches, so they vectorize.
#include "format/quantize.h"

#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "format/codec.h"
#include "format/element_encode.h"
#include "format/scale_rule.h"

namespace mxq {
namespace {

constexpr int kMxBlock = 32;
constexpr int kB128 = 128;
// note: DeepSeek's cast clamps the f32 block amax at 1e-4 (torch rounds the bound to f32 first).
constexpr float kB128MinAmax = 1e-4f;
constexpr float kE4M3Max = 448.0f;

template <Format Src>
constexpr int64_t src_bytes() {
  return Src == Format::kF32 ? 4 : 2;
}

// Widens n elements at p (little-endian, any alignment) to f32; exact for every input value.
template <Format Src>
inline void load_f32(const uint8_t* p, int64_t n, float* out) {
  if constexpr (Src == Format::kF32) {
    std::memcpy(out, p, static_cast<size_t>(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = Src == Format::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
}

// note: for non-negative floats (incl. inf/NaN) the bit patterns order like the values, so the block amax
// is an integer max over |x| bits, and amax >= inf bits flags NaN/Inf in one compare.
inline uint32_t amax_bits(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & detail::kF32AbsMask);
  return m;
}

Status nan_block(std::string_view name, int64_t br, int64_t bc, int64_t r0, int64_t r1, int64_t c0,
                 int64_t c1) {
  return fail("{}: block ({}, {}) holds NaN/Inf (rows {}..{}, cols {}..{})", name, br, bc, r0, r1 - 1, c0,
              c1 - 1);
}

// f32 bits of max |x| over n raw source elements, by an integer max on the source's own bits (no widening),
// 32 elements at a time through a local array so the loop vectorizes.
template <Format Src>
inline uint32_t source_amax_bits(const uint8_t* p, int64_t n) {
  using Bits = std::conditional_t<Src == Format::kF32, uint32_t, uint16_t>;
  constexpr Bits kAbs = Src == Format::kF32 ? detail::kF32AbsMask : 0x7FFFu;
  Bits m = 0;
  for (int64_t i = 0; i < n; i += kMxBlock) {
    Bits chunk[kMxBlock] = {};
    std::memcpy(chunk, p + i * sizeof(Bits),
                static_cast<size_t>(std::min<int64_t>(kMxBlock, n - i)) * sizeof(Bits));
    for (int k = 0; k < kMxBlock; ++k) m = std::max(m, static_cast<Bits>(chunk[k] & kAbs));
  }
  if constexpr (Src == Format::kF32)
    return m;
  else
    return std::bit_cast<uint32_t>(Src == Format::kBF16 ? bf16_to_f32(m) : f16_to_f32(m));
}

// E4M3 codes of x * mul for a run of n source elements (a 128-wide block or a short final one): whole
// 32-element chunks through fixed-trip-count loops on local arrays (vectorized), the ragged tail one by one.
template <Format Src>
inline void encode_e4m3_run(const uint8_t* p, int64_t n, float mul, uint8_t* out) {
  alignas(32) float chunk[kMxBlock];
  int64_t i = 0;
  for (; i + kMxBlock <= n; i += kMxBlock) {
    uint8_t codes[kMxBlock];
    load_f32<Src>(p + i * src_bytes<Src>(), kMxBlock, chunk);
    for (int k = 0; k < kMxBlock; ++k) codes[k] = detail::encode_e4m3(chunk[k] * mul);
    std::memcpy(out + i, codes, kMxBlock);
  }
  load_f32<Src>(p + i * src_bytes<Src>(), n - i, chunk);
  for (int64_t k = 0; k < n - i; ++k) out[i + k] = detail::encode_e4m3(chunk[k] * mul);
}

// fl(p) + 0 for a finite f32 p, as a select: a zero of either sign becomes +0, anything else stays.
// note: rule ct follows compressed-tensors, fl(x / scale) + zero_point in two torch ops (zero_point = +0):
// a product that is zero in f32 (a -0 input, or a negative product that underflows) encodes as 0x00, while
// a nonzero negative product that rounds to zero in E4M3 keeps 0x80. Not written `p + 0.0f`: with
// -march=x86-64-v3 GCC's default -ffp-contract=fast fuses x * mul + 0 into one FMA, which never rounds the
// product to -0 first, so the bytes would depend on compiler flags (issue 22).
inline float plus_zero_point(float p) {
  const uint32_t b = std::bit_cast<uint32_t>(p);
  return std::bit_cast<float>(detail::select((b & detail::kF32AbsMask) == 0, 0u, b));
}

template <Format Src, ScaleRule Rule, bool kFp4>
Status quantize_mx(const uint8_t* x, int64_t rows, int64_t cols, uint8_t* values, uint8_t* scales,
                   std::string_view name) {
  constexpr detail::MxElement el = kFp4 ? detail::kMxE2M1 : detail::kMxE4M3;
  const int64_t blocks = cols / kMxBlock;
  alignas(32) float buf[kMxBlock];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t first = r * cols + j * kMxBlock;
      load_f32<Src>(x + first * src_bytes<Src>(), kMxBlock, buf);
      const uint32_t amax = amax_bits(buf, kMxBlock);
      if (amax >= detail::kF32InfBits) [[unlikely]]
        return nan_block(name, r, j, r, r + 1, j * kMxBlock, (j + 1) * kMxBlock);
      const uint8_t b = detail::mx_scale_from_bits(Rule, el, amax);
      scales[r * blocks + j] = b;
      const float mul = detail::mx_inv_scale(b);
      if constexpr (kFp4) {
        uint8_t codes[kMxBlock];
        for (int i = 0; i < kMxBlock; ++i) codes[i] = detail::encode_e2m1_signed(buf[i] * mul, buf[i]);
        uint8_t* out = values + first / 2;  // note: byte j = element 2j (bits 3:0) | element 2j+1 (bits 7:4)
        for (int i = 0; i < kMxBlock / 2; ++i)
          out[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
      } else {
        // note: codes go to a local array first: a store through uint8_t* may alias `buf`, and the alias
        // check it would need keeps GCC's -O2 (very-cheap) vectorizer off the loop.
        uint8_t codes[kMxBlock];
        for (int i = 0; i < kMxBlock; ++i) {
          const float p = buf[i] * mul;  // exact unless it underflows f32 (mul is a power of two)
          codes[i] = detail::encode_e4m3(Rule == ScaleRule::kCt ? plus_zero_point(p) : p);
        }
        std::memcpy(values + first, codes, kMxBlock);
      }
    }
  }
  return {};
}

template <Format Src>
Status quantize_b128(const uint8_t* x, int64_t rows, int64_t cols, uint8_t* values, uint8_t* scales,
                     std::string_view name) {
  const int64_t col_blocks = cdiv(cols, kB128), row_bytes = cols * src_bytes<Src>();
  std::vector<uint32_t> amax(static_cast<size_t>(col_blocks));
  std::vector<float> mul(static_cast<size_t>(col_blocks));
  for (int64_t r0 = 0; r0 < rows; r0 += kB128) {
    const int64_t r1 = std::min(rows, r0 + kB128), stripe = r0 / kB128;
    std::fill(amax.begin(), amax.end(), 0u);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        const int64_t c0 = cb * kB128, n = std::min(cols - c0, int64_t{kB128});  // short final block
        amax[cb] = std::max(amax[cb], source_amax_bits<Src>(x + r * row_bytes + c0 * src_bytes<Src>(), n));
      }
    }
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      if (amax[cb] >= detail::kF32InfBits)
        return nan_block(name, stripe, cb, r0, r1, cb * kB128, std::min(cols, (cb + 1) * kB128));
      const float a = std::max(std::bit_cast<float>(amax[cb]), kB128MinAmax);
      // note: the reference's `x * (448.0 / amax)` is torch's `amax.reciprocal() * 448`: two f32 roundings,
      // fl(fl(1 / a) * 448), one ulp off fl(448 / a) for some a (formats.md, issue 22).
      mul[cb] = (1.0f / a) * kE4M3Max;
      const float scale_inv = a / kE4M3Max;  // a multiplier despite its checkpoint name
      std::memcpy(scales + (stripe * col_blocks + cb) * 4, &scale_inv, 4);
    }
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        const int64_t c0 = cb * kB128, n = std::min(cols - c0, int64_t{kB128});
        // note: x * m rounded to f32, then to E4M3: the reference's own two roundings.
        encode_e4m3_run<Src>(x + r * row_bytes + c0 * src_bytes<Src>(), n, mul[cb], values + r * cols + c0);
      }
    }
  }
  return {};
}

template <Format Src>
Status quantize_from(Format fmt, ScaleRule rule, const uint8_t* x, int64_t rows, int64_t cols,
                     uint8_t* values, uint8_t* scales, std::string_view name) {
  if (fmt == Format::kFP8_B128) return quantize_b128<Src>(x, rows, cols, values, scales, name);
  if (fmt == Format::kMXFP4)
    return quantize_mx<Src, ScaleRule::kCt, true>(x, rows, cols, values, scales, name);
  switch (rule) {
    case ScaleRule::kCeil:
      return quantize_mx<Src, ScaleRule::kCeil, false>(x, rows, cols, values, scales, name);
    case ScaleRule::kOcp:
      return quantize_mx<Src, ScaleRule::kOcp, false>(x, rows, cols, values, scales, name);
    case ScaleRule::kFloor:
      return quantize_mx<Src, ScaleRule::kFloor, false>(x, rows, cols, values, scales, name);
    case ScaleRule::kCt:
      return quantize_mx<Src, ScaleRule::kCt, false>(x, rows, cols, values, scales, name);
  }
  return fail("{}: unknown scale rule {}", name, static_cast<int>(rule));
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

}  // namespace

Status quantize(Format fmt, ScaleRule rule, Format src, const void* x, int64_t rows, int64_t cols,
                uint8_t* values, uint8_t* scales, std::string_view tensor_name) {
  const std::string_view fname = traits(fmt).name, sname = traits(src).name;
  if (fmt != Format::kMXFP8 && fmt != Format::kMXFP4 && fmt != Format::kFP8_B128)
    return fail("{}: cannot quantize to {} (expected mxfp8, mxfp4 or fp8-b128)", tensor_name, fname);
  if (src != Format::kBF16 && src != Format::kF16 && src != Format::kF32)
    return fail("{}: cannot quantize from {} to {} (expected a bf16, f16 or f32 source)", tensor_name, sname,
                fname);
  if (fmt == Format::kMXFP4 && rule != ScaleRule::kCt)
    return fail("{}: mxfp4 supports scale rule ct only (got {})", tensor_name, scale_rule_name(rule));
  if (rows < 0 || cols < 0)
    return fail("{}: shape [{}, {}] has a negative dimension", tensor_name, rows, cols);
  if (fmt != Format::kFP8_B128 && cols % kMxBlock != 0)
    return fail("{}: {} needs cols % 32 == 0 (got cols {})", tensor_name, fname, cols);
  if (cols != 0 && rows > std::numeric_limits<int64_t>::max() / 4 / cols)
    return fail("{}: shape [{}, {}] is too large", tensor_name, rows, cols);
  if (rows == 0 || cols == 0) return {};
  assert(x != nullptr && values != nullptr && scales != nullptr);
  const auto* in = static_cast<const uint8_t*>(x);
  switch (src) {
    case Format::kBF16:
      return quantize_from<Format::kBF16>(fmt, rule, in, rows, cols, values, scales, tensor_name);
    case Format::kF16:
      return quantize_from<Format::kF16>(fmt, rule, in, rows, cols, values, scales, tensor_name);
    default:
      return quantize_from<Format::kF32>(fmt, rule, in, rows, cols, values, scales, tensor_name);
  }
}

void dequantize(Format fmt, const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t cols,
                float* out) {
  assert(fmt == Format::kMXFP8 || fmt == Format::kMXFP4 || fmt == Format::kFP8_B128);
  assert(rows >= 0 && cols >= 0);
  const std::array<float, 256>& e4m3 = e4m3_table();
  if (fmt == Format::kFP8_B128) {
    const int64_t col_blocks = cdiv(cols, kB128);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float s;
        std::memcpy(&s, scales + ((r / kB128) * col_blocks + c / kB128) * 4, 4);
        out[r * cols + c] = e4m3[values[r * cols + c]] * s;
      }
    }
    return;
  }
  assert(cols % kMxBlock == 0);
  const int64_t blocks = cols / kMxBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < blocks; ++j) {
      const float s = e8m0_to_f32(scales[r * blocks + j]);
      const int64_t first = r * cols + j * kMxBlock;
      float* o = out + first;
      if (fmt == Format::kMXFP8) {
        for (int i = 0; i < kMxBlock; ++i) o[i] = e4m3[values[first + i]] * s;
      } else {
        const uint8_t* v = values + first / 2;
        for (int i = 0; i < kMxBlock / 2; ++i) {
          o[2 * i] = e2m1_to_f32(v[i] & 0xF) * s;
          o[2 * i + 1] = e2m1_to_f32(v[i] >> 4) * s;
        }
      }
    }
  }
}

}  // namespace mxq
