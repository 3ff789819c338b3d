// What the CUDA weight memory (weight_memory_cuda.cpp) derives from a plane's Layout (layout/layout.h) for
// the refit kernels' DevicePlane (refit_launch.h): the run length, the int32 run table of a separable plane,
// and whether it is the GEMV MXFP8 4x4-word transpose and has its rows back to back. Host code; each
// function reads the layout's tables once.
#pragma once

#include <cstdint>
#include <vector>

#include "layout/layout.h"

namespace mxq::cuda {

// DevicePlane::run: the largest R in {16, 8, 4, 2} (16 for identity; else 1) such that every run of R
// canonical bytes of a row starting at a multiple of R lands contiguous and R-aligned.
int plane_run(const PlaneLayout& l);
// DevicePlane::cols: the native column offset of every run of `run` canonical bytes of a separable plane
// (int32, appended to out); false when the plane has none (row_bytes % 16 != 0, offsets past 2^31).
bool plane_run_table(const PlaneLayout& l, int run, std::vector<int32_t>& out);
// DevicePlane::transpose4: the GEMV MXFP8 permutation (gemv_layout.h) with 16-byte-aligned rows.
bool plane_is_transpose4(const PlaneLayout& l, int run);
// DevicePlane::rows_contiguous: row_off[r] == row_off[0] + r·row_bytes for every row.
bool plane_rows_contiguous(const PlaneLayout& l);

}  // namespace mxq::cuda
