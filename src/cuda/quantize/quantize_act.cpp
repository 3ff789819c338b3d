#include "cuda/quantize/quantize_act.h"

#include <climits>

#include "cuda/common/check.h"
#include "cuda/quantize/quantize_act_launch.h"

namespace mxq::cuda {

Status quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values, float* scales,
                             int64_t scale_ld, cudaStream_t stream) {
  if (m < 0 || k < 0) return fail("quantize_act_fp8_b128: shape [{}, {}] (expected non-negative)", m, k);
  if (scale_ld < m) return fail("quantize_act_fp8_b128: scale_ld {} (expected >= m = {})", scale_ld, m);
  if (m == 0 || k == 0) return {};
  // note: the grid holds one warp per (row, block): 8 warps per CUDA block, at most 2^31 - 1 blocks.
  if (m * ((k + 127) / 128) > 8LL * INT_MAX)
    return fail("quantize_act_fp8_b128: shape [{}, {}] has too many blocks for one launch", m, k);
  if (!x || !values || !scales) return fail("quantize_act_fp8_b128: null device pointer");
  MXQ_CUDA_CHECK(launch_quantize_act_fp8_b128(x, m, k, values, scales, scale_ld, stream));
  return {};
}

Status fake_quant_mxfp8(const uint16_t* x, int64_t m, int64_t k, uint16_t* y, cudaStream_t stream) {
  if (m < 0 || k < 0 || k % 32 != 0)
    return fail("fake_quant_mxfp8: shape [{}, {}] (expected non-negative, k a multiple of 32)", m, k);
  if (m == 0 || k == 0) return {};
  // note: four threads per 1x32 block, two blocks' parts per thread, 256 threads per CUDA block.
  if (m * (k / 32) > 128LL * INT_MAX)
    return fail("fake_quant_mxfp8: shape [{}, {}] has too many blocks for one launch", m, k);
  if (!x || !y) return fail("fake_quant_mxfp8: null device pointer");
  if (x < y + m * k && y < x + m * k)
    return fail("fake_quant_mxfp8: y overlaps x (expected separate buffers)");
  MXQ_CUDA_CHECK(launch_fake_quant_mxfp8(x, m, k, y, stream));
  return {};
}

}  // namespace mxq::cuda
