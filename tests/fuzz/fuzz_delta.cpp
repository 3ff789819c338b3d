// libFuzzer harness for the refit delta reader: the input is tried both as a whole file (header + zstd frame)
// and as a bare body, so mutations reach the record parser without having to forge a zstd frame. Beyond "no
// crash, no sanitizer report", an accepted delta must keep the reader's promises; a violation traps.
#include <cstddef>
#include <cstdint>
#include <span>

#include "refit/delta_format.h"
#include "refit/index_codec.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void check_accepted(const mxq::refit::Delta& d) {
  using namespace mxq::refit;
  TensorTable table;
  for (const TensorDelta& t : d.tensors) {
    auto g = tensor_geometry(t.format, t.shape, t.name);
    check(g.has_value());
    // The reader's promise: indices in range and strictly increasing, byte counts that match.
    for (int p = 0; p < 2; ++p) {
      const PlaneDelta& pd = p == 0 ? t.values : t.scales;
      const Plane plane = p == 0 ? Plane::kValues : Plane::kScales;
      check(check_indices(pd.indices, (*g)[p].entries).has_value());
      const int64_t expect = t.anchor
                                 ? (*g)[p].bytes
                                 : static_cast<int64_t>(pd.indices.size()) *
                                       (is_quantized(t.format) || p == 0 ? entry_bytes(t.format, plane) : 0);
      check(static_cast<int64_t>(pd.bytes.size()) == expect);
    }
    table[t.name] = {t.format, t.shape};
  }
  // Validation is total (a verdict, never a crash); a delta it accepts re-encodes and reads back the same.
  auto s = validate_delta(d, table, d.base_version);
  if (!s) {
    check(!s.error().message.empty() && s.error().message.find('\n') == std::string::npos);
    return;
  }
  auto body = encode_delta_body(d);
  check(body.has_value());
  auto back = decode_delta_body(*body);
  check(back.has_value() && back->tensors.size() == d.tensors.size());
  for (size_t i = 0; i < d.tensors.size(); ++i)
    check(back->tensors[i].values.indices == d.tensors[i].values.indices &&
          back->tensors[i].scales.bytes == d.tensors[i].scales.bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  // note: the product's own limits (ReadLimits{}: 64 GiB, what `--apply-delta` and `delta inspect` use), not
  // a harness cap: a 1 MiB cap here hid the 60 GiB zstd content-size abort (issue 22). What bounds memory per
  // run is the reader's frame-size check (at most 32768 content bytes per frame byte: 128 MiB at
  // -max_len=4096).
  auto file = mxq::refit::read_delta(input);
  if (file)
    check_accepted(*file);
  else
    check(file.error().message.find('\n') == std::string::npos);
  auto body = mxq::refit::decode_delta_body(input);
  if (body)
    check_accepted(*body);
  else
    check(body.error().message.find('\n') == std::string::npos);
  return 0;
}
