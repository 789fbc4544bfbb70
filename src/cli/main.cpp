// cuboid: plan and simulate 3D-parallel LLM training.
// Exit codes: 0 success, 1 internal error, 2 bad input (one message on stderr).
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "commands.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid_config.hpp"
#include "number_flags.hpp"
#include "plan_words.hpp"

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
  cuboid::cli::require_finite_numbers(app);
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
