// Helpers for the GPU tests: fresh random inputs, device round trips, and the error measure.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/check.h"

namespace mxq::cuda::test {

// note: a fresh seed per case (printed on failure) keeps inputs new on every run.
inline uint64_t fresh_seed() {
  return (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
}

// Random finite, nonzero bf16 bits with exponents in [2^lo, 2^hi) and random sign and mantissa.
inline std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t count, int lo = -6, int hi = 2) {
  std::uniform_int_distribution<int> exp_dist(lo + 127, hi + 126), man_dist(0, 127), sign_dist(0, 1);
  std::vector<uint16_t> v(count);
  for (auto& h : v) h = static_cast<uint16_t>(sign_dist(rng) << 15 | exp_dist(rng) << 7 | man_dist(rng));
  return v;
}

template <class T>
Result<DeviceBuffer> upload(const std::vector<T>& host) {
  auto buf = DeviceBuffer::alloc(host.size() * sizeof(T));
  if (!buf) return tl::unexpected(buf.error());
  if (!host.empty()) {
    const auto rc = cudaMemcpy(buf->as(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    if (rc != cudaSuccess) return fail("upload: {}", cudaGetErrorName(rc));
  }
  return buf;
}

// A device buffer of `count` T filled with 0xFF bytes: NaN for bf16/f32, so an unwritten output shows.
template <class T>
Result<DeviceBuffer> poisoned(size_t count) {
  auto buf = DeviceBuffer::alloc(count * sizeof(T));
  if (!buf) return tl::unexpected(buf.error());
  MXQ_CUDA_CHECK(cudaMemset(buf->as(), 0xFF, count * sizeof(T)));
  return buf;
}

template <class T>
Result<std::vector<T>> download(const DeviceBuffer& buf, size_t count) {
  std::vector<T> host(count);
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  if (count) MXQ_CUDA_CHECK(cudaMemcpy(host.data(), buf.as(), count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// ‖out − ref‖² / ‖ref‖²; NaN if any output is NaN.
inline double nmse(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) return NAN;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace mxq::cuda::test
