#include "cuda/refit/plane_tables.h"

#include <cstdint>

namespace mxq::cuda {

int plane_run(const PlaneLayout& l) {
  if (l.kind == PlaneKind::kIdentity) return 16;
  const int64_t w = l.canonical.row_bytes;
  for (int r : {16, 8, 4, 2}) {
    bool ok = w % r == 0;
    for (size_t i = 0; ok && i < l.row_off.size(); ++i) ok = l.row_off[i] % r == 0;
    for (int64_t c = 0; ok && c < w; c += r) {
      ok = l.col_off[static_cast<size_t>(c)] % r == 0;
      for (int t = 1; ok && t < r; ++t)
        ok = l.col_off[static_cast<size_t>(c + t)] == l.col_off[static_cast<size_t>(c)] + t;
    }
    if (ok) return r;
  }
  return 1;
}

bool plane_run_table(const PlaneLayout& l, int run, std::vector<int32_t>& out) {
  const int64_t w = l.canonical.row_bytes;
  if (w <= 0 || w % 16 != 0) return false;
  for (int64_t c = 0; c < w; c += run) {
    const int64_t off = l.col_off[static_cast<size_t>(c)];
    if (off < 0 || off > INT32_MAX - 16) return false;
    out.push_back(static_cast<int32_t>(off));
  }
  return true;
}

bool plane_is_transpose4(const PlaneLayout& l, int run) {
  const int64_t w = l.canonical.row_bytes;
  if (run != 4 || w % 64 != 0) return false;
  for (int64_t r : l.row_off)
    if (r % 16 != 0) return false;
  for (int64_t c = 0; c < w; c += 4)
    if (l.col_off[static_cast<size_t>(c)] != (c & ~int64_t{63}) + 16 * (c % 16 / 4) + 4 * (c % 64 / 16))
      return false;
  return true;
}

bool plane_rows_contiguous(const PlaneLayout& l) {
  for (size_t r = 0; r < l.row_off.size(); ++r)
    if (l.row_off[r] != l.row_off[0] + static_cast<int64_t>(r) * l.canonical.row_bytes) return false;
  return true;
}

}  // namespace mxq::cuda
