// The OpenAI error shape every bad request gets: HTTP status plus
// {"error": {"message", "type", "param", "code"}}. Handlers return these as values; nothing a client sends
// reaches an exception or a 500.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

namespace mxq::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;                       // the request field at fault, "" when none
  std::string type = "BadRequestError";    // OpenAI's / vLLM's error type names
};

inline ApiError bad_request(std::string param, std::string message) {
  return {400, std::move(message), std::move(param), "BadRequestError"};
}

// note: vLLM writes the HTTP status as `code`; the openai client reads message, type, param and code.
inline nlohmann::json error_json(const ApiError& e) {
  nlohmann::json err{{"message", e.message}, {"type", e.type}, {"code", e.status}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  return {{"error", err}};
}

// JSON text of any value, with invalid UTF-8 (a token that decodes to half a character) replaced, never
// thrown on.
inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mxq::server
