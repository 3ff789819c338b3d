// The f32 dense golden model (vocab 256, context 64, eos 2, no tokenizer) on the CPU backend, loaded once
// per test binary: the engine and generator tests share it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"

namespace mxq::test {

struct TinyModel {
  LoadedModel loaded;
  std::unique_ptr<Backend> backend;
  std::optional<Qwen3Model> model;
  static TinyModel& get() {
    static TinyModel* t = [] {
      auto* m =
          new TinyModel{*load_model(std::string(MXQ_SOURCE_DIR) + "/tests/golden/model/ckpt/qwen3-dense-f32"),
                        make_cpu_backend(2),
                        {}};
      m->model.emplace(*Qwen3Model::create(m->loaded.config, m->loaded.store, *m->backend));
      return m;
    }();
    return *t;
  }
};

}  // namespace mxq::test
