// mxq bench (placeholder until its module lands)
#include "cli/commands.h"

namespace mxq::cli {
void add_bench(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench", "bench (not built yet)");
  cmd->callback([&exit_code] { exit_code = 1; });
}
}  // namespace mxq::cli
