// Bad input (checkpoint, request, delta) comes back as an Error value; programmer invariants assert.
#pragma once

#include <fmt/format.h>

#include <string>
#include <tl/expected.hpp>
#include <utility>

namespace mxq {

struct Error {
  std::string message;  // one line, names the file/tensor and expected vs actual
};

template <class T>
using Result = tl::expected<T, Error>;
using Status = tl::expected<void, Error>;

template <class... Args>
[[nodiscard]] tl::unexpected<Error> fail(fmt::format_string<Args...> f, Args&&... args) {
  return tl::unexpected<Error>(Error{fmt::format(f, std::forward<Args>(args)...)});
}

// Prefix an error with context ("model.safetensors: " + message) while passing it up.
[[nodiscard]] inline tl::unexpected<Error> fail_in(std::string_view where, const Error& e) {
  return tl::unexpected<Error>(Error{fmt::format("{}: {}", where, e.message)});
}

}  // namespace mxq
