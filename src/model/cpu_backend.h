// The CPU implementation of the model ops (src/cpu/*): the oracle every other backend is checked against.
#pragma once

#include <memory>

#include "cpu/parallel.h"
#include "cpu/weight_view.h"
#include "model/backend.h"

namespace mxq {

// `threads` = total parallelism (0 = one per hardware thread, the shared default pool). act_quant: kBF16, or
// kMXFP8 for the W8A8 mode (cuda/linear/linear.h): every MXFP8 / MXFP4 projection sees its x quantized to
// MXFP8 per 1x32 block and dequantized (cpu/quantize_act.h, on the activations rounded to bf16). Only those
// two.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0, Format act_quant = Format::kBF16);

// How the CPU ops see a live weight: one matrix of it (`expert` >= 0 picks one of a stacked [E, N, K]), or a
// 1-D vector viewed as one row.
WeightView weight_view(const QTensor& w, int64_t expert = -1);

}  // namespace mxq
