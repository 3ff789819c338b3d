// mxq: one binary, one file per subcommand (see commands.h).
#include <spdlog/spdlog.h>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mxq: inference and in-place refit for MXFP8 / MXFP4 / FP8-B128 language models"};
  app.require_subcommand(1);
  int exit_code = 0;
  mxq::cli::add_inspect(app, exit_code);
  mxq::cli::add_quantize(app, exit_code);
  mxq::cli::add_bench(app, exit_code);
  mxq::cli::add_generate(app, exit_code);
  mxq::cli::add_delta(app, exit_code);
  mxq::cli::add_serve(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : mxq::cli::kExitBadInput;
  }
  return exit_code;
}
