#include "format/formats.h"

#include "base/error.h"

namespace mxq {

Result<Format> parse_format(std::string_view name) {
  for (const FormatTraits& t : kFormats)
    if (t.name == name) return t.format;
  return fail("unknown format '{}' (expected one of bf16, f16, f32, mxfp8, mxfp4, fp8-b128)", name);
}

}  // namespace mxq
