// Reads the small .npy golden files under tests/golden/format (format 1.0/2.0, little-endian, C order).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace mxq::testing {

struct Npy {
  std::string descr;           // numpy dtype string, e.g. "<u4", "|u1"
  std::vector<int64_t> shape;  // empty for a failed load
  std::vector<uint8_t> data;

  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  template <class T>
  std::vector<T> as() const {
    std::vector<T> out(data.size() / sizeof(T));
    std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
    return out;
  }
};

inline Npy load_npy(const std::string& name) {
  const std::string path = std::string(MXQ_SOURCE_DIR) + "/tests/golden/format/" + name + ".npy";
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Npy npy;
  // note: magic (6) + version (2) + header length (u16 for v1, u32 for v2) + header text.
  if (raw.size() < 10 || std::memcmp(raw.data(), "\x93NUMPY", 6) != 0) {
    ADD_FAILURE() << path << ": not an .npy file (run tests/golden/make_format_golden.py)";
    return npy;
  }
  const bool v1 = raw[6] == 1;
  const size_t hlen = v1 ? (raw[8] | raw[9] << 8) : (raw[8] | raw[9] << 8 | raw[10] << 16 | raw[11] << 24);
  const size_t hstart = v1 ? 10 : 12;
  const std::string header(raw.begin() + hstart, raw.begin() + hstart + hlen);
  const size_t d = header.find("'descr': '") + 10;
  npy.descr = header.substr(d, header.find('\'', d) - d);
  EXPECT_EQ(header.find("'fortran_order': True"), std::string::npos) << path;
  size_t s = header.find('(', header.find("'shape'")) + 1;
  const size_t e = header.find(')', s);
  while (s < e) {
    const size_t comma = std::min(header.find(',', s), e);
    if (comma > s) npy.shape.push_back(std::stoll(header.substr(s, comma - s)));
    s = comma + 1;
  }
  npy.data.assign(raw.begin() + hstart + hlen, raw.end());
  return npy;
}

}  // namespace mxq::testing
