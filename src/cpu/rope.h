// Rotary position embedding, HF convention (Qwen3RotaryEmbedding + apply_rotary_pos_emb, rope_type
// "default"): dimension i pairs with i + head_dim/2 (rotate_half), not with i + 1.
#pragma once

#include <cstdint>
#include <vector>

#include "base/error.h"

namespace mxq {

// x: [tokens, heads, head_dim] rotated in place; positions: [tokens]. For i < head_dim/2, with
// inv_freq_i = 1 / theta^(2i / head_dim) and a = position * inv_freq_i (both rounded to f32 as HF does):
//   x'[i] = x[i] cos a - x[i + D/2] sin a,   x'[i + D/2] = x[i + D/2] cos a + x[i] sin a.
// Refuses an odd or non-positive head_dim, a theta that is not finite and > 1, or a negative position.
Status rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int64_t* positions, float theta);

// The f32 inverse frequencies rope() uses, [head_dim / 2]: inv_freq_i = 1 / theta^(2i / head_dim). The CUDA
// rope (cuda/qk_norm_rope_cache) reads this table from the device so both backends rotate by the same angles.
// Refuses what rope() refuses for head_dim and theta.
Result<std::vector<float>> rope_inv_freq(float theta, int64_t head_dim);

}  // namespace mxq
