// Host side of the MX GEMM launchers: kernel choice by device and path, the x tensor map for TMA.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <type_traits>

#include "cuda/common/device_sms.h"
#include "cuda/linear/gemm_mx_launch.h"
#include "cuda/linear/gemm_mx_sm80.cuh"
#include "cuda/linear/gemm_mx_sm90.cuh"

namespace mxq::cuda::gemm {

// The driver's cuTensorMapEncodeTiled (null when the driver lacks it).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// x [m, k] bf16 row-major as a 2D tensor map: boxes of 64 k x box_rows rows, 128-byte swizzle, zero fill past
// the edges (so a 32-wide K tail and rows past m read 0).
inline cudaError_t make_x_map(CUtensorMap* map, const uint16_t* x, int m, int k, int box_rows) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(m)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kStageK, static_cast<cuuint32_t>(box_rows)}, elem_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(x), dims, strides,
                            box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The values plane [n rows, row_bytes] (uint8) as a 2D tensor map: boxes of one layout group (64 bytes) x 128
// rows, no swizzle (a slot is [row][64 B]), zero fill past the edges (rows past n, bytes past a short last
// group). values 16-byte aligned (gemm_mx.cpp checks); row_bytes = K or K/2, a multiple of 16.
inline cudaError_t make_w_map(CUtensorMap* map, const uint8_t* values, int n, int row_bytes) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {kWGroupBytes, kSm90BlockN}, elem_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(values), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Whether the current device runs the sm_90a code (compute capability 9.0 exactly).
inline cudaError_t is_sm90(bool* yes) {
  int dev = 0, major = 0, minor = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
      e != cudaSuccess)
    return e;
  *yes = major == 9 && minor == 0;
  return cudaSuccess;
}

// The K splits of an sm_90a launch of `tiles` tiles over `stages` 64-wide K stages: 1 when the tiles fill the
// GPU; else up to 8, each SM one tile and split, each split at least 4 stages, and the f32 partials
// (splits x m x n) within the workspace.
inline int splitk_splits(int64_t tiles, int stages, int sms, int64_t mn, int64_t ws_floats) {
  if (tiles >= sms || ws_floats <= 0) return 1;
  int z = static_cast<int>(std::min<int64_t>({8, sms / tiles, stages / 4}));
  while (z > 1 && (static_cast<int64_t>(z) * mn > ws_floats || (z - 1) * ((stages + z - 1) / z) >= stages))
    --z;
  return std::max(z, 1);
}

