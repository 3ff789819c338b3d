// Reading a request body as JSON the strict way (bad_inputs H-08): one object, no duplicate keys, valid
// UTF-8, every field of the expected type, and every field the route does not know refused by name (a
// field mxq would otherwise ignore changes what the client asked for). Errors are OpenAI-shaped 400s.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "server/api_error.h"

namespace mxq::server {

template <class T>
using ApiResult = tl::expected<T, ApiError>;

// Parses `body` into a JSON object; refuses non-JSON, a non-object, duplicate keys at any depth, invalid
// UTF-8 and nesting deeper than 64 levels.
ApiResult<nlohmann::json> parse_json_object(std::string_view body);

// Typed access to one JSON object's fields. Each getter returns nullopt when the field is absent or null,
// and an error naming the field (with `where` as prefix, e.g. "messages[2].") when it has the wrong type or
// range. `unknown()` names the first field no getter asked for and `allow` does not list.
class Fields {
 public:
  Fields(const nlohmann::json& obj, std::string where = "") : obj_(&obj), where_(std::move(where)) {}

  ApiResult<std::optional<bool>> boolean(const std::string& key);
  ApiResult<std::optional<int64_t>> integer(const std::string& key, int64_t lo, int64_t hi);
  // Any 64-bit integer, signed or not (seeds): negative values keep their two's complement bits.
  ApiResult<std::optional<uint64_t>> bits64(const std::string& key);
  ApiResult<std::optional<double>> number(const std::string& key, double lo, double hi);
  ApiResult<std::optional<std::string>> string(const std::string& key, size_t max_bytes);
  // The raw value (any type) for fields with a union type; the caller checks it.
  const nlohmann::json* raw(const std::string& key);

  // Marks fields that are accepted without effect (documented per route).
  void allow(std::initializer_list<const char*> keys);
  // A 400 naming the first field that was neither read nor allowed.
  std::optional<ApiError> unknown() const;

  std::string name(const std::string& key) const { return where_ + key; }

 private:
  const nlohmann::json* obj_;
  std::string where_;
  std::set<std::string> seen_;
};

}  // namespace mxq::server
