// Fuzzes the command line's plan-describing flags (--tp, --pp, --dp,
// --global-batch, --nodes, --micro-batch, --vpp, --zero, --seq-length, the
// enum spellings, ...): CLI11's parse, planner_options()' validation and the
// plan validator against Llama-3-70B on DGX A100 nodes, the same steps
// `cuboid simulate` takes before it simulates. No plan is searched or run.
// Input: the arguments separated by spaces or newlines; a first argument
// "simulate" selects simulate's flags (every dimension set, --plan allowed),
// anything else plan's (dimensions searched unless fixed).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid_config.hpp"
#include "fuzz_input.hpp"
#include "number_flags.hpp"
#include "plan_flags.hpp"

namespace {

const std::filesystem::path kRoot = CUBOID_SOURCE_ROOT;

std::vector<std::string> split_arguments(const std::string& text) {
  std::vector<std::string> args;
  std::string arg;
  for (char c : text) {
    if (c == ' ' || c == '\n') {
      if (!arg.empty()) args.push_back(arg);
      arg.clear();
    } else {
      arg += c;
    }
  }
  if (!arg.empty()) args.push_back(arg);
  return args;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const cuboid::ModelSpec model = cuboid::load_model(kRoot / "models" / "llama3-70b.json");
  static const nlohmann::json card = cuboid::read_json_file(kRoot / "topologies" / "dgx-a100.json");

  std::vector<std::string> args = split_arguments(cuboid::fuzz::as_text(data, size));
  const bool simulate = !args.empty() && args.front() == "simulate";
  if (simulate) args.erase(args.begin());
  // CLI11 takes the arguments in reverse order (it pops from the back).
  std::vector<std::string> reversed(args.rbegin(), args.rend());

  CLI::App app{"fuzz"};
  cuboid::cli::PlanFlags flags;
  cuboid::cli::add_plan_flags(&app, flags, /*search=*/!simulate, /*with_plan_file=*/simulate);
  cuboid::cli::require_finite_numbers(app);  // as main.cpp does
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return 0;  // the CLI prints it and exits 2
  } catch (const cuboid::InputError&) {
    return 0;  // a NaN or an infinity: the CLI prints it and exits 2
  }
  try {
    const cuboid::PlannerOptions options = cuboid::cli::planner_options(flags);
    const cuboid::Cluster cluster =
        cuboid::cluster_from_json(card, "topologies/dgx-a100.json", kRoot / "topologies", flags.nodes);
    const cuboid::ParallelPlan plan = cuboid::plan_from_options(model, cluster, options);
    (void)plan.world_size();
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
