#include "io/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <nlohmann/json.hpp>
#include <span>

namespace mxq {
namespace {

// note: GPT-2's pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct CodeRange {
  char32_t lo, hi;
};
#include "io/regex_unicode.inc"

std::string hex_escape(char32_t c) { return fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(c)); }

// Class items (no brackets) for what Oniguruma inside `tokenizers` means by \p{L}, \p{N} and \s.
std::string class_items(char kind) {
  std::string out;
  if (kind == 's') {
    for (char32_t c : kWhitespace) out += hex_escape(c);
    return out;
  }
  out = kind == 'L' ? "\\p{L}" : "\\p{N}";
  for (const CodeRange& r :
       kind == 'L' ? std::span<const CodeRange>(kExtraLetters) : std::span<const CodeRange>(kExtraNumbers)) {
    out += hex_escape(r.lo) + "-" + hex_escape(r.hi);
  }
  return out;
}

// Rewrites \p{L}, \p{N}, \s and \S (outside classes) to the character sets `tokenizers` uses.
// note: PCRE2 10.42 has Unicode 14 tables and counts U+180E as \s; tokenizers 0.23's Oniguruma has Unicode 16
// and does not. Without this, letters added since (e.g. CJK Ext. H) split differently.
std::string to_onig_classes(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const std::string_view rest = pattern.substr(i);
      char kind = 0;
      size_t len = 2;
      if (rest.starts_with("\\p{L}") || rest.starts_with("\\p{N}")) {
        kind = rest[3];
        len = 5;
      } else if (rest[1] == 's' || (rest[1] == 'S' && !in_class)) {
        kind = rest[1];
      }
      if (kind == 0) {
        out.append(rest.substr(0, 2));
      } else if (in_class) {
        out += class_items(kind);
      } else {
        out += (kind == 'S' ? "[^" : "[") + class_items(kind == 'S' ? 's' : kind) + "]";
      }
      i += len - 1;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // note: a ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

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
  // note: PCRE2 refuses UCP together with LITERAL; a literal needs no character classes anyway.
  const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  const std::string source = literal ? std::string(pattern) : to_onig_classes(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), opts, &err,
                                   &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return fail("regex '{}' does not compile at offset {}: {}", pattern, err_off,
                reinterpret_cast<char*>(msg));
  }
  // note: JIT failure (e.g. no executable memory) is not an input error; the interpreter gives equal results.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Regex re;
  re.code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
  return re;
}

// note: match data is per call (not per Regex) so one Tokenizer can encode from many threads at once.
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
    if (have_byte_level)
      return fail("{}: pre_tokenizer step {} ({}) after ByteLevel is not supported", where, i, st);
    if (st == "Split") {
      const std::string behavior = s.value("behavior", "");
      if (behavior != "Isolated") {
        return fail("{}: pre_tokenizer Split behavior '{}' is not supported (expected Isolated)", where,
                    behavior);
      }
      if (s.value("invert", false))
        return fail("{}: pre_tokenizer Split with invert=true is not supported", where);
      const auto& pat = s.contains("pattern") ? s["pattern"] : nlohmann::json();
      const bool literal = pat.is_object() && pat.contains("String") && pat["String"].is_string();
      const bool regex = pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string();
      if (!literal && !regex)
        return fail("{}: pre_tokenizer Split needs a pattern {{Regex|String: text}}", where);
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
