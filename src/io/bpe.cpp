#include "io/bpe.h"
#include "io/safetensors.h"  // printable

#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>

namespace mxq {
namespace {

// note: ids at or above this are refused: they would size the id -> token table (G-06 narrowing, memory).
constexpr int64_t kMaxVocabId = int64_t{1} << 24;
// note: the cache stops growing at this many pieces; long pieces (runs of spaces) are not cached at all.
constexpr size_t kCacheCapacity = 1 << 16;
constexpr size_t kCacheMaxPieceBytes = 256;

struct ByteSymbols {
  std::array<std::string, 256> symbol;
  std::unordered_map<uint32_t, uint8_t> byte_of;  // code point -> byte
};

// GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes take the code
// points 256, 257, ... in byte order.
const ByteSymbols& byte_symbols() {
  static const ByteSymbols table = [] {
    ByteSymbols t;
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : extra++;
      std::string& s = t.symbol[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // note: every symbol is below U+0800, so two UTF-8 bytes
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t.byte_of[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return table;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

Result<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& m, size_t i,
                                                        std::string_view where) {
  if (m.is_string()) {
    const auto& s = m.get_ref<const std::string&>();
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      return fail("{}: merge {} '{}' is not two tokens separated by one space", where, i, printable(s));
    }
    return std::pair{s.substr(0, sp), s.substr(sp + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::pair{m[0].get<std::string>(), m[1].get<std::string>()};
  }
  return fail("{}: merge {} is neither \"a b\" nor [a, b]: {}", where, i, m.dump().substr(0, 80));
}

bool null_or_empty(const nlohmann::json& model, const char* key) {
  if (!model.contains(key) || model[key].is_null()) return true;
  return model[key].is_string() && model[key].get_ref<const std::string&>().empty();
}

}  // namespace

struct BpeModel::Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, TransparentHash, std::equal_to<>> map;
};

std::string_view byte_symbol(uint8_t b) { return byte_symbols().symbol[b]; }

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  const auto& byte_of = byte_symbols().byte_of;
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const auto c0 = static_cast<uint8_t>(token[i]);
    uint32_t cp = 0;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // three- and four-byte characters are never byte symbols
    }
    const auto it = byte_of.find(cp);
    if (it == byte_of.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

Result<BpeModel> BpeModel::from_json(const nlohmann::json& model, std::string_view where) {
  if (!model.is_object() || model.value("type", "") != "BPE") {
    return fail("{}: model type must be BPE, got {}", where,
                model.is_object() && model.contains("type") ? model["type"].dump() : "none");
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return fail("{}: BPE dropout {} is not supported (expected null)", where, printable(model["dropout"].dump()));
  }
  if (model.value("byte_fallback", false)) return fail("{}: BPE byte_fallback=true is not supported", where);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!null_or_empty(model, key))
      return fail("{}: BPE {} {} is not supported", where, key, printable(model[key].dump()));
  }
  const auto& vocab = model.contains("vocab") ? model["vocab"] : nlohmann::json();
  if (!vocab.is_object()) return fail("{}: BPE vocab must be an object of token -> id", where);

  BpeModel m;
  m.ignore_merges_ = model.value("ignore_merges", false);
  m.vocab_.reserve(vocab.size());
  // note: the tables are indexed by id, so ids must be about as dense as the entries that name them: one
  // entry with id 2^24 - 1 built 16M-entry tables (1.1 GB) before any other check (issue 22).
  const int64_t id_bound = std::min<int64_t>(kMaxVocabId, dense_id_bound(static_cast<int64_t>(vocab.size())));
  for (const auto& [tok, idj] : vocab.items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= kMaxVocabId) {
      return fail("{}: vocab token '{}' has id {}, expected an integer in [0, {})", where, printable(tok),
                  printable(idj.dump()), kMaxVocabId);
    }
    if (idj.get<int64_t>() >= id_bound)
      return fail("{}: vocab token '{}' has id {} among {} entries; ids must be dense (below {})", where,
                  printable(tok),
                  idj.get<int64_t>(), vocab.size(), id_bound);
    const auto id = static_cast<int32_t>(idj.get<int64_t>());
    if (static_cast<size_t>(id) >= m.tokens_.size()) {
      m.tokens_.resize(static_cast<size_t>(id) + 1);
      m.present_.resize(static_cast<size_t>(id) + 1, false);
    }
    if (m.present_[static_cast<size_t>(id)]) {
      return fail("{}: vocab id {} is used by both '{}' and '{}'", where, id,
                  printable(m.tokens_[static_cast<size_t>(id)]), printable(tok));
    }
    m.present_[static_cast<size_t>(id)] = true;
    m.tokens_[static_cast<size_t>(id)] = tok;
    m.vocab_.emplace(tok, id);
  }
  bool all_bytes = true;
  for (int b = 0; b < 256; ++b) {
    const auto id = m.token_id(byte_symbol(static_cast<uint8_t>(b)));
    m.byte_id_[static_cast<size_t>(b)] = id.value_or(-1);
    all_bytes &= id.has_value();
  }
  // note: with all 256 byte symbols present the unknown token can never be produced, so it is harmless.
  if (!null_or_empty(model, "unk_token") && !all_bytes) {
    return fail("{}: BPE unk_token {} with an incomplete byte alphabet is not supported", where,
                model["unk_token"].dump());
  }

