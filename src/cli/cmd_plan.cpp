// cuboid plan: search, rank, explain.
#include "commands.hpp"
#include "plan_flags.hpp"
#include "plan_words.hpp"

#include <algorithm>
#include <map>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <unistd.h>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/io/svg.hpp"
#include "cuboid/report/explain.hpp"
#include "cuboid/report/html_report.hpp"
#include "cuboid/report/report.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid_config.hpp"

namespace cuboid::cli {

namespace {

std::string header(const Loaded& l, const SearchResult& r, const PlanFlags& f) {
  const ModelSpec& m = l.model;
  const Cluster& c = l.cluster;
  std::string out = fmt::format("model   {}: {:.1f} B parameters, {} layers, hidden {}, {} heads ({} KV), FFN {}, vocab {}\n",
                                m.name, m.parameter_count() / 1e9, m.num_layers, m.hidden_size, m.num_attention_heads,
                                m.num_kv_heads, m.ffn_hidden_size, m.vocab_size);
  out += fmt::format("cluster {}: {} node{} x {} {} = {} GPUs ({} each), {} inside a node, {} x {:.0f} Gb/s {} per node\n",
                     c.name, c.nodes, c.nodes == 1 ? "" : "s", c.gpus_per_node, c.gpu.name, c.total_gpus(),
                     format_bytes_GiB(static_cast<double>(c.gpu.memory_bytes)), c.intra.kind,
                     c.inter.nics_per_node, c.inter.nic_bandwidth_Gbps, c.inter.kind);
  if (c.gpu.speed_spread > 0)
    out += fmt::format("        GPU speed spread sigma {:.2f}%: compute waits for the slowest GPU, x{:.4f} on {} GPUs "
                       "(--gpu-spread 0: off)\n",
                       100 * c.gpu.speed_spread, spread_slowdown(c.gpu.speed_spread, c.total_gpus()), c.total_gpus());
  out += fmt::format("batch   {} sequences x {} tokens = {:.2f} M tokens per iteration{}\n", r.global_batch, r.seq_length,
                     static_cast<double>(r.global_batch * r.seq_length) / 1e6,
                     f.global_batch ? "" : " (default; set --global-batch)");
  return out;
}

// When nothing fits, find out what would: more GPUs, ZeRO, full recompute, a
// shorter sequence. Each is a real search with one thing changed.
std::string what_would_fit(const Loaded& l, const PlannerOptions& o, const PlanFlags& f) {
  std::string out = "\nWhat would make a plan fit (each searched with one change):\n";
  auto report = [&](const std::string& what, const SearchResult& r) {
    if (r.fitting.empty()) {
      out += fmt::format("  {:<44} still does not fit", what);
      if (!r.not_fitting.empty())
        out += fmt::format(" (best needs {} per GPU)", format_bytes_GiB(r.not_fitting.front().memory.total_bytes));
      out += "\n";
      return;
    }
    const Estimate& b = r.fitting.front();
    out += fmt::format("  {:<44} fits: TP {} PP {} DP {} mb {} ZeRO {} recompute {}, {} per GPU, {:.0f} tokens/s\n", what,
                       b.plan.tp, b.plan.pp, b.plan.dp, b.plan.micro_batch, b.plan.zero_stage, to_string(b.plan.recompute),
                       format_bytes_GiB(b.memory.total_bytes), b.tokens_per_s);
  };
  // A change the options refuse (PlanRejected: e.g. a fixed EP the other
  // change leaves no room for) is said, not thrown after the table.
  auto attempt = [&](const std::string& what, const ModelSpec& model, const Topology& topo,
                     const PlannerOptions& opts) -> std::optional<SearchResult> {
    try {
      return search_plans(model, topo, opts);
    } catch (const PlanRejected& e) {
      out += fmt::format("  {:<44} not possible: {}\n", what, worded(e).problem());
      return std::nullopt;
    }
  };
  // More GPUs: double the nodes until something fits (or the card's limit).
  for (int factor = 2; factor <= 1024; factor *= 2) {
    const int nodes = l.cluster.nodes * factor;
    Cluster bigger;
    try {
      bigger = load_cluster(f.cluster_path, nodes, f.gpus_per_node);
    } catch (const InputError& e) {
      out += fmt::format("  {:<44} not possible: {}\n", fmt::format("--nodes {}", nodes), e.problem());
      break;
    }
    Topology t(bigger);
    PlannerOptions opts = o;
    opts.dp.reset();
    opts.global_batch.reset();
    if (o.global_batch) opts.global_batch = *o.global_batch * factor;
    const std::string what = fmt::format("--nodes {} ({}x the GPUs)", nodes, factor);
    const std::optional<SearchResult> r = attempt(what, l.model, t, opts);
    if (!r) break;
    if (!r->fitting.empty() || factor == 1024) {
      report(what, *r);
      break;
    }
  }
  const std::vector<int>& zeros = trainer_of(o).zero_stages;
  if ((!o.zero_stage || *o.zero_stage < 3) && std::find(zeros.begin(), zeros.end(), 3) != zeros.end()) {
    PlannerOptions opts = o;
    opts.zero_stage = 3;
    const std::string what = "--zero 3 (shard weights, grads, optimizer)";
    if (auto r = attempt(what, l.model, *l.topology, opts)) report(what, *r);
  }
  if (!o.recompute || *o.recompute != Recompute::full) {
    PlannerOptions opts = o;
    opts.recompute = Recompute::full;
    if (auto r = attempt("--recompute full", l.model, *l.topology, opts)) report("--recompute full", *r);
  }
  {
    PlannerOptions opts = o;
    const std::int64_t seq = o.seq_length.value_or(l.model.seq_length);
    if (seq >= 256) {
      opts.seq_length = seq / 2;
      if (o.global_batch) opts.global_batch = *o.global_batch * 2;  // same tokens per iteration
      const std::string what = fmt::format("--seq-length {}", seq / 2);
      if (auto r = attempt(what, l.model, *l.topology, opts)) report(what, *r);
    }
  }
  return out;
}

std::string why_best(const Estimate& e) {
  const Breakdown& b = e.breakdown;
  const double t = e.iteration_time_s;
  std::string limit = "compute-bound";
  double worst = b.compute_s;
  auto consider = [&](double v, const char* name) {
    if (v > 0.25 * t && v > 0.5 * worst) {
      limit = name;
      worst = v;
    }
  };
  consider(b.bubble_s, "bubble-bound");
  consider(b.tp_comm_s, "TP-communication-bound");
  consider(b.cp_comm_s, "CP-communication-bound");
  consider(b.ep_comm_s, "EP-communication-bound");
  consider(b.dp_comm_s, "DP-communication-bound");
  consider(b.pp_comm_s, "PP-communication-bound");
  return fmt::format(
      "Best: TP {}{}{} x PP {} x DP {}, micro-batch {}{}, ZeRO {}, recompute {}, SP {}: {:.3f} s per iteration, "
      "MFU {:.1f}%.\n  compute {:.0f}%, bubble {:.0f}%, exposed TP comm {:.0f}%{}{}, PP comm {:.0f}%, DP comm {:.0f}%, "
      "optimizer {:.0f}%; memory {} of {} ({} headroom); {}.\n",
      e.plan.tp,
      e.plan.cp > 1 ? fmt::format(" x CP {} ({})", e.plan.cp, to_string(e.plan.cp_comm)) : std::string(),
      e.plan.etp > 0 ? fmt::format(" (experts: EP {} x ETP {})", e.plan.ep, e.plan.expert_tp()) : std::string(),
      e.plan.pp, e.plan.dp, e.plan.micro_batch,
      e.plan.virtual_stages > 1 ? fmt::format(", {} virtual stages", e.plan.virtual_stages) : std::string(),
      e.plan.zero_stage, to_string(e.plan.recompute), e.plan.sequence_parallel ? "on" : "off", t, 100 * e.mfu,
      100 * b.compute_s / t, 100 * b.bubble_s / t, 100 * b.tp_comm_s / t,
      e.plan.cp > 1 ? fmt::format(", exposed CP comm {:.0f}%", 100 * b.cp_comm_s / t) : std::string(),
      e.plan.ep > 1 ? fmt::format(", EP dispatch + combine ({} dispatcher{}) {:.0f}%", to_string(e.plan.moe_dispatcher),
                                  e.plan.moe_ep_overlap ? ", EP overlap on" : "", 100 * b.ep_comm_s / t)
                    : std::string(),
      100 * b.pp_comm_s / t, 100 * b.dp_comm_s / t,
      100 * b.optimizer_s / t, format_bytes_GiB(e.memory.total_bytes), format_bytes_GiB(e.memory.capacity_bytes),
      format_bytes_GiB(e.memory.headroom_bytes()), limit);
}

// Where the busiest EP rank's load comes from (ep_rank_load).
std::string imbalance_source(const ModelSpec& m, const ParallelPlan& p) {
  if (p.ep <= 1) return "one EP rank holds every expert";
  if (m.moe.router_load_imbalance > 0) return "given: the card's router_load_imbalance or --moe-imbalance";
  const std::int64_t local = m.moe.num_experts / p.ep;
  return fmt::format("1 + the busiest expert's {:.2f} over the mean with {} balancing (Wang et al. 2024, "
                     "arXiv 2408.15664, Table 2) over {} local expert{}; --moe-imbalance to set it",
                     expert_max_violation(m.moe.balancing), to_string(m.moe.balancing), local, local == 1 ? "" : "s");
}

// What the winner's experts cost: the all-to-alls, the router's imbalance
// they are priced at and what a balanced router would save (both by the
// analytical estimate), and the experts' share of the memory.
std::string experts_cost(const ModelSpec& m, const Topology& topo, const Estimate& e) {
  const ParallelPlan& p = e.plan;
  const StageParameters sp = stage_parameters(m, p, e.memory.peak_stage);
  // With torchtitan's pipeline over FSDP, each group's unsharded gradients too (pp_fsdp_no_sync).
  const double grad_bytes = p.grad_element_bytes(), states = p.optimizer_state_bytes();
  const double expert_bytes = sp.expert * bytes_per_parameter(p.zero_stage, p.expert_dp(), grad_bytes, states) +
                              pp_fsdp_no_sync_bytes(p, StageParameters{0, sp.expert});
  const double dense_bytes = sp.dense * bytes_per_parameter(p.zero_stage, p.dp_cp(), grad_bytes, states) +
                             pp_fsdp_no_sync_bytes(p, StageParameters{sp.dense, 0});
  const double load = ep_rank_load(m, p);
  std::string balance;
  if (load > 1.0) {
    ModelSpec balanced = m;
    balanced.moe.router_load_imbalance = 1.0;
    const double at_load = estimate(m, topo, p).iteration_time_s;
    const double saved = at_load - estimate(balanced, topo, p).iteration_time_s;
    balance = fmt::format("; a balanced router would save {:.3f} s per iteration ({:.1f} %, estimated)", saved,
                          at_load > 0 ? 100.0 * saved / at_load : 0.0);
  }
  return fmt::format(
      "  experts: {} of {} per rank (EP {}), {}; dispatch + combine all-to-alls {:.3f} s per iteration on the "
      "critical path; weights + optimizer {} for the experts (sharded over expert-DP {}), {} for the rest (over DP "
      "x CP {}).\n"
      "  routing: the busiest EP rank gets {:.2f} x the mean tokens ({}){}.\n{}",
      m.moe.num_experts / p.ep, m.moe.num_experts, p.ep,
      p.expert_tp() > 1 ? fmt::format("each split over ETP {}", p.expert_tp()) : std::string("each whole (ETP 1)"),
      e.breakdown.ep_comm_s, format_bytes_GiB(expert_bytes), p.expert_dp(), format_bytes_GiB(dense_bytes), p.dp_cp(),
      load, imbalance_source(m, p), balance,
      p.moe_ep_overlap ? "  EP overlap: " + ep_overlap_words(estimate(m, topo, p)) + ".\n" : std::string());
}

// A progress bar on stderr, only on a terminal and only after the first second.
std::function<void(std::size_t, std::size_t)> progress_bar() {
  if (isatty(fileno(stderr)) == 0) return {};
  auto start = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  auto shown = std::make_shared<bool>(false);
  return [start, shown](std::size_t done, std::size_t total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - *start).count();
    if (done >= total) {
      if (*shown) std::fprintf(stderr, "\r%70s\r", "");
      return;
    }
    if (elapsed < 1.0 || total == 0) return;
    *shown = true;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total);
    std::fprintf(stderr, "\rscoring [%s%s] %3d%% %zu/%zu plans", std::string(static_cast<std::size_t>(filled), '=').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(), static_cast<int>(100 * done / total), done,
                 total);
    std::fflush(stderr);
  };
}

