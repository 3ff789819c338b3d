#include "server/metrics.h"

#include <prometheus/text_serializer.h>

namespace mxq::server {
namespace {

using prometheus::Histogram;

// note: vLLM's bucket edges (vllm/v1/metrics/loggers.py), with 1-5 ms edges added in front of the
// inter-token ones: a Hopper decode step of a small model takes a few milliseconds.
const Histogram::BucketBoundaries kTtft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                           1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kItl = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                          0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
const Histogram::BucketBoundaries kLatency = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,   15.0,  20.0,
                                              30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// note: a sparse update of a small model takes milliseconds, a checkpoint of a large one minutes.
const Histogram::BucketBoundaries kUpdate = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1.0,   2.5,    5.0,   10.0, 30.0,  60.0, 120.0, 300.0, 600.0};
const Histogram::BucketBoundaries kTokens = {1,    2,    5,     10,    20,    50,     100,    200,   500,
                                             1000, 2000, 5000,  10000, 20000, 50000, 100000, 200000};

}  // namespace

Metrics::Metrics(const std::string& model_name) : registry(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels{{"model_name", model_name}};
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry).Add(labels);
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry).Add(labels);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& b) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry).Add(labels, b);
  };
  running = gauge("mxq:num_requests_running", "Number of requests in model execution batches.");
  waiting = gauge("mxq:num_requests_waiting", "Number of requests waiting to be processed.");
  kv_usage = gauge("mxq:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  prompt_tokens = counter("mxq:prompt_tokens_total", "Number of prefill tokens processed.");
  generation_tokens = counter("mxq:generation_tokens_total", "Number of generation tokens processed.");
  preemptions = counter("mxq:num_preemptions_total", "Cumulative number of preemptions from the engine.");
  prefix_queries = counter("mxq:prefix_cache_queries_total", "Prefix cache queries, in tokens.");
  prefix_hits = counter("mxq:prefix_cache_hits_total", "Prefix cache hits, in tokens.");
  auto& success_family = prometheus::BuildCounter()
                             .Name("mxq:request_success_total")
                             .Help("Count of successfully processed requests.")
                             .Register(*registry);
  success_stop = &success_family.Add({{"model_name", model_name}, {"finished_reason", "stop"}});
  success_length = &success_family.Add({{"model_name", model_name}, {"finished_reason", "length"}});
  success_abort = &success_family.Add({{"model_name", model_name}, {"finished_reason", "abort"}});
  ttft = histogram("mxq:time_to_first_token_seconds", "Histogram of time to first token in seconds.", kTtft);
  itl = histogram("mxq:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", kItl);
  e2e = histogram("mxq:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", kLatency);
  queue_time = histogram("mxq:request_queue_time_seconds",
                         "Histogram of time spent in WAITING phase for request.", kLatency);
  prompt_len = histogram("mxq:request_prompt_tokens", "Number of prefill tokens processed.", kTokens);
  generation_len = histogram("mxq:request_generation_tokens", "Number of generation tokens processed.", kTokens);
  auto& updates = prometheus::BuildCounter()
                      .Name("mxq:weight_updates_total")
                      .Help("Weight updates by result: success, refused (old weights kept), lost (undo failed).")
                      .Register(*registry);
  updates_success = &updates.Add({{"model_name", model_name}, {"result", "success"}});
  updates_refused = &updates.Add({{"model_name", model_name}, {"result", "refused"}});
  updates_lost = &updates.Add({{"model_name", model_name}, {"result", "lost"}});
  update_bytes = counter("mxq:weight_update_bytes_total", "New value and scale bytes written by weight updates.");
  update_seconds = histogram("mxq:weight_update_seconds", "Histogram of weight update wall time in seconds.", kUpdate);
  weight_version = gauge("mxq:weight_version", "The live weights version (the delta format's integer).");
}

void Metrics::weight_update(bool ok, bool lost, double seconds, uint64_t applied_bytes, uint64_t version) {
  (ok ? updates_success : lost ? updates_lost : updates_refused)->Increment();
  update_seconds->Observe(seconds);
  if (ok) update_bytes->Increment(static_cast<double>(applied_bytes));
  weight_version->Set(static_cast<double>(version));
}

prometheus::Counter& Metrics::success(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return *success_length;
    case FinishReason::kAbort: return *success_abort;
    default: return *success_stop;
  }
}

std::string Metrics::serialize() const { return prometheus::TextSerializer().Serialize(registry->Collect()); }

}  // namespace mxq::server
