// mxq: one binary, one file per subcommand (see commands.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mxq: inference and in-place refit for MXFP8 / MXFP4 / FP8-B128 language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("mxq ") + MXQ_VERSION);
  int exit_code = 0;
  // `mxq help` is `mxq --help`, as git and cargo have it.
  app.add_subcommand("help", "Print this help")->callback([&app] {
    // note: App::help() would describe the selected subcommand (this one); the formatter describes the app.
    std::fputs(app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal).c_str(), stdout);
  });
  mxq::cli::add_inspect(app, exit_code);
  mxq::cli::add_quantize(app, exit_code);
  // note: the benchmarks moved to their own binary (bench/main.cpp); `mxq bench ...` says where, hidden.
  auto* bench = app.add_subcommand("bench", "")->group("")->allow_extras()->prefix_command();
  bench->callback([bench, &exit_code] {
    std::string args;
    for (const std::string& a : bench->remaining()) args += " " + a;
    fmt::print(stderr, "mxq bench: the benchmarks are their own binary: mxq-bench{} (beside mxq)\n", args);
    exit_code = mxq::cli::kExitBadInput;
  });
  mxq::cli::add_generate(app, exit_code);
  mxq::cli::add_delta(app, exit_code);
  mxq::cli::add_serve(app, exit_code);
  return mxq::cli::parse_and_run(app, "mxq", argc, argv, exit_code);
}
