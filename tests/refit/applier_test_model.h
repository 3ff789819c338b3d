// The small mixed-format model both applier test files refit (applier_test.cpp: the host path and the
// decoded device path; applier_encoded_test.cpp: the encoded path on the CPU): one tensor per format a delta
// carries, a stacked-expert one and a 1-D norm, small enough that a whole-store byte compare is cheap, and a
// valid random entry of each plane.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "format/formats.h"
#include "model/weight_store.h"
#include "refit/delta_format.h"

namespace mxq::refit::test_model {

struct Spec {
  std::string name;
  Format format;
  std::vector<int64_t> shape;
};

inline const std::vector<Spec> kSpecs = {
    {"model.norm.weight", Format::kBF16, {64}},
    {"model.layers.0.mlp.up_proj.weight", Format::kMXFP8, {8, 64}},
    {"model.layers.0.mlp.experts.gate_up_proj", Format::kMXFP4, {2, 4, 64}},
    {"model.layers.0.self_attn.o_proj.weight", Format::kFP8_B128, {130, 160}},
    {"model.embed_tokens.weight", Format::kF32, {4, 8}},
};

// A valid entry of plane p: no E4M3 NaN, no E8M0 NaN, finite floats, positive f32 scales.
inline void random_entry(Format f, Plane p, std::mt19937& rng, uint8_t* e) {
  if (p == Plane::kScales && f == Format::kFP8_B128) {
    const float s = std::uniform_real_distribution<float>(1e-4f, 1.0f)(rng);
    std::memcpy(e, &s, 4);
  } else if (p == Plane::kScales) {
    e[0] = static_cast<uint8_t>(110 + rng() % 30);
  } else if (f == Format::kBF16 || f == Format::kF32) {
    const float x = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    if (f == Format::kF32)
      std::memcpy(e, &bits, 4);
    else
      e[0] = static_cast<uint8_t>(bits >> 16), e[1] = static_cast<uint8_t>(bits >> 24);
  } else {
    e[0] = static_cast<uint8_t>(rng());
    if (f != Format::kMXFP4 && (e[0] & 0x7F) == 0x7F) e[0] ^= 1;  // E4M3 NaN codes
  }
}

// Both canonical planes of a tensor, and of every tensor of a store by name.
struct Planes {
  std::vector<uint8_t> values, scales;
  bool operator==(const Planes&) const = default;
};
using ModelPlanes = std::map<std::string, Planes>;

// Live native bytes, padding included: a rollback must restore these too.
inline ModelPlanes native(const WeightStore& store) {
  ModelPlanes m;
  for (const auto& [name, t] : store.tensors())
    m[name] = {{t.values.begin(), t.values.end()}, {t.scales.begin(), t.scales.end()}};
  return m;
}

}  // namespace mxq::refit::test_model
