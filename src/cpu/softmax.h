// softmax / log_softmax over the last dimension, and argmax: the pieces of sampling and routing.
#pragma once

#include <cstdint>

namespace mxq {

// x, out: [rows, n] row-major; out may alias x. f32 throughout, the row max subtracted before exp.
void softmax(const float* x, int64_t rows, int64_t n, float* out);
void log_softmax(const float* x, int64_t rows, int64_t n, float* out);

// Index of the first maximum of x[0, n) (torch.argmax semantics for finite inputs); -1 when n <= 0.
int64_t argmax(const float* x, int64_t n);

// Sum of x[0, n) in f32, blocked so the error grows slowly with n (softmax normalisers over a vocabulary).
float sum_f32(const float* x, int64_t n);

}  // namespace mxq
