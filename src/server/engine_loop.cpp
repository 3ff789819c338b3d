#include "server/engine_loop.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace mxq::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// An abort names a request by its id as submitted or as the response's id shows it ("cmpl-ID",
// "chatcmpl-ID"), as SGLang matches a rid.
bool names(const std::string& given, const std::string& request_id) {
  if (given == request_id) return true;
  for (std::string_view prefix : {"cmpl-", "chatcmpl-"})
    if (given.size() == prefix.size() + request_id.size() && given.rfind(prefix, 0) == 0 &&
        given.compare(prefix.size(), std::string::npos, request_id) == 0)
      return true;
  return false;
}

}  // namespace

void RequestChannel::push(StreamEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

std::optional<StreamEvent> RequestChannel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

EngineLoop::EngineLoop(Engine& engine, Metrics& metrics) : engine_(&engine), metrics_(&metrics) {}

EngineLoop::~EngineLoop() {
  if (thread_.joinable()) drain(std::chrono::milliseconds(0));
}

void EngineLoop::start() { thread_ = std::thread([this] { run(); }); }

std::shared_ptr<RequestChannel> EngineLoop::submit(std::string request_id, std::vector<SampleJob> samples) {
  if (stopping_ || !healthy_) return nullptr;
  auto channel = std::make_shared<RequestChannel>();
  {
    std::lock_guard lock(mu_);
    inbox_.push_back({std::move(request_id), std::move(samples), channel, Clock::now()});
  }
  ++in_flight_;
  cv_.notify_one();
  return channel;
}

size_t EngineLoop::abort(const std::string& request_id) {
  std::lock_guard lock(mu_);
  size_t found = 0;
  for (const Submission& s : inbox_) found += request_id.empty() || names(request_id, s.request_id);
  if (request_id.empty()) {
    abort_all_ = true;
    found += in_flight_ - std::min<size_t>(in_flight_, inbox_.size());
  } else {
    aborts_.push_back(request_id);
    // note: the live count per id is the engine thread's; an id in flight counts once however many samples.
    found += std::any_of(live_ids_.begin(), live_ids_.end(), [&](const std::string& id) { return names(request_id, id); });
  }
  cv_.notify_one();
  return found;
}

bool EngineLoop::run_task(EngineTask task) {
  if (stopping_ || !healthy_) return false;
  auto done = std::make_shared<std::promise<bool>>();
  std::future<bool> ran = done->get_future();
  {
    std::lock_guard lock(mu_);
    if (exited_) return false;
    tasks_.push_back({std::move(task), done});
  }
  cv_.notify_one();
  return ran.get();
}

void TaskScope::abort_all() { loop_->abort_everything(); }
void TaskScope::reset_prefix_cache() { loop_->engine_->reset_prefix_cache(); }
uint64_t TaskScope::version() const { return loop_->version_; }
void TaskScope::set_version(uint64_t v) { loop_->version_ = v; }
void TaskScope::fail(const Error& e) { loop_->fail_all(e); }

void TaskScope::pause(PauseMode mode) {
  if (mode == PauseMode::kAbort) abort_all();
  loop_->admitting_ = false;
  loop_->stepping_ = mode == PauseMode::kWait;
  loop_->paused_ = true;
}

void TaskScope::resume() {
  loop_->admitting_ = true;
  loop_->stepping_ = true;
  loop_->paused_ = false;
}

void EngineLoop::run_tasks(std::deque<Task>& tasks) {
  for (Task& t : tasks) {
    // note: a task queued behind one that failed the engine does not run (the loop no longer serves).
    if (!healthy_) {
      t.done->set_value(false);
      continue;
    }
    TaskScope scope(*this);
    t.fn(scope);
    update_gauges();
    t.done->set_value(true);
  }
  tasks.clear();
}

std::deque<EngineLoop::Submission> EngineLoop::take_aborted(const std::vector<std::string>& aborts,
                                                             bool abort_all) {
  std::deque<Submission> taken;
  std::lock_guard lock(mu_);
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    const bool named = std::any_of(aborts.begin(), aborts.end(),
                                   [&](const std::string& a) { return names(a, it->request_id); });
    if (abort_all || named || it->channel->cancelled()) {
      taken.push_back(std::move(*it));
      it = inbox_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

// note: a queued request is admitted and then aborted, so its client sees a normal end (finish_reason
// "abort"), as a running one does.
void EngineLoop::abort_everything() {
  std::deque<Submission> queued = take_aborted({}, true);
  for (Submission& s : queued) admit(s);
  for (auto it = live_.begin(); it != live_.end();) {
    const uint64_t id = it->first;
    Live& live = it->second;
    ++it;
    abort_live(id, live);
  }
}

void EngineLoop::drain(std::chrono::milliseconds bound) {
  drain_deadline_ns_ = (Clock::now() + bound).time_since_epoch().count();
  stopping_ = true;
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::admit(Submission& s) {
  std::vector<uint64_t> added;
  for (size_t i = 0; i < s.samples.size(); ++i) {
    const uint64_t id = next_id_++;
    if (auto st = engine_->add(id, s.samples[i].prompt, s.samples[i].params); !st) {
      for (uint64_t a : added) (void)engine_->abort(a);
      StreamEvent e{StreamEvent::Kind::kRefused, i, {}, bad_request("", st.error().message), weight_version()};
      s.channel->push(std::move(e));
      --in_flight_;
      return;
    }
    added.push_back(id);
  }
  for (size_t i = 0; i < added.size(); ++i)
    live_.emplace(added[i], Live{s.request_id, s.channel, i, static_cast<int64_t>(s.samples[i].prompt.size()),
                                 s.arrival, s.arrival, std::nullopt, 0});
  remaining_[s.channel.get()] = added.size();
  {
    std::lock_guard lock(mu_);
    live_ids_.push_back(s.request_id);
  }
  s.channel->push({StreamEvent::Kind::kAccepted, 0, {}, {}, weight_version()});
}

// A sample ended (finished, aborted, failed): it is counted, its request leaves the in-flight count with its
// last sample, and only then is `last` pushed, so a client that has read its last event sees the metrics and
// /abort_request already count it.
void EngineLoop::finish(uint64_t id, Live& live, FinishReason reason, StreamEvent last) {
  const auto now = Clock::now();
  metrics_->success(reason).Increment();
  metrics_->e2e->Observe(seconds(now - live.arrival));
  metrics_->prompt_len->Observe(static_cast<double>(live.prompt_len));
  metrics_->generation_len->Observe(static_cast<double>(live.generated));
  auto it = remaining_.find(live.channel.get());
  if (it != remaining_.end() && --it->second == 0) {
    remaining_.erase(it);
    --in_flight_;
    std::lock_guard lock(mu_);
    auto r = std::find(live_ids_.begin(), live_ids_.end(), live.request_id);
    if (r != live_ids_.end()) live_ids_.erase(r);
  }
  live.channel->push(std::move(last));
  live_.erase(id);
}

void EngineLoop::abort_live(uint64_t id, Live& live) {
  (void)engine_->abort(id);
  StreamEvent e{StreamEvent::Kind::kOutput, live.sample, {}, {}, weight_version()};
  e.out.id = id;
  e.out.finished = true;
  e.out.finish = FinishReason::kAbort;
  finish(id, live, FinishReason::kAbort, std::move(e));
}

void EngineLoop::fail_all(const Error& err) {
  healthy_ = false;
  spdlog::error("mxq serve: the engine failed: {}", err.message);
  for (auto it = live_.begin(); it != live_.end();) {
    const uint64_t id = it->first;
    Live& live = it->second;
    ++it;
    (void)engine_->abort(id);
    finish(id, live, FinishReason::kAbort,
           {StreamEvent::Kind::kFailed, live.sample, {},
            ApiError{500, "the engine failed: " + err.message, "", "InternalServerError"}, weight_version()});
  }
}

void EngineLoop::update_gauges() {
  const Scheduler& s = engine_->scheduler();
  metrics_->running->Set(static_cast<double>(s.num_running()));
  metrics_->waiting->Set(static_cast<double>(s.num_waiting()));
  const BlockPool& pool = engine_->pool();
  metrics_->kv_usage->Set(1.0 - static_cast<double>(pool.free_blocks()) / pool.num_blocks());
  const EngineCounters c = engine_->counters();
  metrics_->preemptions->Increment(static_cast<double>(c.preemptions - seen_preemptions_));
  metrics_->prefix_queries->Increment(static_cast<double>(c.prefix_queries - seen_queries_));
  metrics_->prefix_hits->Increment(static_cast<double>(c.prefix_hits - seen_hits_));
  seen_preemptions_ = c.preemptions;
  seen_queries_ = c.prefix_queries;
  seen_hits_ = c.prefix_hits;
}

void EngineLoop::run() {
  for (;;) {
    std::deque<Submission> inbox;
    std::vector<std::string> aborts;
    std::deque<Task> tasks;
    bool abort_all = false, taking = true;
    {
      std::unique_lock lock(mu_);
      // note: idle, the thread sleeps until a request, an abort, a task or the drain arrives. Paused, it
      // also wakes every 50 ms to notice queued requests whose client left.
      auto ready = [&] {
        return ((admitting_ || stopping_) && !inbox_.empty()) || !aborts_.empty() || abort_all_ ||
               stopping_ || !tasks_.empty() || (!live_.empty() && (stepping_ || stopping_));
      };
      if (paused_ && (!inbox_.empty() || !live_.empty()))
        cv_.wait_for(lock, std::chrono::milliseconds(50), ready);
      else
        cv_.wait(lock, ready);
      taking = admitting_ || stopping_;
      if (taking) inbox.swap(inbox_);
      aborts.swap(aborts_);
      tasks.swap(tasks_);
      abort_all = std::exchange(abort_all_, false);
    }
    // note: held in the inbox while paused; an abort or a client that left still ends them.
    if (!taking)
      for (Submission& s : take_aborted(aborts, abort_all)) inbox.push_back(std::move(s));
    const bool past_deadline =
        stopping_ && Clock::now().time_since_epoch().count() >= drain_deadline_ns_.load();
    for (Submission& s : inbox) {
      if (!healthy_ || stopping_) {
        s.channel->push({StreamEvent::Kind::kRefused, 0, {},
                         ApiError{503, "the server is shutting down", "", "ServiceUnavailableError"},
                         weight_version()});
        --in_flight_;
        continue;
      }
      admit(s);
    }
    for (auto it = live_.begin(); it != live_.end();) {
      const uint64_t id = it->first;
      Live& live = it->second;
      ++it;
      const bool named =
          std::any_of(aborts.begin(), aborts.end(), [&](const std::string& a) { return names(a, live.request_id); });
      if (abort_all || named || past_deadline || live.channel->cancelled()) abort_live(id, live);
    }
    if (!tasks.empty()) run_tasks(tasks);
    if (stopping_ && live_.empty()) break;
    update_gauges();
    if (live_.empty() || !(stepping_ || stopping_)) continue;

    const auto step_start = Clock::now();
    auto outs = engine_->step();
    if (!outs) {
      fail_all(outs.error());
      update_gauges();
      continue;
    }
    const auto now = Clock::now();
    for (auto& [id, live] : live_)
      if (!live.scheduled) {
        const SequenceState* s = engine_->scheduler().find(id);
        if (!s || s->computed > 0) {
          live.scheduled = step_start;
          metrics_->queue_time->Observe(seconds(step_start - live.arrival));
        }
      }
    for (RequestOutput& out : *outs) {
      auto it = live_.find(out.id);
      if (it == live_.end()) continue;
      Live& live = it->second;
      const auto n = static_cast<int64_t>(out.tokens.size());
      if (live.generated == 0 && n > 0) {
        metrics_->ttft->Observe(seconds(now - live.arrival));
        metrics_->prompt_tokens->Increment(static_cast<double>(live.prompt_len));
      } else if (n > 0) {
        metrics_->itl->Observe(seconds(now - live.last_token));
      }
      live.last_token = now;
      live.generated += n;
      metrics_->generation_tokens->Increment(static_cast<double>(n));
      const bool finished = out.finished;
      const FinishReason reason = out.finish;
      StreamEvent e{StreamEvent::Kind::kOutput, live.sample, std::move(out), {}, weight_version()};
      if (finished) {
        finish(it->first, live, reason, std::move(e));
      } else {
        live.channel->push(std::move(e));
      }
    }
    update_gauges();
  }
  std::deque<Task> left;
  {
    std::lock_guard lock(mu_);
    left.swap(tasks_);
    exited_ = true;
  }
  for (Task& t : left) t.done->set_value(false);
  update_gauges();
}

}  // namespace mxq::server
