// Weight updates of `mxq serve` below HTTP: the WeightUpdater on a private load of the tiny f32 model (a
// sparse delta applies and changes the tokens; a wrong base (W-12), a wrong checksum (W-09) and bytes that
// are not a delta (W-25) leave every byte as it was; a checkpoint update equals a fresh load), and the engine
// thread's tasks (run between two steps, one at a time (W-15); events carry the version that produced their
// tokens (W-20); the pause modes).
#include "server/weight_update.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "../engine/tiny_model.h"
#include "refit/delta_encoder.h"
#include "server/engine_loop.h"

namespace mxq::server {
namespace {

using std::chrono::milliseconds;

const std::string kTinyDir = std::string(MXQ_SOURCE_DIR) + "/tests/golden/model/ckpt/qwen3-dense-f32";

// A load of the tiny model of its own (updates must not reach the shared TinyModel).
struct OwnModel {
  OwnModel() : loaded(*load_model(kTinyDir)), backend(make_cpu_backend(2)) {
    model.emplace(*Qwen3Model::create(loaded.config, loaded.store, *backend));
  }
  std::vector<int32_t> greedy() {
    auto e = Engine::create(model->config(), nullptr, {}, make_cpu_runner(*model));
    GenerateParams p;
    p.max_new_tokens = 12;
    p.ignore_eos = true;
    const std::vector<int32_t> prompt{5, 6, 7, 8};
    auto g = generate_one(*e, prompt, p);
    EXPECT_TRUE(g);
    return g ? g->token_ids : std::vector<int32_t>{};
  }
  std::vector<uint8_t> values(const std::string& name) const {
    std::vector<uint8_t> v(loaded.store.at(name).values.size());
    EXPECT_TRUE(loaded.store.read_canonical(name, Plane::kValues, v));
    return v;
  }
  LoadedModel loaded;
  std::unique_ptr<Backend> backend;
  std::optional<Qwen3Model> model;
};

// A delta from `base` to `base + 1` covering every tensor: the sign of every `stride`-th f32 value of `name`
// flipped, the others unchanged.
std::vector<uint8_t> sign_flip_delta(const OwnModel& m, const std::string& flipped, uint64_t base,
                                     int stride = 3, bool corrupt_checksum = false) {
  refit::Delta d{base, base + 1, {}};
  size_t k = 0;
  for (const auto& [name, t] : m.loaded.store.tensors()) {
    EXPECT_EQ(t.format, Format::kF32) << name;
    const std::vector<uint8_t> old = m.values(name);
    std::vector<uint8_t> now = old;
    if (name == flipped)
      for (size_t i = 3; i < now.size(); i += 4 * static_cast<size_t>(stride)) now[i] ^= 0x80;
    refit::CanonicalPlanes before{old, {}}, after{now, {}};
    auto rec = refit::diff_tensor(name, t.format, t.shape, &before, after);
    EXPECT_TRUE(rec) << (rec ? "" : rec.error().message);
    d.tensors.push_back(std::move(*rec));
    if (corrupt_checksum && name == flipped) d.tensors.back().checksum ^= 1;
    ++k;
  }
  auto bytes = refit::write_delta(d);
  EXPECT_TRUE(bytes);
  return *bytes;
}

std::map<std::string, uint64_t> sums(const WeightUpdater& u) { return u.checksums(); }

const char* kFlipped = "model.layers.0.mlp.down_proj.weight";

TEST(WeightUpdater, SparseDeltaAppliesAndChangesTheTokens) {
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  const auto tokens = m.greedy();
  const auto before = sums(u);
  uint64_t version = 0;
  const UpdateOutcome o = u.apply_delta_file(sign_flip_delta(m, kFlipped, 0), version);
  ASSERT_TRUE(o.success) << o.message;
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(o.version, 1u);
  EXPECT_GT(o.applied_bytes, 0u);
  const auto after = sums(u);
  for (const auto& [name, sum] : before) EXPECT_EQ(sum != after.at(name), name == kFlipped) << name;
  EXPECT_NE(m.greedy(), tokens);
}

TEST(WeightUpdater, WrongBaseIsRefusedBeforeAnyWrite) {
  // covers W-12
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  uint64_t version = 4;
  const auto before = sums(u);
  const UpdateOutcome o = u.apply_delta_file(sign_flip_delta(m, kFlipped, 0), version);
  EXPECT_FALSE(o.success);
  EXPECT_FALSE(o.lost);
  EXPECT_NE(o.message.find("version"), std::string::npos) << o.message;
  EXPECT_EQ(version, 4u);
  EXPECT_EQ(sums(u), before);
}

TEST(WeightUpdater, ChecksumMismatchRestoresEveryByte) {
  // covers W-09: the record's checksum is wrong; the written bytes are undone exactly
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  const auto tokens = m.greedy();
  const auto before = sums(u);
  const auto bytes_before = m.values(kFlipped);
  uint64_t version = 0;
  const UpdateOutcome o = u.apply_delta_file(sign_flip_delta(m, kFlipped, 0, 3, true), version);
  EXPECT_FALSE(o.success);
  EXPECT_FALSE(o.lost);
  EXPECT_NE(o.message.find(kFlipped), std::string::npos) << o.message;
  EXPECT_EQ(version, 0u);
  EXPECT_EQ(sums(u), before);
  EXPECT_EQ(m.values(kFlipped), bytes_before);
  EXPECT_EQ(m.greedy(), tokens);
}

TEST(WeightUpdater, BytesThatAreNotADeltaAreRefused) {
  // covers W-25: a pickle (or anything else) is not read past the magic
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  uint64_t version = 0;
  std::vector<uint8_t> bytes = {0x80, 0x04, 0x95, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                '}',  0x94, '(',  0x8c, 0x01, 'w',  0x94, 'K',  0x01, 'u',  '.'};
  bytes.resize(64, 0);
  const UpdateOutcome o = u.apply_delta_file(bytes, version);
  EXPECT_FALSE(o.success);
  EXPECT_NE(o.message.find("magic"), std::string::npos) << o.message;
  EXPECT_FALSE(u.apply_delta_file({}, version).success);
  EXPECT_EQ(version, 0u);
}

TEST(WeightUpdater, DecompressedBodyPastTheCapIsRefused) {
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, 1024);
  uint64_t version = 0;
  const UpdateOutcome o = u.apply_delta_file(sign_flip_delta(m, kFlipped, 0), version);
  EXPECT_FALSE(o.success);
  EXPECT_NE(o.message.find("1024"), std::string::npos) << o.message;
}

TEST(WeightUpdater, CheckpointUpdateEqualsAFreshLoad) {
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  const auto tokens = m.greedy();
  const auto fresh = sums(u);
  uint64_t version = 0;
  ASSERT_TRUE(u.apply_delta_file(sign_flip_delta(m, kFlipped, 0), version).success);
  ASSERT_NE(sums(u), fresh);
  // back to the checkpoint's bytes, at the version asked for
  UpdateOutcome o = u.apply_checkpoint(kTinyDir, 9, version);
  ASSERT_TRUE(o.success) << o.message;
  EXPECT_EQ(version, 9u);
  EXPECT_EQ(sums(u), fresh);
  EXPECT_EQ(m.greedy(), tokens);
  // the default new version is live + 1; one that does not advance is refused by name (W-12)
  ASSERT_TRUE(u.apply_checkpoint(kTinyDir, std::nullopt, version).success);
  EXPECT_EQ(version, 10u);
  o = u.apply_checkpoint(kTinyDir, 10, version);
  EXPECT_FALSE(o.success);
  EXPECT_NE(o.message.find("weight_version"), std::string::npos) << o.message;
  o = u.apply_checkpoint(kTinyDir + "/missing", std::nullopt, version);
  EXPECT_FALSE(o.success);
  EXPECT_NE(o.message.find("model_path"), std::string::npos) << o.message;
  EXPECT_EQ(version, 10u);
}

TEST(WeightUpdater, CheckpointOfAnotherModelIsRefusedByName) {
  // covers W-07/W-08: the tiny MoE checkpoint has other tensors and shapes
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  const auto before = sums(u);
  uint64_t version = 0;
  const UpdateOutcome o = u.apply_checkpoint(
      std::string(MXQ_SOURCE_DIR) + "/tests/golden/model/ckpt/qwen3-moe-f32-stacked", std::nullopt, version);
  EXPECT_FALSE(o.success);
  EXPECT_FALSE(o.lost);
  EXPECT_NE(o.message.find("model."), std::string::npos) << o.message;
  EXPECT_EQ(sums(u), before);
  EXPECT_EQ(version, 0u);
}

TEST(WeightUpdater, TensorBufferNeedsTheCudaEngineAndAnAdvancingVersion) {
  OwnModel m;
  WeightUpdater u(m.loaded.store, {}, size_t{1} << 30);
  const auto before = sums(u);
  uint64_t version = 4;
  refit::TensorManifest manifest;
  UpdateOutcome o = u.apply_tensor_manifest(manifest, std::nullopt, version);
  EXPECT_FALSE(o.success);
  EXPECT_FALSE(o.lost);
  EXPECT_NE(o.message.find("serve --device cuda"), std::string::npos) << o.message;
  // with a device half (here one that records its call), the version rule is the updater's
  int calls = 0;
  uint64_t to = 0;
  u.set_device_update([&](WeightStore&, uint64_t& v, uint64_t new_version, const refit::TensorManifest&,
                          refit::StageTimes* times) {
    times->emplace_back("open", 1.5);
    ++calls, to = new_version;
    v = new_version;
    return Status{};
  });
  o = u.apply_tensor_manifest(manifest, 4, version);
  EXPECT_FALSE(o.success);
  EXPECT_NE(o.message.find("W-12"), std::string::npos) << o.message;
  EXPECT_EQ(calls, 0);
  o = u.apply_tensor_manifest(manifest, std::nullopt, version);
  ASSERT_TRUE(o.success) << o.message;
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(to, 5u);
  EXPECT_EQ(version, 5u);
  ASSERT_EQ(o.stages.size(), 1u);
  EXPECT_EQ(o.stages[0].first, "open");
  EXPECT_EQ(sums(u), before);
}

TEST(WeightUpdater, VersionsAreDecimalUnsignedIntegers) {
  EXPECT_EQ(*parse_version("v", "0"), 0u);
  EXPECT_EQ(*parse_version("v", "18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1.0", "0x1", "abc", "18446744073709551616"}) {
    auto r = parse_version("new_version", bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("new_version"), std::string::npos);
  }
}

// ---- the engine thread's tasks
// The per-sequence runner, `step` per step, telling whether a step is running.
class SlowRunner final : public ModelRunner {
 public:
  SlowRunner(Qwen3Model& model, milliseconds step, std::atomic<bool>& in_step)
      : inner_(make_cpu_runner(model)), step_(step), in_step_(&in_step) {}
  Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& s,
                                        std::span<const SampleSpec> specs) override {
    *in_step_ = true;
    std::this_thread::sleep_for(step_);
    auto r = inner_->run(plan, s, specs);
    *in_step_ = false;
    return r;
  }
  void drop(uint64_t id) override { inner_->drop(id); }