  const auto& merges = model.contains("merges") ? model["merges"] : nlohmann::json();
  if (!merges.is_array()) return fail("{}: BPE merges must be a list", where);
  m.merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    auto pair = parse_merge(merges[i], i, where);
    if (!pair) return tl::unexpected(pair.error());
    const auto a = m.token_id(pair->first), b = m.token_id(pair->second);
    const auto ab = m.token_id(pair->first + pair->second);
    if (!a || !b || !ab) {
      return fail("{}: merge {} '{} {}' names a token not in the vocab", where, i, printable(pair->first),
                  printable(pair->second));
    }
    // note: a repeated merge keeps its last rank, as HF's collect into a HashMap does.
    m.merges_[pair_key(*a, *b)] = Merge{static_cast<int32_t>(i), *ab};
  }
  m.cache_ = std::make_shared<Cache>();
  return m;
}

std::optional<int32_t> BpeModel::token_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::token(int32_t id) const {
  if (id < 0 || id >= id_end() || !present_[static_cast<size_t>(id)]) return nullptr;
  return &tokens_[static_cast<size_t>(id)];
}

// note: the cache is keyed by the raw bytes of a piece, not its byte-level spelling: the mapping is a
// bijection, and this saves building the symbol string on every hit.
void BpeModel::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    std::string symbols;
    for (char c : bytes) symbols.append(byte_symbol(static_cast<uint8_t>(c)));
    if (const auto id = token_id(symbols)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = bytes.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard lock(cache_->mu);
    const auto it = cache_->map.find(bytes);
    if (it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_symbols(bytes, out);
  if (cacheable) {
    std::lock_guard lock(cache_->mu);
    if (cache_->map.size() < kCacheCapacity) {
      cache_->map.emplace(std::string(bytes),
                          std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(first), out.end()));
    }
  }
}

// HF's word merge: symbols form a doubly linked list over one array (merged-away entries stay, marked dead),
// and a min-heap holds candidate pairs by (rank, left position). Popping a stale pair is checked against the
// merge table rather than removed eagerly. O(n log n) in the piece length, so long runs of spaces stay cheap.
void BpeModel::merge_symbols(std::string_view bytes, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the live list, -1 at the ends
    bool live;
  };
  std::vector<Symbol> sym;
  sym.reserve(bytes.size());
  for (char c : bytes) {
    const int32_t id = byte_id_[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // note: HF drops symbols missing from the vocab when there is no unk_token
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
  }
  // (rank, position, result id); the smallest rank pops first, then the leftmost position
  using Entry = std::tuple<int32_t, int32_t, int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  auto push_pair = [&](int32_t pos) {
    const Symbol& s = sym[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    const auto it = merges_.find(pair_key(s.id, sym[static_cast<size_t>(s.next)].id));
    if (it != merges_.end()) queue.emplace(it->second.rank, pos, it->second.result);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const auto [rank, pos, result] = queue.top();
    queue.pop();
    Symbol& left = sym[static_cast<size_t>(pos)];
    if (!left.live || left.next < 0) continue;
    Symbol& right = sym[static_cast<size_t>(left.next)];
    // note: a stale entry still applies when its pair now merges into the same token; HF checks only that.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.result != result) continue;
    left.id = result;
    right.live = false;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(pos);
  }
  for (const Symbol& s : sym) {
    if (s.live) out.push_back(s.id);
  }
}

}  // namespace mxq
