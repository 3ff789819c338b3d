#include "server/http_server.h"

#include <spdlog/spdlog.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "io/chat_template.h"
#include "server/connection.h"
#include "server/routes.h"

namespace mxq::server {
namespace {

using nlohmann::json;

// note: set on the thread that serves a connection accepted while every worker was busy and the backlog
// full; the pre-routing handler answers 503 and closes (cpp-httplib's own pool would queue it unbounded).
thread_local bool t_overloaded = false;

constexpr size_t kMaxHeaders = 100;
// note: cpp-httplib 0.11 listens with a backlog of 5 (compiled into Debian's library), which resets
// connections at a burst of 64 clients; the listening socket is listened on again with this backlog.
constexpr int kListenBacklog = 4096;

// cpp-httplib's task queue with a bound: `workers` threads serve connections; up to as many more wait;
// beyond that a connection is answered 503 by one extra thread and closed.
class BoundedPool final : public httplib::TaskQueue {
 public:
  explicit BoundedPool(size_t workers) : limit_(2 * workers) {
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(queue_, false); });
    threads_.emplace_back([this] { work(rejects_, true); });
  }
  ~BoundedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      (busy_ + queue_.size() < limit_ ? queue_ : rejects_).push_back(std::move(fn));
    }
    cv_.notify_all();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void work(std::deque<std::function<void()>>& q, bool overloaded) {
    t_overloaded = overloaded;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !q.empty(); });
        if (q.empty()) return;
        fn = std::move(q.front());
        q.pop_front();
        busy_ += !overloaded;
      }
      fn();
      std::lock_guard lock(mu_);
      busy_ -= !overloaded;
    }
  }

  size_t limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_, rejects_;
  size_t busy_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

bool same_key(std::string_view a, std::string_view b) {
  // note: constant time in the key's length, so the comparison does not leak a matching prefix.
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

void send_json(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

}  // namespace

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, error_json(e), e.status); }

void add_post(httplib::Server& server, const std::string& path, size_t max_body, PostHandler handler) {
  server.Post(path, [max_body, handler](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) {
    std::string body;
    bool too_big = false;
    reader([&](const char* data, size_t len) {
      if (body.size() + len > max_body) return !(too_big = true);
      body.append(data, len);
      return true;
    });
    if (too_big) {
      res.set_header("Connection", "close");
      shutdown_reads(req.remote_addr, req.remote_port, req.local_port);
      return send_error(res, {413, fmt::format("the request body is larger than the server's limit of {} bytes",
                                               max_body),
                              "", "RequestEntityTooLargeError"});
    }
    handler(req, body, res);
  });
}

ApiResult<json> json_body(const httplib::Request& req, const std::string& body) {
  // note: a missing Content-Type is read as JSON (curl -d without -H, as FastAPI does); any other type is 415.
  const std::string type = req.get_header_value("Content-Type");
  if (!type.empty() && type.rfind("application/json", 0) != 0)
    return tl::unexpected(ApiError{415, fmt::format("Content-Type {}: expected application/json",
                                                    type.substr(0, 100)),
                                   "", "UnsupportedMediaTypeError"});
  return parse_json_object(body);
}

struct HttpServer::Impl {
  httplib::Server server;
  RouteContext ctx;
  int listen_fd = -1;
  std::unique_ptr<HeaderWatchdog> watchdog;  // made at bind(), once the port is known
};