// --report plan.html: the page of html_report.hpp, with the winner's
// simulated timeline and the --explain rows.
void write_report(const Loaded& l, const PlannerOptions& o, const SearchResult& r, const PlanFlags& f,
                  const std::string& head, const std::vector<ExplainRow>* explained) {
  const Estimate& best = r.fitting.front();
  sim::SimOptions so;
  so.timeline = true;
  ReportPage page;
  page.title = fmt::format("{} on {} ({} GPUs)", l.model.name, l.cluster.name, l.cluster.total_gpus());
  page.command = "plan";
  page.header = head + "\n" + why_best(best);
  page.generator = std::string("cuboid ") + CUBOID_VERSION;
  page.cluster = l.cluster;
  page.chosen = best;
  page.ranked.assign(r.fitting.begin(), r.fitting.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(f.top, r.fitting.size())));
  page.fitting = r.fitting;
  page.timeline = sim::run_simulation(l.model, *l.topology, best.plan, so).timeline;
  page.explain = explained != nullptr ? *explained : explain_choices(l.model, *l.topology, o, r);
  write_output_file(*f.report_path, html_report(page));
  spdlog::info("wrote {}", *f.report_path);
}

// --out plan.json, --svg pareto.svg and --report plan.html, each written atomically.
// `explained`: the --explain rows when already computed.
void write_outputs(const Loaded& l, const PlannerOptions& o, const SearchResult& r, const PlanFlags& f,
                   const std::string& head, const std::vector<ExplainRow>* explained = nullptr) {
  if (!f.out_path && !f.svg_path && !f.report_path) return;
  if (r.fitting.empty())
    throw InputError("command line", f.out_path ? "--out" : f.svg_path ? "--svg" : "--report",
                     "no plan fits in memory, so nothing was written", "see what would make a plan fit above");
  if (f.out_path) {
    Estimate best = r.fitting.front();
    attach_other_orders(best, r);
    write_output_file(*f.out_path, plan_to_json(l.model, l.cluster, best).dump(2) + "\n");
    spdlog::info("wrote {}", *f.out_path);
  }
  if (f.svg_path) {
    const std::string title = fmt::format("{} on {} ({} GPUs): step time vs memory of {} plans that fit (rank-order ties as one)",
                                          l.model.name, l.cluster.name, l.cluster.total_gpus(), r.fitting.size());
    write_output_file(*f.svg_path, pareto_svg(r.fitting, r.fitting.front(), title));
    spdlog::info("wrote {}", *f.svg_path);
  }
  if (f.report_path) write_report(l, o, r, f, head, explained);
}


