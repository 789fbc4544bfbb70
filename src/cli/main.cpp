// cuboid: plan and simulate 3D-parallel LLM training.
// Exit codes: 0 success, 1 internal error, 2 bad input (one message on stderr).
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "commands.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid_config.hpp"
#include "plan_words.hpp"

namespace {

// Every floating-point flag of every command takes finite numbers only: NaN
// passes every comparison (a range check, `<= 0`) and an infinity overflows
// the conversions behind them (seconds to nanoseconds). One check, attached
// here to each such option, so a new flag cannot miss it.
void require_finite_numbers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    // The type name starts with FLOAT for float and double options (then any range check's words).
    if (opt->get_type_name().rfind("FLOAT", 0) != 0 || opt->get_lnames().empty()) continue;
    const std::string flag = "--" + opt->get_lnames().front();
    opt->check(CLI::Validator(
        [flag](std::string& text) -> std::string {
          char* end = nullptr;
          const double v = std::strtod(text.c_str(), &end);
          // Text that is no number at all is left to CLI11's conversion error.
          if (end != text.c_str() && *end == '\0' && !std::isfinite(v))
            throw cuboid::InputError("command line", flag, "is not a finite number: " + text.substr(0, 20),
                                     "give a finite number");
          return {};
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) require_finite_numbers(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr so that --json output on stdout stays one document.
  auto logger = spdlog::stderr_color_mt("cuboid");
  logger->set_pattern("%^[%l]%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);

  CLI::App app{"cuboid: plan 3D-parallel (TP x PP x DP) LLM training on a GPU cluster"};
  app.set_version_flag("--version", std::string("cuboid ") + CUBOID_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  cuboid::cli::register_plan_command(app);
  cuboid::cli::register_simulate_commands(app);
  cuboid::cli::register_export_command(app);
  cuboid::cli::register_validate_command(app);
#if CUBOID_HAVE_MPI && defined(CUBOID_HAVE_RUN_COMMAND)
  cuboid::cli::register_run_command(app);
#endif
#if CUBOID_HAVE_MPI && defined(CUBOID_HAVE_CALIBRATE_COMMAND)
  cuboid::cli::register_calibrate_command(app, argc, argv);
#endif
  require_finite_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "cuboid: command line: " << e.what() << " (fix: see 'cuboid " << "--help')\n";
    return 2;
  } catch (const cuboid::PlanRejected& e) {
    std::cerr << "cuboid: " << cuboid::cli::worded(e).what() << "\n";
    return 2;
  } catch (const cuboid::InputError& e) {
    std::cerr << "cuboid: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cuboid: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
