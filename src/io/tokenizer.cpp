#include "io/tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <nlohmann/json.hpp>

#include "base/regular_file.h"
#include "io/bpe.h"
#include "io/pretokenize.h"
#include "io/safetensors.h"
#include "io/utf8_text.h"

namespace mxq {
namespace {

// note: Qwen3's tokenizer.json is 11 MB; anything past this is not a tokenizer file.
constexpr size_t kMaxFileBytes = size_t{1} << 30;

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

// Leftmost-longest matching of added-token contents, as HF's Aho-Corasick (MatchKind::LeftmostLongest).
// note: candidates are bucketed by first byte and sorted longest first, so the first hit is the longest;
// added-token lists are short (Qwen3 has 26), which keeps this scan cheaper than an automaton to build.
class AddedMatcher {
 public:
  void add(const AddedToken* t) { by_first_[static_cast<uint8_t>(t->content[0])].push_back(t); }
  void finish() {
    for (auto& v : by_first_) {
      std::stable_sort(v.begin(), v.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->content.size() > b->content.size();
      });
    }
  }
  bool empty() const {
    return std::all_of(by_first_.begin(), by_first_.end(), [](const auto& v) { return v.empty(); });
  }
  // Splits text into runs of plain text and added tokens. A special token met while !parse_special stays
  // text, and matching resumes after it (so nothing inside it matches either), as HF does.
  void split(std::string_view text, bool parse_special, const std::function<void(std::string_view)>& on_text,
             std::vector<int32_t>& ids) const {
    size_t pos = 0, text_start = 0;
    while (pos < text.size()) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : by_first_[static_cast<uint8_t>(text[pos])]) {
        if (text.substr(pos).starts_with(t->content)) {
          hit = t;
          break;
        }
      }
      if (hit == nullptr) {
        ++pos;
        continue;
      }
      if (hit->special && !parse_special) {
        pos += hit->content.size();
        continue;
      }
      if (pos > text_start) on_text(text.substr(text_start, pos - text_start));
      ids.push_back(hit->id);
      pos += hit->content.size();
      text_start = pos;
    }
    if (text_start < text.size()) on_text(text.substr(text_start));
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_;
};

Result<std::vector<AddedToken>> parse_added(const nlohmann::json& j, std::vector<bool>& normalized,
                                            std::string_view where) {
  std::vector<AddedToken> out;
  if (j.is_null()) return out;
  if (!j.is_array()) return fail("{}: added_tokens must be a list", where);
  for (const auto& t : j) {
    const std::string content = t.value("content", "");
    const nlohmann::json id = t.contains("id") ? t["id"] : nlohmann::json();
    if (content.empty() || !utf8::is_valid(content)) {
      return fail("{}: added token {} has empty or non-UTF-8 content", where, printable(id.dump()));
    }
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 24)) {
      return fail("{}: added token '{}' has id {}, expected an integer in [0, 2^24)", where, printable(content),
                  printable(id.dump()));
    }
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      if (t.value(flag, false)) {
        return fail("{}: added token '{}' sets {}=true, which is not supported (Qwen uses false)", where,
                    printable(content), flag);
      }
    }
    out.push_back({static_cast<int32_t>(id.get<int64_t>()), content, t.value("special", false)});
    // note: HF's default for a token without the flag is normalized = !special.
    normalized.push_back(t.value("normalized", !out.back().special));
  }
  return out;
}

Status check_type(const nlohmann::json& j, const char* what, std::initializer_list<std::string_view> allowed,
                  bool null_ok, std::string_view where) {
  if (j.is_null() && null_ok) return {};
  const std::string type = j.is_object() ? j.value("type", "") : "";
  for (auto a : allowed) {
    if (type == a) return {};
  }
  return fail("{}: {} {} is not supported (expected {}{})", where, what,
              j.is_null() ? "null" : "'" + type + "'", fmt::join(allowed, " or "), null_ok ? " or null" : "");
}

}  // namespace

