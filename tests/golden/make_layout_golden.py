#!/usr/bin/env python3
"""Golden native-position maps for the layout module (tests/layout/layout_golden_test.cpp).

Run on a machine with torch (not CI):  python3 tests/golden/make_layout_golden.py
Writes tests/golden/layout/<case>_<plane>.npy: int16/int32 [native bytes], entry q = the canonical byte index that
native byte q holds, -1 for padding. Canonical planes are byte matrices (values [E*N, K*bits/8], scales
[E*N, K/32]); each case pushes index-valued planes through torch re-typings of the public transforms:

- vLLM vllm/model_executor/layers/quantization/utils/mxfp8_utils.py `swizzle_mxfp8_scale`
  (pad to [128·m, 4·k] with zeros, view(m, 4, 32, k, 4).transpose(1, 3)), the 128x4 scale layout; it also
  stands in for FlashInfer's C++ `block_scale_interleave` (reference_notes.md §5.1 [M]: same bytes).
- vLLM vllm/model_executor/layers/quantization/utils/flashinfer_utils.py `swap_w13_to_w31`
  (reshape(-1, 2, rows // 2, cols).flip(dims=[1])).
- FlashInfer flashinfer/fused_moe/core.py `get_reorder_rows_for_gated_act_gemm_row_indices` /
  `reorder_rows_for_gated_act_gemm`, flashinfer/utils.py `get_shuffle_matrix_a_row_indices`
  (srcToDstBlk32RowMap), `shuffle_matrix_a`, `shuffle_matrix_sf_a` (row gather + 128x4 interleave); the
  order is vLLM's MXFP8 trtllm MoE preparation: swap, reorder (w13 only), shuffle(·, 128).
- vLLM `prepare_flashinfer_fp8_blockscale_weight_scales` (FlashInfer FP8 block-scale path):
  scales.transpose(0, 1).contiguous() on f32 [N/128, K/128], run on [R, C, 4] byte indices (the f32 bytes
  ride along as a trailing dimension).
- vLLM vllm/model_executor/layers/quantization/utils/marlin_utils_test.py `get_weight_perm`,
  `marlin_permute_weights`, `marlin_weights` (the numpy int32 pack, run on base-256 digits of the indices),
  marlin_utils.py `get_scale_perms` / `marlin_permute_scales`, and marlin_utils_fp8.py
  `prepare_mxfp8_layer_for_marlin` (pack_fp8_to_int32(w).T is q = W^T; scales .T) with
  `mxfp8_marlin_process_scales` (view(-1, 4)[:, [0, 2, 1, 3]]; its final e8m0 cast is elementwise).
"""
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout")


def save(name, arr):
    arr = np.asarray(arr)
    # int16 where the indices fit, to keep the committed files small
    arr = np.ascontiguousarray(arr.astype(np.int16 if arr.max() < 2**15 else np.int32))
    np.save(os.path.join(OUT, name + ".npy"), arr)


def index_plane(*shape):
    """Canonical byte indices + 1, so that 0 marks padding after a transform."""
    n = int(np.prod(shape))
    return torch.arange(1, n + 1, dtype=torch.int64).reshape(shape)


