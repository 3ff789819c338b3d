// Block quantizers (CPU reference): row-major [rows, cols] bf16/f16/f32 -> canonical planes, and back.
// The rules are spec/formats.md's, byte for byte: MXFP8 (scale rules ceil/ocp/floor/ct), MXFP4 (ct) and
// FP8-B128 (DeepSeek). Scale exponents come from f32 bits, never from a floating-point log2.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "format/formats.h"

namespace mxq {

// How an MX block's E8M0 scale byte b follows from its amax = m·2^k (m in [1,2)). emax = 8 for E4M3 and
// 2 for E2M1; every rule clamps b to [0, 254].
enum class ScaleRule : uint8_t {
  kCeil,   // b = ceil(log2(max(amax, FLT_MIN) / elem_max)) + 127 (vLLM torch, TE, FlashInfer, ModelOpt)
  kOcp,    // b = k - emax + 127; the block max may saturate (OCP MX v1.0 reference emulation)
  kFloor,  // b = floor(log2(max(amax, FLT_MIN))) + 127 (older vLLM torch path)
  kCt,     // b = k - emax + [m >= 1.75] + 127 (compressed-tensors); amax subnormal or 0 -> 0
};

Result<ScaleRule> parse_scale_rule(std::string_view name);  // "ceil", "ocp", "floor", "ct"
std::string_view scale_rule_name(ScaleRule rule);
ScaleRule default_scale_rule(Format fmt);  // MXFP8 ceil, MXFP4 ct

// E8M0 byte for a block amax (fmt MXFP8 or MXFP4; amax finite and >= 0, as the quantizer guarantees).
uint8_t mx_scale_byte(Format fmt, ScaleRule rule, float amax);

// Quantizes a row-major [rows, cols] tensor of `src` elements (kBF16, kF16 or kF32; raw little-endian bytes,
// any alignment) into canonical planes: `values` (values_bytes(fmt, rows, cols) bytes) and `scales`
// (scales_bytes(fmt, rows, cols) bytes: E8M0 for MX, f32 little-endian for FP8-B128). `rule` is ignored for
// FP8-B128; MXFP4 takes rule ct only. Single-threaded: callers split rows (FP8-B128 by 128-row stripes).
// Errors, by tensor name: NaN/Inf in a block, cols % 32 != 0 for MX, negative shape, unsupported pair.
Status quantize(Format fmt, ScaleRule rule, Format src, const void* x, int64_t rows, int64_t cols,
                uint8_t* values, uint8_t* scales, std::string_view tensor_name);

// Dequantizes canonical planes to f32: out[r*cols + c] = element * scale. Any row range works for MX; for
// FP8-B128 the first row must sit on a 128-row boundary (scales then start at that stripe's scale row).
void dequantize(Format fmt, const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t cols,
                float* out);

}  // namespace mxq
