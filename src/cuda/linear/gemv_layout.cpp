#include "cuda/linear/gemv_layout.h"

#include <algorithm>
#include <cstring>

namespace mxq::cuda {

int64_t gemv_group_elems(Format f) {
  // note: both give 16 bytes per quad lane per group: 64 x 1 B (MXFP8) and 128 x 0.5 B (MXFP4).
  if (f == Format::kMXFP8) return 64;
  if (f == Format::kMXFP4) return 128;
  return 0;
}

int64_t gemv_native_elem(Format f, int64_t cols, int64_t k) {
  const int64_t group = gemv_group_elems(f);
  const int64_t k0 = k / group * group;
  const int64_t mmas = std::min(group, cols - k0) / 16;
  const int64_t kk = k - k0, j = kk / 16, t = kk % 16 / 4, e = kk % 4;
  return k0 + 4 * mmas * t + 4 * j + e;
}

Status prepare_gemv_values(Format f, const uint8_t* canonical, uint8_t* native, int64_t rows, int64_t cols) {
  if (gemv_group_elems(f) == 0)
    return fail("GEMV layout: format {} has none (expected mxfp8 or mxfp4)", traits(f).name);
  if (rows < 0 || cols < 0 || cols % 32 != 0)
    return fail("GEMV layout: shape [{}, {}] (expected K a multiple of 32)", rows, cols);
  const int64_t row_bytes = values_bytes(f, 1, cols);
  // note: 4 consecutive elements stay together (1 word of MXFP8, 2 bytes of MXFP4): move runs of 4.
  const int64_t run_bytes = f == Format::kMXFP8 ? 4 : 2, elems_per_byte = f == Format::kMXFP8 ? 1 : 2;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = canonical + r * row_bytes;
    uint8_t* dst = native + r * row_bytes;
    for (int64_t k = 0; k < cols; k += 4)
      std::memcpy(dst + gemv_native_elem(f, cols, k) / elems_per_byte, src + k / elems_per_byte, run_bytes);
  }
  return {};
}

}  // namespace mxq::cuda
