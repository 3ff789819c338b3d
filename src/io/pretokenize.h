// The pre-tokenizer of an HF tokenizer.json: regex splits, then ByteLevel. It cuts normalized text into the
// pieces that BPE encodes one at a time; pieces stay raw UTF-8 bytes (BpeModel does the byte-level mapping).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"

namespace mxq {

// A PCRE2 pattern compiled in UTF + UCP mode (Unicode \s, \p{L}) with the JIT, as HF's Oniguruma reads it.
class Regex {
 public:
  static Result<Regex> compile(std::string_view pattern, bool literal = false);
  // Appends the non-empty matches of text as [begin, end) byte ranges. text must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8, freed by its deleter
};

class PreTokenizer {
 public:
  // `where` names the file for errors. Accepts ByteLevel, or Sequence[Split(Isolated)..., ByteLevel].
  static Result<PreTokenizer> from_json(const nlohmann::json& j, std::string_view where);
  // Calls emit for each piece of text in order; the views are valid only during the call.
  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;

 private:
  std::vector<Regex> splits_;  // Split steps, each with behavior Isolated
  bool add_prefix_space_ = false;
  std::shared_ptr<Regex> byte_level_regex_;  // set when ByteLevel has use_regex=true (the GPT-2 pattern)
};

}  // namespace mxq
