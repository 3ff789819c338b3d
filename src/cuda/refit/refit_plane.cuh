// Device-side reads of a DevicePlane (refit_launch.h) in canonical coordinates: one byte, or one 8-byte
// little-endian word, through the layout's tables; and the job lookup of the batched kernels. Used by the
// scatter, sparse decode, incremental-sum and XXH3 checksum kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"

namespace mxq::cuda {

// The unsigned type of R bytes (R = 1, 2, 4, 8, 16): one load or store moves a run of a separable plane.
template <int R>
struct Unit;
template <>
struct Unit<1> {
  using T = uint8_t;
};
template <>
struct Unit<2> {
  using T = uint16_t;
};
template <>
struct Unit<4> {
  using T = uint32_t;
};
template <>
struct Unit<8> {
  using T = uint2;
};
template <>
struct Unit<16> {
  using T = uint4;
};

// (row, column) of canonical byte q; 32-bit division when it fits (the common case, and much cheaper).
__device__ __forceinline__ void row_col(const DevicePlane& p, uint64_t q, int64_t& r, int64_t& c) {
  const auto w = static_cast<uint64_t>(p.row_bytes);
  if (q <= 0xFFFFFFFFull && w <= 0xFFFFFFFFull) {
    const uint32_t rr = static_cast<uint32_t>(q) / static_cast<uint32_t>(w);
    r = rr;
    c = static_cast<int64_t>(static_cast<uint32_t>(q) - rr * static_cast<uint32_t>(w));
  } else {
    r = static_cast<int64_t>(q / w);
    c = static_cast<int64_t>(q - static_cast<uint64_t>(r) * w);
  }
}

__device__ __forceinline__ int64_t native_offset(const DevicePlane& p, uint64_t q) {
  if (p.identity()) return static_cast<int64_t>(q);
  int64_t r, c;
  row_col(p, q, r, c);
  return p.row_off[r] + p.col_off[c];
}

// 8 canonical bytes from (r, c) of a separable plane, c % min(run, 8) == 0 and c + 8 <= row_bytes.
__device__ __forceinline__ uint64_t row_word(const DevicePlane& p, int64_t r, int64_t c) {
  const uint8_t* base = p.native + p.row_off[r];
  if (p.run >= 8) return *reinterpret_cast<const uint64_t*>(base + p.col_off[c]);
  uint64_t w = 0;
  if (p.run == 4) {
    w = *reinterpret_cast<const uint32_t*>(base + p.col_off[c]);
    return w | uint64_t{*reinterpret_cast<const uint32_t*>(base + p.col_off[c + 4])} << 32;
  }
  if (p.run == 2) {
    for (int k = 0; k < 4; ++k)
      w |= uint64_t{*reinterpret_cast<const uint16_t*>(base + p.col_off[c + 2 * k])} << (16 * k);
    return w;
  }
  for (int k = 0; k < 8; ++k) w |= uint64_t{base[p.col_off[c + k]]} << (8 * k);
  return w;
}

__device__ __forceinline__ uint64_t bytewise_word(const DevicePlane& p, uint64_t q) {
  uint64_t w = 0;
  for (int k = 0; k < 8; ++k) w |= uint64_t{p.native[native_offset(p, q + k)]} << (8 * k);
  return w;
}

// Canonical bytes q..q+7 of the plane (q + 8 <= bytes()).
__device__ __forceinline__ uint64_t plane_word(const DevicePlane& p, uint64_t q) {
  if (p.identity()) {
    if (q % 8 == 0) return *reinterpret_cast<const uint64_t*>(p.native + q);
    return bytewise_word(p, q);
  }
  int64_t r, c;
  row_col(p, q, r, c);
  const int align = p.run < 8 ? p.run : 8;
  if (c % align == 0 && c + 8 <= p.row_bytes) return row_word(p, r, c);
  return bytewise_word(p, q);
}

// The job of batch item x: the last j with first[j] <= x, for x < first[n] (first: n + 1 non-decreasing
// words, a job's first item). One thread per item of all jobs finds its job by this binary search.
__device__ __forceinline__ int job_of(const uint64_t* first, int n, uint64_t x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace mxq::cuda
