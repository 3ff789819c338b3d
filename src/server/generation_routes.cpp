// POST /v1/completions and POST /v1/chat/completions: parse, submit every (prompt, sample) pair to the
// engine thread as one request, then either stream SSE chunks as outputs arrive or send one JSON object.
// Both bodies go out chunked so the handler can watch the connection: a client that disconnects (mid-prefill
// included) cancels its request, and the engine thread frees its KV blocks before its next step (H-12).
#include <algorithm>
#include <chrono>
#include <random>

#include "server/response.h"
#include "server/routes.h"

namespace mxq::server {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{50};  // how often a waiting handler checks its client is still there

std::string random_hex() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

struct Generation {
  ParsedRequest request;
  ResponseContext ctx;
  std::shared_ptr<RequestChannel> channel;
  std::vector<ChoiceState> choices;
  std::vector<size_t> sample_choice;  // engine sample index -> choice index
  size_t finished = 0;
  std::optional<ApiError> failed;
  std::vector<std::string> versions;  // distinct weights versions that produced tokens, in order
};

// Waits for the channel's next event while the client stays connected; nullopt when it left.
template <class Alive>
std::optional<StreamEvent> next_event(Generation& g, Alive&& alive) {
  for (;;) {
    if (auto e = g.channel->pop(kPoll)) return e;
    if (!alive()) {
      g.channel->cancel();
      return std::nullopt;
    }
  }
}

// Applies one event; returns the chunk to stream for an output (or null JSON).
json apply(Generation& g, StreamEvent& e, std::string& weight_version) {
  weight_version = e.weight_version;
  if (e.kind == StreamEvent::Kind::kFailed) {
    g.failed = e.error;
    g.finished = g.choices.size();
    return nullptr;
  }
  // note: a weight update runs between two steps, so every token of one event comes from one version.
  if (!e.out.tokens.empty() && (g.versions.empty() || g.versions.back() != e.weight_version))
    g.versions.push_back(e.weight_version);
  const size_t ci = g.sample_choice[e.sample];
  ChoiceState& c = g.choices[ci];
  const std::string piece = add_output(g.ctx, c, e.out);
  if (c.finished) ++g.finished;
  if (!g.request.stream) return nullptr;
  json chunk = stream_chunk(g.ctx, ci, c, piece, weight_version);
  if (g.finished == g.choices.size()) chunk["weight_versions"] = g.versions;
  if (g.request.continuous_usage) chunk["usage"] = usage_json(g.ctx, g.choices);
  return chunk;
}

bool write_sse(httplib::DataSink& sink, const json& j) {
  const std::string s = "data: " + dump_json(j) + "\n\n";
  return sink.write(s.data(), s.size());
}

void handle(const httplib::Request& req, const std::string& raw, httplib::Response& res, RouteContext& ctx,
            bool chat) {
  auto body = json_body(req, raw);
  if (!body) return send_error(res, body.error());
  auto parsed = chat ? parse_chat_request(*body, ctx.parse) : parse_completion_request(*body, ctx.parse);
  if (!parsed) return send_error(res, parsed.error());
  auto g = std::make_shared<Generation>();
  g->request = std::move(*parsed);
  ParsedRequest& r = g->request;
  std::string rid = r.request_id.empty() ? req.get_header_value("X-Request-Id") : r.request_id;
  if (rid.size() > 256) rid.resize(256);
  if (rid.empty()) rid = random_hex();
  g->ctx = {&g->request, ctx.model.tokenizer, (chat ? "chatcmpl-" : "cmpl-") + rid, ctx.model.name,
            std::chrono::duration_cast<std::chrono::seconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count()};
  // note: counted before any sample is built (H-05): 1024 prompts x n = 256 would copy 262k prompts first.
  const size_t count = r.prompts.size() * static_cast<size_t>(r.n);
  if (count > static_cast<size_t>(ctx.options.limits.max_n) * 4)
    return send_error(res, bad_request("n", fmt::format("{} prompts x n = {} samples, the limit is {}",
                                                        r.prompts.size(), count, ctx.options.limits.max_n * 4)));
  if (!r.params.ignore_eos)
    for (int32_t id : ctx.model.extra_stop_ids)
      if (std::find(r.params.stop_token_ids.begin(), r.params.stop_token_ids.end(), id) ==
          r.params.stop_token_ids.end())
        r.params.stop_token_ids.push_back(id);
  // Choices are ordered prompt by prompt, n samples each (vLLM's index = prompt * n + sample).
  std::vector<SampleJob> samples;
  samples.reserve(count);
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    auto max_tokens = resolve_max_tokens(r, r.prompts[p], ctx.model.max_model_len);
    if (!max_tokens) return send_error(res, max_tokens.error());
    for (int64_t i = 0; i < r.n; ++i) {
      GenerateParams params = r.params;
      params.max_new_tokens = *max_tokens;
      params.seed = r.seed + static_cast<uint64_t>(i);
      samples.push_back({r.prompts[p].ids, std::move(params)});
      g->choices.emplace_back();
      g->choices.back().prompt = p;
      g->sample_choice.push_back(g->choices.size() - 1);
    }
  }
  g->channel = ctx.loop->submit(rid, std::move(samples));
  if (!g->channel)
    return send_error(res, {503, "the server is not serving (shutting down or the engine failed)", "",
                            "ServiceUnavailableError"});
  // The engine thread answers between two steps: accepted, or refused with the engine's reason.
  for (int unanswered = 0;;) {
    auto e = g->channel->pop(kPoll);
    if (e && e->kind == StreamEvent::Kind::kRefused) return send_error(res, e->error);
    if (e) break;
    // note: a request that raced the drain's last look at the inbox is never answered by the thread.
    if (!ctx.loop->healthy() && ++unanswered > 40) {
      g->channel->cancel();
      return send_error(res, {503, "the server is shutting down", "", "ServiceUnavailableError"});
    }
  }
  RouteContext* c = &ctx;
  auto releaser = [g](bool success) {
    if (!success) g->channel->cancel();
  };
  if (r.stream) {
    res.set_chunked_content_provider(
        "text/event-stream",
        [g, c](size_t, httplib::DataSink& sink) {
          std::string version = c->loop->weight_version();
          auto alive = [&] { return sink.is_writable(); };
          if (g->request.echo)
            for (size_t i = 0; i < g->choices.size(); ++i) {
              json chunk = stream_chunk(g->ctx, i, g->choices[i], g->request.prompts[g->choices[i].prompt].text,
                                        version);
              if (!write_sse(sink, chunk)) return g->channel->cancel(), false;
            }
          if (g->request.chat)
            for (size_t i = 0; i < g->choices.size(); ++i)
              if (!write_sse(sink, chat_role_chunk(g->ctx, i))) return g->channel->cancel(), false;
          while (g->finished < g->choices.size()) {
            auto e = next_event(*g, alive);
            if (!e) return false;
            json chunk = apply(*g, *e, version);
            if (!chunk.is_null() && !write_sse(sink, chunk)) return g->channel->cancel(), false;
          }
          // note: an engine failure mid-stream is an error event, then [DONE] (H-14).
          if (g->failed && !write_sse(sink, error_json(*g->failed))) return false;
          if (!g->failed && g->request.include_usage && !write_sse(sink, usage_chunk(g->ctx, g->choices)))
            return false;
          const std::string done = "data: [DONE]\n\n";
          if (!sink.write(done.data(), done.size())) return false;
          sink.done();
          return true;
        },
        releaser);
    return;
  }
  res.set_chunked_content_provider(
      "application/json",
      [g, c](size_t, httplib::DataSink& sink) {
        std::string version = c->loop->weight_version();
        auto alive = [&] { return sink.is_writable(); };
        while (g->finished < g->choices.size()) {
          auto e = next_event(*g, alive);
          if (!e) return false;
          apply(*g, *e, version);
        }
        // note: the status line went out when the engine accepted the request; an engine failure after
        // that can only be reported in the body (and /health turns 503).
        json out = g->failed ? error_json(*g->failed) : completion_response(g->ctx, g->choices, version);
        if (!g->failed) out["weight_versions"] = g->versions;
        const std::string text = dump_json(out);
        if (!sink.write(text.data(), text.size())) return false;
        sink.done();
        return true;
      },
      releaser);
}

}  // namespace

void add_generation_routes(httplib::Server& server, RouteContext& ctx) {
  const size_t max = ctx.options.max_body_bytes;
  add_post(server, "/v1/completions", max, [&ctx](const httplib::Request& req, const std::string& body,
                                                  httplib::Response& res) { handle(req, body, res, ctx, false); });
  add_post(server, "/v1/chat/completions", max,
           [&ctx](const httplib::Request& req, const std::string& body, httplib::Response& res) {
             handle(req, body, res, ctx, true);
           });
}

}  // namespace mxq::server
