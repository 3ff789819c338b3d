// Prometheus metrics of `mxq serve` (GET /metrics): vLLM's metric names with the `mxq:` prefix, so a
// dashboard built for vllm:* maps one to one, each with a model_name label. prometheus-cpp's core types are
// thread-safe: the engine thread updates them, HTTP threads serialize them.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "engine/generator.h"

namespace mxq::server {

class Metrics {
 public:
  explicit Metrics(const std::string& model_name);

  // The text exposition format (version 0.0.4).
  std::string serialize() const;

  prometheus::Counter& success(FinishReason reason);

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Gauge *running, *waiting, *kv_usage;
  prometheus::Counter *prompt_tokens, *generation_tokens, *preemptions, *prefix_queries, *prefix_hits;
  prometheus::Counter *success_stop, *success_length, *success_abort;
  prometheus::Histogram *ttft, *itl, *e2e, *queue_time, *prompt_len, *generation_len;
};

}  // namespace mxq::server
