#pragma once
// The cuboid command line: one file per subcommand (cmd_*.cpp), each with a
// register function called from main.cpp.
#include <CLI/CLI.hpp>

namespace cuboid::cli {

void register_plan_command(CLI::App& app);       // cmd_plan.cpp
void register_simulate_commands(CLI::App& app);  // cmd_simulate.cpp: simulate, mesh
void register_export_command(CLI::App& app);      // cmd_export.cpp
void register_run_command(CLI::App& app);         // cmd_run.cpp (built with MPI)
void register_validate_command(CLI::App& app);    // cmd_validate.cpp
// cmd_calibrate.cpp (built with MPI); argv is recorded in the calibrated card.
void register_calibrate_command(CLI::App& app, int argc, char** argv);

}  // namespace cuboid::cli
