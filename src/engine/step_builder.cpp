#include "engine/step_builder.h"

#include <algorithm>
#include <climits>

namespace mxq {

bool is_decode_plan(const StepPlan& plan) {
  return std::all_of(plan.chunks.begin(), plan.chunks.end(),
                     [](const ScheduledChunk& c) { return c.count == 1 && c.samples; });
}

ForwardShape forward_shape(const StepLayout& l) {
  ForwardShape s;
  s.rows = l.rows, s.seqs = l.seqs, s.decode = l.decode;
  s.sample_rows = l.decode ? l.seqs : static_cast<int32_t>(l.sample_rows.size());
  if (!l.decode) s.sample_token_rows = l.sample_rows;
  return s;
}

Result<StepLayout> build_step(const StepPlan& plan, const Scheduler& scheduler,
                              std::span<const SampleSpec> specs, int32_t seqs, int32_t max_blocks,
                              int32_t block_size, StepMeta& h) {
  return build_step(
      plan, [&](uint64_t id) { return scheduler.find(id); }, specs, seqs, max_blocks, block_size, h);
}

Result<StepLayout> build_step(const StepPlan& plan, const std::function<const SequenceState*(uint64_t)>& find,
                              std::span<const SampleSpec> specs, int32_t seqs, int32_t max_blocks,
                              int32_t block_size, StepMeta& h) {
  const int32_t S = static_cast<int32_t>(plan.chunks.size());
  StepLayout out;
  out.decode = is_decode_plan(plan);
  out.seqs = seqs;
  out.rows = out.decode ? seqs : plan.tokens;
  const int32_t bs = block_size, B = max_blocks;
  int32_t t = 0, j = 0;
  h.cu_seqlens[0] = 0;
  for (int32_t i = 0; i < S; ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const SequenceState* s = find(c.id);
    if (!s) return fail("request {}: not in the scheduler", c.id);
    if (static_cast<int64_t>(s->blocks.size()) > B ||
        c.start + c.count > static_cast<int64_t>(s->blocks.size()) * bs)
      return fail("request {}: {} blocks for {} positions (at most {} blocks of {})", c.id, s->blocks.size(),
                  c.start + c.count, B, bs);
    // note: c.start may be past 0 in a sequence's first chunk (a prefix cache hit): positions before it are
    // in blocks other sequences may share, read through the table below and never written.
    for (int64_t p = c.start; p < c.start + c.count; ++p, ++t) {
      h.ids[t] = s->tokens[p];
      h.positions[t] = static_cast<int32_t>(p);
      h.slot_mapping[t] = s->blocks[p / bs] * bs + static_cast<int32_t>(p % bs);
    }
    std::copy(s->blocks.begin(), s->blocks.end(), h.block_tables + static_cast<int64_t>(i) * B);
    h.seq_lens[i] = static_cast<int32_t>(c.start + c.count);
    h.cu_seqlens[i + 1] = t;
    if (!c.samples) continue;
    if (j >= static_cast<int32_t>(specs.size())) return fail("request {}: no sampling spec", c.id);
    const SampleSpec& sp = specs[j];
    h.temperature[j] = sp.params->temperature;
    h.top_k[j] = static_cast<int32_t>(std::clamp<int64_t>(sp.params->top_k, -1, INT32_MAX));
    h.top_p[j] = sp.params->top_p;
    h.min_p[j] = sp.params->min_p;
    h.seed[j] = sp.seed;
    h.step[j] = static_cast<uint64_t>(sp.index);
    out.sample_rows.push_back(t - 1);
    ++j;
  }
  // Padding rows of a decode bucket: no KV write, no attention, nothing sampled.
  for (int64_t r = t; r < out.rows; ++r) {
    h.ids[r] = 0;
    h.positions[r] = 0;
    h.slot_mapping[r] = -1;
  }
  for (int32_t i = S; i < seqs; ++i) {
    h.seq_lens[i] = 0;
    h.cu_seqlens[i + 1] = t;
  }
  *h.num_tokens = t;
  *h.num_seqs = j;
  return out;
}

}  // namespace mxq
