// Third-party native layouts as prepare routines (canonical planes → native planes, host memory), written
// from the formulas in spec/formats.md "Layouts" and reference_notes.md §5. mxq never trusts them directly:
// probe_layout learns each one's permutation and the tests hold them against torch re-typings of the
// vLLM / FlashInfer sources (tests/golden/make_layout_golden.py).
//
// Every routine takes the tensor's geometry (format, [E,] N, K) and refuses, by layout name and with the
// expected vs actual value, a format or shape its kernel does not take. Experts are prepared one by one and
// concatenated, as vLLM does.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "layout/layout.h"
#include "layout/probe.h"

namespace mxq {

// Row-major, both planes as stored: the CPU backend.
Result<HostPlanes> prepare_row_major(const TensorGeometry& g, const HostPlanes& canonical);
// CuTe-DSL dense weight: `weight.t()` is a view over the same [N, K] bytes, so no byte moves.
Result<HostPlanes> prepare_transposed_view(const TensorGeometry& g, const HostPlanes& canonical);
// CUTLASS / FlashInfer SM100 scale factors: values as stored, E8M0 scales in the 128x4 swizzle.
Result<HostPlanes> prepare_scale_swizzle_128x4(const TensorGeometry& g, const HostPlanes& canonical);
// FlashInfer FP8 block-scale GEMM (vLLM prepare_flashinfer_fp8_blockscale_weight_scales): FP8-B128 values
// as stored, f32 scales [N/128, K/128] transposed to MN-major [K/128, N/128]; 4-byte entries move whole.
Result<HostPlanes> prepare_scales_mn_major(const TensorGeometry& g, const HostPlanes& canonical);
// FlashInfer trtllm-gen fused MoE, w13 [E, 2I, H]: [gate; up] → [up; gate], gate/up rows interleaved,
// 32-row shuffle; scales take the same rows, then the 128x4 swizzle.
Result<HostPlanes> prepare_trtllm_moe_w13(const TensorGeometry& g, const HostPlanes& canonical);
// FlashInfer trtllm-gen fused MoE, w2 [E, H, I]: 32-row shuffle; scales shuffled, then swizzled.
Result<HostPlanes> prepare_trtllm_moe_w2(const TensorGeometry& g, const HostPlanes& canonical);
// vLLM Marlin W8A16 / W4A16 (MX): weight tiles per marlin_utils_test.get_weight_perm, scales
// marlin_permute_scales + the within-4 [0,2,1,3] of *_marlin_process_scales. MXFP4 values pack 8 nibbles
// of different K into one int32, so probing refuses that plane (a nibble-granular layout).
Result<HostPlanes> prepare_marlin(const TensorGeometry& g, const HostPlanes& canonical);

// note: 128x4 swizzle of one [R, C] E8M0 matrix, Rp = roundup(R, 128), KT = roundup(C, 4) / 4:
// off(r, c) = (r/128)·KT·512 + (c/4)·512 + (r%32)·16 + ((r%128)/32)·4 + c%4.
int64_t swizzle_128x4_offset(int64_t r, int64_t c, int64_t cols);
int64_t swizzle_128x4_bytes(int64_t rows, int64_t cols);  // Rp·Cp, padding included

using PrepareRoutine = Result<HostPlanes> (*)(const TensorGeometry&, const HostPlanes&);
struct NamedPrepare {
  std::string_view name;  // the layout / kernel name probe_layout records
  PrepareRoutine prepare;
};
std::span<const NamedPrepare> builtin_prepares();

// probe_layout over the built-in prepare named `layout`; an unknown name is refused with the known ones.
Result<Layout> probe_builtin(std::string_view tensor, std::string_view layout, Format f,
                             std::span<const int64_t> shape);

}  // namespace mxq
