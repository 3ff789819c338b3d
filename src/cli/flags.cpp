// What more than one command shares (commands.h): the argv parse of mxq and mxq-bench, and the flag helpers
// of generate, serve and mxq-bench decode.
#include <fmt/format.h>

#include "cli/commands.h"
#include "io/safetensors.h"  // printable
#if MXQ_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mxq::cli {

int parse_and_run(CLI::App& app, std::string_view name, int argc, char** argv, const int& exit_code) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // note: one line, as every other refusal (CLI11's own exit() adds a second "Run with --help" line).
    std::string cmd(name);
    for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
      a = a->get_subcommands().front();
      cmd += " " + a->get_name();
    }
    fmt::print(stderr, "{}: {} (see {} --help)\n", cmd, e.what(), cmd);
    return kExitBadInput;
  }
  return exit_code;
}

bool cuda_device_visible() {
#if MXQ_HAVE_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

Result<Format> parse_activation_quant(std::string_view flag, Format linear_format, Format declared) {
  if (flag == "auto") return declared == Format::kMXFP8 && is_mx(linear_format) ? Format::kMXFP8 : Format::kBF16;
  if (flag == "none") return Format::kBF16;
  if (flag != "mxfp8")
    return fail("--activation-quant {}: expected auto, none or mxfp8", printable(flag.substr(0, 64)));
  if (!is_mx(linear_format))
    return fail(
        "--activation-quant mxfp8: the projections run in {} (expected mxfp8 or mxfp4; use --quantization)",
        traits(linear_format).name);
  return Format::kMXFP8;
}

std::string activation_mode_notice(std::string_view dir, Format declared, Format running) {
  if (declared != Format::kMXFP8) return "";
  if (running == Format::kMXFP8)
    return fmt::format(
        "{}: quantization_config declares dynamic MXFP8 input_activations: running W8A8 (activations "
        "quantized to MXFP8 per 1x32, rule ceil; --activation-quant none for weight-only)",
        dir);
  return fmt::format(
      "{}: quantization_config declares dynamic MXFP8 input_activations, but --activation-quant none runs "
      "weight-only",
      dir);
}

}  // namespace mxq::cli