 private:
  std::unique_ptr<ModelRunner> inner_;
  milliseconds step_;
  std::atomic<bool>* in_step_;
};

struct LoopFixture {
  explicit LoopFixture(milliseconds step = milliseconds(5))
      : engine(std::move(
            *Engine::create(test::TinyModel::get().model->config(), nullptr, {},
                            std::make_unique<SlowRunner>(*test::TinyModel::get().model, step, in_step)))),
        metrics("tiny"),
        loop(engine, metrics) {
    loop.start();
  }
  ~LoopFixture() { loop.drain(milliseconds(0)); }
  std::atomic<bool> in_step{false};
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

struct Read {
  std::vector<int32_t> ids;
  std::vector<std::string> versions;  // per output event with tokens
  FinishReason finish = FinishReason::kLength;
  bool ended = false;
};
// Reads outputs until the sample ends, or `max_events` outputs, or `wait` without an event.
Read read(RequestChannel& c, size_t max_events = SIZE_MAX, milliseconds wait = milliseconds(5000)) {
  Read r;
  for (size_t n = 0; n < max_events;) {
    auto e = c.pop(wait);
    if (!e) break;
    if (e->kind != StreamEvent::Kind::kOutput) continue;
    ++n;
    for (const SampledToken& t : e->out.tokens) r.ids.push_back(t.id);
    if (!e->out.tokens.empty()) r.versions.push_back(e->weight_version);
    if (e->out.finished) {
      r.finish = e->out.finish;
      r.ended = true;
      break;
    }
  }
  return r;
}

std::vector<int32_t> alone(int64_t max_new) {
  Qwen3Model& model = *test::TinyModel::get().model;
  auto e = Engine::create(model.config(), nullptr, {}, make_cpu_runner(model));
  auto g = generate_one(*e, job(max_new).prompt, job(max_new).params);
  return g ? g->token_ids : std::vector<int32_t>{};
}

TEST(EngineLoopTasks, EventsCarryTheVersionThatMadeTheirTokens) {
  // covers W-20: a request in flight across a version change reports both, in order, and keeps running
  LoopFixture f;
  auto c = f.loop.submit("a", {job(40)});
  ASSERT_TRUE(c);
  const Read first = read(*c, 5);
  ASSERT_FALSE(first.ended);
  ASSERT_TRUE(f.loop.run_task([](TaskScope& s) { s.set_version(s.version() + 6); }));
  EXPECT_EQ(f.loop.weight_version(), "6");
  const Read rest = read(*c);
  ASSERT_TRUE(rest.ended);
  EXPECT_EQ(rest.finish, FinishReason::kLength);
  // note: events of steps that ran before the task may still wait in the channel: a run of "0", then "6".
  std::vector<std::string> versions = first.versions;
  versions.insert(versions.end(), rest.versions.begin(), rest.versions.end());
  ASSERT_FALSE(versions.empty());
  EXPECT_EQ(versions.front(), "0");
  EXPECT_EQ(versions.back(), "6");
  EXPECT_TRUE(std::is_sorted(versions.begin(), versions.end()));
  for (const std::string& v : versions) EXPECT_TRUE(v == "0" || v == "6") << v;
  std::vector<int32_t> ids = first.ids;
  ids.insert(ids.end(), rest.ids.begin(), rest.ids.end());
  EXPECT_EQ(ids, alone(40));
}

TEST(EngineLoopTasks, TasksRunBetweenStepsOneAtATime) {
  // covers W-15: concurrent tasks never overlap each other or a step
  LoopFixture f(milliseconds(10));
  auto c = f.loop.submit("a", {job(60)});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->pop(milliseconds(5000)));
  std::atomic<int> inside{0}, most{0}, steps_seen{0}, ran{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] {
      const bool ok = f.loop.run_task([&](TaskScope&) {
        most = std::max(most.load(), ++inside);
        steps_seen += f.in_step.load();
        std::this_thread::sleep_for(milliseconds(15));
        --inside;
      });
      ran += ok;
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ran, 6);
  EXPECT_EQ(most, 1);
  EXPECT_EQ(steps_seen, 0);
  EXPECT_TRUE(read(*c).ended);
}

