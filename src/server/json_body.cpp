#include "server/json_body.h"

#include <cmath>
#include <vector>

#include "io/safetensors.h"  // printable()

namespace mxq::server {
namespace {

constexpr int kMaxDepth = 64;

std::string kind_of(const nlohmann::json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

}  // namespace

ApiResult<nlohmann::json> parse_json_object(std::string_view body) {
  using nlohmann::json;
  // note: nlohmann keeps the last of duplicate keys; the callback sees every key first and refuses a repeat,
  // so {"max_tokens": 1, "max_tokens": 100000} cannot slip past a check on the first one.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool too_deep = false;
  auto cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth) too_deep = true;
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && duplicate.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) duplicate = k;
    }
    return !too_deep && duplicate.empty();
  };
  json j;
  try {
    j = json::parse(body.begin(), body.end(), cb);
  } catch (const json::exception& e) {
    if (too_deep) return tl::unexpected(bad_request("", fmt::format("JSON nests deeper than {} levels", kMaxDepth)));
    if (!duplicate.empty())
      return tl::unexpected(bad_request(duplicate, fmt::format("duplicate key '{}' in the JSON body",
                                                               printable(duplicate))));
    // note: nlohmann's message names the byte offset and what it expected; it quotes at most a few bytes.
    return tl::unexpected(bad_request("", fmt::format("the body is not valid JSON: {}", e.what())));
  }
  if (too_deep) return tl::unexpected(bad_request("", fmt::format("JSON nests deeper than {} levels", kMaxDepth)));
  if (!duplicate.empty())
    return tl::unexpected(bad_request(
        duplicate, fmt::format("duplicate key '{}' in the JSON body", printable(duplicate))));
  if (!j.is_object())
    return tl::unexpected(bad_request("", fmt::format("the body is {}, expected a JSON object", kind_of(j))));
  return j;
}

const nlohmann::json* Fields::raw(const std::string& key) {
  seen_.insert(key);
  auto it = obj_->find(key);
  if (it == obj_->end() || it->is_null()) return nullptr;
  return &*it;
}

ApiResult<std::optional<bool>> Fields::boolean(const std::string& key) {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    return tl::unexpected(bad_request(name(key), fmt::format("{}: {}, expected a boolean", name(key), kind_of(*v))));
  return v->get<bool>();
}

ApiResult<std::optional<int64_t>> Fields::integer(const std::string& key, int64_t lo, int64_t hi) {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  auto range = [&](const std::string& shown) {
    return tl::unexpected(bad_request(name(key), fmt::format("{}: {}, expected an integer in [{}, {}]", name(key),
                                                             shown, lo, hi)));
  };
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) return range(std::to_string(u));
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) return range(std::to_string(i));
    return i;
  }
  // note: 16.0 is accepted as 16 (Python clients send floats for ints); 16.5 and 1e300 are not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
      return static_cast<int64_t>(d);
    return range(fmt::format("{}", d));
  }
  return tl::unexpected(bad_request(name(key), fmt::format("{}: {}, expected an integer", name(key), kind_of(*v))));
}

ApiResult<std::optional<uint64_t>> Fields::bits64(const std::string& key) {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer()) return static_cast<uint64_t>(v->get<int64_t>());
  return tl::unexpected(
      bad_request(name(key), fmt::format("{}: {}, expected a 64-bit integer", name(key), kind_of(*v))));
}

ApiResult<std::optional<double>> Fields::number(const std::string& key, double lo, double hi) {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    return tl::unexpected(bad_request(name(key), fmt::format("{}: {}, expected a number", name(key), kind_of(*v))));
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi))
    return tl::unexpected(
        bad_request(name(key), fmt::format("{}: {}, expected a number in [{}, {}]", name(key), d, lo, hi)));
  return d;
}

ApiResult<std::optional<std::string>> Fields::string(const std::string& key, size_t max_bytes) {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_string())
    return tl::unexpected(bad_request(name(key), fmt::format("{}: {}, expected a string", name(key), kind_of(*v))));
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_bytes)
    return tl::unexpected(bad_request(
        name(key), fmt::format("{}: {} bytes, the limit is {}", name(key), s.size(), max_bytes)));
  return s;
}

void Fields::allow(std::initializer_list<const char*> keys) {
  for (const char* k : keys) seen_.insert(k);
}

std::optional<ApiError> Fields::unknown() const {
  for (const auto& [k, v] : obj_->items())
    if (!seen_.count(k))
      return bad_request(name(k), fmt::format("{}: unsupported field (mxq does not implement it; leave it out)",
                                              printable(name(k))));
  return std::nullopt;
}

}  // namespace mxq::server
