#include "io/utf8_text.h"

#include <unicode/unorm2.h>
#include <unicode/uset.h>
#include <unicode/ustring.h>

#include <climits>
#include <vector>

namespace mxq::utf8 {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// note: second-byte ranges per lead byte are Unicode Table 3-7 (well-formed UTF-8); they exclude overlongs
// (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points above U+10FFFF (F4 90..BF).
struct LeadRule {
  uint8_t count;   // continuation bytes that follow
  uint8_t lo, hi;  // range of the first continuation byte
};

LeadRule rule_for(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {0, 0, 0};
}

// note: HF tokenizers normalizes with the unicode-normalization-alignments crate, whose tables are Unicode
// 9.0: characters assigned later have no decomposition and combining class 0 there. ICU's filtered normalizer
// over [:Age=9.0:] reproduces that (characters outside the set are left alone and end a reordering run);
// checked equal to tokenizers' NFC on 1.1 M strings around every code point, where plain ICU NFC differs
// on 51.
const UNormalizer2* unicode9_nfc(UErrorCode* err) {
  static UErrorCode init_err = U_ZERO_ERROR;
  static const UNormalizer2* norm = [] {
    const UNormalizer2* full = unorm2_getNFCInstance(&init_err);
    static const std::u16string pattern = u"[:Age=9.0:]";
    USet* set = uset_openPattern(reinterpret_cast<const UChar*>(pattern.data()),
                                 static_cast<int32_t>(pattern.size()), &init_err);
    if (U_FAILURE(init_err)) return static_cast<const UNormalizer2*>(nullptr);
    uset_freeze(set);  // note: owned by the filtered normalizer's lifetime, which is the process's
    return static_cast<const UNormalizer2*>(unorm2_openFiltered(full, set, &init_err));
  }();
  *err = init_err;
  return norm;
}

}  // namespace

Step step(std::string_view s, size_t pos) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  if (lead < 0x80) return {Step::kValid, 1};
  const LeadRule rule = rule_for(lead);
  if (rule.count == 0) return {Step::kInvalid, 1};
  size_t len = 1;
  for (uint8_t k = 0; k < rule.count; ++k) {
    if (pos + len >= s.size()) return {Step::kTruncated, len};
    const auto b = static_cast<uint8_t>(s[pos + len]);
    const uint8_t lo = k == 0 ? rule.lo : 0x80, hi = k == 0 ? rule.hi : 0xBF;
    if (b < lo || b > hi) return {Step::kInvalid, len};
    ++len;
  }
  return {Step::kValid, len};
}

size_t first_error(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Step st = step(s, pos);
    if (st.kind != Step::kValid) return pos;
    pos += st.length;
  }
  return s.size();
}

bool is_valid(std::string_view s) { return first_error(s) == s.size(); }

// note: a valid prefix is copied in one append; most decoded text has no error at all.
std::string lossy(std::string_view s) {
  size_t bad = first_error(s);
  if (bad == s.size()) return std::string(s);
  std::string out(s.substr(0, bad));
  for (size_t pos = bad; pos < s.size();) {
    const Step st = step(s, pos);
    if (st.kind == Step::kValid) {
      out.append(s.substr(pos, st.length));
    } else {
      out.append(kReplacement);
    }
    pos += st.length;
  }
  return out;
}

size_t complete_prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const Step st = step(s, pos);
    if (st.kind == Step::kTruncated) return pos;
    pos += st.length;
  }
  return s.size();
}

Result<std::string> nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);  // note: ASCII is always NFC; skips two UTF-16 conversions
  if (s.size() > static_cast<size_t>(INT32_MAX / 4))
    return fail("NFC: text of {} bytes is too long", s.size());
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = unicode9_nfc(&err);
  if (U_FAILURE(err) || norm == nullptr) return fail("NFC: ICU has no NFC instance ({})", u_errorName(err));
  // note: UTF-16 never has more code units than the UTF-8 input has bytes.
  std::vector<UChar> src(s.size() + 1);
  int32_t src_len = 0;
  u_strFromUTF8(src.data(), static_cast<int32_t>(src.size()), &src_len, s.data(),
                static_cast<int32_t>(s.size()), &err);
  if (U_FAILURE(err)) return fail("NFC: input is not UTF-8 ({})", u_errorName(err));
  // note: NFC can grow text (a few compatibility-excluded characters decompose); ICU reports the size needed.
  std::vector<UChar> dst(static_cast<size_t>(src_len) * 2 + 16);
  int32_t dst_len =
      unorm2_normalize(norm, src.data(), src_len, dst.data(), static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.resize(static_cast<size_t>(dst_len));
    dst_len = unorm2_normalize(norm, src.data(), src_len, dst.data(), static_cast<int32_t>(dst.size()), &err);
  }
  if (U_FAILURE(err)) return fail("NFC: normalization failed ({})", u_errorName(err));
  std::string out(static_cast<size_t>(dst_len) * 3, '\0');
  int32_t out_len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_len, dst.data(), dst_len, &err);
  if (U_FAILURE(err)) return fail("NFC: UTF-8 conversion failed ({})", u_errorName(err));
  out.resize(static_cast<size_t>(out_len));
  return out;
}

}  // namespace mxq::utf8
