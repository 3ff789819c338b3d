// The engine thread of `mxq serve` on the tiny CPU model: outputs reach their channel and equal the engine's
// own; a cancelled channel frees its KV blocks (H-12); a failing step fails its requests, turns /health off
// and refuses later ones (H-14); abort by the response's id; the drain ends running requests within its bound.
#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <thread>

#include "../engine/tiny_model.h"

namespace mxq::server {
namespace {

using std::chrono::milliseconds;

// The per-sequence runner, failing every step from the `fail_at`-th on (a device error, say), and taking at
// least `step` per step, so a test can act while a request still runs.
class FailingRunner final : public ModelRunner {
 public:
  FailingRunner(Qwen3Model& model, int fail_at, milliseconds step)
      : inner_(make_cpu_runner(model)), fail_at_(fail_at), step_(step) {}
  Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& s,
                                        std::span<const SampleSpec> specs) override {
    std::this_thread::sleep_for(step_);
    if (++steps_ >= fail_at_) return fail("injected failure at step {}", steps_);
    return inner_->run(plan, s, specs);
  }
  void drop(uint64_t id) override { inner_->drop(id); }

 private:
  std::unique_ptr<ModelRunner> inner_;
  int fail_at_, steps_ = 0;
  milliseconds step_;
};

struct Fixture {
  explicit Fixture(int fail_at = 1 << 30, milliseconds step = milliseconds(0))
      : engine(std::move(
            *Engine::create(test::TinyModel::get().model->config(), nullptr, {},
                            std::make_unique<FailingRunner>(*test::TinyModel::get().model, fail_at, step)))),
        metrics("tiny"),
        loop(engine, metrics) {
    loop.start();
  }
  Engine engine;
  Metrics metrics;
  EngineLoop loop;
};

SampleJob job(int64_t max_new) {
  SampleJob j{{5, 6, 7, 8}, {}};
  j.params.max_new_tokens = max_new;
  j.params.ignore_eos = true;
  return j;
}

// Reads a channel to its end: the tokens of sample 0 and the last event's kind.
struct Drained {
  std::vector<int32_t> ids;
  StreamEvent::Kind last = StreamEvent::Kind::kAccepted;
  FinishReason finish = FinishReason::kLength;
};
Drained drain_channel(RequestChannel& c, size_t samples = 1) {
  Drained d;
  size_t done = 0;
  while (done < samples) {
    auto e = c.pop(milliseconds(5000));
    if (!e) {
      ADD_FAILURE() << "no event within 5 s";
      break;
    }
    d.last = e->kind;
    if (e->kind == StreamEvent::Kind::kRefused || e->kind == StreamEvent::Kind::kFailed) break;
    if (e->kind != StreamEvent::Kind::kOutput) continue;
    if (e->sample == 0)
      for (const SampledToken& t : e->out.tokens) d.ids.push_back(t.id);
    if (e->out.finished) {
      ++done;
      d.finish = e->out.finish;
    }
  }
  return d;
}

TEST(EngineLoop, OutputsEqualTheEngineAlone) {
  Qwen3Model& model = *test::TinyModel::get().model;
  auto alone = Engine::create(model.config(), nullptr, {}, make_cpu_runner(model));
  ASSERT_TRUE(alone);
  auto want = generate_one(*alone, job(12).prompt, job(12).params);
  ASSERT_TRUE(want);
  Fixture f;
  auto c = f.loop.submit("a", {job(12), job(12)});
  ASSERT_TRUE(c);
  const Drained d = drain_channel(*c, 2);
  EXPECT_EQ(d.ids, want->token_ids);
  EXPECT_EQ(d.finish, FinishReason::kLength);
  // note: a request is counted before its last event goes out, so the count is there once it is read
  EXPECT_EQ(f.metrics.success_length->Value(), 2);
  EXPECT_EQ(f.loop.in_flight(), 0u);
  f.loop.drain(milliseconds(1000));
}

TEST(EngineLoop, CancelledChannelFreesItsBlocks) {
  // covers H-12: a client gone mid-stream is aborted before the engine's next step
  Fixture f(1 << 30, milliseconds(10));
  auto c = f.loop.submit("a", {job(50)});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->pop(milliseconds(5000)));  // accepted
  c->cancel();
  const Drained d = drain_channel(*c);
  EXPECT_EQ(d.finish, FinishReason::kAbort);
  EXPECT_EQ(f.loop.in_flight(), 0u);
  EXPECT_EQ(f.metrics.success_abort->Value(), 1);
  f.loop.drain(milliseconds(1000));
  EXPECT_EQ(f.engine.pool().free_blocks(), f.engine.pool().num_blocks());
}

TEST(EngineLoop, AbortByResponseId) {
  Fixture f(1 << 30, milliseconds(10));
  auto c = f.loop.submit("abc", {job(60)});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->pop(milliseconds(5000)));
  EXPECT_EQ(f.loop.abort("cmpl-abc"), 1u);
  EXPECT_EQ(drain_channel(*c).finish, FinishReason::kAbort);
  EXPECT_EQ(f.loop.abort("nobody"), 0u);
  f.loop.drain(milliseconds(1000));
}

TEST(EngineLoop, FailedStepFailsItsRequestsAndTheHealth) {
  // covers H-14: an engine failure ends the request with an error event and /health goes 503
  Fixture f(3);
  auto c = f.loop.submit("a", {job(20)});
  ASSERT_TRUE(c);
  const Drained d = drain_channel(*c);
  EXPECT_EQ(d.last, StreamEvent::Kind::kFailed);
  for (int i = 0; i < 200 && f.loop.healthy(); ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_FALSE(f.loop.healthy());
  EXPECT_EQ(f.loop.submit("b", {job(2)}), nullptr);  // refused: the handler answers 503
  f.loop.drain(milliseconds(1000));
}

TEST(EngineLoop, DrainAbortsWhatOutlivesItsBound) {
  Fixture f(1 << 30, milliseconds(10));
  auto c = f.loop.submit("a", {job(60)});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->pop(milliseconds(5000)));
  f.loop.drain(milliseconds(0));
  EXPECT_EQ(drain_channel(*c).finish, FinishReason::kAbort);
  EXPECT_EQ(f.loop.submit("b", {job(2)}), nullptr);
}

}  // namespace
}  // namespace mxq::server
