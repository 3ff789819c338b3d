// Prometheus metrics of `mxq serve` (GET /metrics): vLLM's metric names with the `mxq:` prefix, so a
// dashboard built for vllm:* maps one to one, each with a model_name label. prometheus-cpp's core types are
// thread-safe: the engine thread updates them, HTTP threads serialize them.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
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
  // One weight update ended (docs/serve.md "Metrics"): its result, wall seconds and new value/scale bytes.
  void weight_update(bool success, bool lost, double seconds, uint64_t applied_bytes, uint64_t version);

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Gauge *running, *waiting, *kv_usage;
  prometheus::Counter *prompt_tokens, *generation_tokens, *preemptions, *prefix_queries, *prefix_hits;
  prometheus::Counter *success_stop, *success_length, *success_abort;
  prometheus::Histogram *ttft, *itl, *e2e, *queue_time, *prompt_len, *generation_len;
  // mxq's own (vLLM has no weight-update metrics): updates by result, their seconds, bytes, the live version.
  prometheus::Counter *updates_success, *updates_refused, *updates_lost, *update_bytes;
  prometheus::Histogram* update_seconds;
  prometheus::Gauge* weight_version;
};

}  // namespace mxq::server
