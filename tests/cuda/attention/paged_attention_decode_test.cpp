// GPU flash-decoding over a paged cache against cpu/paged_attention_decode (cpu/attention on the gathered
// cache) on fresh random q/K/V: GQA groups 1, 3, 4, 8, 16, D 64 and 128, ragged batches of sequence lengths
// around the split-K partition (256) and block (16 / 32) edges, padding sequences of length 0 (zero rows).
#include "cuda/attention/paged_attention_decode.h"

#include "../op_test_util.h"
#include "cpu/paged_attention_decode.h"

namespace mxq::cuda {
namespace {

struct DecodeCase {
  int q_heads, kv_heads, head_dim, block_size;
  std::vector<int32_t> seq_lens;
};
void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << "Hq=" << c.q_heads << " Hkv=" << c.kv_heads << " D=" << c.head_dim << " bs=" << c.block_size
      << " lens=";
  for (int32_t l : c.seq_lens) *os << l << ",";
}

class PagedAttentionDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(PagedAttentionDecode, MatchesCpuTwin) {
  const DecodeCase& c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int S = static_cast<int>(c.seq_lens.size()), D = c.head_dim;
  const test::PagedCache cache = test::random_paged_cache(rng, c.seq_lens, c.block_size, c.kv_heads, D);
  const auto q = test::normal_bf16(rng, static_cast<size_t>(S) * c.q_heads * D);
  const auto qf = test::to_f32(q);
  std::vector<float> ref(q.size());
  const PagedKvView view{cache.kf.data(),  cache.vf.data(),  cache.tables.data(), cache.num_blocks,
                         cache.block_size, cache.max_blocks, cache.kv_heads,      cache.head_dim};
  ASSERT_TRUE(paged_attention_decode(qf.data(), c.seq_lens.data(), S, c.q_heads, view, ref.data()));

  auto dq = test::must(test::upload(q));
  auto dk = test::must(test::upload(cache.k));
  auto dv = test::must(test::upload(cache.v));
  auto dt = test::must(test::upload(cache.tables));
  auto dl = test::must(test::upload(c.seq_lens));
  const size_t ws = paged_attention_decode_workspace_bytes(S, c.q_heads, D,
                                                           static_cast<int>(cache.max_blocks), c.block_size);
  auto dws = test::must(test::poisoned<uint8_t>(ws));
  auto dout = test::must(test::poisoned<uint16_t>(q.size()));
  PagedDecodeArgs a{dq.as<uint16_t>(),
                    dk.as<uint16_t>(),
                    dv.as<uint16_t>(),
                    dt.as<int32_t>(),
                    dl.as<int32_t>(),
                    dws.as<float>(),
                    dout.as<uint16_t>(),
                    S,
                    static_cast<int>(cache.max_blocks),
                    c.block_size,
                    c.q_heads,
                    c.kv_heads,
                    D};
  ASSERT_EQ(launch_paged_attention_decode(a, nullptr), cudaSuccess);
  const auto got = test::must(test::download<uint16_t>(dout, q.size()));
  test::expect_close_bf16(got, ref, test::kBf16Rtol, 2e-3 * test::rms(ref), "out");
  std::vector<float> gf(got.size());
  for (size_t i = 0; i < got.size(); ++i) gf[i] = bf16_to_f32(got[i]);
  const std::vector<double> refd(ref.begin(), ref.end());
  EXPECT_LE(test::nmse(gf, refd), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionDecode,
    ::testing::Values(DecodeCase{6, 2, 64, 16, {1}},
                      DecodeCase{6, 2, 64, 16, {7, 0, 16, 17, 255, 256, 257, 511, 512, 513, 1}},
                      DecodeCase{32, 8, 128, 16, {1, 100, 1024, 1500, 0, 3000}},
                      DecodeCase{32, 4, 128, 16, {2049, 33, 5}}, DecodeCase{64, 4, 128, 32, {700, 64, 1}},
                      DecodeCase{4, 4, 64, 16, {300, 1025}}, DecodeCase{16, 8, 128, 16, {4096}},
                      DecodeCase{40, 8, 128, 16, {9, 600}}));

}  // namespace
}  // namespace mxq::cuda
