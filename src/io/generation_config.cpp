#include "io/generation_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/regular_file.h"
#include "io/config.h"
#include "io/safetensors.h"  // printable

namespace mxq {
namespace {

using json = nlohmann::json;

// note: real generation_config.json files are a few hundred bytes; 1 MiB bounds a hostile one.
constexpr int64_t kMaxFileBytes = int64_t{1} << 20;
constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();  // stop ids are int32 in GenerateParams
constexpr size_t kMaxEosIds = 1024;

// One row per float key vLLM reads, with the range its SamplingParams._verify_args accepts.
struct FloatKey {
  const char* key;
  std::optional<float> GenerationConfig::*dst;
  double lo, hi;
  bool lo_open, hi_open;
  const char* range;  // as printed in errors
};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr FloatKey kFloatKeys[] = {
    {"temperature", &GenerationConfig::temperature, 0, kInf, false, true, "[0, inf)"},
    {"top_p", &GenerationConfig::top_p, 0, 1, true, false, "(0, 1]"},
    {"min_p", &GenerationConfig::min_p, 0, 1, false, false, "[0, 1]"},
    {"repetition_penalty", &GenerationConfig::repetition_penalty, 0, kInf, true, true, "(0, inf)"},
};

struct IntKey {
  const char* key;
  std::optional<int64_t> GenerationConfig::*dst;
  int64_t lo, hi;
};
constexpr IntKey kIntKeys[] = {
    {"top_k", &GenerationConfig::top_k, -1, kMaxId},  // -1 and 0 both mean off
    {"max_new_tokens", &GenerationConfig::max_new_tokens, 1, kMaxId},
};

// nlohmann keeps non-negative integers unsigned and negative ones signed; both are read without narrowing.
Result<int64_t> get_int(const json& v, std::string_view key, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo)
      return fail("{}: expected an integer in [{}, {}], got {}", key, lo, hi, u);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) return fail("{}: expected an integer in [{}, {}], got {}", key, lo, hi, i);
    return i;
  }
  return fail("{}: expected an integer, got {} {}", key, v.type_name(), printable(v.dump()));
}

Result<float> get_float(const json& v, const FloatKey& k) {
  if (!v.is_number()) return fail("{}: expected a number, got {} {}", k.key, v.type_name(), printable(v.dump()));
  const double d = v.get<double>();
  // note: 1e400 parses as inf, and 1e39 is finite as a double but inf as the float the sampler takes.
  const bool below = k.lo_open ? !(d > k.lo) : !(d >= k.lo);
  const bool above = k.hi_open ? !(d < k.hi) : !(d <= k.hi);
  if (below || above || !std::isfinite(static_cast<float>(d)))
    return fail("{}: expected a finite number in {}, got {}", k.key, k.range, printable(v.dump()));
  return static_cast<float>(d);
}

Result<std::vector<int64_t>> get_eos_ids(const json& v) {
  std::vector<int64_t> ids;
  auto add = [&](const json& e) -> Status {
    auto id = get_int(e, "eos_token_id", 0, kMaxId);
    if (!id) return tl::unexpected(id.error());
    ids.push_back(*id);
    return {};
  };
  if (v.is_array()) {
    if (v.size() > kMaxEosIds)
      return fail("eos_token_id: expected at most {} ids, got {}", kMaxEosIds, v.size());
    for (const json& e : v)
      if (auto s = add(e); !s) return tl::unexpected(s.error());
  } else if (v.is_number()) {
    if (auto s = add(v); !s) return tl::unexpected(s.error());
  } else {
    return fail("eos_token_id: expected an integer or a list of integers, got {} {}", v.type_name(),
                printable(v.dump()));
  }
  return ids;
}

Result<GenerationConfig> parse_object(const json& obj) {
  if (!obj.is_object()) return fail("expected a JSON object, got {}", obj.type_name());
  GenerationConfig c;
  // note: a null value is "not set", as vLLM's `config.get(p) is not None` filter treats it.
  auto find = [&](const char* key) -> const json* {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* v = find("eos_token_id")) {
    auto ids = get_eos_ids(*v);
    if (!ids) return tl::unexpected(ids.error());
    c.eos_token_ids = std::move(*ids);
  }
  for (const FloatKey& k : kFloatKeys) {
    if (const json* v = find(k.key)) {
      auto f = get_float(*v, k);
      if (!f) return tl::unexpected(f.error());
      c.*k.dst = *f;
    }
  }
  for (const IntKey& k : kIntKeys) {
    if (const json* v = find(k.key)) {
      auto i = get_int(*v, k.key, k.lo, k.hi);
      if (!i) return tl::unexpected(i.error());
      c.*k.dst = *i;
    }
  }
  return c;
}

}  // namespace

bool GenerationConfig::empty() const {
  return eos_token_ids.empty() && !temperature && !top_p && !min_p && !top_k && !repetition_penalty &&
         !max_new_tokens;
}

std::optional<float> GenerationConfig::unsupported_repetition_penalty() const {
  if (repetition_penalty && *repetition_penalty != 1.0f) return repetition_penalty;
  return std::nullopt;
}

bool ResolvedSampling::max_new_tokens_from_generation_config() const {
  return std::find(from_generation_config.begin(), from_generation_config.end(), "max_new_tokens") !=
         from_generation_config.end();
}

Result<GenerationConfig> parse_generation_config(std::string_view json_text, std::string_view origin) {
  auto parsed = parse_json_text(json_text, origin);
  if (!parsed) return tl::unexpected(parsed.error());
  auto c = parse_object(*parsed);
  if (!c) return fail_in(origin, c.error());
  return c;
}

Result<GenerationConfig> load_generation_config(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  auto text = read_regular_file(path, kMaxFileBytes);
  if (!text) return tl::unexpected(text.error());
  if (!*text) return GenerationConfig{};
  return parse_generation_config(**text, path);
}

ResolvedSampling apply_generation_defaults(const GenerationConfig& config, const SamplingRequest& request,
                                           const SamplingFallback& fallback) {
  ResolvedSampling r;
  auto pick = [&r](const auto& requested, const auto& from_file, const auto& otherwise, const char* key) {
    if (requested) return *requested;
    if (from_file) {
      r.from_generation_config.emplace_back(key);
      return *from_file;
    }
    return otherwise;
  };
  r.temperature = pick(request.temperature, config.temperature, fallback.temperature, "temperature");
  r.top_p = pick(request.top_p, config.top_p, fallback.top_p, "top_p");
  r.min_p = pick(request.min_p, config.min_p, fallback.min_p, "min_p");
  r.top_k = pick(request.top_k, config.top_k, fallback.top_k, "top_k");
  r.repetition_penalty = pick(request.repetition_penalty, config.repetition_penalty,
                              fallback.repetition_penalty, "repetition_penalty");
  r.max_new_tokens =
      pick(request.max_new_tokens, config.max_new_tokens, fallback.max_new_tokens, "max_new_tokens");
  return r;
}

std::vector<int32_t> extra_stop_token_ids(const GenerationConfig& config,
                                          std::span<const int64_t> model_eos) {
  std::vector<int32_t> out;
  for (int64_t id : config.eos_token_ids) {
    const bool known = std::find(model_eos.begin(), model_eos.end(), id) != model_eos.end() ||
                       std::find(out.begin(), out.end(), static_cast<int32_t>(id)) != out.end();
    if (!known) out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace mxq
