// UTF-8 repair and Unicode normalization for the tokenizer.
// Replacement follows the Unicode "maximal subpart" practice that Rust's String::from_utf8_lossy uses (and
// so HF tokenizers' decode): each maximal invalid or truncated subsequence becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/error.h"

namespace mxq::utf8 {

// One step of decoding at s[pos]: how many bytes it spans and whether they form a whole scalar value.
struct Step {
  enum Kind { kValid, kInvalid, kTruncated };  // kTruncated: a valid prefix cut off by the end of s
  Kind kind;
  size_t length;  // >= 1 for pos < s.size()
};
Step step(std::string_view s, size_t pos);

bool is_valid(std::string_view s);
// Byte offset of the first invalid or truncated sequence, s.size() when none.
size_t first_error(std::string_view s);
// s with every maximal invalid subpart replaced by U+FFFD (EF BF BD).
std::string lossy(std::string_view s);
// The longest prefix length that can be emitted now: it stops before a trailing truncated sequence, which
// later bytes may complete. Invalid sequences inside the prefix are left for lossy() to replace.
size_t complete_prefix(std::string_view s);

// Canonical composition (NFC) through ICU. s must be valid UTF-8.
Result<std::string> nfc(std::string_view s);

}  // namespace mxq::utf8