# ---- vLLM mxfp8_utils.py swizzle_mxfp8_scale ----------------------------------------------------------
def swizzle_mxfp8_scale(sf, M, K):
    scaling_vector_size = 32
    factor = scaling_vector_size * 4
    num_m_tiles = (M + 127) // 128
    num_k_tiles = (K + factor - 1) // factor
    sf_padded = torch.zeros((num_m_tiles * 128, num_k_tiles * 4), dtype=sf.dtype)
    sf_padded[:M, : K // scaling_vector_size] = sf
    sf_reshaped = sf_padded.view(num_m_tiles, 4, 32, num_k_tiles, 4)
    return sf_reshaped.transpose(1, 3).contiguous().view(-1)


# ---- vLLM flashinfer_utils.py / FlashInfer fused_moe/core.py, utils.py -----------------------------------
def swap_w13_to_w31(x):
    return x.reshape(-1, 2, x.shape[-2] // 2, x.shape[-1]).flip(dims=[1]).reshape(x.shape)


def get_reorder_rows_for_gated_act_gemm_row_indices(x):
    M = x.shape[0]
    row_indices = torch.arange(M, dtype=torch.long)
    top = row_indices[: (M + 1) // 2]
    bot = row_indices[(M + 1) // 2 :]
    permuted = torch.empty_like(row_indices)
    permuted[0::2] = top
    permuted[1::2] = bot
    return permuted


SRC_TO_DST_BLK32_ROW_MAP = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                            4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]


def get_shuffle_matrix_a_row_indices(x, epilogue_tile_m):
    assert epilogue_tile_m % 128 == 0  # 32-row blocks
    M = x.shape[0]
    block = 32
    assert M % block == 0
    row_indices = torch.empty(M, dtype=torch.long)
    for old_row in range(M):
        new_row = old_row // block * block + SRC_TO_DST_BLK32_ROW_MAP[old_row % block]
        row_indices[new_row] = old_row
    return row_indices


def shuffle_matrix_a(x, epilogue_tile_m):
    return x[get_shuffle_matrix_a_row_indices(x, epilogue_tile_m)]


def shuffle_matrix_sf_a(sf, epilogue_tile_m, K):
    M, cols = sf.shape
    assert M % 128 == 0 and cols % 4 == 0
    shuffled = sf[get_shuffle_matrix_a_row_indices(sf, epilogue_tile_m)]
    return swizzle_mxfp8_scale(shuffled, M, K)


def trtllm_moe(values, scales, K, gated):
    """values [E, M, W] bytes, scales [E, M, K/32]; per expert, concatenated (vLLM prepares experts in a loop)."""
    if gated:
        values, scales = swap_w13_to_w31(values), swap_w13_to_w31(scales)
    out_v, out_s = [], []
    for e in range(values.shape[0]):
        v, s = values[e], scales[e]
        if gated:
            v = v[get_reorder_rows_for_gated_act_gemm_row_indices(v)]
            s = s[get_reorder_rows_for_gated_act_gemm_row_indices(s)]
        out_v.append(shuffle_matrix_a(v, 128).reshape(-1))
        out_s.append(shuffle_matrix_sf_a(s, 128, K))
    return torch.cat(out_v), torch.cat(out_s)


# ---- vLLM marlin_utils_test.py / marlin_utils.py / marlin_utils_fp8.py -----------------------------------
def get_weight_perm(num_bits):
    perm_list = []
    for i in range(32):
        perm1 = []
        col = i // 4
        for block in [0, 1]:
            for row in [2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1]:
                perm1.append(16 * row + col + 8 * block)
        for j in range(4):
            perm_list.extend([p + 256 * j for p in perm1])
    perm = np.array(perm_list)
    interleave = np.array([0, 2, 4, 6, 1, 3, 5, 7]) if num_bits == 4 else np.array([0, 2, 1, 3])
    perm = perm.reshape((-1, len(interleave)))[:, interleave].ravel()
    return torch.from_numpy(perm)


def marlin_permute_weights(q_w, size_k, size_n, perm, tile=16):
    q_w = q_w.reshape((size_k // tile, tile, size_n // tile, tile))
    q_w = q_w.permute((0, 2, 1, 3))
    q_w = q_w.reshape((size_k // tile, size_n * tile))
    return q_w.reshape((-1, perm.numel()))[:, perm].reshape(q_w.shape)


def marlin_weights(q_w, size_k, size_n, num_bits, perm):
    q_w = marlin_permute_weights(q_w, size_k, size_n, perm)
    pack_factor = 32 // num_bits
    q_w = q_w.cpu().numpy().astype(np.uint32)
    q_packed = np.zeros((q_w.shape[0], q_w.shape[1] // pack_factor), dtype=np.uint32)
    for i in range(pack_factor):
        q_packed |= q_w[:, i::pack_factor] << num_bits * i
    return q_packed


def get_scale_perms():
    scale_perm = []
    for i in range(8):
        scale_perm.extend([i + 8 * j for j in range(8)])
    scale_perm_single = []
    for i in range(4):
        scale_perm_single.extend([2 * i + j for j in [0, 1, 8, 9, 16, 17, 24, 25]])
    return scale_perm, scale_perm_single


def marlin_permute_scales(s, size_k, size_n, group_size):
    scale_perm, scale_perm_single = get_scale_perms()
    if group_size < size_k and group_size != -1:
        s = s.reshape((-1, len(scale_perm)))[:, scale_perm]
    else:
        s = s.reshape((-1, len(scale_perm_single)))[:, scale_perm_single]
    return s.reshape((-1, size_n)).contiguous()


def mxfp8_marlin_process_scales(marlin_scales):
    return marlin_scales.view(-1, 4)[:, [0, 2, 1, 3]].reshape(marlin_scales.size(0), -1)


def marlin_mxfp8(values, scales, N, K):
    """values [E, N, K] canonical byte indices (no +1: Marlin has no padding), scales [E, N, K/32]."""
    perm = get_weight_perm(8)
    out_v, out_s = [], []
    for e in range(values.shape[0]):
        q_w = values[e].T.contiguous()  # pack_fp8_to_int32(w, size_k_first=False).T: GPTQ [K/4, N] int32
        native = np.zeros(N * K, dtype=np.int64)
        for d in range(3):  # indices < 2^24: three base-256 digit planes through the real int32 pack
            digits = (q_w >> (8 * d)) & 0xFF
            packed = marlin_weights(digits, K, N, 8, perm)
            native += packed.view(np.uint8).reshape(-1).astype(np.int64) << (8 * d)
        out_v.append(torch.from_numpy(native))
        s = scales[e].T.contiguous()
        out_s.append(mxfp8_marlin_process_scales(marlin_permute_scales(s, K, N, 32)).reshape(-1))
    return torch.cat(out_v), torch.cat(out_s)


# ---- vLLM FlashInfer FP8 block-scale weight scales ----------------------------------------------------
def prepare_flashinfer_fp8_blockscale_weight_scales(scales):
    assert scales.ndim == 3  # [R, C, 4]: f32 entries as 4 index bytes
    return scales.transpose(0, 1).contiguous()


# ---- cases ------------------------------------------------------------------------------------------------
def swizzle_case(name, E, N, K):
    scales = index_plane(E, N, K // 32)
    out = torch.cat([swizzle_mxfp8_scale(scales[e], N, K) for e in range(E)])
    save(f"{name}_scales", out.numpy() - 1)


def trtllm_case(name, bits, E, N, K, gated):
    values = index_plane(E, N, K * bits // 8)
    scales = index_plane(E, N, K // 32)
    v, s = trtllm_moe(values, scales, K, gated)
    save(f"{name}_values", v.numpy() - 1)
    save(f"{name}_scales", s.numpy() - 1)


def mn_major_case(name, E, N, K):
    R, C = -(-N // 128), -(-K // 128)
    scales = index_plane(E, R, C, 4)
    out = torch.cat([prepare_flashinfer_fp8_blockscale_weight_scales(scales[e]).reshape(-1) for e in range(E)])
    save(f"{name}_scales", out.numpy() - 1)


def marlin_case(name, E, N, K):
    values = index_plane(E, N, K) - 1
    scales = index_plane(E, N, K // 32) - 1
    v, s = marlin_mxfp8(values, scales, N, K)
    save(f"{name}_values", v.numpy())
    save(f"{name}_scales", s.numpy())


def main():
    os.makedirs(OUT, exist_ok=True)
    # names must match kGoldenCases in tests/layout/layout_golden_test.cpp
    swizzle_case("swizzle_mxfp8_200x320", 1, 200, 320)
    swizzle_case("swizzle_mxfp8_2x130x96", 2, 130, 96)
    swizzle_case("swizzle_mxfp4_1x32", 1, 1, 32)
    trtllm_case("trtllm_w13_mxfp8_2x128x128", 8, 2, 128, 128, True)
    trtllm_case("trtllm_w13_mxfp4_1x256x128", 4, 1, 256, 128, True)
    trtllm_case("trtllm_w2_mxfp8_1x128x128", 8, 1, 128, 128, False)
    mn_major_case("mn_major_b128_520x390", 1, 520, 390)
    mn_major_case("mn_major_b128_2x300x260", 2, 300, 260)
    marlin_case("marlin_mxfp8_64x64", 1, 64, 64)
    marlin_case("marlin_mxfp8_128x96", 1, 128, 96)
    marlin_case("marlin_mxfp8_64x32", 1, 64, 32)
    marlin_case("marlin_mxfp8_2x64x64", 2, 64, 64)


if __name__ == "__main__":
    main()
