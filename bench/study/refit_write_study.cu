// Study (not product code, not built by CMake): which shape of a refit-like write kernel reaches the copy
// ceiling while it also computes and stores XXH3 lane sums per 1 KiB block (as refit_batch.cu and
// branch refit8's refit_write_warp.cu do; keys here are stand-ins, the arithmetic and bytes are the same).
// 7.163 GB (the size `mxq-bench refit` moves), random bytes, 7 runs each, median, against cudaMemcpy D2D.
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -o refit_write_study refit_write_study.cu
//   ./refit_write_study
// Results: bench/RESULTS.md, Refit write study.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ uint64_t mul_term(uint64_t w, uint64_t k) {
  const uint64_t d = w ^ k;
  return uint64_t{static_cast<uint32_t>(d)} * (d >> 32);
}
__device__ __forceinline__ uint64_t kw(int j) { return 0x9E3779B185EBCA87ull * (j + 1) ^ 0xC2B2AE3D27D4EB4Full; }

__device__ unsigned* g_counters;
template <int kSync>
__device__ __forceinline__ void count_unit(uint64_t base, int lane) {
  if (kSync == 0) return;
  __syncwarp();
  unsigned* at = g_counters + ((base >> 20) & 4095) * 32;  // one word a MiB region, 128-byte apart
  unsigned before = 0;
  if (lane == 0) {
    if (kSync == 1) asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(at) : "memory");
    if (kSync == 2) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(at) : "memory");
    if (kSync == 3) asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(at) : "memory");
  }
  (void)before;
}
template <bool kHash, int kLoads, int kSync = 0>
__device__ __forceinline__ void do_unit(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, uint64_t base,
                                        uint64_t* __restrict__ sums, int lane, const uint64_t (&key)[2][2]) {
  uint4 v[kLoads];
#pragma unroll
  for (int e = 0; e < kLoads; ++e) v[e] = __ldcs(reinterpret_cast<const uint4*>(src + base + 512 * e + 16 * lane));
  if (kHash) {
    const int u = lane & 3;
#pragma unroll
    for (int e = 0; e < kLoads; e += 2) {
      uint64_t a0 = 0, a1 = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4& w = v[e + h];
        const uint64_t w0 = uint64_t{w.x} | uint64_t{w.y} << 32, w1 = uint64_t{w.z} | uint64_t{w.w} << 32;
        a0 += mul_term(w0, key[h][0]) + w1;
        a1 += mul_term(w1, key[h][1]) + w0;
      }
#pragma unroll
      for (int m = 4; m < 32; m *= 2) {
        a0 += __shfl_xor_sync(0xFFFFFFFFu, a0, m);
        a1 += __shfl_xor_sync(0xFFFFFFFFu, a1, m);
      }
      if (lane < 4) {
        const uint64_t block = (base + 512 * e) / 1024;
        *reinterpret_cast<ulonglong2*>(sums + block * 8 + 2 * u) = make_ulonglong2(a0, a1);
      }
    }
  }
  count_unit<kSync>(base, lane);
#pragma unroll
  for (int e = 0; e < kLoads; ++e) __stcs(reinterpret_cast<uint4*>(dst + base + 512 * e + 16 * lane), v[e]);
}

__device__ __forceinline__ void keys(int lane, uint64_t (&key)[2][2]) {
  const int u = lane & 3;
  for (int h = 0; h < 2; ++h) {
    const int j = 8 * h + (lane >> 2) + 2 * u;
    key[h][0] = kw(j), key[h][1] = kw(j + 1);
  }
}

// Persistent: warp gw takes units gw, gw + W, ... (unit = kLoads * 512 bytes).
template <bool kHash, int kLoads>
__global__ void __launch_bounds__(256) grid_stride(const uint8_t* src, uint8_t* dst, uint64_t bytes, uint64_t* sums) {
  const int lane = threadIdx.x & 31;
  const uint64_t W = uint64_t{gridDim.x} * (blockDim.x / 32);
  uint64_t key[2][2];
  keys(lane, key);
  const uint64_t unit = kLoads * 512ull, units = bytes / unit;
  for (uint64_t g = uint64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; g < units; g += W)
    do_unit<kHash, kLoads>(src, dst, g * unit, sums, lane, key);
}

// One tile per block (kTile bytes, 4 warps, each a quarter in units of kLoads * 512 bytes).
template <bool kHash, int kLoads, int kTile>
__global__ void __launch_bounds__(128) tile_block(const uint8_t* src, uint8_t* dst, uint64_t bytes, uint64_t* sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t key[2][2];
  keys(lane, key);
  const uint64_t base = uint64_t{blockIdx.x} * kTile + uint64_t{warp} * (kTile / 4);
#pragma unroll 1
  for (int o = 0; o < kTile / 4; o += kLoads * 512) do_unit<kHash, kLoads>(src, dst, base + o, sums, lane, key);
}