TEST(EngineLoopTasks, PauseInPlaceStopsSteppingAndKeepsTheRequest) {
  LoopFixture f;
  auto c = f.loop.submit("a", {job(30)});
  ASSERT_TRUE(c);
  const Read first = read(*c, 3);
  ASSERT_TRUE(f.loop.run_task([](TaskScope& s) { s.pause(PauseMode::kInPlace); }));
  EXPECT_TRUE(f.loop.paused());
  // nothing moves while paused; a new request is queued, not refused
  auto d = f.loop.submit("b", {job(3)});
  ASSERT_TRUE(d);
  std::vector<int32_t> ids = first.ids;
  for (;;) {  // the events of the step that was running when the pause came
    const Read late = read(*c, 1, milliseconds(100));
    if (late.ids.empty()) break;
    ids.insert(ids.end(), late.ids.begin(), late.ids.end());
  }
  EXPECT_FALSE(d->pop(milliseconds(200)));
  ASSERT_TRUE(f.loop.run_task([](TaskScope& s) { s.resume(); }));
  const Read rest = read(*c);
  ASSERT_TRUE(rest.ended);
  ids.insert(ids.end(), rest.ids.begin(), rest.ids.end());
  EXPECT_EQ(ids, alone(30));
  EXPECT_TRUE(read(*d).ended);
}

