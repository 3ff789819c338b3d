// The HTTP side of `mxq serve` (cpp-httplib): routes, the API key, size and time limits, and streaming.
// Handlers parse and validate, submit to the EngineLoop, and write what comes back; they never touch the
// engine. Every failure a client can cause is an OpenAI-shaped 4xx (bad_inputs H-01..H-17).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/tokenizer.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/request.h"

namespace mxq::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // H-16: local only unless told otherwise
  int port = 8000;                 // 0: any free port (bind() says which)
  std::string api_key;             // "": no key; else every route but /health needs `Bearer KEY` (H-15)
  size_t max_body_bytes = size_t{16} << 20;  // larger bodies get 413 (H-02)
  size_t max_update_bytes = size_t{64} << 30;  // the same for /update_weights_from_delta bodies and files
  int read_timeout_s = 10;    // a client that sends nothing for this long is dropped (H-02, H-13)
  int write_timeout_s = 10;   // a client that reads nothing for this long is dropped
  int keep_alive_timeout_s = 5;
  int header_timeout_s = 20;  // a whole request's headers must arrive within this (H-02 slow loris)
  size_t max_connections = 512;  // connections served at once; more wait, and past 2x get 503
  RequestLimits limits;
};

// What the routes say about the model.
struct ServedModel {
  std::string name;  // --served-model-name, the id clients send as `model`
  std::string root;  // the checkpoint directory
  std::string format;            // the linear format and activation mode ("mxfp8", "mxfp4-a8")
  std::string quantization;      // the linear format ("bf16", "mxfp8", ...)
  std::string activation_quant;  // "none" or "mxfp8"
  std::string device;
  const Tokenizer* tokenizer = nullptr;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  SamplingDefaults defaults;
  std::vector<int32_t> extra_stop_ids;  // generation_config.json's eos ids (stop unless ignore_eos)
};

class WeightUpdater;  // server/weight_update.h

class HttpServer {
 public:
  // `weights` (may be null: no weight routes) must outlive the server; its store is touched only by tasks on
  // the loop's engine thread.
  HttpServer(ServerOptions options, ServedModel model, EngineLoop& loop, Metrics& metrics,
             WeightUpdater* weights = nullptr);
  ~HttpServer();

  // Binds the listening socket; returns the port (the chosen one for port 0).
  Result<int> bind();
  // Serves until stop(); returns after the listener closes. In-flight handlers finish on their threads.
  void listen();
  // Stops accepting connections (safe from another thread, not from a signal handler).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxq::server
