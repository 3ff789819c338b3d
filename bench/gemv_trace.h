// `mxq-bench linear --gemv-trace`: the timeline of the M = 1 ring GEMV inside the benchmark's CUDA graph,
// from the per-block records the ring kernels write when a GemvTrace is set (cuda/linear/gemv_mx_launch.h).
// Study only: it shows whether, and by how much, consecutive launches overlap under programmatic dependent
// launch. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>

#include "base/error.h"

namespace mxq::cli {

// Times `launch(i)` as time_graph does (a graph of `launches` launches) without and with the trace on, and
// prints one row for `label`: µs per launch (untraced, traced), then medians over the last replay's
// consecutive launch pairs (j - 1, j), all in µs relative to the last block end of launch j - 1: the first
// and last block start of launch j, its first and last block past the PDL wait, its last block end (= the
// period); and, per block, the time from start to its first step's bytes, and from the PDL wait to its end.
Status trace_gemv_row(const std::string& label, int launches, int reps, cudaStream_t stream,
                      const std::function<Status(int)>& launch);

// The header of trace_gemv_row's rows.
void print_gemv_trace_header();

}  // namespace mxq::cli