TEST(EngineLoopTasks, PauseWaitFinishesRunningRequestsAndHoldsNewOnes) {
  LoopFixture f;
  auto c = f.loop.submit("a", {job(20)});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->pop(milliseconds(5000)));
  ASSERT_TRUE(f.loop.run_task([](TaskScope& s) { s.pause(PauseMode::kWait); }));
  auto d = f.loop.submit("b", {job(3)});
  ASSERT_TRUE(d);
  const Read r = read(*c);
  EXPECT_TRUE(r.ended);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_FALSE(d->pop(milliseconds(200)));  // not even accepted
  // a queued request can still be aborted while paused
  EXPECT_EQ(f.loop.abort("b"), 1u);
  auto accepted = d->pop(milliseconds(5000));
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->kind, StreamEvent::Kind::kAccepted);
  EXPECT_EQ(read(*d).finish, FinishReason::kAbort);
  EXPECT_EQ(f.loop.in_flight(), 0u);
}

TEST(EngineLoopTasks, PauseAbortEndsRunningAndQueuedRequests) {
  LoopFixture f(milliseconds(10));
  auto c = f.loop.submit("a", {job(60)});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->pop(milliseconds(5000)));
  ASSERT_TRUE(f.loop.run_task([](TaskScope& s) { s.pause(PauseMode::kAbort); }));
  const Read r = read(*c);
  EXPECT_TRUE(r.ended);
  EXPECT_EQ(r.finish, FinishReason::kAbort);
  EXPECT_LT(r.ids.size(), 60u);
  auto d = f.loop.submit("b", {job(3)});
  ASSERT_TRUE(d);
  ASSERT_TRUE(f.loop.run_task([](TaskScope& s) { s.abort_all(); }));
  ASSERT_TRUE(d->pop(milliseconds(5000)));
  EXPECT_EQ(read(*d).finish, FinishReason::kAbort);
  EXPECT_EQ(f.loop.in_flight(), 0u);
  EXPECT_EQ(f.engine.pool().free_blocks(), f.engine.pool().num_blocks());
}

TEST(EngineLoopTasks, NoTaskRunsAfterTheDrain) {
  LoopFixture f;
  f.loop.drain(milliseconds(0));
  bool ran = false;
  EXPECT_FALSE(f.loop.run_task([&](TaskScope&) { ran = true; }));
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace mxq::server
