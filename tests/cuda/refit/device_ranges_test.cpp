// DeviceRanges (cuda/refit/device_ranges.h) against is_device: device, managed, pinned host, pageable host
// and null pointers; pointers inside an allocation already seen are answered from its cached range, pointers
// past its end are not.
#include "cuda/refit/device_ranges.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/check.h"

namespace mxq::cuda::test {
namespace {

TEST(DeviceRanges, AgreesWithIsDevice) {
  auto a = DeviceBuffer::alloc(1 << 20), b = DeviceBuffer::alloc(3000);
  ASSERT_TRUE(a && b);
  void* managed = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 4096), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  std::vector<uint8_t> pageable(4096);
  DeviceRanges r;
  EXPECT_FALSE(r.is_device(nullptr));
  EXPECT_TRUE(r.is_device(a->as<uint8_t>()));
  const size_t after_first = r.ranges();
  EXPECT_LE(after_first, 1u);
  EXPECT_TRUE(r.is_device(a->as<uint8_t>() + 12345));
  EXPECT_TRUE(r.is_device(a->as<uint8_t>() + (1 << 20) - 1));
  EXPECT_EQ(r.ranges(), after_first) << "pointers inside a seen allocation need no new range";
  EXPECT_TRUE(r.is_device(b->as<uint8_t>() + 100));
  EXPECT_TRUE(r.is_device(managed));
  EXPECT_FALSE(r.is_device(pinned));
  EXPECT_FALSE(r.is_device(pageable.data()));
  EXPECT_FALSE(r.is_device(pageable.data() + 100));
  // note: the byte past the first allocation is whatever is_device says (another allocation or none).
  const uint8_t* past = a->as<uint8_t>() + (1 << 20);
  EXPECT_EQ(r.is_device(past), is_device(past));
  for (const void* p : {static_cast<const void*>(a->as<uint8_t>()), static_cast<const void*>(managed),
                        static_cast<const void*>(pinned), static_cast<const void*>(pageable.data())})
    EXPECT_EQ(r.is_device(p), is_device(p));
  cudaFree(managed);
  cudaFreeHost(pinned);
}

}  // namespace
}  // namespace mxq::cuda::test
