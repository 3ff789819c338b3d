// The refit benchmark's copy ceiling kernel (bench/cuda/copy_ceiling.h) against memcpy, bitwise: every
// variant, byte counts from one 16-byte unit to several grid strides with a ragged remainder, the destination
// poisoned.
#include "bench/cuda/copy_ceiling.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "../cuda/gpu_test_util.h"

namespace mxq::cuda::test {
namespace {

TEST(CopyCeiling, CopiesEveryByte) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int64_t bytes : {int64_t{16}, int64_t{4096 + 16}, int64_t{(3 << 20) + 48}, int64_t{(37 << 20) + 1008}})
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(::testing::Message() << bytes << " bytes, variant " << variant);
      std::vector<uint8_t> host(static_cast<size_t>(bytes));
      for (auto& b : host) b = static_cast<uint8_t>(rng());
      auto src = upload(host);
      auto dst = DeviceBuffer::alloc(static_cast<size_t>(bytes));
      ASSERT_TRUE(src && dst);
      ASSERT_EQ(cudaMemset(dst->as(), 0xA5, static_cast<size_t>(bytes)), cudaSuccess);
      ASSERT_EQ(launch_copy_ceiling(dst->as<uint8_t>(), src->as<uint8_t>(), bytes, variant, nullptr),
                cudaSuccess);
      std::vector<uint8_t> back(host.size());
      ASSERT_EQ(cudaMemcpy(back.data(), dst->as(), back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(back == host);
    }
}

}  // namespace
}  // namespace mxq::cuda::test
