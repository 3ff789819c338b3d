#include "cpu/embedding.h"

#include "cpu/dequantize_row.h"

namespace mxq {

Status embedding(const int32_t* ids, int64_t count, const WeightView& table, float* out) {
  if (auto ok = check_weight_view(table, "embedding table"); !ok) return ok;
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= table.rows)
      return fail("embedding: token id {} at position {} is outside the vocabulary [0, {})", ids[i], i,
                  table.rows);
  for (int64_t i = 0; i < count; ++i) dequantize_row(table, ids[i], 0, table.cols, out + i * table.cols);
  return {};
}

}  // namespace mxq
