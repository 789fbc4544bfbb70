// cuboid export: a plan file as the configuration of another trainer.
#include "commands.hpp"
#include "plan_flags.hpp"

#include <iostream>
#include <string>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/export_order.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"

namespace cuboid::cli {

namespace {

struct ExportFlags {
  std::string plan_path;
  std::string target;
  std::string out_path;
  std::string cluster_path;  // for the re-plan; default: the card the plan file names
  bool as_planned = false;   // refuse instead of re-planning
};

// The target's refusal with `more` added to its fix.
InputError with_fix(const InputError& refused, const std::string& more) {
  return InputError(refused.source(), refused.field(), refused.problem(), refused.fix() + "; " + more);
}

// The settings in which `b` differs from `a`, e.g. "4 virtual stages -> 1, ZeRO 1 -> 3".
std::string differences(const ParallelPlan& a, const ParallelPlan& b) {
  std::string out;
  auto add = [&](const std::string& what, const std::string& x, const std::string& y) {
    if (x != y) out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", what, x, y);
  };
  add("micro-batch", std::to_string(a.micro_batch), std::to_string(b.micro_batch));
  add("schedule", std::string(to_string(a.schedule)), std::string(to_string(b.schedule)));
  add("virtual stages", std::to_string(a.virtual_stages), std::to_string(b.virtual_stages));
  add("ZeRO", std::to_string(a.zero_stage), std::to_string(b.zero_stage));
  add("recompute", std::string(to_string(a.recompute)), std::string(to_string(b.recompute)));
  add("SP", a.sequence_parallel ? "on" : "off", b.sequence_parallel ? "on" : "off");
  add("rank order", a.order.str(), b.order.str());
  add("grad-accum fusion", a.grad_accum_fusion ? "on" : "off", b.grad_accum_fusion ? "on" : "off");
  add("precision", std::string(to_string(a.precision)), std::string(to_string(b.precision)));
  add("trainer", a.trainer.preset, b.trainer.preset);
  return out.empty() ? "nothing else" : out;
}

// The plan file's TP x PP x DP as the target runs it: the search of `plan --for
// TARGET` with the plan's layout, batch and sequence length fixed, exported
// with a note that says what changed and what cuboid predicts for it. The
// refusal `refused` stands when the cluster card is not found or nothing fits.
ExportResult replan_for_target(const PlanFile& pf, const ExportFlags& f, const InputError& refused) {
  const ParallelPlan& planned = pf.plan;
  // No target that refuses a CP plan runs context parallelism as cuboid
  // prices it: the exporter's refusal says so and what to do.
  if (planned.cp > 1) throw refused;
  // Nor does one that refuses the experts run them at all, and no target
  // writes a precision (a bf16 replan would drop the plan's FP8).
  if (refused.field() == "model.moe" || refused.field() == "parallel.precision") throw refused;
  const std::string cp_flag = planned.cp > 1 ? fmt::format(" --cp {}", planned.cp) : std::string();
  const std::string layout = fmt::format("TP {}{} x PP {} x DP {}", planned.tp,
                                         planned.cp > 1 ? fmt::format(" x CP {}", planned.cp) : std::string(), planned.pp,
                                         planned.dp);
  const std::string command = fmt::format("--tp {}{} --pp {} --dp {} --global-batch {} --seq-length {} --for {}", planned.tp,
                                          cp_flag, planned.pp, planned.dp, planned.global_batch, planned.seq_length,
                                          f.target);
  auto refuse = [&](const std::string& why) { return with_fix(refused, "or plan again with " + command + " (" + why + ")"); };
  PlanFlags flags;
  flags.plan_path = f.plan_path;
  flags.cluster_path = f.cluster_path;
  Loaded l;
  try {
    l = load(flags);
  } catch (const InputError& e) {
    throw refuse("cuboid export could not re-plan: " + e.problem());
  }
  PlannerOptions o;
  o.tp = planned.tp;
  o.pp = planned.pp;
  o.dp = planned.dp;
  o.cp = planned.cp;
  if (planned.cp > 1) o.cp_comm = planned.cp_comm;
  if (l.model.moe.enabled()) {  // the experts' layout stays too
    o.ep = planned.ep;
    o.etp = planned.expert_tp();
  }
  o.global_batch = planned.global_batch;
  o.seq_length = planned.seq_length;
  if (has_uneven_stages(planned)) {  // the planned split of the layers stays
    o.uneven_stages = true;
    o.first_stage_layers = planned.first_stage_layers;
    o.last_stage_layers = planned.last_stage_layers;
  }
  restrict_to_target(o, l, f.target);
  SearchResult r;
  try {
    r = search_plans(l.model, *l.topology, o);
  } catch (const InputError& e) {
    throw refuse(f.target + " runs no plan of this layout: " + e.problem());
  }
  if (r.candidates == 0)
    throw with_fix(refused, fmt::format("{} runs no plan with {}: plan again with --for {} and other dimensions",
                                        f.target, layout, f.target));
  if (r.fitting.empty()) throw refuse("no plan of this layout that " + f.target + " runs fits in memory");
  const Estimate& best = r.fitting.front();
  PlanFile replanned = plan_file_from_json(plan_to_json(l.model, l.cluster, best), pf.source);
  replanned.source = pf.source + ", re-planned for " + f.target;
  ExportResult result = export_in_expressible_order(replanned, f.target);
  const double planned_s = pf.prediction.value("iteration_time_s", 0.0);
  result.notes = fmt::format(
                     "cuboid export: the plan in {} cannot run on {} as planned ({}: {}); exported instead the best "
                     "plan {} runs with {} (cuboid plan {}): {}; {:.3f} s per iteration ({}), {:+.1f} "
                     "% against the planned {:.3f} s. --as-planned refuses instead.\n",
                     pf.source, f.target, refused.field(), refused.problem(), f.target, layout, command, differences(planned, best.plan), best.iteration_time_s,
                     best.simulated ? "simulated" : "analytical estimate",
                     planned_s > 0 ? 100 * (best.iteration_time_s / planned_s - 1) : 0.0, planned_s) +
                 result.notes;
  return result;
}

void run_export(const ExportFlags& f) {
  if (f.as_planned && !f.cluster_path.empty())
    throw InputError("command line", "--cluster",
                     "--cluster names the card of a re-plan, which --as-planned never makes; it would be ignored",
                     "drop --cluster, or drop --as-planned to let export re-plan on that card");
  const PlanFile pf = read_plan_file(f.plan_path);
  if (!f.out_path.empty()) check_output_paths(std::vector<OutputPath>{{"--out", f.out_path}});
  ExportResult result;
  try {
    result = export_in_expressible_order(pf, f.target);
  } catch (const InputError& e) {
    // A plan the target cannot express (not an unknown target, not a bad file).
    if (e.source() != pf.source || e.field().rfind("parallel", 0) != 0) throw;
    if (f.as_planned)
      throw with_fix(e, "or plan again with --for " + f.target + ", which searches only what it can run");
    result = replan_for_target(pf, f, e);
  }
  // Notes (what the target needs beyond a comment-less file) go to stderr so
  // that stdout stays the file itself.
  if (!result.notes.empty()) std::cerr << result.notes;
  if (f.out_path.empty()) {
    std::cout << result.text;
    return;
  }
  write_output_file(f.out_path, result.text);
}

}  // namespace

void register_export_command(CLI::App& app) {
  static ExportFlags flags;
  CLI::App* cmd = app.add_subcommand("export", "write a plan file as the configuration of Megatron-LM, "
                                               "Megatron-Bridge, DeepSpeed, torchtitan or NeMo 1.x");
  cmd->add_option("--plan", flags.plan_path, "plan file written by cuboid plan --out (schema cuboid.plan/1)")
      ->required();
  // Not CLI11's check(IsMember): the target is validated by export_plan so
  // that the message (and exit code 2) is the same as every other bad input.
  static const std::string kTargets = [] {
    std::string out;
    for (const ExportTarget& t : export_target_list())
      out += fmt::format("\n  {:<16} {} {}: {}", t.name, t.trainer, t.version, t.what);
    return out;
  }();
  cmd->add_option("--to", flags.target, "the target trainer and version:" + kTargets)->required();
  cmd->add_option("--out", flags.out_path, "write to FILE (atomically) instead of stdout");
  cmd->add_flag("--as-planned", flags.as_planned,
                "refuse a plan the target cannot run as planned, instead of exporting the best plan of the same "
                "TP x PP x DP that it runs (re-planned as `cuboid plan --for TARGET` would, and said so on stderr)");
  cmd->add_option("--cluster", flags.cluster_path,
                  "the cluster card for that re-plan (default: the card the plan file names)");
  cmd->callback([] { run_export(flags); });
}

}  // namespace cuboid::cli
