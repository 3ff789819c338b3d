// libFuzzer harness: config.json parsing and quantization-scheme detection on arbitrary JSON.
// Input: one JSON document, read as config.json; its optional keys "tensors" ({name: {"dtype", "shape"}})
// and "hf_quant_config" feed detect_scheme. Invariants: nothing crashes or throws, and whatever is detected
// survives a round trip through the writer (make_quantization_config -> detect_scheme gives the same scheme).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "io/config.h"
#include "io/scheme.h"

namespace {

using nlohmann::json;

mxq::TensorMetaMap tensors_from(const json& obj) {
  mxq::TensorMetaMap out;
  auto it = obj.find("tensors");
  if (it == obj.end() || !it->is_object()) return out;
  for (const auto& [name, meta] : it->items()) {
    if (!meta.is_object()) continue;
    auto dtype = meta.find("dtype");
    auto shape = meta.find("shape");
    if (dtype == meta.end() || !dtype->is_string() || shape == meta.end() || !shape->is_array()) continue;
    mxq::TensorMeta m{dtype->get<std::string>(), {}};
    for (const json& d : *shape)
      if (d.is_number_integer()) m.shape.push_back(d.get<int64_t>());
    out.emplace(name, std::move(m));
  }
  return out;
}

bool plain_names(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    for (char c : n)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_')) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto cfg = mxq::parse_config(text, "fuzz/config.json");
  auto parsed = mxq::parse_json_text(text, "fuzz");
  if (!parsed || !parsed->is_object()) return 0;
  const json& obj = *parsed;
  json qc = nullptr;
  if (cfg) {
    qc = cfg->quantization_config;
    for (int64_t layer = 0; layer < std::min<int64_t>(cfg->num_hidden_layers, 8); ++layer)
      cfg->layer_is_sparse(layer);
  } else if (auto it = obj.find("quantization_config"); it != obj.end()) {
    qc = *it;
  }
  const json* hf = nullptr;
  if (auto it = obj.find("hf_quant_config"); it != obj.end()) hf = &*it;
  const mxq::TensorMetaMap tensors = tensors_from(obj);

  auto scheme = mxq::detect_scheme(qc, hf, tensors);
  if (!scheme) return 0;
  (void)mxq::check_partitions(*scheme, 2);
  for (const auto& [name, check] : scheme->byte_checks) {
    if (check.bytes > 4096) continue;
    std::vector<uint8_t> bytes(static_cast<size_t>(check.bytes));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = data[i % size];
    (void)mxq::check_tensor_bytes(*scheme, name, bytes);
  }
  if (!plain_names(scheme->ignored)) return 0;
  const json written = mxq::make_quantization_config(scheme->kind, scheme->ignored);
  const auto written_hf = mxq::make_hf_quant_config(scheme->kind, scheme->ignored);
  auto again = mxq::detect_scheme(written, written_hf ? &*written_hf : nullptr, tensors);
  if (!again || again->kind != scheme->kind || again->ignored != scheme->ignored ||
      again->linears.size() != scheme->linears.size())
    std::abort();  // the writer and the reader disagree
  return 0;
}
