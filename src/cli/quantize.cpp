// mxq quantize (placeholder until its module lands)
#include "cli/commands.h"

namespace mxq::cli {
void add_quantize(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("quantize", "quantize (not built yet)");
  cmd->callback([&exit_code] { exit_code = 1; });
}
}  // namespace mxq::cli
