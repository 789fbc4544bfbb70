// cuboid validate: the simulator's prediction of a plan vs what cuboid run measured.
// Exit codes: 0 within --tolerance, 1 end-to-end error beyond it, 2 bad input
// (measurements of another plan, cluster or backend, missing ops, bad times).
#include "commands.hpp"
#include "plan_flags.hpp"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/io/measurements.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/report/validate.hpp"

namespace cuboid::cli {

namespace {

struct ValidateFlags {
  std::string plan_path, cluster_path;
  std::vector<std::string> measurements_paths;
  double tolerance = 0.10;
  bool json = false;
  bool ops = false;
  std::string statistic = "median";
};

void run_validate(const ValidateFlags& f) {
  if (!(std::isfinite(f.tolerance) && f.tolerance > 0))
    throw InputError("command line", "--tolerance", fmt::format("must be a positive fraction, got {}", f.tolerance),
                     "give e.g. --tolerance 0.10 for 10 %");
  const Statistic stat = parse_statistic(f.statistic, "--statistic");
  const PlanFile pf = read_plan_file(f.plan_path);
  const Cluster cluster = load_cluster_for_plan(f.cluster_path, pf.nodes, std::nullopt, pf.gpus_per_node);
  std::vector<Measurements> runs;
  for (const std::string& path : f.measurements_paths) runs.push_back(load_measurements(path));
  const Measurements m = merge_runs(runs);
  if (const std::string w = host_mismatch_warning(cluster, m); !w.empty()) std::cerr << w << "\n";
  const ValidationReport r = validate_measurements(pf, cluster, m, f.tolerance, stat);
  if (f.json)
    std::cout << validation_to_json(r).dump(2) << "\n";
  else
    std::cout << format_validation(r, f.ops);
  std::cout.flush();
  if (!r.within_tolerance()) std::exit(1);
}

}  // namespace

void register_validate_command(CLI::App& app) {
  static ValidateFlags flags;
  CLI::App* cmd = app.add_subcommand("validate", "compare the simulator's prediction of a plan with what `cuboid run` "
                                                 "measured, per component and end to end (exit 1 beyond --tolerance)");
  cmd->add_option("--plan", flags.plan_path, "the plan file the run executed")->required();
  cmd->add_option("--measurements", flags.measurements_paths,
                  "measurements.json written by cuboid run --out; several runs of the plan (e.g. interleaved with "
                  "calibrations) count as one: each time's min is the runs' smallest, its median the runs' medians' "
                  "median")
      ->required();
  cmd->add_option("--cluster", flags.cluster_path,
                  "cluster card to simulate with (a calibrated card from cuboid calibrate, or the card the plan was made for)")
      ->required();
  cmd->add_option("--tolerance", flags.tolerance, "largest accepted end-to-end error, as a fraction (default 0.10)");
  cmd->add_flag("--ops", flags.ops, "add a per-op table (cost model vs measured)");
  cmd->add_option("--statistic", flags.statistic,
                  "median (default) or min: the measured steps' median, or their minimum (the step least disturbed "
                  "by other processes on a shared machine; pair it with cuboid calibrate --statistic min)");
  cmd->add_flag("--json", flags.json, "print one JSON document on stdout");
  cmd->callback([] { run_validate(flags); });
}

}  // namespace cuboid::cli
