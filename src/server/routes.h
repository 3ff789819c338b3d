// Route registration shared by http_server.cpp (setup, limits, utility routes), generation_routes.cpp
// (the two OpenAI generation routes and their streaming) and weight_routes.cpp (weight updates).
#pragma once

#include <httplib.h>

#include "server/api_error.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/weight_update.h"

namespace mxq::server {

struct RouteContext {
  ServerOptions options;
  ServedModel model;
  EngineLoop* loop;
  Metrics* metrics;
  WeightUpdater* weights = nullptr;  // null: no weight routes
  ParseContext parse;  // built once from options and model
};

// Writes an OpenAI error body with its status.
void send_error(httplib::Response& res, const ApiError& e);
// The body as a JSON object, refusing a wrong Content-Type (415) and what parse_json_object refuses.
ApiResult<nlohmann::json> json_body(const httplib::Request& req, const std::string& body);

// A POST route whose body is read by the handler's own reader, capped at `max_body` bytes whether it comes
// with a Content-Length or chunked (cpp-httplib 0.11 caps only the former): past the cap the client gets 413
// and the connection closes, so an endless chunked body costs no memory (H-02).
using PostHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;
void add_post(httplib::Server& server, const std::string& path, size_t max_body, PostHandler handler);

void add_generation_routes(httplib::Server& server, RouteContext& ctx);
void add_weight_routes(httplib::Server& server, RouteContext& ctx);

}  // namespace mxq::server
