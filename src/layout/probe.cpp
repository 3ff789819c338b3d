#include "layout/probe.h"

#include <algorithm>
#include <string>
#include <vector>

namespace mxq {
namespace {

// note: base 255 with digits 1..255 keeps every probe byte non-zero; 4 runs cover planes < 255^4 ≈ 4.2e9
// bytes, 5 runs anything an int64 plane can hold in memory.
constexpr int64_t kBase = 255;

int probe_runs(int64_t max_bytes) {
  int runs = 1;
  for (int64_t span = kBase; span < max_bytes; span *= kBase) ++runs;
  return runs;
}

// Digit `place` (a power of 255) of every byte index, as 1..255; counters instead of a division per byte.
void fill_digits(std::vector<uint8_t>& plane, int64_t bytes, int64_t place) {
  plane.resize(static_cast<size_t>(bytes));
  int64_t in_place = 0;
  uint8_t digit = 1;
  for (int64_t i = 0; i < bytes; ++i) {
    plane[i] = digit;
    if (++in_place == place) in_place = 0, digit = digit == kBase ? 1 : digit + 1;
  }
}

uint8_t splitmix_byte(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint8_t>(z ^ (z >> 31));
}

// Check plane `run` of a plane: byte i is j ^ mask(j / 256) with j = i + run·bytes, so every aligned run of
// 256 stream positions holds each byte value once (zeros included), in a pseudo-random order per block.
// note: cdiv(256, bytes) runs therefore show every byte value to even a tiny plane.
void fill_check(std::vector<uint8_t>& plane, int64_t bytes, int64_t run, uint64_t seed) {
  plane.resize(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) {
    const int64_t j = i + run * bytes;
    plane[i] =
        static_cast<uint8_t>(j) ^ splitmix_byte(seed * 0x100000001B3ull + static_cast<uint64_t>(j / 256));
  }
}

struct ProbeContext {
  std::string_view tensor, kernel;
  const TensorGeometry& g;
  const PrepareFn& prepare;

