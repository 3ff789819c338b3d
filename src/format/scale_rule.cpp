#include "format/scale_rule.h"

#include <array>

#include "format/element_encode.h"

namespace mxq {

namespace {
constexpr std::array<std::string_view, 4> kRuleNames = {"ceil", "ocp", "floor", "ct"};
}  // namespace

Result<ScaleRule> parse_scale_rule(std::string_view name) {
  for (size_t i = 0; i < kRuleNames.size(); ++i)
    if (kRuleNames[i] == name) return static_cast<ScaleRule>(i);
  return fail("unknown scale rule '{}' (expected one of ceil, ocp, floor, ct)", name);
}

std::string_view scale_rule_name(ScaleRule rule) { return kRuleNames[static_cast<size_t>(rule)]; }

ScaleRule default_scale_rule(Format fmt) { return fmt == Format::kMXFP4 ? ScaleRule::kCt : ScaleRule::kCeil; }

uint8_t mx_scale_byte(Format fmt, ScaleRule rule, float amax) {
  const detail::MxElement el = fmt == Format::kMXFP4 ? detail::kMxE2M1 : detail::kMxE4M3;
  return detail::mx_scale_from_bits(rule, el, std::bit_cast<uint32_t>(amax) & detail::kF32AbsMask);
}

}  // namespace mxq
