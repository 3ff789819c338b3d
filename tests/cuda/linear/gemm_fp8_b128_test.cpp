// cuBLASLt block-scaled FP8 (gemm_fp8_b128_cublaslt.h) on already-quantized operands against an f64
// reference, for each operand-role assignment and each candidate placement of the two scale tensors. The
// cuBLAS documentation leaves the exact majorness and padding of VEC128_32F / BLK128x128_32F scales to be
// read off its figures, so this test measures them: a wrong placement mixes scales of different blocks
// (drawn 2^-4..2^4 apart), which shows as an NMSE near 1. It prints every candidate's error (or cuBLASLt's
// refusal) and requires the roles and layout the library uses (detail::kRoles, fp8_b128_scale_offset,
// fp8_b128_padded_m) to be within tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/linear/gemm_fp8_b128_cublaslt.h"
#include "format/codec.h"
#include "format/formats.h"

namespace mxq::cuda {
namespace {

int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }

struct Placement {
  const char* name;
  std::function<int64_t(int64_t outer, int64_t kb, int64_t outer_count, int64_t kb_count)> offset;
};

TEST(Fp8B128CublasLt, ScaleLayoutProbe) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // note: 20 rows (a multiple of 4, as cuBLASLt requires, not of 8) and 6 K-blocks expose padding to 4
  constexpr int64_t m = 20, n = 384, k = 768;
  const int64_t sr = cdiv(n, 128), sc = cdiv(k, 128);
  auto codes = [&](size_t count) {
    std::vector<uint8_t> v(count);
    for (auto& b : v) {
      do b = static_cast<uint8_t>(rng());
      while ((b & 0x7F) == 0x7F);
    }
    return v;
  };
  auto scale = [&] {
    return std::ldexp(1.0f + static_cast<float>(rng() % 256) / 256.0f, -4 + static_cast<int>(rng() % 9));
  };
  const std::vector<uint8_t> wq = codes(static_cast<size_t>(n * k)), xq = codes(static_cast<size_t>(m * k));
  std::vector<float> ws(static_cast<size_t>(sr * sc)),
      xs(static_cast<size_t>(m * sc));  // canonical, row-major
  for (auto& s : ws) s = scale();
  for (auto& s : xs) s = scale();
  std::vector<double> ref(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j)
        acc += static_cast<double>(e4m3_to_f32(xq[static_cast<size_t>(r * k + j)])) *
               xs[static_cast<size_t>(r * sc + j / 128)] * e4m3_to_f32(wq[static_cast<size_t>(c * k + j)]) *
               ws[static_cast<size_t>((c / 128) * sc + j / 128)];
      ref[static_cast<size_t>(r * n + c)] = acc;
    }

  const Placement w_places[] = {
      {"w K-major (canonical)", [](int64_t nb, int64_t kb, int64_t, int64_t kc) { return nb * kc + kb; }},
      {"w K-major, ld pad 4",
       [](int64_t nb, int64_t kb, int64_t, int64_t kc) { return nb * round4(kc) + kb; }},
      {"w MN-major", [](int64_t nb, int64_t kb, int64_t nc, int64_t) { return kb * nc + nb; }},
      {"w MN-major, ld pad 4",
       [](int64_t nb, int64_t kb, int64_t nc, int64_t) { return kb * round4(nc) + nb; }},
  };
  constexpr size_t kLibW = 1;  // K-major, ld padded to 4: what fp8_b128_scale_offset writes
  const Placement x_places[] = {
      {"x M-major", [](int64_t r, int64_t kb, int64_t mc, int64_t) { return kb * mc + r; }},
      {"x M-major, ld pad 4", [](int64_t r, int64_t kb, int64_t mc, int64_t) { return kb * round4(mc) + r; }},
      {"x K-major", [](int64_t r, int64_t kb, int64_t, int64_t kc) { return r * kc + kb; }},
  };
  auto dwq = test::upload(wq);
  auto dxq = test::upload(xq);
  ASSERT_TRUE(dwq && dxq);
  double production = NAN;
  for (detail::LtRoles roles :
       {detail::LtRoles::kWeightA, detail::LtRoles::kActARowD, detail::LtRoles::kActAColD}) {
    const bool transposed = roles == detail::LtRoles::kActAColD;  // D holds y^T
    bool usable = true;
    for (const Placement& wp : w_places)
      for (const Placement& xp : x_places) {
        if (!usable) continue;
        std::vector<float> wn(static_cast<size_t>(round4(sr) * round4(sc)), 0.f),
            xn(static_cast<size_t>(round4(m) * round4(sc)), 0.f);
        for (int64_t nb = 0; nb < sr; ++nb)
          for (int64_t kb = 0; kb < sc; ++kb)
            wn[static_cast<size_t>(wp.offset(nb, kb, sr, sc))] = ws[static_cast<size_t>(nb * sc + kb)];
        for (int64_t r = 0; r < m; ++r)
          for (int64_t kb = 0; kb < sc; ++kb)
            xn[static_cast<size_t>(xp.offset(r, kb, m, sc))] = xs[static_cast<size_t>(r * sc + kb)];
        auto dws = test::upload(wn);
        auto dxs = test::upload(xn);
        auto dy = test::poisoned<uint16_t>(static_cast<size_t>(m * n));
        ASSERT_TRUE(dws && dxs && dy);
        const Status st = detail::probe_matmul(roles, dxq->as<uint8_t>(), dxs->as<float>(), m,
                                               Fp8B128Weights{dwq->as<uint8_t>(), dws->as<float>(), n, k},
                                               dy->as<uint16_t>(), nullptr);
        if (!st) {  // note: a role assignment cuBLASLt refuses is reported once, not failed here
          std::printf("  scale layout probe: %s: %s\n", std::string(detail::lt_roles_name(roles)).c_str(),
                      st.error().message.c_str());
          usable = false;
          if (roles == detail::kRoles)
            ADD_FAILURE() << "the library's role assignment: " << st.error().message;
          continue;
        }
        auto y = test::download<uint16_t>(*dy, static_cast<size_t>(m * n));
        ASSERT_TRUE(y);
        std::vector<float> out(y->size());
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c)
            out[static_cast<size_t>(r * n + c)] =
                bf16_to_f32((*y)[static_cast<size_t>(transposed ? c * m + r : r * n + c)]);
        const double err = test::nmse(out, ref);
        std::printf("  scale layout probe: [%s] %-22s %-20s nmse %.3g\n",
                    std::string(detail::lt_roles_name(roles)).c_str(), wp.name, xp.name, err);
        if (roles == detail::kRoles && &wp == &w_places[kLibW] && &xp == &x_places[0]) production = err;
      }
  }
  // The library's layout is candidate (kLibW, 0); keep the two in step.
  for (int64_t nb = 0; nb < sr; ++nb)
    for (int64_t kb = 0; kb < sc; ++kb)
      EXPECT_EQ(fp8_b128_scale_offset(nb, kb, n, k), w_places[kLibW].offset(nb, kb, sr, sc));
  EXPECT_EQ(fp8_b128_padded_m(m), m);
  EXPECT_LE(production, traits(Format::kFP8_B128).nmse_tolerance) << "cuBLASLt reads the scales elsewhere";
}

TEST(Fp8B128CublasLt, RefusesShapesByName) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{100, 768}, {128, 100}, {0, 128}}) {
    const Status st = check_fp8_b128_gemm_shape(n, k);
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message.find("fp8-b128"), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find("[" + std::to_string(n) + ", " + std::to_string(k) + "]"),
              std::string::npos)
        << st.error().message;
  }
  EXPECT_TRUE(check_fp8_b128_gemm_shape(200, 784));
}

}  // namespace
}  // namespace mxq::cuda
