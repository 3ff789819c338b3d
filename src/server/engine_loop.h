// The engine thread of `mxq serve` (DESIGN "Serving contract"): one thread owns the Engine and runs its
// steps; HTTP handler threads only submit requests and read their events from a RequestChannel. Between two
// steps the thread takes new requests, aborts (client gone, /abort_request, drain) and runs the step; each
// output goes to its request's channel at once, so tokens stream as the step that made them ends. Work that
// must not overlap a step (weight updates, cache flushes, pause and continue) is a task: the thread runs
// tasks one at a time, in arrival order, between two steps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/metrics.h"

namespace mxq::server {

using Clock = std::chrono::steady_clock;

// One sample of a request: a prompt and its own parameters (seed included).
struct SampleJob {
  std::vector<int32_t> prompt;
  GenerateParams params;
};

struct StreamEvent {
  enum class Kind {
    kAccepted,  // every sample is queued; outputs follow
    kRefused,   // nothing was queued (error: 4xx / 503)
    kOutput,    // one sample's output of one step (out.finished ends that sample)
    kFailed,    // the engine failed while running this request; no more events
  };
  Kind kind = Kind::kOutput;
  size_t sample = 0;
  RequestOutput out;
  ApiError error;
  std::string weight_version;  // the weights version that produced this event's tokens
};

// SGLang's pause modes (/pause_generation): abort = abort every request, then pause; wait = running requests
// finish, no new one is scheduled; in_place = no step at all, running requests keep their KV. While paused,
// new requests queue (they are not refused) and tasks still run.
enum class PauseMode { kAbort, kWait, kInPlace };

class EngineLoop;

// What a task may do, on the engine thread, between two steps.
class TaskScope {
 public:
  explicit TaskScope(EngineLoop& loop) : loop_(&loop) {}
  // Aborts every running and queued request (their streams end with finish_reason "abort").
  void abort_all();
  void reset_prefix_cache();
  uint64_t version() const;
  // The version every later event reports.
  void set_version(uint64_t v);
  void pause(PauseMode mode);
  void resume();
  // The weights can no longer serve (an update could not be undone): fails every request, /health turns 503.
  void fail(const Error& e);

 private:
  EngineLoop* loop_;
};
using EngineTask = std::function<void(TaskScope&)>;

// Events of one request, from the engine thread to its HTTP handler.
class RequestChannel {
 public:
  void push(StreamEvent e);
  // The next event, or nullopt after `timeout` without one.
  std::optional<StreamEvent> pop(std::chrono::milliseconds timeout);
  // The handler's client is gone (or it gave up): the engine thread aborts the request's samples.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
};

class EngineLoop {
 public:
  // `engine` and `metrics` must outlive the loop.
  EngineLoop(Engine& engine, Metrics& metrics);
  ~EngineLoop();

  void start();
  // Queues a request: the channel's first event says whether it was accepted. Returns null when the loop no
  // longer takes requests (draining, stopped or failed): the handler answers 503.
  std::shared_ptr<RequestChannel> submit(std::string request_id, std::vector<SampleJob> samples);
  // Aborts the requests with this id (every request when `request_id` is empty); their streams end with
  // finish_reason "abort". Returns how many were found (counted at the time of the call).
  size_t abort(const std::string& request_id);
  // Stops taking requests, lets running ones finish for up to `bound`, aborts the rest and joins the thread.
  void drain(std::chrono::milliseconds bound);

  // Runs `task` on the engine thread between two steps and returns once it ran (a step in flight ends
  // first; tasks queued before it run before it). Returns false, without running it, when the loop no
  // longer serves (draining, stopped or failed).
  bool run_task(EngineTask task);

  // /health: false once a step failed (the engine is dead) or after drain.
  bool healthy() const { return healthy_ && !stopping_; }
  // The live weights version as the API spells it (decimal; "0" at load).
  std::string weight_version() const { return std::to_string(version_.load()); }
  uint64_t version() const { return version_; }
  size_t in_flight() const { return in_flight_; }
  bool paused() const { return paused_; }

 private:
  struct Submission {
    std::string request_id;
    std::vector<SampleJob> samples;
    std::shared_ptr<RequestChannel> channel;
    Clock::time_point arrival;
  };
  struct Live {  // one sample in the engine
    std::string request_id;
    std::shared_ptr<RequestChannel> channel;
    size_t sample;
    int64_t prompt_len;
    Clock::time_point arrival, last_token;
    std::optional<Clock::time_point> scheduled;
    int64_t generated = 0;
  };

  friend class TaskScope;
  struct Task {
    EngineTask fn;
    std::shared_ptr<std::promise<bool>> done;  // true: it ran
  };

  void run();
  void run_tasks(std::deque<Task>& tasks);
  // Takes from the inbox (under mu_) the queued submissions an abort names or whose client left.
  std::deque<Submission> take_aborted(const std::vector<std::string>& aborts, bool abort_all);
  void abort_everything();
  void admit(Submission& s);
  void finish(uint64_t id, Live& live, FinishReason reason, StreamEvent last);
  void abort_live(uint64_t id, Live& live);
  void fail_all(const Error& e);
  void update_gauges();

  Engine* engine_;
  Metrics* metrics_;
  std::thread thread_;
  std::atomic<uint64_t> version_{0};

  std::mutex mu_;  // guards inbox_, aborts_, tasks_
  std::condition_variable cv_;
  std::deque<Submission> inbox_;
  std::vector<std::string> aborts_;
  bool abort_all_ = false;
  std::deque<Task> tasks_;
  bool exited_ = false;  // the thread left its loop: no task will run
  std::vector<std::string> live_ids_;  // request ids admitted and not yet ended (for abort's count)

  std::atomic<bool> stopping_{false}, healthy_{true};
  std::atomic<size_t> in_flight_{0};
  std::atomic<int64_t> drain_deadline_ns_{0};
  // Set by pause tasks: while !admitting_ submissions wait in the inbox; while !stepping_ no step runs.
  std::atomic<bool> admitting_{true}, stepping_{true}, paused_{false};

  // engine thread only
  std::map<uint64_t, Live> live_;
  std::map<const RequestChannel*, size_t> remaining_;  // samples of each request still in the engine
  uint64_t next_id_ = 1;
  int64_t seen_preemptions_ = 0, seen_queries_ = 0, seen_hits_ = 0;
};

}  // namespace mxq::server
