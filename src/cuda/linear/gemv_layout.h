// Native layout of the GEMV values plane (gemv_mxfp8.cu / gemv_mxfp4.cu). It is a byte permutation of the
// canonical row-major [N, K] plane, inside each row:
//   K is cut into groups of G elements (G = 64 for MXFP8, 128 for MXFP4; the last group may be shorter,
//   any multiple of 32). In a group of g elements with J = g/16, canonical element k0 + 16j + 4t + e
//   (j < J, t < 4, e < 4) sits at native element k0 + 4J·t + 4j + e.
// So lane t of an mma.sync quad reads its whole share of a group with one 16-byte load, and the 16 k-slots
// of MMA j all fall in one 32-element scale block (j/2). MXFP4 keeps nibble order: the map moves whole bytes.
// The scales plane stays canonical ([N, K/32] E8M0, identity layout).
#pragma once

#include <cstdint>

#include "base/error.h"
#include "format/formats.h"

namespace mxq::cuda {

// Elements per layout group for a GEMV format (64 or 128); 0 for formats with no GEMV layout.
int64_t gemv_group_elems(Format f);

// Native element index (within the row) of canonical element k of a row of `cols` elements.
int64_t gemv_native_elem(Format f, int64_t cols, int64_t k);

// canonical → native for the values plane, host memory, values_bytes(f, rows, cols) bytes each. Refuses a
// format with no GEMV layout, cols not a multiple of 32, or negative sizes.
Status prepare_gemv_values(Format f, const uint8_t* canonical, uint8_t* native, int64_t rows, int64_t cols);

}  // namespace mxq::cuda
