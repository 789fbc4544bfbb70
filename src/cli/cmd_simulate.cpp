// cuboid simulate and cuboid mesh: one plan.
#include "commands.hpp"
#include "plan_flags.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid/io/svg.hpp"
#include "cuboid/core/trace.hpp"
#include "cuboid/report/html_report.hpp"
#include "cuboid/report/report.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid_config.hpp"

namespace cuboid::cli {

namespace {

// --ablate: turn one modelled mechanism off, to see what it contributes
// (tools/fidelity's ablation table). The plan and the card otherwise stay.
constexpr const char* kMechanisms =
    "dp-16bit-grads, zero1-all-reduce, bf16-optimizer-copy, fp16-grad-accum, unfused-attention, gpu-spread, "
    "sustained-gemm, nccl-sms, cuda-graphs, tp-comm-overlap, overlap-param-gather, moe-imbalance, ep-overlap";

void ablate(const std::string& name, ParallelPlan& plan, Cluster& cluster, ModelSpec& model) {
  if (name == "dp-16bit-grads") {
    plan.trainer.dp_grad_bytes = 4;
  } else if (name == "zero1-all-reduce") {
    plan.trainer.zero1_grad_all_reduce = false;
  } else if (name == "bf16-optimizer-copy") {
    // DeepSpeed's fp32 copy (18 B) -> Megatron's main_grad hook (10 B).
    if (plan.trainer.grad_accum_bytes == 18) plan.trainer.grad_accum_bytes = TrainerSettings{}.grad_accum_bytes;
  } else if (name == "fp16-grad-accum") {
    // Autograd's 16-bit .grad accumulation (6 B) -> Megatron's fp32 main_grad hook (10 B).
    if (plan.trainer.grad_accum_bytes == 6) plan.trainer.grad_accum_bytes = TrainerSettings{}.grad_accum_bytes;
  } else if (name == "unfused-attention") {
    cluster.gpu.unfused_attention_efficiency = 0;
  } else if (name == "gpu-spread") {
    cluster.gpu.speed_spread = 0;
  } else if (name == "sustained-gemm") {
    cluster.gpu.gemm_sustained_fraction = 1;
  } else if (name == "nccl-sms") {
    // The SMs NCCL's kernels take from the compute beside them (TP and DP).
    cluster.intra.nccl_channels = 0;
  } else if (name == "cuda-graphs") {
    plan.trainer.cuda_graphs = CudaGraphs{};
  } else if (name == "tp-comm-overlap") {
    plan.trainer.tp_comm_overlap = false;
  } else if (name == "overlap-param-gather") {
    plan.trainer.overlap_param_gather = false;
    plan.trainer.overlap_param_gather_with_optimizer_step = false;
  } else if (name == "moe-imbalance") {
    // The busiest EP rank at the mean load (a balanced router).
    if (model.moe.enabled()) model.moe.router_load_imbalance = 1.0;
  } else if (name == "ep-overlap") {
    plan.moe_ep_overlap = false;
  } else {
    throw InputError("command line", "--ablate", "unknown mechanism \"" + name + "\"",
                     std::string("use one of ") + kMechanisms);
  }
}

void run_simulate(const PlanFlags& f) {
  PlannerOptions o = planner_options(f);
  Loaded l = load(f);
  check_outputs({{"--trace", &f.trace_path}, {"--report", &f.report_path}});  // before the simulation
  ParallelPlan plan = l.plan ? *l.plan : plan_from_options(l.model, l.cluster, o);
  const std::string cl = "command line";
  if (!f.ablate.empty()) {
    for (const std::string& name : f.ablate) ablate(name, plan, l.cluster, l.model);
    l.topology = std::make_unique<Topology>(l.cluster);
  }
  if (f.analytical && f.trace_path) throw InputError(cl, "--analytical", "--trace needs the simulator", "drop --analytical");
  if (f.analytical && f.report_path) throw InputError(cl, "--analytical", "--report needs the simulator", "drop --analytical");
  Estimate e;
  std::string extra;
  nlohmann::json sim_json;
  sim::Timeline timeline;  // for --report
  if (f.analytical) {
    e = estimate(l.model, *l.topology, plan);
  } else {
    sim::SimOptions so;
    if (f.trace_path) so.trace_path = *f.trace_path;
    if (f.trace_ranks) {
      if (!f.trace_path) throw InputError(cl, "--trace-ranks", "needs --trace FILE", "add --trace out.json");
      try {
        so.trace_ranks = parse_rank_list(*f.trace_ranks);
      } catch (const std::exception& ex) {
        throw InputError(cl, "--trace-ranks", ex.what(), "give ranks as a comma-separated list, e.g. 0,8");
      }
      for (int r : so.trace_ranks)
        if (r < 0 || r >= plan.world_size())
          throw InputError(cl, "--trace-ranks", "rank " + std::to_string(r) + " is not in 0.." + std::to_string(plan.world_size() - 1),
                           "give ranks of this plan");
    }
    so.trace_per_rank = f.trace_per_rank;
    so.timeline = f.report_path.has_value();
    if (so.trace_per_rank && !f.trace_path) throw InputError(cl, "--trace-per-rank", "needs --trace FILE", "add --trace out.json");
    sim::SimResult r = sim::run_simulation(l.model, *l.topology, plan, so);
    e = r.estimate;
    timeline = std::move(r.timeline);
    extra += fmt::format("\nsimulation: {} tasks, {} events, {} flows, {:.3f} s of host time; critical GPU rank {}\n", r.tasks,
                         r.events, r.flows, r.wall_s, r.critical_rank);
    if (r.stages.size() > 1 && e.gpu_spread > 0) {
      // Each stage's GPU paces at the slowest of the GPUs it stands for.
      const auto slow = std::max_element(r.stages.begin(), r.stages.end(),
                                         [](const auto& x, const auto& y) { return x.compute_factor < y.compute_factor; });
      const auto fast = std::min_element(r.stages.begin(), r.stages.end(),
                                         [](const auto& x, const auto& y) { return x.compute_factor < y.compute_factor; });
      extra += fmt::format("GPU speed spread per stage: compute x{:.4f} (stage {}) to x{:.4f} (stage {})\n",
                           fast->compute_factor, fast->stage, slow->compute_factor, slow->stage);
    }
    extra += fmt::format("peak link utilisation: NVLink {:.0f}%, PCIe {:.0f}%, InfiniBand {:.0f}%\n",
                         100 * r.peak_nvlink_utilisation, 100 * r.peak_pcie_utilisation, 100 * r.peak_ib_utilisation);
    for (const auto& link : r.busiest_links)
      extra += fmt::format("  {:<28} {:<6} {:5.0f}% peak, {:10.3f} GB moved\n", link.name, link.kind,
                           100 * link.peak_utilisation, link.bytes / 1e9);
    for (const auto& file : r.trace_files) {
      extra += fmt::format("trace written to {}\n", file.string());
      if (const auto bytes = std::filesystem::file_size(file); bytes > kTraceViewerLimitBytes)
        spdlog::warn("trace {} is {} MiB: chrome://tracing cannot open JSON over {} MiB and the Perfetto UI may run out "
                     "of browser memory; trace fewer ranks (--trace-ranks 0), split it (--trace-per-rank) or open it "
                     "through trace_processor --httpd",
                     file.string(), bytes >> 20, kTraceViewerLimitBytes >> 20);
    }
    // No host time here (it is in the text output): the JSON of the same
    // inputs is byte-identical from run to run (tests/test_determinism.cpp).
    sim_json = {{"tasks", r.tasks},
                {"events", r.events},
                {"flows", r.flows},
                {"critical_rank", r.critical_rank},
                {"peak_link_utilisation",
                 {{"nvlink", r.peak_nvlink_utilisation}, {"pcie", r.peak_pcie_utilisation}, {"ib", r.peak_ib_utilisation}}}};
  }
  attach_interval(e, l.cluster);
  if (f.report_path) {
    ReportPage page;
    page.title = fmt::format("{} on {} ({} GPUs)", l.model.name, l.cluster.name, l.cluster.total_gpus());
    page.command = "simulate";
    page.header = format_estimate(l.model, l.cluster, e);
    page.generator = std::string("cuboid ") + CUBOID_VERSION;
    page.cluster = l.cluster;
    page.chosen = e;
    page.timeline = std::move(timeline);
    write_output_file(*f.report_path, html_report(page));
    extra += fmt::format("report written to {}\n", *f.report_path);
  }
  if (f.json) {
    nlohmann::json j = estimate_to_json(e);
    j["model"] = l.model.name;
    j["cluster"] = l.cluster.name;
    if (!sim_json.is_null()) j["simulation"] = sim_json;
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << format_estimate(l.model, l.cluster, e) << extra;
}

void run_mesh(const PlanFlags& f) {
  refuse_flags_without_effect(f, "mesh");
  PlannerOptions o = planner_options(f);
  Loaded l = load(f);
  check_outputs({{"--svg", &f.svg_path}});
  ParallelPlan plan = l.plan ? *l.plan : plan_from_options(l.model, l.cluster, o);
  if (f.svg_path) {
    const std::string title = fmt::format("{} on {}: TP {} x PP {} x DP {}, rank order {}", l.model.name, l.cluster.name,
                                          plan.tp, plan.pp, plan.dp, plan.order.str());
    write_output_file(*f.svg_path, mesh_svg(plan, l.cluster, title));
  }
  std::cout << format_mesh(plan, l.cluster);
}

}  // namespace

void register_simulate_commands(CLI::App& app) {
  static PlanFlags sim_flags, mesh_flags;
  CLI::App* sim = app.add_subcommand("simulate", "simulate one iteration of one plan (discrete-event) with a per-component breakdown "
                                                  "(unset dimensions: TP 1, PP 1, DP = the rest, mb 1, selective recompute)");
  add_plan_flags(sim, sim_flags, false, true);
  sim->add_flag("--analytical", sim_flags.analytical, "the closed-form estimate instead of the discrete-event simulation");
  sim->add_option("--ablate", sim_flags.ablate,
                  std::string("turn a modelled mechanism off, to see what it contributes (repeatable): ") + kMechanisms);
  sim->add_option("--trace", sim_flags.trace_path, "write a Chrome/Perfetto trace of the iteration to FILE");
  sim->add_option("--trace-ranks", sim_flags.trace_ranks, "ranks to trace, e.g. 0,8 (default: one GPU per stage)");
  sim->add_flag("--trace-per-rank", sim_flags.trace_per_rank, "one trace file per rank (FILE.rankN.json)");
  sim->add_option("--report", sim_flags.report_path,
                  "write a self-contained HTML report: the plan's mesh, simulated timeline and breakdown");
  sim->callback([] { run_simulate(sim_flags); });

  CLI::App* mesh = app.add_subcommand("mesh", "show which GPU (node, gpu) holds which TP group, pipeline stage and DP replica");
  add_plan_flags(mesh, mesh_flags, false, true);
  mesh->add_option("--svg", mesh_flags.svg_path, "also draw the mesh as an SVG picture to this file");
  mesh->callback([] { run_mesh(mesh_flags); });
}

}  // namespace cuboid::cli
