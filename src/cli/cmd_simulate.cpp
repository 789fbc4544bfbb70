// cuboid simulate and cuboid mesh: one plan.
#include "commands.hpp"
#include "plan_flags.hpp"

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cuboid/cluster.hpp"
#include "cuboid/error.hpp"
#include "cuboid/model.hpp"
#include "cuboid/planfile.hpp"
#include "cuboid/planner.hpp"
#include "cuboid/svg.hpp"
#include "cuboid/report.hpp"
#include "cuboid/topology.hpp"

namespace cuboid::cli {

namespace {

void run_simulate(const PlanFlags& f) {
  PlannerOptions o = planner_options(f);
  Loaded l = load(f);
  ParallelPlan plan = l.plan ? *l.plan : plan_from_options(l.model, l.cluster, o);
  Estimate e = estimate(l.model, *l.topology, plan);
  if (f.json) {
    nlohmann::json j = estimate_to_json(e);
    j["model"] = l.model.name;
    j["cluster"] = l.cluster.name;
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << format_estimate(l.model, l.cluster, e);
}

void run_mesh(const PlanFlags& f) {
  PlannerOptions o = planner_options(f);
  Loaded l = load(f);
  ParallelPlan plan = l.plan ? *l.plan : plan_from_options(l.model, l.cluster, o);
  if (f.svg_path) {
    const std::string title = fmt::format("{} on {}: TP {} x PP {} x DP {}, rank order {}", l.model.name, l.cluster.name,
                                          plan.tp, plan.pp, plan.dp, plan.order.str());
    write_file_atomically(*f.svg_path, mesh_svg(plan, l.cluster, title));
  }
  std::cout << format_mesh(plan, l.cluster);
}

}  // namespace

void register_simulate_commands(CLI::App& app) {
  static PlanFlags sim_flags, mesh_flags;
  CLI::App* sim = app.add_subcommand("simulate", "estimate one plan with a per-component breakdown "
                                                  "(unset dimensions: TP 1, PP 1, DP = the rest, mb 1, selective recompute)");
  add_plan_flags(sim, sim_flags, false, true);
  sim->callback([] { run_simulate(sim_flags); });

  CLI::App* mesh = app.add_subcommand("mesh", "show which GPU (node, gpu) holds which TP group, pipeline stage and DP replica");
  add_plan_flags(mesh, mesh_flags, false, true);
  mesh->add_option("--svg", mesh_flags.svg_path, "also draw the mesh as an SVG picture to this file");
  mesh->callback([] { run_mesh(mesh_flags); });
}

}  // namespace cuboid::cli