// The discrete-event re-rank costs grow with the DP replicas it mirrors: at
// 16,384 GPUs (Llama 3.1 405B on 2048 nodes) it takes ~3 s, at 100,000 GPUs
// minutes per plan. Above this size plan ranks analytically unless
// --simulate-top is given explicitly, so a big cluster never looks like a hang.
constexpr int kMaxAutoSimulatedGpus = 16384;
CLI::Option* g_simulate_top_option = nullptr;

void run_plan(const PlanFlags& f) {
  refuse_flags_without_effect(f, "plan");
  if (f.top <= 0) throw InputError("command line", "--top", "must be positive, got " + std::to_string(f.top), "give a value >= 1");
  if (f.simulate_top < 0)
    throw InputError("command line", "--simulate-top", "must not be negative, got " + std::to_string(f.simulate_top),
                     "give 0 (analytical only) or more");
  if (f.threads < 0)
    throw InputError("command line", "--threads", "must not be negative, got " + std::to_string(f.threads),
                     "give 0 (all cores) or more");
  PlannerOptions o = planner_options(f);
  Loaded l = load(f);
  check_outputs({{"--out", &f.out_path}, {"--svg", &f.svg_path}, {"--report", &f.report_path}});  // before the search
  std::shared_ptr<const TargetRefusals> refused;
  if (f.for_target) refused = restrict_to_target(o, l, *f.for_target);
  const bool simulation_skipped = l.cluster.total_gpus() > kMaxAutoSimulatedGpus &&
                                  (g_simulate_top_option == nullptr || g_simulate_top_option->count() == 0);
  if (simulation_skipped) o.simulate_top = 0;
  if (!f.json) o.progress = progress_bar();
  SearchResult r = search_plans(l.model, *l.topology, o);
  o.progress = {};
  if (r.candidates == 0 && refused) refuse_fixed_flag_for_target(o, *refused);
  for (auto* rows : {&r.fitting, &r.not_fitting})
    for (Estimate& e : *rows) attach_interval(e, l.cluster);
  spdlog::info("scored {} candidates ({} fit in memory), skipped {}", r.candidates, r.fitting_plans, r.skipped);
  const std::map<std::string, std::int64_t> skipped = skip_reasons(r, l.model, l.cluster, o, f.for_target);
  for (const auto& [reason, count] : skipped) spdlog::info("  skipped {} x: {}", count, reason);
  std::string head = header(l, r, f);
  head += fmt::format("search  {} valid plans scored analytically (est), {} fit in memory, the best {} re-ranked by "
                      "discrete-event simulation (sim)\n",
                      r.candidates, r.fitting_plans, r.simulated);
  // Only when not Adam: other searches print as they did.
  if (o.optimizer == OptimizerKind::muon)
    head += "        optimizer Muon (--optimizer muon): ZeRO 0 steps every matrix on every DP rank, ZeRO 1 is its "
            "layer-wise distributed optimizer; ZeRO 2 and 3 are not searched with it\n";
  if (simulation_skipped)
    head += fmt::format("\n        (no simulation above {} GPUs by default: it would take minutes; --simulate-top K forces it)\n",
                        kMaxAutoSimulatedGpus);
  if (f.json) {
    std::cout << search_to_json(l.model, l.cluster, r, skipped, f.top).dump(2) << "\n";
    write_outputs(l, o, r, f, head);
    return;
  }
  std::cout << head << "\n";
  if (r.candidates == 0) {
    std::cout << "No valid plan: no factorisation of the cluster satisfies the constraints.\n";
    for (const auto& [reason, count] : skipped) std::cout << fmt::format("  {} x {}\n", count, reason);
    std::cout << what_would_fit(l, o, f);
    std::cout.flush();
    write_outputs(l, o, r, f, head);
    return;
  }
  if (r.fitting.empty()) {
    const Estimate& b = r.not_fitting.front();
    std::cout << fmt::format("Nothing fits in {} per GPU. Smallest-memory plans:\n",
                             format_bytes_GiB(b.memory.capacity_bytes));
    std::cout << format_plan_table(r.not_fitting, 5);
    std::cout << what_would_fit(l, o, f);
    std::cout.flush();
    write_outputs(l, o, r, f, head);
    return;
  }
  std::cout << fmt::format("Top {} plans (fastest first):\n", std::min<std::size_t>(f.top, r.fitting.size()));
  std::cout << format_plan_table(r.fitting, static_cast<std::size_t>(f.top));
  if (const auto& in = r.fitting.front().interval)
    std::cout << fmt::format("likely(s): where a measured step would likely fall: {}\n",
                             in->known ? in->basis : "unknown, " + in->basis);
  // The best plan of every TP x CP x PP x DP factorisation, so the layouts can be
  // compared with each other and not only the variants of the winner.
  std::vector<Estimate> per_shape;
  for (const auto& e : r.fitting) {
    bool seen = false;
    for (const auto& s : per_shape)
      seen = seen || (s.plan.tp == e.plan.tp && s.plan.cp == e.plan.cp && s.plan.pp == e.plan.pp);
    if (!seen) per_shape.push_back(e);
  }
  std::cout << fmt::format("\nBest plan of each TP x CP x PP x DP layout that fits ({} layouts):\n", per_shape.size());
  std::cout << format_plan_table(per_shape, 30);
  std::cout << "\n" << why_best(r.fitting.front());
  if (l.model.moe.enabled()) std::cout << experts_cost(l.model, *l.topology, r.fitting.front());
  std::vector<ExplainRow> explained;
  if (f.explain) {
    explained = explain_choices(l.model, *l.topology, o, r);
    std::cout << format_explain(explained, r.fitting.front());
  }
  write_outputs(l, o, r, f, head, f.explain ? &explained : nullptr);
}

}  // namespace

