#include "cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cpu/softmax.h"

namespace mxq {
namespace {

constexpr float kGreedyTemperature = 1e-5f;  // vLLM's _SAMPLING_EPS
constexpr float kMasked = -INFINITY;

// min-p on temperature-scaled logits: drop tokens whose probability is below min_p times the largest.
void apply_min_p(std::vector<float>& logits, float min_p) {
  std::vector<float> probs(logits.size());
  softmax(logits.data(), 1, static_cast<int64_t>(logits.size()), probs.data());
  const float threshold = min_p * *std::max_element(probs.begin(), probs.end());
  for (size_t i = 0; i < logits.size(); ++i)
    if (probs[i] < threshold) logits[i] = kMasked;
}

// top-k and top-p as vLLM's apply_top_k_top_p: over the logits sorted ascending, mask values below the
// k-th largest; then mask from the bottom every token whose ascending cumulative probability is
// <= 1 - top_p, never the largest one.
// note: equal logits sort by descending id, so among ties the higher id is cut first.
void apply_top_k_top_p(std::vector<float>& logits, int64_t top_k, float top_p) {
  const auto n = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] < logits[b] || (logits[a] == logits[b] && a > b); });
  std::vector<float> sorted(logits.size());
  for (int64_t i = 0; i < n; ++i) sorted[i] = logits[order[i]];
  if (top_k > 0 && top_k < n) {
    const float kth = sorted[n - top_k];
    for (float& v : sorted)
      if (v < kth) v = kMasked;
  }
  if (top_p < 1.0f) {
    std::vector<float> probs(sorted.size());
    softmax(sorted.data(), 1, n, probs.data());
    const float cut = 1.0f - top_p;
    float cumulative = 0.0f;
    for (int64_t i = 0; i + 1 < n; ++i) {
      cumulative += probs[i];
      if (cumulative <= cut) sorted[i] = kMasked;
    }
  }
  for (int64_t i = 0; i < n; ++i) logits[order[i]] = sorted[i];
}

// One draw by inverse CDF over token ids in increasing order; u uses the top 53 bits of one rng output
// (portable: std::uniform_real_distribution differs between standard libraries).
int32_t draw(const std::vector<float>& logits, uint64_t random_bits) {
  const float m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i)
    total += weights[i] = std::exp(static_cast<double>(logits[i] - m));
  const double target = static_cast<double>(random_bits >> 11) * 0x1p-53 * total;
  double cumulative = 0.0;
  int32_t last_kept = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (weights[i] == 0.0) continue;
    last_kept = static_cast<int32_t>(i);
    cumulative += weights[i];
    if (target < cumulative) return last_kept;
  }
  return last_kept;  // rounding left target at the very top
}

}  // namespace

Status check_sampling_params(const SamplingParams& p, int64_t vocab) {
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max())
    return fail("sampling: vocabulary size must be in [1, 2^31-1], got {}", vocab);
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature))
    return fail("sampling: temperature must be a finite number >= 0, got {}", p.temperature);
  if (p.top_k < -1) return fail("sampling: top_k must be -1, 0 (off) or positive, got {}", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return fail("sampling: top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return fail("sampling: min_p must be in [0, 1], got {}", p.min_p);
  if (p.num_logprobs < 0 || p.num_logprobs > vocab)
    return fail("sampling: logprobs must be in [0, {}], got {}", vocab, p.num_logprobs);
  return {};
}

namespace {

// note: the draw is taken through `bits` only after every check passed and only when not greedy, so the
// std::mt19937_64 overload advances its generator exactly as before.
template <class Bits>
Result<SampledToken> sample_impl(const float* logits, int64_t vocab, const SamplingParams& p, Bits bits) {
  if (auto ok = check_sampling_params(p, vocab); !ok) return tl::unexpected(ok.error());
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isnan(logits[i]) || logits[i] == INFINITY)
      return fail("sampling: logit of token {} is {}", i, logits[i]);
  if (*std::max_element(logits, logits + vocab) == kMasked) return fail("sampling: every logit is -inf");
  std::vector<float> raw_logprobs(static_cast<size_t>(vocab));
  log_softmax(logits, 1, vocab, raw_logprobs.data());

  SampledToken out{};
  if (p.temperature < kGreedyTemperature) {
    out.id = static_cast<int32_t>(argmax(logits, vocab));
  } else {
    std::vector<float> scaled(logits, logits + vocab);
    for (float& v : scaled) v /= p.temperature;
    if (p.min_p > 0.0f) apply_min_p(scaled, p.min_p);
    if (p.top_k > 0 || p.top_p < 1.0f) apply_top_k_top_p(scaled, p.top_k, p.top_p);
    out.id = draw(scaled, bits());
  }
  out.logprob = raw_logprobs[out.id];

  if (p.num_logprobs == 0) return out;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + p.num_logprobs, order.end(), [&](int32_t a, int32_t b) {
    return raw_logprobs[a] > raw_logprobs[b] || (raw_logprobs[a] == raw_logprobs[b] && a < b);
  });
  for (int64_t j = 0; j < p.num_logprobs; ++j) out.top_logprobs.push_back({order[j], raw_logprobs[order[j]]});
  return out;
}

}  // namespace

Result<SampledToken> sample(const float* logits, int64_t vocab, const SamplingParams& p,
                            std::mt19937_64& rng) {
  return sample_impl(logits, vocab, p, [&rng] { return rng(); });
}

Result<SampledToken> sample(const float* logits, int64_t vocab, const SamplingParams& p,
                            uint64_t random_bits) {
  return sample_impl(logits, vocab, p, [random_bits] { return random_bits; });
}

}  // namespace mxq
