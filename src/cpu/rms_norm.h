// RMSNorm as HF Qwen3RMSNorm computes it in f32: out = weight * (x * rsqrt(mean(x^2) + eps)).
#pragma once

#include <cstdint>

#include "cpu/parallel.h"

namespace mxq {

// x, out: [rows, dim] row-major (out may alias x); weight: [dim].
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out,
              ThreadPool& pool = default_pool());

// The decoder layer's fused step: residual += x, then out = rms_norm(residual). residual: [rows, dim].
void add_rms_norm(const float* x, float* residual, int64_t rows, int64_t dim, const float* weight, float eps,
                  float* out, ThreadPool& pool = default_pool());

// Qwen3 self_attn.q_norm / k_norm: x [tokens, heads, head_dim] normalised per head, in place; weight
// [head_dim] is shared by all heads.
void head_rms_norm(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const float* weight, float eps,
                   ThreadPool& pool = default_pool());

}  // namespace mxq
