// The sm_90a MX GEMM: wgmma with the weights as A from registers, activations as B from shared memory.
// Computes Y^T = W · X^T per tile: 128 weight rows (N) x 256 (or 128) activation rows (M), K in 64-wide
// stages. Warp-specialised, 3 warpgroups: warpgroup 0 has one thread issuing TMA copies of the x tile (256
// rows x 64 bf16, 128-byte swizzle, 4-stage mbarrier ring); warpgroups 1 and 2 own 64 weight rows each: every
// lane loads its 16 B per row per layout group straight from global memory (2 stages before decoding, GEMV
// layout), reorders them to natural k order in the quad (gemm_mx_kernel.cuh), decodes with the scale folded
// in and issues wgmma m64n256k16 or m64n128k16 (f32 accumulators, 128 or 64 registers per thread) from a ring
// of 3 A-register sets: stage s+2 is decoded while stages s and s+1 are queued on the tensor cores.
#pragma once

#include <cuda.h>

#include <type_traits>
#include <utility>

#include "cuda/gemm_mx_kernel.cuh"

namespace mxq::cuda::gemm {

// note: kBM (activation rows per tile) is 256, or 128 when 256-row tiles would leave SMs idle; 64 or 32 when M
// itself is that small (a 128-row tile would spend 2-4x the tensor time on zero rows).
inline constexpr int kSm90BlockN = 128, kSm90Stages = 4, kSm90Threads = 384;
// Raw weight stages loaded ahead of decoding: 4 for 128-row activation tiles (hides more load latency where a
// stage's wgmmas are short); 2 for 256-row tiles, whose 128 accumulator registers leave no room (ptxas
// spills ~1 KB with 4).
constexpr int sm90_raw_stages(int bm) { return bm == 256 ? 2 : 4; }
constexpr int sm90_stage_bytes(int bm) { return bm * kStageK * 2; }
// note: + 1024 so the stage ring can start on a 1024-byte boundary (128-byte swizzle atoms), + barriers.
constexpr int sm90_smem_bytes(int bm) {
  return kSm90Stages * sm90_stage_bytes(bm) + 1024 + 2 * kSm90Stages * 8;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// K-major operand, 128-byte swizzle: rows of 128 B, 8-row atoms 1024 B apart (SBO); LBO unused.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) | (1ull << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// d[128] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 256).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// d[64] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 128).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// d[32] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 64).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// d[16] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 32).
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}
#endif

// Grid: x = cdiv(n, 128) * cdiv(m, kBM) tiles (tile_of), y = K splits; 384 threads, sm90_smem_bytes(kBM) of
// dynamic shared memory. Split-K (gridDim.y > 1, small grids): split z runs stages [z·c, z·c + c) of the
// cdiv(K, 64) (c = cdiv(stages, splits)) and stores its f32 partial tile, row scale applied, to
// ws[z][m][n]; splitk_reduce sums the splits in order into y (deterministic). ws is null without a split.
// kTail: K has a short last layout group (K % 64 for MXFP8, K % 128 for MXFP4); without one the weight
// loads need no bounds and the scale pairs are 2-byte aligned.
template <class Fmt, bool kTail, int kBM>
__global__ void __launch_bounds__(kSm90Threads, 1)
    gemm_mx_sm90(const __grid_constant__ CUtensorMap xmap, int m, const uint8_t* __restrict__ wv,
                 const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k,
                 float* __restrict__ partial) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStageBytes = sm90_stage_bytes(kBM);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kSm90Stages * kStageBytes);
  uint64_t* empty = full + kSm90Stages;
  const int wg = threadIdx.x / 128, all_stages = (k + kStageK - 1) / kStageK;
  const int chunk = (all_stages + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int s0 = static_cast<int>(blockIdx.y) * chunk, stages = min(chunk, all_stages - s0);
  int tile_n, tile_m;
  tile_of(blockIdx.x, (m + kBM - 1) / kBM, tile_n, tile_m);
  const int n0 = tile_n * kSm90BlockN, m0 = tile_m * kBM;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kSm90Stages; ++i) mbar_init(full + i, 1), mbar_init(empty + i, 8);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one thread keeps the x ring full.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s) {
        const int slot = s % kSm90Stages;
        if (s >= kSm90Stages) mbar_wait(empty + slot, ((s / kSm90Stages) - 1) & 1);
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
    constexpr int kRaw = sm90_raw_stages(kBM);
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
      const int slot = s % kSm90Stages;
      mbar_wait(full + slot, (s / kSm90Stages) & 1);
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
      if (s > 0 && lane == 0) mbar_arrive(empty + (s + kSm90Stages - 1) % kSm90Stages);
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

// y [m, n] bf16 = the sum over z of ws[z][m][n] (f32), z in order: 4 elements a thread. note: internal
// linkage, one copy per format's translation unit.
namespace {
__global__ void splitk_reduce(const float* __restrict__ ws, int splits, int64_t count, __nv_bfloat16* y) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= count) return;
  if (i + 4 <= count && count % 4 == 0) {
    float4 acc = *reinterpret_cast<const float4*>(ws + i);
    for (int z = 1; z < splits; ++z) {
      const float4 v = *reinterpret_cast<const float4*>(ws + z * count + i);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y + i);
    out[0] = __floats2bfloat162_rn(acc.x, acc.y);
    out[1] = __floats2bfloat162_rn(acc.z, acc.w);
    return;
  }
  for (int64_t e = i; e < min(count, i + 4); ++e) {
    float acc = ws[e];
    for (int z = 1; z < splits; ++z) acc += ws[z * count + e];
    y[e] = __float2bfloat16_rn(acc);
  }
}
}  // namespace

}  // namespace mxq::cuda::gemm