// note: `bytes` and `kind` are indexed by id over [0, vocab_size()); ids that neither the BPE vocab nor the
// added tokens use are kAbsent, which decode skips and decode_checked reports.
struct Tokenizer::Impl {
  BpeModel bpe;
  PreTokenizer pre;
  bool nfc = false;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher;        // normalized=false tokens, matched on the text as given
  AddedMatcher norm_matcher;       // normalized=true tokens, matched after NFC
  std::vector<std::string> bytes;  // id -> decoded bytes
  std::vector<uint8_t> kind;       // id -> kAbsent / kModel / kAdded / kSpecial
  std::unordered_map<std::string, int32_t> added_ids;
  enum : uint8_t { kAbsent, kModel, kAdded, kSpecial };
};

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  auto text = read_regular_file(path, kMaxFileBytes);
  if (!text) return fail("tokenizer: {}", text.error().message);
  if (!*text) return fail("{}: no such tokenizer file", path);
  return from_json_text(**text, path);
}

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text, std::string_view where) {
  const auto j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return fail("{}: not a JSON object", where);
  // note: nlohmann's accessors throw on type mismatches; they are caught here so bad files come back as
  // errors, never as exceptions to the caller.
  try {
    for (const char* key : {"truncation", "padding"}) {
      if (j.contains(key) && !j[key].is_null())
        return fail("{}: {} is set, which is not supported", where, key);
    }
    const nlohmann::json none;
    auto field = [&](const char* k) -> const nlohmann::json& { return j.contains(k) ? j[k] : none; };
    if (auto s = check_type(field("normalizer"), "normalizer", {"NFC"}, true, where); !s)
      return tl::unexpected(s.error());
    if (auto s = check_type(field("post_processor"), "post_processor", {"ByteLevel"}, true, where); !s) {
      return tl::unexpected(s.error());
    }
    if (auto s = check_type(field("decoder"), "decoder", {"ByteLevel"}, false, where); !s)
      return tl::unexpected(s.error());

    auto impl = std::make_shared<Impl>();
    impl->nfc = !field("normalizer").is_null();
    if (impl->nfc) {
      if (auto probe = utf8::nfc("e\xCC\x81"); !probe) return fail_in(where, probe.error());
    }
    auto pre = PreTokenizer::from_json(field("pre_tokenizer"), where);
    if (!pre) return tl::unexpected(pre.error());
    impl->pre = std::move(*pre);
    auto bpe = BpeModel::from_json(field("model"), where);
    if (!bpe) return tl::unexpected(bpe.error());
    impl->bpe = std::move(*bpe);

    std::vector<bool> normalized;
    auto added = parse_added(field("added_tokens"), normalized, where);
    if (!added) return tl::unexpected(added.error());
    impl->added = std::move(*added);

    int32_t end = impl->bpe.id_end();
    const int64_t id_bound = dense_id_bound(impl->bpe.size() + static_cast<int64_t>(impl->added.size()));
    for (const auto& t : impl->added) {
      if (t.id >= id_bound)
        return fail("{}: added token '{}' has id {} among {} tokens; ids must be dense (below {})", where,
                    printable(t.content.substr(0, 64)), t.id,
                    impl->bpe.size() + static_cast<int64_t>(impl->added.size()), id_bound);
      end = std::max(end, t.id + 1);
    }
    impl->bytes.assign(static_cast<size_t>(end), {});
    impl->kind.assign(static_cast<size_t>(end), Impl::kAbsent);
    for (int32_t id = 0; id < impl->bpe.id_end(); ++id) {
      if (const std::string* tok = impl->bpe.token(id)) {
        // note: HF's ByteLevel decoder passes a token through unchanged when a character is not a byte
        // symbol.
        impl->bytes[static_cast<size_t>(id)] = byte_level_to_bytes(*tok).value_or(*tok);
        impl->kind[static_cast<size_t>(id)] = Impl::kModel;
      }
    }
    for (size_t i = 0; i < impl->added.size(); ++i) {
      const AddedToken& t = impl->added[i];
      if (!impl->added_ids.emplace(t.content, t.id).second) {
        return fail("{}: added token '{}' is listed twice", where, printable(t.content));
      }
      impl->bytes[static_cast<size_t>(t.id)] = byte_level_to_bytes(t.content).value_or(t.content);
      impl->kind[static_cast<size_t>(t.id)] = t.special ? Impl::kSpecial : Impl::kAdded;
      (normalized[i] ? impl->norm_matcher : impl->raw_matcher).add(&impl->added[i]);
    }
    impl->raw_matcher.finish();
    impl->norm_matcher.finish();
    Tokenizer tok;
    tok.impl_ = std::move(impl);
    return tok;
  } catch (const nlohmann::json::exception& e) {
    return fail("{}: unexpected JSON value type: {}", where, e.what());
  }
}

// Order of HF's AddedVocabulary::extract_and_normalize: tokens with normalized=false are cut out of the raw
// text first; each remaining run is normalized on its own, then tokens with normalized=true are cut out of
// it; what is left goes through the pre-tokenizer and BPE. note: no post-processor step: ByteLevel adds no
// ids.
std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  auto encode_plain = [&](std::string_view piece) {
    m.pre.split(piece, [&](std::string_view p) { m.bpe.encode_piece(p, ids); });
  };
  auto encode_raw_piece = [&](std::string_view piece) {
    std::string normalized;
    if (m.nfc) {
      // note: NFC fails only past ICU's int32 lengths (>512 MB pieces); encode_checked caps input before
      // that.
      auto n = utf8::nfc(piece);
      if (n) {
        normalized = std::move(*n);
        piece = normalized;
      }
    }
    m.norm_matcher.split(piece, parse_special, encode_plain, ids);
  };
  m.raw_matcher.split(text, parse_special, encode_raw_piece, ids);
  return ids;
}

Result<std::vector<int32_t>> Tokenizer::encode_checked(std::string_view text, bool parse_special,
                                                       size_t max_bytes) const {
  if (text.size() > max_bytes)
    return fail("text of {} bytes exceeds the limit of {} bytes", text.size(), max_bytes);
  if (const size_t bad = utf8::first_error(text); bad != text.size()) {
    return fail("text is not UTF-8: invalid byte 0x{:02X} at offset {}", static_cast<uint8_t>(text[bad]),
                bad);
  }
  return encode(text, parse_special);
}

const std::string* Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->kind[static_cast<size_t>(id)] == Impl::kAbsent) return nullptr;
  return &impl_->bytes[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    const std::string* b = token_bytes(id);
    if (b == nullptr || (skip_special && is_special(id))) continue;
    raw.append(*b);
  }
  return utf8::lossy(raw);
}

Result<std::string> Tokenizer::decode_checked(std::span<const int32_t> ids, bool skip_special) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (token_bytes(ids[i]) == nullptr) {
      return fail("token id {} at position {} is not in the vocabulary (vocab size {})", ids[i], i,
                  vocab_size());
    }
  }
  return decode(ids, skip_special);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->kind.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (const auto it = impl_->added_ids.find(std::string(token)); it != impl_->added_ids.end())
    return it->second;
  return impl_->bpe.token_id(token);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->kind[static_cast<size_t>(id)] == Impl::kSpecial;
}

std::string StreamDecoder::push(int32_t id) {
  const std::string* b = tok_->token_bytes(id);
  if (b == nullptr || (skip_ && tok_->is_special(id))) return {};
  pending_.append(*b);
  const size_t n = utf8::complete_prefix(pending_);
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace mxq
