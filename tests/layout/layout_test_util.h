// Test helpers for the layout module: golden native maps (.npy, int16/int32) and fixed random planes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "layout/layout.h"

namespace mxq::testing {

// tests/golden/layout/<name>.npy as int64 (C order, little-endian, 1-D); empty + a test failure if absent.
inline std::vector<int64_t> load_native_map(const std::string& name) {
  const std::string path = std::string(MXQ_SOURCE_DIR) + "/tests/golden/layout/" + name + ".npy";
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // note: numpy writes format 1.0 here: magic (6) + version (2) + u16 header length + header text.
  if (raw.size() < 10 || std::memcmp(raw.data(), "\x93NUMPY", 6) != 0 || raw[6] != 1) {
    ADD_FAILURE() << path << ": not an .npy 1.0 file (run tests/golden/make_layout_golden.py)";
    return {};
  }
  const size_t hlen = raw[8] | raw[9] << 8;
  const std::string header(raw.begin() + 10, raw.begin() + 10 + hlen);
  const bool i16 = header.find("'<i2'") != std::string::npos;
  if (!i16 && header.find("'<i4'") == std::string::npos) {
    ADD_FAILURE() << path << ": expected int16 or int32, header " << header;
    return {};
  }
  const uint8_t* data = raw.data() + 10 + hlen;
  const size_t n = (raw.size() - 10 - hlen) / (i16 ? 2 : 4);
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (i16) {
      int16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      out[i] = v;
    } else {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      out[i] = v;
    }
  }
  return out;
}

// Per native byte, the canonical byte index a learned plane layout puts there (-1 = padding).
inline std::vector<int64_t> native_map(const PlaneLayout& l) {
  std::vector<int64_t> map(static_cast<size_t>(l.native_bytes), -1);
  for (int64_t i = 0; i < l.canonical.bytes(); ++i) map[l.native_offset(i)] = i;
  return map;
}

// A fixed pseudo-random byte plane (every byte value occurs, zeros included).
inline std::vector<uint8_t> random_plane(int64_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<uint8_t>(x >> 11);
  }
  return out;
}

}  // namespace mxq::testing