  template <class... Args>
  tl::unexpected<Error> refuse(Plane p, fmt::format_string<Args...> f, Args&&... args) const {
    return fail("{}: kernel '{}' {} plane: {}", tensor, kernel, plane_name(p),
                fmt::format(f, std::forward<Args>(args)...));
  }
  std::string where(Plane p, int64_t i) const {
    const int64_t w = g.plane(p).row_bytes;
    return fmt::format("canonical byte {} (row {}, byte {})", i, i / w, i % w);
  }
};

// A 4-bit values plane whose probes do not decode: check whether the prepare splits bytes into nibbles, so
// the refusal says why rather than reporting a scrambled index.
Status diagnose_nibbles(const ProbeContext& ctx) {
  constexpr uint8_t kPair = 0x21;  // low nibble 1, high nibble 2
  HostPlanes in;
  in.values.assign(static_cast<size_t>(ctx.g.values.bytes()), kPair);
  in.scales.assign(static_cast<size_t>(ctx.g.scales.bytes()), kPair);
  auto out = ctx.prepare(in);
  if (!out) return {};
  for (size_t p = 0; p < out->values.size(); ++p)
    if (out->values[p] != 0 && out->values[p] != kPair)
      return ctx.refuse(Plane::kValues,
                        "prepare moves 4-bit elements between bytes (native byte {} = 0x{:02x} from bytes "
                        "0x21); nibble-granular layouts are refused: mxq layouts are byte permutations",
                        p, out->values[p]);
  return {};
}

Result<PlaneLayout> decode_plane(const ProbeContext& ctx, Plane p, const std::vector<HostPlanes>& runs) {
  const PlaneGeometry& cg = ctx.g.plane(p);
  const int64_t bytes = cg.bytes(), w = cg.row_bytes;
  const auto native = [&](int r) -> const std::vector<uint8_t>& {
    return p == Plane::kValues ? runs[r].values : runs[r].scales;
  };
  const int64_t native_bytes = static_cast<int64_t>(native(0).size());
  const int nruns = static_cast<int>(runs.size());
  // Canonical byte index held by native byte q, -1 for padding; anything else is refused.
  const auto decode = [&](int64_t q) -> Result<int64_t> {
    int64_t index = 0, place = 1;
    int zeros = 0;
    for (int r = 0; r < nruns; ++r, place *= kBase) {
      const uint8_t b = native(r)[q];
      zeros += b == 0;
      index += (b == 0 ? 0 : b - 1) * place;
    }
    if (zeros == nruns) return -1;
    if (zeros > 0)
      return ctx.refuse(p, "native byte {} is zero in {} of {} probe runs: not a copy of a canonical byte", q,
                        zeros, nruns);
    if (index >= bytes)
      return ctx.refuse(p, "native byte {} decodes to canonical byte {} of a {}-byte plane: not a copy", q,
                        index, bytes);
    return index;
  };
  // note: pass 1 keeps a bit per canonical byte plus the native positions of row 0 and column 0 (the
  // tables); pass 2 checks every byte against them. Transient memory beyond the prepare's own outputs is
  // bytes/8, so probing a vocabulary-sized tensor stays cheap.
  std::vector<bool> seen(static_cast<size_t>(bytes), false);
  PlaneLayout l{PlaneKind::kIdentity, cg, native_bytes, {}, {}};
  l.row_off.assign(static_cast<size_t>(cg.rows), 0);
  l.col_off.assign(static_cast<size_t>(w), 0);
  bool identity = native_bytes == bytes;
  for (int64_t q = 0; q < native_bytes; ++q) {
    auto index = decode(q);
    if (!index) return tl::unexpected(index.error());
    const int64_t i = *index;
    if (i < 0) continue;
    if (seen[i]) {
      int64_t first = 0;
      while (*decode(first) != i) ++first;
      return ctx.refuse(p, "{} is duplicated at native bytes {} and {}", ctx.where(p, i), first, q);
    }
    seen[i] = true;
    identity = identity && i == q;
    if (i < w) l.col_off[i] = q;
    if (i % w == 0) l.row_off[i / w] = q;
  }
  for (int64_t i = 0; i < bytes; ++i)
    if (!seen[i]) return ctx.refuse(p, "{} is missing from the native plane", ctx.where(p, i));
  if (identity) return PlaneLayout{PlaneKind::kIdentity, cg, native_bytes, {}, {}};
  l.kind = PlaneKind::kSeparable;
  if (bytes == 0) return l;
  for (int64_t c = w - 1; c >= 0; --c) l.col_off[c] -= l.col_off[0];
  for (int64_t q = 0; q < native_bytes; ++q) {
    const int64_t i = *decode(q);
    if (i < 0) continue;
    const int64_t predicted = l.row_off[i / w] + l.col_off[i % w];
    if (predicted != q)
      return ctx.refuse(
          p, "not a separable permutation: {} sits at native byte {}, row/column tables predict {}",
          ctx.where(p, i), q, predicted);
  }
  return l;
}

// The learned layout must reproduce the prepare on planes it has never seen, holding every byte value.
Status verify_check_planes(const ProbeContext& ctx, const Layout& layout) {
  const int64_t smallest =
      std::max<int64_t>(1, ctx.g.scales.bytes() == 0 ? ctx.g.values.bytes()
                                                     : std::min(ctx.g.values.bytes(), ctx.g.scales.bytes()));
  const int64_t runs = cdiv(256, smallest);
  for (int64_t run = 0; run < runs; ++run) {
    HostPlanes in;
    fill_check(in.values, ctx.g.values.bytes(), run, 1);
    fill_check(in.scales, ctx.g.scales.bytes(), run, 2);
    auto out = ctx.prepare(in);
    if (!out) return fail("{}: kernel '{}': prepare failed: {}", ctx.tensor, ctx.kernel, out.error().message);
    for (Plane p : {Plane::kValues, Plane::kScales}) {
      const PlaneLayout& l = layout.plane(p);
      const std::vector<uint8_t>& got = p == Plane::kValues ? out->values : out->scales;
      const std::vector<uint8_t>& src = p == Plane::kValues ? in.values : in.scales;
      if (static_cast<int64_t>(got.size()) != l.native_bytes)
        return ctx.refuse(p, "native size {} on a check plane, {} on the probes", got.size(), l.native_bytes);
      std::vector<uint8_t> want(got.size());
      if (auto s = to_native(l, src, want); !s) return ctx.refuse(p, "{}", s.error().message);
      for (size_t q = 0; q < got.size(); ++q)
        if (got[q] != want[q])
          return ctx.refuse(p,
                            "prepare changes byte values: on a check plane native byte {} is 0x{:02x}, the "
                            "learned permutation puts 0x{:02x} there",
                            q, got[q], want[q]);
    }
  }
  return {};
}

}  // namespace

Result<Layout> probe_layout(std::string_view tensor, std::string_view kernel, Format f,
                            std::span<const int64_t> shape, const PrepareFn& prepare) {
  auto g = tensor_geometry(tensor, f, shape);
  if (!g) return tl::unexpected(g.error());
  const ProbeContext ctx{tensor, kernel, *g, prepare};
  const int nruns = probe_runs(std::max(g->values.bytes(), g->scales.bytes()));
  std::vector<HostPlanes> runs;
  int64_t place = 1;
  for (int r = 0; r < nruns; ++r, place *= kBase) {
    HostPlanes in;
    fill_digits(in.values, g->values.bytes(), place);
    fill_digits(in.scales, g->scales.bytes(), place);
    auto out = prepare(in);
    if (!out) return fail("{}: kernel '{}': prepare failed: {}", tensor, kernel, out.error().message);
    if (r > 0 && (out->values.size() != runs[0].values.size() || out->scales.size() != runs[0].scales.size()))
      return fail("{}: kernel '{}': native sizes change between probe runs ({} + {} then {} + {} bytes)",
                  tensor, kernel, runs[0].values.size(), runs[0].scales.size(), out->values.size(),
                  out->scales.size());
    runs.push_back(std::move(*out));
  }
  Layout layout;
  layout.name = std::string(kernel);
  auto values = decode_plane(ctx, Plane::kValues, runs);
  if (!values) {
    if (traits(f).element_bits == 4)
      if (auto s = diagnose_nibbles(ctx); !s) return tl::unexpected(s.error());
    return tl::unexpected(values.error());
  }
  layout.values = std::move(*values);
  auto scales = decode_plane(ctx, Plane::kScales, runs);
  if (!scales) return tl::unexpected(scales.error());
  layout.scales = std::move(*scales);
  if (auto s = verify_check_planes(ctx, layout); !s) return tl::unexpected(s.error());
  return layout;
}

}  // namespace mxq
