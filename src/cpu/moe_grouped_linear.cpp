#include "cpu/moe_grouped_linear.h"

#include <algorithm>
#include <vector>

#include "cpu/linear.h"

namespace mxq {

Status moe_grouped_linear(std::string_view what, std::span<const WeightView> w, int64_t parts,
                          const int32_t* offsets, const int32_t* sorted_rows, int64_t top_k, const float* x,
                          float* y, int64_t part_stride, ThreadPool& pool) {
  if (parts < 1 || w.empty() || static_cast<int64_t>(w.size()) % parts != 0 || top_k < 1)
    return fail("{}: {} expert matrices for {} parts, top_k {}", what, w.size(), parts, top_k);
  const int64_t experts = static_cast<int64_t>(w.size()) / parts, n = w[0].rows, k = w[0].cols;
  for (const WeightView& v : w) {
    if (v.rows != n || v.cols != k)
      return fail("{}: expert matrix [{}, {}], expected [{}, {}] like matrix 0", what, v.rows, v.cols, n, k);
    if (Status st = check_weight_view(v, what); !st) return st;
  }
  std::vector<float> xe;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t off = offsets[e], cnt = offsets[e + 1] - off;
    if (cnt <= 0) continue;
    const float* xin = x + off * k;
    if (sorted_rows) {
      xe.resize(static_cast<size_t>(cnt * k));
      for (int64_t i = 0; i < cnt; ++i) {
        const float* src = x + static_cast<int64_t>(sorted_rows[off + i] / top_k) * k;
        std::copy(src, src + k, xe.begin() + i * k);
      }
      xin = xe.data();
    }
    for (int64_t q = 0; q < parts; ++q)
      if (Status st = linear(xin, cnt, w[e * parts + q], nullptr, y + q * part_stride + off * n, pool); !st)
        return fail_in(std::string(what), st.error());
  }
  return {};
}

}  // namespace mxq
