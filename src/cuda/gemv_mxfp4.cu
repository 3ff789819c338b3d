// W4A16 MXFP4 GEMV for decode, y[M,N] = x[M,K] · W[N,K]^T, M = 1..16.
// Layout contract (gemv_layout.h, written by prepare_gemv_values):
//   values: [N, K/2] bytes, E2M1 nibbles (element 2i in bits 3:0 of byte i), each row a byte permutation of
//           the canonical row in groups of 128 elements (tail 32, 64 or 96): canonical element
//           k0 + 16j + 4t + e → native k0 + 4J·t + 4j + e (J = 8, or tail/16); bytes move whole;
//   scales: canonical [N, K/32] E8M0, row-major (identity); x, y: row-major bf16; K % 32 == 0; any N >= 1.
// Arch: sm_80+ (mma.sync bf16). Decode (default, "lut"): two prmt lookups, exact bf16 values, no multiply:
// the magnitude (3 bits) picks a selector byte (low-byte index | high-byte index << 4) from an 8-byte table,
// the sign sets bit 2 of the high index, and that selector picks the bf16 bytes from a second 8-byte table.
// Decode ("mul", MXQ_GEMV_DECODE=cvt): nibble bits placed as bf16 bits (code << 6, sign << 12) are the
// value · 2^-126 (code 1 = 0.5 becomes a bf16 subnormal); one bf16x2 multiply by 2^126 makes them exact.
#include <cstdlib>
#include <cstring>

#include "cuda/gemv_mx_kernel.cuh"

namespace mxq::cuda {
namespace {

// note: bf16 byte table: 0x00, 0x3F, 0x40 (high bytes of 0, 0.5..1.5, 2..6), their signed forms 0x80, 0xBF,
// 0xC0 at index + 4; the low bytes 0x00, 0x40, 0x80, 0xC0 reuse indices 0, 2, 4, 6.
inline constexpr uint32_t kBf16BytesLo = 0x00403F00u, kBf16BytesHi = 0x00C0BF80u;
// note: selector byte per magnitude 0..7 (values 0, .5, 1, 1.5, 2, 3, 4, 6): 00 10 14 16 20 22 24 26.
inline constexpr uint32_t kSelectorLo = 0x16141000u, kSelectorHi = 0x26242220u;

struct Mxfp4LutDecode {
  static constexpr int kGroupK = 128, kPairsPerWord = 4, kRowBytesNum = 1, kRowBytesDen = 2, kScaleFold = 0;
  // Byte p of `word` (elements 2p, 2p+1) becomes pair p.
  __device__ static void decode(uint32_t word, uint32_t* pairs) {
    const uint32_t mag = word & 0x77777777u, shifted = word << 4;
    // Selector bytes of elements 0..3 and 4..7 (prmt reads the low 16 bits: four magnitude nibbles).
    uint32_t sel0 = gemv::prmt(kSelectorLo, kSelectorHi, mag);
    uint32_t sel1 = gemv::prmt(kSelectorLo, kSelectorHi, mag >> 16);
    // note: sign-replicate selectors (8-F): byte j = 0xFF when element j is negative; even elements' signs
    // are byte MSBs of word << 4, odd ones of word. Bit 6 of a selector byte is bit 2 of its high index.
    sel0 |= gemv::prmt(shifted, word, 0xD9C8) & 0x40404040u;
    sel1 |= gemv::prmt(shifted, word, 0xFBEA) & 0x40404040u;
    pairs[0] = gemv::prmt(kBf16BytesLo, kBf16BytesHi, sel0);
    pairs[1] = gemv::prmt(kBf16BytesLo, kBf16BytesHi, sel0 >> 16);
    pairs[2] = gemv::prmt(kBf16BytesLo, kBf16BytesHi, sel1);
    pairs[3] = gemv::prmt(kBf16BytesLo, kBf16BytesHi, sel1 >> 16);
  }
  __device__ static uint32_t load_tail(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint16_t*>(p));
  }
};

struct Mxfp4Decode {
  static constexpr int kGroupK = 128, kPairsPerWord = 4, kRowBytesNum = 1, kRowBytesDen = 2, kScaleFold = 0;
  // Byte p of `word` (elements 2p, 2p+1) becomes pair p.
  __device__ static void decode(uint32_t word, uint32_t* pairs) {
    const uint32_t even = word & 0x0F0F0F0Fu, odd = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      // note: selector nibble 8 sign-replicates byte 0 of `even`, whose bit 7 is clear: a zero byte.
      const uint32_t q = gemv::prmt(even, odd, 0x8080u | p | ((4u + p) << 8));
      // note: q * 4160 = (q << 6) + (q << 12); a 4-bit code per half keeps the two terms from overlapping.
      const uint32_t raw = (q * 4160u) & 0x81C081C0u;
      pairs[p] = gemv::bf16x2_mul(raw, 0x7E807E80u);  // note: bf16 0x7E80 = 2^126
    }
  }
  __device__ static uint32_t load_tail(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint16_t*>(p));
  }
};

}  // namespace

cudaError_t launch_gemv_mxfp4(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream) {
  static const bool use_mul = [] {
    const char* v = std::getenv("MXQ_GEMV_DECODE");
    return v != nullptr && std::strcmp(v, "cvt") == 0;
  }();
  if (use_mul) return gemv::launch_gemv<Mxfp4Decode>(x, m, values, scales, y, n, k, stream);
  return gemv::launch_gemv<Mxfp4LutDecode>(x, m, values, scales, y, n, k, stream);
}

}  // namespace mxq::cuda
