// The last guard of the one-line error rule: control bytes (newline, ESC, DEL, ...) that an untrusted name
// carried into a message (a tensor name from a safetensors header, a config string) are shown as \xNN, so an
// error is one line and cannot drive the terminal. Values are capped where they are echoed (io/safetensors.h
// printable, 200 bytes); this only escapes.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "base/error.h"

namespace mxq {

inline std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out;
}

inline Error one_line(const Error& e) { return Error{escape_controls(e.message)}; }

}  // namespace mxq
