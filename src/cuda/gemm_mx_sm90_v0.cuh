// TEMPORARY (bench comparison only, removed once the default is chosen): the session-5 sm_90a MX GEMM, whose
// consumer warpgroups load their weight bytes from global memory themselves. MXQ_GEMM_SM90_VARIANT=0 runs it.
#pragma once

#include "cuda/gemm_mx_sm90.cuh"

namespace mxq::cuda::gemm {

inline constexpr int kV0Stages = 4;
constexpr int v0_raw_stages(int bm) { return bm == 256 ? 2 : 4; }
constexpr int v0_stage_bytes(int bm) { return bm * kStageK * 2; }
constexpr int v0_smem_bytes(int bm) { return kV0Stages * v0_stage_bytes(bm) + 1024 + 2 * kV0Stages * 8; }

// Grid: x = cdiv(n, 128) * cdiv(m, kBM) tiles (tile_of), y = K splits; 384 threads, v0_smem_bytes(kBM) of
// dynamic shared memory. Split-K (gridDim.y > 1, small grids): split z runs stages [z·c, z·c + c) of the
// cdiv(K, 64) (c = cdiv(stages, splits)) and stores its f32 partial tile, row scale applied, to
// ws[z][m][n]; splitk_reduce sums the splits in order into y (deterministic). ws is null without a split.
// kTail: K has a short last layout group (K % 64 for MXFP8, K % 128 for MXFP4); without one the weight
// loads need no bounds and the scale pairs are 2-byte aligned.
template <class Fmt, bool kTail, int kBM>
__global__ void __launch_bounds__(kSm90Threads, 1)
    gemm_mx_sm90_v0(const __grid_constant__ CUtensorMap xmap, int m, const uint8_t* __restrict__ wv,
                 const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k,
                 float* __restrict__ partial) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStageBytes = v0_stage_bytes(kBM);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kV0Stages * kStageBytes);
  uint64_t* empty = full + kV0Stages;
  const int wg = threadIdx.x / 128, all_stages = (k + kStageK - 1) / kStageK;
  const int chunk = (all_stages + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int s0 = static_cast<int>(blockIdx.y) * chunk, stages = min(chunk, all_stages - s0);
  int tile_n, tile_m;
  tile_of(blockIdx.x, (m + kBM - 1) / kBM, tile_n, tile_m);
  const int n0 = tile_n * kSm90BlockN, m0 = tile_m * kBM;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kV0Stages; ++i) mbar_init(full + i, 1), mbar_init(empty + i, 8);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one thread keeps the x ring full.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s) {
        const int slot = s % kV0Stages;
        if (s >= kV0Stages) mbar_wait(empty + slot, ((s / kV0Stages) - 1) & 1);
        mbar_expect_tx(full + slot, kStageBytes);
        tma_load_2d(ring + slot * kStageBytes, &xmap, (s0 + s) * kStageK, m0, full + slot);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_a = n0 + 64 * (wg - 1) + 16 * warp + g, row_b = row_a + 8;
    // note: rows past n read row n-1 (valid memory) and are never stored.
    const int64_t ra = min(row_a, n - 1), rb = min(row_b, n - 1);
    const int64_t row_bytes = Fmt::kWords == 4 ? k : k / 2;
    const int kb = k / 32;
    const uint8_t *va = wv + ra * row_bytes, *vb = wv + rb * row_bytes;
    const uint8_t *sa = ws + ra * kb, *sb = ws + rb * kb;
    const uint32_t bref_a = row_max_scale(sa, kb, t), bref_b = row_max_scale(sb, kb, t);

    float acc[kBM / 2];
#pragma unroll
    for (int i = 0; i < kBM / 2; ++i) acc[i] = 0.f;
    // note: kRaw stages of raw weight bytes in flight (s+2 .. s+1+kRaw while stage s runs): at small M a
    // stage's wgmmas are short and the global loads' latency is what a CTA waits on.
    constexpr int kRaw = v0_raw_stages(kBM);
    RawStage<Fmt::kWords> raw[kRaw][2];  // [stage % kRaw][row a, row b]
    uint32_t frag[3][4][4];              // [stage % 3][k-step][register]
    auto load_stage = [&](int s, RawStage<Fmt::kWords>(&r)[2]) {
      load_raw<Fmt, kTail>(va, sa, k, s0 + s, t, r[0]);
      load_raw<Fmt, kTail>(vb, sb, k, s0 + s, t, r[1]);
    };
    load_stage(0, raw[0]);
    if (stages > 1) load_stage(1, raw[1]);
    stage_fragments<Fmt, true>(raw[0][0], raw[0][1], bref_a, bref_b, t, frag[0]);
    if (stages > 1) stage_fragments<Fmt, true>(raw[1][0], raw[1][1], bref_a, bref_b, t, frag[1]);
#pragma unroll
    for (int q = 2; q < 2 + kRaw; ++q)
      if (q < stages) load_stage(q, raw[q % kRaw]);
    // One stage s (fragments in frag[F = s % 3], raw[R = (s + 2) % kRaw] holding stage s+2): wait for its x
    // tile, issue 4 wgmmas, retire stage s-1 (wait_group 1) and free its slot, then decode stage s+2 into
    // the fragments stage s-1 used and refill raw[R] with stage s+2+kRaw. Two stages stay queued on the
    // tensor cores while a third is decoded.
    // note: fragments are written 2 stages ahead, never while the wgmma they feed has an older wgmma in
    // flight that was issued after the write: ptxas then keeps the wgmmas asynchronous (writing them one
    // stage ahead with wait_group 1 triggers C7513 serialisation).
    auto stage = [&](int s, auto fi, auto ri) {
      constexpr int F = decltype(fi)::value, R = decltype(ri)::value;
      const int slot = s % kV0Stages;
      mbar_wait(full + slot, (s / kV0Stages) & 1);
      const uint8_t* tile = ring + slot * kStageBytes;
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kBM == 256)
          wgmma_m64n256k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
        else if constexpr (kBM == 128)
          wgmma_m64n128k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
        else if constexpr (kBM == 64)
          wgmma_m64n64k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
        else
          wgmma_m64n32k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
      }
      wgmma_commit();
      wgmma_wait<1>();
      if (s > 0 && lane == 0) mbar_arrive(empty + (s + kV0Stages - 1) % kV0Stages);
      if (s + 2 < stages) {
        stage_fragments<Fmt, true>(raw[R][0], raw[R][1], bref_a, bref_b, t, frag[(F + 2) % 3]);
        if (s + 2 + kRaw < stages) load_stage(s + 2 + kRaw, raw[R]);
      }
    };
    // note: the register indices must be compile-time: the loop body is the lcm(3, kRaw) stages of one
    // period, each with its own (F, R); the fold stops at the last stage.
    constexpr int kPeriod = kRaw % 3 == 0 ? kRaw : 3 * kRaw;  // lcm(3, kRaw)
    for (int s = 0; s < stages; s += kPeriod) {
      [&]<int... O>(std::integer_sequence<int, O...>) {
        (void)((s + O < stages
                    ? (stage(s + O, std::integral_constant<int, O % 3>{},
                             std::integral_constant<int, (O + 2) % kRaw>{}),
                       true)
                    : false) &&
               ...);
      }(std::make_integer_sequence<int, kPeriod>{});
    }
    wgmma_wait<0>();

    // Epilogue: acc[4j + c] holds row (c < 2 ? g : g+8), activation column 8j + 2t + (c & 1).
    const float post_a = post_scale(bref_a), post_b = post_scale(bref_b);
    float* part = partial ? partial + static_cast<int64_t>(blockIdx.y) * m * n : nullptr;
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const int col = m0 + 8 * j + 2 * t;
      if (part) {
        store_pair(part, m, n, row_a, col, acc[4 * j] * post_a, acc[4 * j + 1] * post_a);
        store_pair(part, m, n, row_b, col, acc[4 * j + 2] * post_b, acc[4 * j + 3] * post_b);
      } else {
        store_pair(y, m, n, row_a, col, acc[4 * j] * post_a, acc[4 * j + 1] * post_a);
        store_pair(y, m, n, row_b, col, acc[4 * j + 2] * post_b, acc[4 * j + 3] * post_b);
      }
    }
  }
#endif
}

}  // namespace mxq::cuda::gemm
