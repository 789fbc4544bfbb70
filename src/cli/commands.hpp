#pragma once
// The cuboid command line: CLI11 subcommands over the library.
#include <CLI/CLI.hpp>

namespace cuboid::cli {

// Registers every subcommand on `app`; the returned callbacks run the chosen one.
void register_commands(CLI::App& app);

}  // namespace cuboid::cli