void register_plan_command(CLI::App& app) {
  static PlanFlags plan_flags;
  CLI::App* plan = app.add_subcommand("plan", "search TP x PP x DP (and micro-batch, virtual stages, ZeRO, recompute, SP) "
                                              "and rank the plans that fit");
  add_plan_flags(plan, plan_flags, true);
  // Ranges are checked in run_plan, not with CLI11's check(): its message
  // prints the range as 0 to 1.8e308 and names no fix.
  plan->add_option("--top", plan_flags.top, "rows in the ranked table (default 10)");
  plan->add_option("--out", plan_flags.out_path, "write the best plan as a plan file (schema cuboid.plan/1)");
  plan->add_option("--svg", plan_flags.svg_path, "draw step time vs memory of every plan that fits as an SVG picture");
  plan->add_option("--report", plan_flags.report_path,
                   "write a self-contained HTML report: ranked table, time vs memory, the winner's mesh, simulated "
                   "timeline and breakdown, the --explain table");
  g_simulate_top_option = plan->add_option("--simulate-top", plan_flags.simulate_top,
                   "re-rank the best K plans with the discrete-event simulator (default 32; 0: analytical only)");
  plan->add_option("--for", plan_flags.for_target,
                   "search only plans this export target can express: megatron|megatron-bridge|deepspeed|torchtitan|torchtitan-main|nemo (see cuboid export)");
  plan->add_flag("--explain", plan_flags.explain, "for each dimension, the best plan with that dimension forced to each value");
  plan->add_option("--threads", plan_flags.threads, "scoring threads (default: all cores)");
  plan->callback([] { run_plan(plan_flags); });
}

}  // namespace cuboid::cli