// Arguments were checked by gemm_mx.cpp.
template <class Fmt>
cudaError_t launch_gemm(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales, uint16_t* y,
                        int n, int k, GemmPath path, float* ws, int64_t ws_floats, cudaStream_t stream) {
  auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
  bool sm90 = false;
  if (path == GemmPath::kAuto)
    if (cudaError_t e = is_sm90(&sm90); e != cudaSuccess) return e;
  if (sm90) {
    // note: an unknown SM count plans for the H200's 132.
    const int sms = device_sms() > 0 ? device_sms() : 132;
    static const cudaError_t attr = [] {
      cudaError_t e = cudaSuccess;
      auto set = [&e](auto kernel, int bm) {
        if (e == cudaSuccess)
          e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90_smem_bytes(bm));
      };
      set(gemm_mx_sm90<Fmt, true, 256>, 256), set(gemm_mx_sm90<Fmt, false, 256>, 256);
      set(gemm_mx_sm90<Fmt, true, 128>, 128), set(gemm_mx_sm90<Fmt, false, 128>, 128);
      set(gemm_mx_sm90<Fmt, true, 64>, 64), set(gemm_mx_sm90<Fmt, false, 64>, 64);
      set(gemm_mx_sm90<Fmt, true, 32>, 32), set(gemm_mx_sm90<Fmt, false, 32>, 32);
      return e;
    }();
    if (attr != cudaSuccess) return attr;
    const int tiles_n = (n + kSm90BlockN - 1) / kSm90BlockN;
    // Activation tile: M <= 64 takes the smallest of 32 / 64 rows that holds it (one tile; K splits fill
    // the GPU); else the one with the smaller estimated time, waves x rows per tile, a 128-row tile costing
    // 1.15x half a 256-row one (shorter wgmmas, same decode work).
    // note: bench/history/RESULTS-log.md, "Large-M GEMM (prefill)", variant runs 3-4: 128 always below 2
    // waves made 6144x4096 at M = 512 1.5 waves (91 µs vs 59 µs with 256), while it halved 4096x4096 at
    // M = 32..512 and gate_up at M = 32..128.
    const int64_t waves256 = (static_cast<int64_t>(tiles_n) * ((m + 255) / 256) + sms - 1) / sms;
    const int64_t waves128 = (static_cast<int64_t>(tiles_n) * ((m + 127) / 128) + sms - 1) / sms;
    const int bm = m <= 32 ? 32 : m <= 64 ? 64 : waves128 * 115 < waves256 * 200 ? 128 : 256;
    CUtensorMap map, wmap;
    if (cudaError_t e = make_x_map(&map, x, m, k, bm); e != cudaSuccess) return e;
    if (cudaError_t e = make_w_map(&wmap, values, n, Fmt::kWords == 4 ? k : k / 2); e != cudaSuccess)
      return e;
    const int64_t tiles = static_cast<int64_t>(tiles_n) * ((m + bm - 1) / bm),
                  mn = static_cast<int64_t>(m) * n;
    const int splits = splitk_splits(tiles, (k + kStageK - 1) / kStageK, sms, mn, ws_floats);
    // note: without a split the grid is persistent, one block per SM walking the tiles: against one block a
    // tile, the Qwen3-8B sums at M = 4096 measured 2-4% faster for MXFP8 and 1-3% for MXFP4 on the H200
    // (bench/history/RESULTS-log.md, "Session 9 (lead) — issue #4: MX GEMM persistent grid").
    const int64_t blocks = splits > 1 ? tiles : std::min<int64_t>(tiles, sms);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
    // note: the staged 16-byte-store epilogue (gemm_mx_sm90.cuh) wherever no split writes f32 partials and y
    // rows are whole 16-byte chunks: against 2-byte stores from registers at M = 4096 on the H200, 6.5%
    // faster on the MXFP4 Qwen3-8B sum and 4-8% on the MXFP8 shapes but down_proj (noisy;
    // bench/history/RESULTS-log.md, "Session 10 (lead) — issue #4: the MX GEMM's epilogue and shared-memory
    // loads").
    const bool staged_store = splits == 1 && n % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    const bool tail = k % Fmt::kGroupK != 0;
    auto pick = [tail](auto t) {
      constexpr int b = decltype(t)::value;
      return tail ? gemm_mx_sm90<Fmt, true, b> : gemm_mx_sm90<Fmt, false, b>;
    };
    using std::integral_constant;
    auto kernel = bm == 256   ? pick(integral_constant<int, 256>{})
                  : bm == 128 ? pick(integral_constant<int, 128>{})
                  : bm == 64  ? pick(integral_constant<int, 64>{})
                              : pick(integral_constant<int, 32>{});
    kernel<<<grid, kSm90Threads, sm90_smem_bytes(bm), stream>>>(
        map, wmap, m, scales, yb, n, k, splits > 1 ? ws : nullptr, staged_store ? 1 : 0);
    if (splits > 1) {
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      splitk_reduce<<<static_cast<unsigned>((mn / 4 + 256) / 256), 256, 0, stream>>>(ws, splits, mn, yb);
    }
    return cudaGetLastError();
  }
  static const cudaError_t attr =
      cudaFuncSetAttribute(gemm_mx_sm80<Fmt>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm80SmemBytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(((n + kSm80BlockN - 1) / kSm80BlockN) * ((m + kSm80BlockM - 1) / kSm80BlockM));
  gemm_mx_sm80<Fmt><<<grid, kSm80Threads, kSm80SmemBytes, stream>>>(reinterpret_cast<const __nv_bfloat16*>(x),
                                                                    m, values, scales, yb, n, k);
  return cudaGetLastError();
}

}  // namespace mxq::cuda::gemm