HttpServer::HttpServer(ServerOptions options, ServedModel model, EngineLoop& loop, Metrics& metrics,
                       WeightUpdater* weights)
    : impl_(std::make_unique<Impl>()) {
  RouteContext& c = impl_->ctx;
  c.options = std::move(options);
  c.model = std::move(model);
  c.loop = &loop;
  c.metrics = &metrics;
  c.weights = weights;
  c.parse = {c.model.tokenizer, c.model.vocab_size, c.model.max_model_len, c.model.name, c.model.defaults,
             c.options.limits};
  httplib::Server& s = impl_->server;
  const size_t workers = c.options.max_connections;
  s.new_task_queue = [workers] { return new BoundedPool(workers); };
  // note: the library's cap (on a Content-Length) is the largest route cap; each route's own reader (add_post)
  // enforces its own, so generation routes still stop at --max-body-bytes.
  s.set_payload_max_length(weights ? std::max(c.options.max_body_bytes, c.options.max_update_bytes)
                                   : c.options.max_body_bytes);
  s.set_read_timeout(c.options.read_timeout_s, 0);
  s.set_write_timeout(c.options.write_timeout_s, 0);
  s.set_keep_alive_timeout(c.options.keep_alive_timeout_s);
  s.set_keep_alive_max_count(10000);
  // note: replaces cpp-httplib's defaults (SO_REUSEADDR and SO_REUSEPORT): without SO_REUSEPORT a second
  // server on the same port fails to bind instead of silently sharing it. TCP_NODELAY (which Linux passes on
  // to accepted sockets): a response goes out as several small writes (headers, then one chunk per event),
  // and with Nagle each waited for the client's delayed ACK, ~40 ms (the H200 run's TTFT at concurrency 1).
  s.set_tcp_nodelay(true);
  int* listen_fd = &impl_->listen_fd;
  s.set_socket_options([listen_fd](int fd) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *listen_fd = fd;
  });

  RouteContext* ctx = &c;
  Impl* impl = impl_.get();
  s.set_logger([impl](const httplib::Request& req, const httplib::Response&) {
    if (impl->watchdog) impl->watchdog->request_ended(req.remote_addr, req.remote_port);
  });
  s.set_pre_routing_handler([ctx, impl](const httplib::Request& req, httplib::Response& res) {
    if (impl->watchdog) impl->watchdog->request_started(req.remote_addr, req.remote_port);
    // note: cpp-httplib 0.11 caps each header line at 8 KiB but not their number (H-01).
    if (req.headers.size() > kMaxHeaders) {
      send_error(res, {431, fmt::format("{} request headers, the limit is {}", req.headers.size(), kMaxHeaders),
                       "", "RequestHeaderFieldsTooLargeError"});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (t_overloaded) {
      res.set_header("Connection", "close");
      shutdown_reads(req.remote_addr, req.remote_port, req.local_port);
      send_error(res, {503, "too many connections; retry later", "", "ServiceUnavailableError"});
      return httplib::Server::HandlerResponse::Handled;
    }
    // note: every route but /health needs the key, the admin ones included (H-15).
    if (!ctx->options.api_key.empty() && req.path != "/health") {
      const std::string auth = req.get_header_value("Authorization");
      const std::string_view prefix = "Bearer ";
      if (auth.rfind(prefix, 0) != 0 || !same_key(std::string_view(auth).substr(prefix.size()), ctx->options.api_key)) {
        send_error(res, {401, "Unauthorized: a valid API key is required (Authorization: Bearer KEY)", "",
                         "AuthenticationError"});
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // note: the library's own errors (unknown route 404, 413 body too large, 400 bad request line, 414 URI too
  // long) get the OpenAI shape too.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = fmt::format("HTTP {} on {} {}", res.status, req.method, req.path.substr(0, 200));
    if (res.status == 404) message = fmt::format("no route {} {}", req.method, req.path.substr(0, 200));
    if (res.status == 413) message = "the request body is larger than the server's limit";
    send_error(res, {res.status, message, "", res.status == 404 ? "NotFoundError" : "BadRequestError"});
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::error("mxq serve: handler exception: {}", what);
    send_error(res, {500, "internal error: " + what, "", "InternalServerError"});
  });

  s.Get("/health", [ctx](const httplib::Request&, httplib::Response& res) {
    res.status = ctx->loop->healthy() ? 200 : 503;
  });
  s.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"version", MXQ_VERSION}});
  });
  s.Get("/v1/models", [ctx](const httplib::Request&, httplib::Response& res) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    json m{{"id", ctx->model.name},     {"object", "model"},          {"created", now},
           {"owned_by", "mxq"},         {"root", ctx->model.root},    {"parent", nullptr},
           {"max_model_len", ctx->model.max_model_len}};
    send_json(res, {{"object", "list"}, {"data", json::array({m})}});
  });
  s.Get("/metrics", [ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(ctx->metrics->serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const size_t max = c.options.max_body_bytes;
  add_post(s, "/tokenize", max, [ctx](const httplib::Request& req, const std::string& raw, httplib::Response& res) {
    auto body = json_body(req, raw);
    if (!body) return send_error(res, body.error());
    // note: the request parsers do the work: a completions body for "prompt", a chat body for "messages".
    json probe = *body;
    for (const char* k : {"add_special_tokens", "return_token_strs"}) probe.erase(k);
    const bool chat = probe.contains("messages");
    auto r = chat ? parse_chat_request(probe, ctx->parse) : parse_completion_request(probe, ctx->parse);
    if (!r) return send_error(res, r.error());
    if (r->prompts.size() != 1) return send_error(res, bad_request("prompt", "prompt: expected one prompt"));
    const std::vector<int32_t>& ids = r->prompts[0].ids;
    json strs = nullptr;
    if (body->value("return_token_strs", false)) {
      strs = json::array();
      for (int32_t id : ids) strs.push_back(ctx->model.tokenizer ? ctx->model.tokenizer->decode(std::span(&id, 1)) : "");
    }
    send_json(res, {{"count", ids.size()}, {"max_model_len", ctx->model.max_model_len}, {"tokens", ids},
                    {"token_strs", strs}});
  });
  add_post(s, "/detokenize", max, [ctx](const httplib::Request& req, const std::string& raw,
                                         httplib::Response& res) {
    auto body = json_body(req, raw);
    if (!body) return send_error(res, body.error());
    Fields f(*body);
    f.allow({"model"});
    const json* tokens = f.raw("tokens");
    if (auto e = f.unknown()) return send_error(res, *e);
    if (!tokens || !tokens->is_array()) return send_error(res, bad_request("tokens", "tokens: expected a list of token ids"));
    if (!ctx->model.tokenizer) return send_error(res, bad_request("tokens", "the model has no tokenizer.json"));
    std::vector<int32_t> ids;
    for (const json& v : *tokens) {
      if (!v.is_number_integer()) return send_error(res, bad_request("tokens", "tokens: expected integers"));
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= ctx->model.vocab_size)
        return send_error(res, bad_request("tokens", fmt::format("tokens: {} is outside the vocabulary [0, {})", id,
                                                                 ctx->model.vocab_size)));
      ids.push_back(static_cast<int32_t>(id));
    }
    send_json(res, {{"prompt", ctx->model.tokenizer->decode(ids)}});
  });
  // SGLang's abort: {"rid": ID} or {"abort_all": true}.
  add_post(s, "/abort_request", max, [ctx](const httplib::Request& req, const std::string& raw,
                                            httplib::Response& res) {
    auto body = json_body(req, raw);
    if (!body) return send_error(res, body.error());
    Fields f(*body);
    auto rid = f.string("rid", 256);
    auto all = f.boolean("abort_all");
    if (!rid) return send_error(res, rid.error());
    if (!all) return send_error(res, all.error());
    if (auto e = f.unknown()) return send_error(res, *e);
    if (all->value_or(false) == rid->has_value())
      return send_error(res, bad_request("rid", "give exactly one of rid and abort_all: true"));
    const size_t n = ctx->loop->abort(all->value_or(false) ? std::string() : **rid);
    send_json(res, {{"success", true}, {"aborted", n}});
  });
  add_generation_routes(s, c);
  if (weights) add_weight_routes(s, c);
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::bind() {
  const ServerOptions& o = impl_->ctx.options;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->server.bind_to_any_port(o.host);
    if (port <= 0) return fail("--host {}: cannot bind a port", o.host);
  } else if (!impl_->server.bind_to_port(o.host, o.port)) {
    return fail("--host {} --port {}: cannot bind (in use, or not an address of this machine)", o.host, o.port);
  }
  if (impl_->listen_fd < 0 || ::listen(impl_->listen_fd, kListenBacklog) != 0)
    return fail("--port {}: cannot set the listen backlog to {}", port, kListenBacklog);
  impl_->watchdog = std::make_unique<HeaderWatchdog>(port, std::chrono::seconds(o.header_timeout_s));
  return port;
}

void HttpServer::listen() { impl_->server.listen_after_bind(); }

void HttpServer::stop() { impl_->server.stop(); }

}  // namespace mxq::server
