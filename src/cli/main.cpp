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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // note: one line, as every other refusal (CLI11's own exit() adds a second "Run with --help" line).
    std::string cmd = "mxq";
    for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
      a = a->get_subcommands().front();
      cmd += " " + a->get_name();
    }
    fmt::print(stderr, "{}: {} (see {} --help)\n", cmd, e.what(), cmd);
    return mxq::cli::kExitBadInput;
  }
  return exit_code;
}
