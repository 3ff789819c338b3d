// Shared by the CPU op tests: seeded random inputs (never zeros) and error measures against f64 references.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace mxq::test {

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& f : v) {
    do f = dist(rng);
    while (f == 0.0f);
  }
  return v;
}

// Normalised mean squared error: sum (got - want)^2 / sum want^2.
template <class Got>
double nmse(const Got& got, const std::vector<double>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    err += d * d;
    ref += want[i] * want[i];
  }
  return ref > 0 ? err / ref : err;
}

template <class Got>
double max_abs_diff(const Got& got, const std::vector<double>& want) {
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::abs(static_cast<double>(got[i]) - want[i]));
  return m;
}

}  // namespace mxq::test
