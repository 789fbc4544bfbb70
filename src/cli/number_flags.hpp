#pragma once
// Checks every command's number flags share, attached once to all options.
#include <CLI/CLI.hpp>

namespace cuboid::cli {

// Attaches to every floating-point option of `app` and of its subcommands a
// check that refuses NaN and infinities (InputError naming the flag): NaN
// passes every comparison (a range check, `<= 0`) and an infinity overflows
// the conversions behind them (seconds to nanoseconds). Called once all
// options are registered, so a new flag cannot miss it.
void require_finite_numbers(CLI::App& app);

}  // namespace cuboid::cli
