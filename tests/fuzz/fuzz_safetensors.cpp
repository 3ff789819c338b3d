// libFuzzer harness for the safetensors header validator (parse_safetensors on an in-memory image).
// Beyond "no crash, no sanitizer report", an accepted image must satisfy what the validator promises its
// callers; a violation traps, which libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/safetensors.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> image(data, size);
  mxq::Result<mxq::SafetensorsHeader> header = mxq::parse_safetensors(image, "fuzz.safetensors");
  if (!header) {
    // Errors are one line (G-09: every failure is a value, never an abort).
    check(!header.error().message.empty() && header.error().message.find('\n') == std::string::npos);
    return 0;
  }
  check(header->data_offset == 8 + header->header_bytes && header->data_offset <= size);
  // Tensors tile the data section exactly, in order, each the size its shape and dtype say.
  uint64_t cursor = 0;
  for (const mxq::TensorEntry& t : header->tensors) {
    check(t.begin == cursor && t.end >= t.begin && t.shape.size() <= mxq::kMaxRank);
    mxq::Result<uint64_t> n = mxq::tensor_nbytes(t.dtype, t.shape, t.name);
    check(n.has_value() && *n == t.nbytes());
    check(mxq::parse_dtype(mxq::dtype_name(t.dtype)).value_or(mxq::Dtype::kCount) == t.dtype);
    cursor = t.end;
  }
  check(cursor == size - header->data_offset);
  return 0;
}
