#include "format/quantize_parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace mxq {

Result<QuantizedPlanes> quantize_tensor(Format fmt, ScaleRule rule, Format src, std::span<const uint8_t> x,
                                        const std::vector<int64_t>& shape, std::string_view name, int threads) {
  if (shape.size() < 2) return fail("{}: rank {} tensor cannot be quantized as a matrix", name, shape.size());
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) batch *= shape[i];
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  const int64_t src_bytes = traits(src).element_bits / 8;
  if (static_cast<int64_t>(x.size()) != batch * rows * cols * src_bytes)
    return fail("{}: {} bytes for {} elements of {}", name, x.size(), batch * rows * cols, traits(src).name);

  QuantizedPlanes out;
  const int64_t vb = values_bytes(fmt, rows, cols), sb = scales_bytes(fmt, rows, cols);
  out.values.resize(static_cast<size_t>(batch * vb));
  out.scales.resize(static_cast<size_t>(batch * sb));
  const auto ss = scales_shape(fmt, rows, cols);
  out.values_shape = out.scales_shape = std::vector<int64_t>(shape.begin(), shape.end() - 2);
  out.values_shape.insert(out.values_shape.end(), {rows, vb / std::max<int64_t>(rows, 1)});
  out.scales_shape.insert(out.scales_shape.end(), {ss[0], ss[1]});

  // Work items: (batch index, first row, row count), rows in multiples of the format's block rows.
  const int64_t step = traits(fmt).block_rows;
  const int64_t stripe = std::max<int64_t>(step, cdiv(std::max<int64_t>(rows / std::max(threads, 1), 1), step) * step);
  struct Item { int64_t b, r0, n; };
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r0 = 0; r0 < rows; r0 += stripe) items.push_back({b, r0, std::min(stripe, rows - r0)});

  const int64_t scale_row_bytes = ss[1] * traits(fmt).scale_bytes, values_row_bytes = rows ? vb / rows : 0;
  std::atomic<bool> failed{false};
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < items.size() && !failed; i = next++) {
      const Item& it = items[i];
      const uint8_t* xs = x.data() + ((it.b * rows + it.r0) * cols) * src_bytes;
      uint8_t* v = out.values.data() + it.b * vb + it.r0 * values_row_bytes;
      uint8_t* s = out.scales.data() + it.b * sb + (it.r0 / step) * scale_row_bytes;
      if (!quantize(fmt, rule, src, xs, it.n, cols, v, s, name)) failed = true;
    }
  };
  const int n = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(items.size(), 1)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failed) {
    // note: a stripe names blocks relative to its first row, and which stripe fails first varies; errors are
    // rare, so redo the matrices in order on one thread for a deterministic message in tensor coordinates.
    for (int64_t b = 0; b < batch; ++b) {
      auto st = quantize(fmt, rule, src, x.data() + b * rows * cols * src_bytes, rows, cols,
                         out.values.data() + b * vb, out.scales.data() + b * sb, name);
      if (!st) return batch > 1 ? fail("{} (expert {})", st.error().message, b) : tl::unexpected(st.error());
    }
  }
  return out;
}

}  // namespace mxq
