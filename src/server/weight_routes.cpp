// SGLang's weight-update routes (and vLLM's /reset_prefix_cache) on `mxq serve`: /update_weights_from_delta,
// /update_weights_from_disk, /update_weights_from_tensor, /get_weight_version, /update_weight_version,
// /weights_checker, /pause_generation, /continue_generation, /flush_cache, /reset_prefix_cache and
// /get_model_info (docs/serve.md "Weight updates"). Handlers parse and validate; every read or write of the
// weights, the version and the prefix cache is a task on the engine thread (EngineLoop::run_task), so updates
// run one at a time between two steps (W-15) and requests in flight keep running across them.
// /update_weights_from_tensor takes mxq's own manifest of a CUDA IPC buffer (not SGLang's pickled torch
// objects, W-25); its device half is the CUDA build's (refit/tensor_update_cuda.h), a CPU engine refuses it
// by name.
#include <spdlog/spdlog.h>

#include <array>
#include <charconv>
#include <optional>
#include <vector>

#include "server/routes.h"
#include "server/weight_update.h"

namespace mxq::server {
namespace {

using nlohmann::json;

void send(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

// A refused call: the OpenAI error shape, plus SGLang's {success: false, message} beside it.
void send_refusal(httplib::Response& res, const ApiError& e, const std::string& version) {
  json j = error_json(e);
  j["success"] = false;
  j["message"] = e.message;
  j["weight_version"] = version;
  send(res, j, e.status);
}

ApiError not_serving() {
  return {503, "the server is not serving (shutting down or the engine failed)", "",
          "ServiceUnavailableError"};
}

// The body as a JSON object; an empty body is {} (SGLang's clients post some of these routes bare).
ApiResult<json> optional_json_body(const httplib::Request& req, const std::string& raw) {
  if (raw.empty()) return json::object();
  return json_body(req, raw);
}

// A version field: a decimal string (SGLang's type) or a non-negative JSON integer.
ApiResult<std::optional<uint64_t>> version_field(Fields& f, const std::string& key) {
  const json* v = f.raw(key);
  if (!v) return std::optional<uint64_t>();
  std::string text;
  if (v->is_string()) {
    text = v->get<std::string>();
  } else if (v->is_number_unsigned()) {
    return std::optional<uint64_t>(v->get<uint64_t>());
  } else {
    text = v->dump().substr(0, 64);
  }
  auto parsed = parse_version(key, text);
  if (!parsed) return tl::unexpected(bad_request(key, parsed.error().message));
  return std::optional<uint64_t>(*parsed);
}

// The answer of an update: 200 on success, 400 when refused (the old weights serve, exactly), 500 when the
// undo failed (the engine stops serving).
void send_outcome(httplib::Response& res, const UpdateOutcome& o) {
  json j{{"success", o.success},
         {"message", o.message},
         {"weight_version", std::to_string(o.version)},
         {"applied_bytes", o.applied_bytes},
         {"seconds", o.seconds}};
  // note: an ordered list, not an object: the stages' order is the order they ran in.
  if (!o.stages.empty()) {
    json stages = json::array();
    for (const auto& [name, ms] : o.stages) stages.push_back({name, ms});
    j["stages_ms"] = stages;
  }
  if (o.success) return send(res, j);
  const ApiError e =
      o.lost ? ApiError{500, o.message, "", "InternalServerError"} : bad_request("", o.message);
  j.update(error_json(e));
  send(res, j, e.status);
}

// Runs one update on the engine thread: abort first when asked, then the update; on success the version
// advances and the prefix cache is dropped (old-weight KV is never reused, W-19).
template <class Update>
void run_update(httplib::Response& res, RouteContext& ctx, bool abort_first, Update&& update) {
  UpdateOutcome outcome;
  const bool ran = ctx.loop->run_task([&](TaskScope& scope) {
    if (abort_first) scope.abort_all();
    uint64_t version = scope.version();
    outcome = update(version);
    if (outcome.success) {
      scope.reset_prefix_cache();
      scope.set_version(version);
      spdlog::info("mxq serve: weights updated to version {} ({} bytes in {:.3f} s)", version,
                   outcome.applied_bytes, outcome.seconds);
    } else if (outcome.lost) {
      scope.fail(Error{"a weight update failed and could not be undone: " + outcome.message});
    } else {
      spdlog::warn("mxq serve: weight update refused: {}", outcome.message);
    }
  });
  if (!ran) return send_refusal(res, not_serving(), ctx.loop->weight_version());
  ctx.metrics->weight_update(outcome.success, outcome.lost, outcome.seconds, outcome.applied_bytes,
                             outcome.version);
  send_outcome(res, outcome);
}

void update_from_delta(const httplib::Request& req, const std::string& raw, httplib::Response& res,
                       RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  const std::string type = req.get_header_value("Content-Type");
  bool abort_first = false;
  std::vector<uint8_t> from_file;
  // note: a posted body is read in place (no copy of a delta that may be gigabytes).
  std::span<const uint8_t> file(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  if (type.rfind("application/octet-stream", 0) != 0) {
    auto body = json_body(req, raw);
    if (!body) return send_refusal(res, body.error(), version);
    Fields f(*body);
    auto path = f.string("path", 4096);
    auto abort_all = f.boolean("abort_all_requests");
    if (!path) return send_refusal(res, path.error(), version);
    if (!abort_all) return send_refusal(res, abort_all.error(), version);
    if (auto e = f.unknown()) return send_refusal(res, *e, version);
    if (!*path)
      return send_refusal(res,
                          bad_request("path",
                                      "path: required (or post the delta's bytes as "
                                      "application/octet-stream)"),
                          version);
    auto bytes = read_update_file(**path, ctx.weights->max_update_bytes());
    if (!bytes) return send_refusal(res, bad_request("path", bytes.error().message), version);
    from_file = std::move(*bytes);
    file = from_file;
    abort_first = abort_all->value_or(false);
  }
  run_update(res, ctx, abort_first,
             [&](uint64_t& live) { return ctx.weights->apply_delta_file(file, live); });
}

void update_from_disk(const httplib::Request& req, const std::string& raw, httplib::Response& res,
                      RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  auto body = json_body(req, raw);
  if (!body) return send_refusal(res, body.error(), version);
  Fields f(*body);
  auto path = f.string("model_path", 4096);
  auto target = version_field(f, "weight_version");
  auto flush_cache = f.boolean("flush_cache");
  auto abort_all = f.boolean("abort_all_requests");
  // note: SGLang's load_format picks a weight loader; mxq reads what the directory holds, so only its
  // default (null / "auto") is accepted.
  auto load_format = f.string("load_format", 64);
  for (const auto* r : {&flush_cache, &abort_all})
    if (!*r) return send_refusal(res, r->error(), version);
  if (!path) return send_refusal(res, path.error(), version);
  if (!target) return send_refusal(res, target.error(), version);
  if (!load_format) return send_refusal(res, load_format.error(), version);
  if (auto e = f.unknown()) return send_refusal(res, *e, version);
  if (!*path) return send_refusal(res, bad_request("model_path", "model_path: required"), version);
  if (*load_format && **load_format != "auto")
    return send_refusal(
        res, bad_request("load_format", fmt::format("load_format {}: only auto is supported", **load_format)),
        version);
  // note: flush_cache: false is accepted, but the prefix cache is dropped after every successful update
  // (KV computed with the old weights must never be reused, W-19).
  run_update(res, ctx, abort_all->value_or(false),
             [&](uint64_t& live) { return ctx.weights->apply_checkpoint(**path, *target, live); });
}

// Standard base64 (RFC 4648, '=' padding); nullopt for any other text.
std::optional<std::vector<uint8_t>> decode_base64(std::string_view text) {
  auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  if (text.size() % 4 != 0) return std::nullopt;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t word = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      // note: '=' only at the very end (at most two), as the encoder writes it.
      if (c == '=' && i + 4 == text.size() && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++pad, word <<= 6;
        continue;
      }
      const int v = pad ? -1 : sextet(c);
      if (v < 0) return std::nullopt;
      word = word << 6 | static_cast<uint32_t>(v);
    }
    for (int b = 0; b < 3 - pad; ++b) out.push_back(static_cast<uint8_t>(word >> (16 - 8 * b)));
  }
  return out;
}

// The 64-byte cudaIpcMemHandle_t of an "ipc_handle" field: the handle itself, or torch's shareable handle as
// `storage._share_cuda_()[1]` gives it (a version byte, 'c' for a cudaMalloc block, then the handle).
ApiResult<std::array<uint8_t, 64>> ipc_handle(std::string_view text) {
  auto bytes = decode_base64(text);
  if (bytes && bytes->size() == 66 && (*bytes)[1] == 'e')
    return tl::unexpected(bad_request(
        "ipc_handle", "ipc_handle: a torch expandable-segments handle, not a CUDA IPC handle (export from a "
                      "process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)"));
  if (bytes && bytes->size() == 66 && (*bytes)[1] == 'c') bytes->erase(bytes->begin(), bytes->begin() + 2);
  if (!bytes || bytes->size() != 64)
    return tl::unexpected(bad_request(
        "ipc_handle", "ipc_handle: expected the base64 of a 64-byte cudaIpcMemHandle_t (or of torch's "
                      "storage._share_cuda_()[1])"));
  std::array<uint8_t, 64> h;
  std::copy(bytes->begin(), bytes->end(), h.begin());
  return h;
}

// One entry of the manifest's "tensors" array (refit/tensor_manifest.h).
ApiResult<refit::ManifestTensor> manifest_tensor(const json& item, size_t i) {
  const std::string where = fmt::format("tensors[{}].", i);
  if (!item.is_object()) return tl::unexpected(bad_request("tensors", where + " expected an object"));
  Fields f(item, where);
  constexpr int64_t kMaxOffset = int64_t{1} << 50;
  auto name = f.string("name", 4096);
  auto dtype = f.string("dtype", 64);
  auto offset = f.integer("offset", 0, kMaxOffset);
  auto scales_offset = f.integer("scales_offset", 0, kMaxOffset);
  auto checksum = f.string("checksum", 64);
  const json* shape = f.raw("shape");
  if (!name) return tl::unexpected(name.error());
  if (!dtype) return tl::unexpected(dtype.error());
  if (!offset) return tl::unexpected(offset.error());
  if (!scales_offset) return tl::unexpected(scales_offset.error());
  if (!checksum) return tl::unexpected(checksum.error());
  if (auto e = f.unknown()) return tl::unexpected(*e);
  for (auto [field, present] : {std::pair{"name", name->has_value()}, {"dtype", dtype->has_value()},
                                {"offset", offset->has_value()}, {"shape", shape != nullptr}})
    if (!present) return tl::unexpected(bad_request(f.name(field), f.name(field) + ": required"));
  refit::ManifestTensor t;
  t.name = **name;
  auto d = refit::parse_manifest_dtype(**dtype);
  if (!d) return tl::unexpected(bad_request(f.name("dtype"), f.name("") + d.error().message));
  t.dtype = *d;
  if (!shape->is_array() || shape->size() > 8)
    return tl::unexpected(bad_request(f.name("shape"), f.name("shape") + ": expected an array of at most 8 sizes"));
  for (const json& dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
      return tl::unexpected(bad_request(f.name("shape"), f.name("shape") + ": expected non-negative integers"));
    t.shape.push_back(dim.get<int64_t>());
  }
  t.offset = static_cast<uint64_t>(**offset);
  t.scales_offset = static_cast<uint64_t>(scales_offset->value_or(0));
  if (*checksum) {
    uint64_t v = 0;
    const std::string& hex = **checksum;
    auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
    if (hex.size() != 16 || ec != std::errc() || ptr != hex.data() + hex.size())
      return tl::unexpected(bad_request(f.name("checksum"), f.name("checksum") + ": expected 16 hex digits"));
    t.checksum = v;
  }
  return t;
}

void update_from_tensor(const httplib::Request& req, const std::string& raw, httplib::Response& res,
                        RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  auto body = json_body(req, raw);
  if (!body) return send_refusal(res, body.error(), version);
  Fields f(*body);
  auto handle = f.string("ipc_handle", 128);
  auto ipc_offset = f.integer("ipc_offset", 0, int64_t{1} << 50);
  auto size = f.integer("size", 1, int64_t{1} << 50);
  auto target = version_field(f, "weight_version");
  auto flush_cache = f.boolean("flush_cache");
  auto abort_all = f.boolean("abort_all_requests");
  const json* tensors = f.raw("tensors");
  for (const auto* r : {&flush_cache, &abort_all})
    if (!*r) return send_refusal(res, r->error(), version);
  if (!handle) return send_refusal(res, handle.error(), version);
  if (!ipc_offset) return send_refusal(res, ipc_offset.error(), version);
  if (!size) return send_refusal(res, size.error(), version);
  if (!target) return send_refusal(res, target.error(), version);
  if (auto e = f.unknown()) return send_refusal(res, *e, version);
  refit::TensorManifest m;
  auto h = ipc_handle(handle->value_or(""));
  if (!h) return send_refusal(res, h.error(), version);
  m.ipc_handle = *h;
  if (!*size) return send_refusal(res, bad_request("size", "size: required (bytes of the buffer)"), version);
  if (!tensors || !tensors->is_array() || tensors->empty())
    return send_refusal(res, bad_request("tensors", "tensors: required, a non-empty array"), version);
  m.ipc_offset = static_cast<uint64_t>(ipc_offset->value_or(0));
  m.size = static_cast<uint64_t>(**size);
  for (size_t i = 0; i < tensors->size(); ++i) {
    auto t = manifest_tensor((*tensors)[i], i);
    if (!t) return send_refusal(res, t.error(), version);
    m.tensors.push_back(std::move(*t));
  }
  // note: flush_cache is accepted; the prefix cache is dropped after every successful update (W-19).
  run_update(res, ctx, abort_all->value_or(false),
             [&](uint64_t& live) { return ctx.weights->apply_tensor_manifest(m, *target, live); });
}

void update_version(const httplib::Request& req, const std::string& raw, httplib::Response& res,
                    RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  auto body = json_body(req, raw);
  if (!body) return send_refusal(res, body.error(), version);
  Fields f(*body);
  auto v = version_field(f, "new_version");
  auto abort_all = f.boolean("abort_all_requests");
  if (!v) return send_refusal(res, v.error(), version);
  if (!abort_all) return send_refusal(res, abort_all.error(), version);
  if (auto e = f.unknown()) return send_refusal(res, *e, version);
  if (!*v) return send_refusal(res, bad_request("new_version", "new_version: required"), version);
  const bool ran = ctx.loop->run_task([&](TaskScope& scope) {
    if (abort_all->value_or(false)) scope.abort_all();
    scope.set_version(**v);
  });
  if (!ran) return send_refusal(res, not_serving(), version);
  ctx.metrics->weight_version->Set(static_cast<double>(**v));
  send(res, {{"success", true}, {"message", "weight version set"}, {"weight_version", std::to_string(**v)}});
}

void weights_checker(const httplib::Request& req, const std::string& raw, httplib::Response& res,
                     RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  auto body = json_body(req, raw);
  if (!body) return send_refusal(res, body.error(), version);
  Fields f(*body);
  auto action = f.string("action", 64);
  const json* given = f.raw("checksums");
  if (!action) return send_refusal(res, action.error(), version);
  if (auto e = f.unknown()) return send_refusal(res, *e, version);
  if (!*action || (**action != "checksum" && **action != "compare"))
    return send_refusal(res, bad_request("action", "action: expected \"checksum\" or \"compare\""), version);
  const bool compare = **action == "compare";
  if (compare != (given != nullptr))
    return send_refusal(res,
                        bad_request("checksums", compare ? "checksums: required by action compare"
                                                         : "checksums: only with action compare"),
                        version);
  if (compare && !given->is_object())
    return send_refusal(res, bad_request("checksums", "checksums: expected an object {name: hex}"), version);
  std::map<std::string, uint64_t> live;
  std::string at;
  const bool ran = ctx.loop->run_task([&](TaskScope& scope) {
    live = ctx.weights->checksums();
    at = std::to_string(scope.version());
  });
  if (!ran) return send_refusal(res, not_serving(), version);
  if (!compare) {
    json out = json::object();
    for (const auto& [name, sum] : live) out[name] = fmt::format("{:016x}", sum);
    return send(res, {{"success", true}, {"weight_version", at}, {"checksums", out}});
  }
  // note: a name the engine does not have, one it has that the request misses, and a value that is not 16
  // hex digits are all mismatches; the comparison itself never fails.
  json mismatches = json::array();
  for (const auto& [name, value] : given->items()) {
    auto it = live.find(name);
    const std::string want = value.is_string() ? value.get<std::string>() : value.dump();
    if (it == live.end() || want != fmt::format("{:016x}", it->second)) mismatches.push_back(name);
  }
  for (const auto& [name, sum] : live)
    if (!given->contains(name)) mismatches.push_back(name);
  send(
      res,
      {{"success", true}, {"weight_version", at}, {"match", mismatches.empty()}, {"mismatches", mismatches}});
}

void pause(const httplib::Request& req, const std::string& raw, httplib::Response& res, RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  auto body = optional_json_body(req, raw);
  if (!body) return send_refusal(res, body.error(), version);
  Fields f(*body);
  auto mode = f.string("mode", 64);
  if (!mode) return send_refusal(res, mode.error(), version);
  if (auto e = f.unknown()) return send_refusal(res, *e, version);
  const std::string m = mode->value_or("abort");
  PauseMode pm = PauseMode::kAbort;
  if (m == "wait") {
    pm = PauseMode::kWait;
  } else if (m == "in_place") {
    pm = PauseMode::kInPlace;
  } else if (m != "abort") {
    return send_refusal(
        res, bad_request("mode", fmt::format("mode {}: expected abort, wait or in_place", m.substr(0, 64))),
        version);
  }
  if (!ctx.loop->run_task([&](TaskScope& scope) { scope.pause(pm); }))
    return send_refusal(res, not_serving(), version);
  send(res, {{"success", true}, {"message", "generation paused (" + m + ")"}});
}

// Routes with no fields: an empty body or {}.
ApiResult<bool> empty_body(const httplib::Request& req, const std::string& raw) {
  auto body = optional_json_body(req, raw);
  if (!body) return tl::unexpected(body.error());
  Fields f(*body);
  if (auto e = f.unknown()) return tl::unexpected(*e);
  return true;
}

void flush(const httplib::Request& req, const std::string& raw, httplib::Response& res, RouteContext& ctx) {
  const std::string version = ctx.loop->weight_version();
  if (auto b = empty_body(req, raw); !b) return send_refusal(res, b.error(), version);
  if (!ctx.loop->run_task([](TaskScope& scope) { scope.reset_prefix_cache(); }))
    return send_refusal(res, not_serving(), version);
  send(res, {{"success", true}, {"message", "prefix cache flushed"}});
}

json model_info(const RouteContext& ctx) {
  json tensors = json::array();
  for (const auto& [name, spec] : ctx.weights->table())
    tensors.push_back({{"name", name}, {"format", traits(spec.format).name}, {"shape", spec.shape}});
  return {{"model_path", ctx.model.root},
          {"tokenizer_path", ctx.model.root},
          {"served_model_name", ctx.model.name},
          {"is_generation", true},
          {"weight_version", ctx.loop->weight_version()},
          {"quantization", ctx.model.quantization},
          {"activation_quant", ctx.model.activation_quant},
          {"device", ctx.model.device},
          {"tensors", tensors}};
}

}  // namespace

void add_weight_routes(httplib::Server& server, RouteContext& ctx) {
  RouteContext* c = &ctx;
  const size_t max = ctx.options.max_body_bytes;
  auto route =
      [c](void (*fn)(const httplib::Request&, const std::string&, httplib::Response&, RouteContext&)) {
        return [c, fn](const httplib::Request& req, const std::string& body, httplib::Response& res) {
          fn(req, body, res, *c);
        };
      };
  add_post(server, "/update_weights_from_delta", ctx.options.max_update_bytes, route(update_from_delta));
  add_post(server, "/update_weights_from_disk", max, route(update_from_disk));
  add_post(server, "/update_weights_from_tensor", max, route(update_from_tensor));
  add_post(server, "/update_weight_version", max, route(update_version));
  add_post(server, "/weights_checker", max, route(weights_checker));
  add_post(server, "/pause_generation", max, route(pause));
  add_post(server, "/continue_generation", max,
           route([](const httplib::Request& req, const std::string& raw, httplib::Response& res,
                    RouteContext& rc) {
             const std::string version = rc.loop->weight_version();
             if (auto b = empty_body(req, raw); !b) return send_refusal(res, b.error(), version);
             if (!rc.loop->run_task([](TaskScope& scope) { scope.resume(); }))
               return send_refusal(res, not_serving(), version);
             send(res, {{"success", true}, {"message", "generation continues"}});
           }));
  add_post(server, "/flush_cache", max, route(flush));
  add_post(server, "/reset_prefix_cache", max, route(flush));
  server.Get("/flush_cache",
             [c](const httplib::Request& req, httplib::Response& res) { flush(req, "", res, *c); });
  server.Get("/get_weight_version", [c](const httplib::Request&, httplib::Response& res) {
    send(res, {{"weight_version", c->loop->weight_version()}});
  });
  server.Get("/get_model_info",
             [c](const httplib::Request&, httplib::Response& res) { send(res, model_info(*c)); });
}

}  // namespace mxq::server
