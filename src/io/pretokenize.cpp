#include "io/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

namespace mxq {
namespace {

// note: GPT-2's pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

pcre2_code* as_code(const std::shared_ptr<void>& p) { return static_cast<pcre2_code*>(p.get()); }

// Isolated behaviour: every match and every gap between matches becomes its own piece.
void split_isolated(const Regex& re, std::string_view text, std::vector<std::pair<size_t, size_t>>& spans,
                    std::vector<std::string_view>& out) {
  spans.clear();
  re.find_all(text, spans);
  size_t prev = 0;
  for (const auto& [b, e] : spans) {
    if (b > prev) out.push_back(text.substr(prev, b - prev));
    out.push_back(text.substr(b, e - b));
    prev = e;
  }
  if (prev < text.size()) out.push_back(text.substr(prev));
}

}  // namespace

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  const uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err,
                                   &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return fail("regex '{}' does not compile at offset {}: {}", pattern, err_off, reinterpret_cast<char*>(msg));
  }
  // note: JIT failure (e.g. no executable memory) is not an input error; the interpreter gives equal results.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Regex re;
  re.code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
  return re;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  pcre2_code* code = as_code(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: the rest stays one gap piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[1] > ov[0]) {
      out.emplace_back(ov[0], ov[1]);
      pos = ov[1];
    } else {
      // note: an empty match yields no piece (HF drops empty splits); step one whole UTF-8 character on.
      pos = ov[0] + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j, std::string_view where) {
  if (!j.is_object()) return fail("{}: pre_tokenizer must be an object, got {}", where, j.type_name());
  std::vector<nlohmann::json> steps;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    const auto& list = j.contains("pretokenizers") ? j["pretokenizers"] : nlohmann::json();
    if (!list.is_array()) return fail("{}: pre_tokenizer Sequence without a pretokenizers list", where);
    for (const auto& s : list) steps.push_back(s);
  } else {
    steps.push_back(j);
  }
  PreTokenizer pt;
  bool have_byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    const std::string st = s.is_object() ? s.value("type", "") : "";
    if (have_byte_level) return fail("{}: pre_tokenizer step {} ({}) after ByteLevel is not supported", where, i, st);
    if (st == "Split") {
      const std::string behavior = s.value("behavior", "");
      if (behavior != "Isolated") {
        return fail("{}: pre_tokenizer Split behavior '{}' is not supported (expected Isolated)", where, behavior);
      }
      if (s.value("invert", false)) return fail("{}: pre_tokenizer Split with invert=true is not supported", where);
      const auto& pat = s.contains("pattern") ? s["pattern"] : nlohmann::json();
      const bool literal = pat.is_object() && pat.contains("String") && pat["String"].is_string();
      const bool regex = pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string();
      if (!literal && !regex) return fail("{}: pre_tokenizer Split needs a pattern {{Regex|String: text}}", where);
      auto re = Regex::compile(pat[literal ? "String" : "Regex"].get<std::string>(), literal);
      if (!re) return fail_in(where, re.error());
      pt.splits_.push_back(std::move(*re));
    } else if (st == "ByteLevel") {
      have_byte_level = true;
      pt.add_prefix_space_ = s.value("add_prefix_space", true);
      if (s.value("use_regex", true)) {
        auto re = Regex::compile(kGpt2Pattern);
        if (!re) return fail_in(where, re.error());
        pt.byte_level_regex_ = std::make_shared<Regex>(std::move(*re));
      }
    } else {
      return fail("{}: pre_tokenizer '{}' is not supported (expected Split or ByteLevel)", where, st);
    }
  }
  // note: BPE vocabularies of this kind are over byte-level symbols; without ByteLevel no text would encode.
  if (!have_byte_level) return fail("{}: pre_tokenizer has no ByteLevel step", where);
  return pt;
}

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (text.empty()) return;
  std::vector<std::string_view> cur{text}, next;
  std::vector<std::pair<size_t, size_t>> spans;
  for (const Regex& re : splits_) {
    next.clear();
    for (std::string_view piece : cur) split_isolated(re, piece, spans, next);
    cur.swap(next);
  }
  std::string prefixed;
  for (std::string_view piece : cur) {
    // note: HF's ByteLevel prepends the space to every piece it receives, not only to the first one.
    if (add_prefix_space_ && piece.front() != ' ') {
      prefixed.assign(1, ' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (!byte_level_regex_) {
      emit(piece);
      continue;
    }
    next.clear();
    split_isolated(*byte_level_regex_, piece, spans, next);
    for (std::string_view p : next) emit(p);
  }
}

}  // namespace mxq
