#include "model/weight_store.h"

#include <xxhash.h>

#include <cassert>
#include <cstdlib>
#include <cstring>

namespace mxq {

void WeightStore::Free::operator()(uint8_t* p) const { std::free(p); }

Result<PlaneBytes> plane_bytes(Format format, const std::vector<int64_t>& shape, std::string_view name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    // note: each dimension is bounded too, so a zero elsewhere cannot let a huge one reach values_bytes().
    if (d < 0 || d > (int64_t{1} << 48) || (d > 0 && n > (int64_t{1} << 48) / d))
      return fail("{}: shape too large or negative", name);
    n *= d;
  }
  if (!is_quantized(format)) return PlaneBytes{n * traits(format).element_bits / 8, 0};
  if (shape.size() < 2)
    return fail("{}: a {} tensor needs rank >= 2, got {}", name, traits(format).name, shape.size());
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  const int64_t batch = rows && cols ? n / (rows * cols) : 0;
  if (traits(format).block_rows == 1 && cols % traits(format).block_cols != 0)
    return fail("{}: K = {} is not a multiple of {} ({})", name, cols, traits(format).block_cols,
                traits(format).name);
  return PlaneBytes{batch * values_bytes(format, rows, cols), batch * scales_bytes(format, rows, cols)};
}

uint64_t canonical_checksum(std::span<const uint8_t> values, std::span<const uint8_t> scales) {
  XXH3_state_t* s = XXH3_createState();
  assert(s);
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, values.data(), values.size());
  XXH3_64bits_update(s, scales.data(), scales.size());
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

Status WeightStore::add(std::string name, Format format, std::vector<int64_t> shape) {
  if (tensors_.count(name)) return fail("{}: added twice to the weight store", name);
  auto pb = plane_bytes(format, shape, name);
  if (!pb) return tl::unexpected(pb.error());
  // note: 64-byte alignment so vector loads of a row never split a cache line at the start.
  auto alloc = [this](int64_t bytes) -> std::span<uint8_t> {
    if (bytes == 0) return {};
    const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
    assert(p && "out of host memory for weights");
    std::memset(p, 0, rounded);
    buffers_.emplace_back(p);
    total_bytes_ += bytes;
    return {p, static_cast<size_t>(bytes)};
  };
  QTensor t{name, format, std::move(shape), alloc(pb->values), alloc(pb->scales), 0};
  t.checksum = canonical_checksum(t.values, t.scales);
  tensors_.emplace(std::move(name), std::move(t));
  return {};
}

Status WeightStore::apply_tensor(std::string_view name, std::span<const uint8_t> values,
                                 std::span<const uint8_t> scales) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return fail("{}: not a tensor of this model", name);
  QTensor& t = it->second;
  if (values.size() != t.values.size() || scales.size() != t.scales.size())
    return fail("{}: {} update with {} value bytes and {} scale bytes, expected {} and {}", name,
                traits(t.format).name, values.size(), scales.size(), t.values.size(), t.scales.size());
  std::memcpy(t.values.data(), values.data(), values.size());
  if (!scales.empty()) std::memcpy(t.scales.data(), scales.data(), scales.size());
  t.checksum = canonical_checksum(t.values, t.scales);
  return {};
}

const QTensor* WeightStore::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const QTensor& WeightStore::at(std::string_view name) const {
  const QTensor* t = find(name);
  assert(t && "weight missing from the store");
  return *t;
}

}  // namespace mxq