// A warp-sized block per tile (kTile bytes).
template <bool kHash, int kLoads, int kTile, int kSync = 0, int kSmem = 0>
__global__ void __launch_bounds__(32) tile_warp(const uint8_t* src, uint8_t* dst, uint64_t bytes, uint64_t* sums) {
  __shared__ uint64_t pad[kSmem > 0 ? kSmem / 8 : 1];
  if (kSmem > 0 && bytes == 1) pad[threadIdx.x] = 1, sums[0] = pad[threadIdx.x ^ 1];
  const int lane = threadIdx.x & 31;
  uint64_t key[2][2];
  keys(lane, key);
  const uint64_t base = uint64_t{blockIdx.x} * kTile;
#pragma unroll 1
  for (int o = 0; o < kTile; o += kLoads * 512) do_unit<kHash, kLoads, kSync>(src, dst, base + o, sums, lane, key);
}
// Blocks of 4 warps per tile, one release add per tile after a barrier (refit_batch.cu's count).
template <int kLoads, int kTile>
__global__ void __launch_bounds__(128) tile_block_count(const uint8_t* src, uint8_t* dst, uint64_t bytes, uint64_t* sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t key[2][2];
  keys(lane, key);
  const uint64_t base = uint64_t{blockIdx.x} * kTile + uint64_t{warp} * (kTile / 4);
#pragma unroll 1
  for (int o = 0; o < kTile / 4; o += kLoads * 512) do_unit<true, kLoads>(src, dst, base + o, sums, lane, key);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    unsigned* at = g_counters + ((base >> 20) & 4095) * 32;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(at) : "memory");
    if (before == 0xFFFFFFFFu) sums[0] = 0;
  }
}

__global__ void fill(uint64_t* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    p[i] = z ^ (z >> 31);
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const uint64_t bytes = 109300ull * 65536;  // 7.163 GB, the refit bench's size
  uint8_t *src, *dst;
  uint64_t* sums;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMalloc(&sums, bytes / 16));
  fill<<<4096, 256>>>(reinterpret_cast<uint64_t*>(src), bytes / 8, 7);
  unsigned* counters;
  CK(cudaMalloc(&counters, 4096 * 128));
  CK(cudaMemset(counters, 0, 4096 * 128));
  CK(cudaMemcpyToSymbol(g_counters, &counters, sizeof(counters)));
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto time = [&](auto&& f) {
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      CK(cudaEventRecord(a));
      f();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      CK(cudaGetLastError());
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[3];
  };
  const float d2d = time([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  printf("%-44s %8.3f ms  %6.1f%%\n", "cudaMemcpy D2D", d2d, 100.0);
  auto row = [&](const char* name, auto&& f) {
    const float ms = time(f);
    printf("%-44s %8.3f ms  %6.1f%%\n", name, ms, 100.0 * d2d / ms);
  };
#define GS(H, L, BPS) row("grid-stride " #H " loads" #L " blocks/SM " #BPS, [&] { grid_stride<H, L><<<sms * BPS, 256>>>(src, dst, bytes, sums); })
  GS(false, 4, 8); GS(false, 8, 4); GS(false, 8, 8);
  GS(true, 4, 8); GS(true, 8, 4); GS(true, 8, 6); GS(true, 8, 8);
#define TB(H, L, T) row("tile-block " #H " loads" #L " tile " #T, [&] { tile_block<H, L, T><<<bytes / T, 128>>>(src, dst, bytes, sums); })
  TB(false, 8, 65536); TB(true, 8, 65536); TB(false, 8, 16384); TB(true, 8, 16384); TB(true, 4, 16384); TB(true, 8, 262144);
#define TW(H, L, T) row("tile-warp " #H " loads" #L " tile " #T, [&] { tile_warp<H, L, T><<<bytes / T, 32>>>(src, dst, bytes, sums); })
  TW(false, 8, 4096); TW(true, 8, 4096); TW(true, 8, 16384);
#define TS(S, SM) row("tile-warp hash 4096 sync" #S " smem" #SM, [&] { tile_warp<true, 8, 4096, S, SM><<<bytes / 4096, 32>>>(src, dst, bytes, sums); })
  TS(0, 6144); TS(1, 0); TS(2, 0); TS(3, 0); TS(1, 6144);
#define TC(T) row("tile-block hash + release add a tile " #T, [&] { tile_block_count<8, T><<<bytes / T, 128>>>(src, dst, bytes, sums); })
  TC(16384); TC(65536);
  return 0;
}
