// The cases of tests/golden/model/cases.json (tests/golden/make_model_golden.py): one per checkpoint and
// scheme, each with its runs (prompt, greedy continuation, logits), for the model tests that walk them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace mxq {

// note: constant-initialised: the INSTANTIATE_TEST_SUITE_P calls read it during static initialisation
inline constexpr const char* kGolden = MXQ_SOURCE_DIR "/tests/golden/";

inline const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(kGolden) + "model/cases.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

struct GoldenCase {
  std::string name, checkpoint, quantization;
  size_t index;
};
inline void PrintTo(const GoldenCase& c, std::ostream* os) {
  *os << c.name << " (" << c.checkpoint << (c.quantization.empty() ? "" : " --quantization " + c.quantization)
      << ")";
}

inline std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> out;
  const auto& cases = golden()["cases"];
  for (size_t i = 0; i < cases.size(); ++i)
    out.push_back({cases[i]["name"], cases[i]["checkpoint"], cases[i]["quantization"], i});
  return out;
}

// A gtest parameter name for a case: its name with '-' as '_'.
inline std::string golden_case_name(const ::testing::TestParamInfo<GoldenCase>& i) {
  std::string n = i.param.name;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

}  // namespace mxq
