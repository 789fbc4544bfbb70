// cuboid validate: the measurements' checks, the simulation with the
// executor's semantics and the comparison (formatting: validate_report.cpp).
#include "cuboid/report/validate.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "cuboid/core/calibration.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/operand_pool.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

const std::vector<NamedReason>& executor_only_ops() {
  static const std::vector<NamedReason> ops = {
      {op::dqkv_zero, "clears the QKV gradient buffer before the attention backward accumulates into it"},
      {op::cp_kv_pack, "copies K and V out of the QKV output into one buffer for the CP ring (Transformer Engine "
                       "sends them as they lie)"},
      {op::tp_ar_norm_grads, "all-reduces the norms' weight gradients over TP under sequence parallelism (Megatron's "
                             "finalize_model_grads; a few vectors of h per layer, not priced)"},
      {op::param_copy, "writes the updated master weights back (counted as optimizer; the simulator prices Megatron's "
                     "fp32 -> bf16 copy, which an f32 run without ZeRO skips: its master weights are the weights)"},
  };
  return ops;
}

const std::vector<NamedReason>& simulator_only_ops() {
  static const std::vector<NamedReason> ops = {
      {op::embed_dropout, "the executor applies no dropout after the embedding"},
      {op::embed_dropout_bwd, "the executor applies no dropout after the embedding"},
      {op::xent_bwd, "the executor's cross-entropy writes the logits' gradient in its forward kernel (xent)"},
      {op::attn_ctx_copy, "the executor's per-head GEMMs write the context in [tokens, heads x head_dim] order (no permute copy)"},
      {op::attn_qkv_grad_cat, "the executor's per-head GEMMs write the Q, K, V gradients into one buffer (no concatenation)"},
      {op::qkv_bias, "the executor runs no linear biases"},
      {op::qkv_bias_grad, "the executor runs no linear biases"},
      {op::grad_norm, "the executor clips no gradients (Megatron reads them once for the global norm)"},
      {op::qkv_grad_accum, "the executor's wgrad GEMMs accumulate into the gradient buffer (beta = 1); Megatron 2022 adds "
                         "each bf16 weight gradient into its fp32 main_grad in a DDP hook"},
      {op::proj_grad_accum, "the executor's wgrad GEMMs accumulate into the gradient buffer (see qkv_grad_accum)"},
      {op::fc1_grad_accum, "the executor's wgrad GEMMs accumulate into the gradient buffer (see qkv_grad_accum)"},
      {op::fc2_grad_accum, "the executor's wgrad GEMMs accumulate into the gradient buffer (see qkv_grad_accum)"},
      {op::logits_grad_accum, "the executor's wgrad GEMMs accumulate into the gradient buffer (see qkv_grad_accum)"},
      {op::attn_qk_scale_bwd, "the executor applies 1 / sqrt(head_dim) inside its softmax, not as torch.baddbmm's alpha"},
      {op::attn_alibi_bias, "the executor encodes no positions (no rotary embedding, no ALiBi bias)"},
      {op::router_aux_scores, "the executor's router trains without a balancing loss or expert bias"},
      {op::router_aux_loss, "the executor's router trains without a balancing loss or expert bias"},
      {op::tp_ar_aux_counts, "the executor's router trains without a balancing loss or expert bias"},
      {op::router_aux_loss_bwd, "the executor's router trains without a balancing loss or expert bias"},
      {op::router_bias_counts, "the executor's router trains without a balancing loss or expert bias"},
      {op::moe_host_sync, "the executor routes on the host (router_topk downloads the logits), so its token counts "
                          "need no further wait"},
  };
  return ops;
}

namespace {

bool listed(const std::vector<NamedReason>& list, const std::string& name) {
  return std::any_of(list.begin(), list.end(), [&](const NamedReason& r) { return name == r.name; });
}

// The plan as the executor runs it (exec/step.cpp): every op of a rank in
// order, the DP reduction after the last backward, a CP ring step's K/V
// exchanged before its block, and fp32 gradients, master weights and
// moments whatever the plan's trainer keeps, stepped by Adam whatever the
// plan's optimizer.
ParallelPlan as_executor_runs(const ParallelPlan& plan) {
  ParallelPlan p = plan;
  p.trainer.dp_overlap = false;
  p.trainer.cp_overlap = false;
  p.trainer.dp_grad_bytes = 4;
  if (p.trainer.fsdp_grad_bytes > 0) p.trainer.fsdp_grad_bytes = 4;
  p.precision_aware_optimizer = false;
  p.adam_moment_bytes = 4;
  p.optimizer = OptimizerKind::adam;
  return p;
}

// The executor's optimizer-step kernels, which the simulator prices as the
// optimizer step (optimizer_step.hpp).
bool is_optimizer_op(const std::string& name) {
  return name == op::grad_scale || name == op::adam || name == op::param_copy || name == op::grad_zero;
}

const std::string kRerun = "validate the measurements of a run of this very plan file "
                           "(cuboid run --plan PLAN --out measurements.json)";

// The workload ops the simulator plays on a stage, by name (first occurrence).
std::map<std::string, Op> stage_workload(const ModelSpec& model, const ParallelPlan& plan, int stage) {
  std::map<std::string, Op> out;
  auto add = [&](const LayerOps& l) {
    for (const auto* list : {&l.forward, &l.backward, &l.recompute})
      for (const Op& op : *list) out.emplace(op.name, op);
  };
  if (layers_on_stage(plan, model.num_layers, stage) > 0) add(transformer_layer_ops(model, plan));
  if (stage == 0) add(embedding_ops(model, plan));
  if (stage == plan.pp - 1) add(lm_head_ops(model, plan));
  return out;
}

// Op names the simulator prices on a stage, in the executor's naming for the
// pipeline, DP and optimizer tasks (which the workload does not list).
std::set<std::string> priced_ops(const ModelSpec& model, const ParallelPlan& plan, int stage) {
  std::set<std::string> names;
  for (const auto& [name, op] : stage_workload(model, plan, stage)) names.insert(name);
  // Pipeline exchanges: which batches a stage times depends on its schedule
  // (check_ops accepts op::pipeline_exchanges when PP > 1).
  if (plan.dp_cp() > 1) {  // the gradient group is DP x CP
    if (plan.zero_stage == 0)
      names.insert(op::dp_ar_grads);
    else
      names.insert({op::dp_rs_grads, op::dp_ag_params});
  }
  // The optimizer step's kernels the executor always runs too
  // (optimizer_step.hpp; not grad_norm, a simulator-only op, nor param_copy,
  // which an f32 run without ZeRO skips).
  names.insert({op::grad_scale, op::adam, op::grad_zero});
  return names;
}

template <class T>
void same(const Measurements& m, const PlanFile& pf, const std::string& field, const T& measured, const T& planned,
          const std::string& what) {
  if (measured == planned) return;
  throw InputError(m.source, field,
                   fmt::format("the run had {} {} but plan file {} has {}: these measurements are from another plan",
                               what, measured, pf.source, planned),
                   kRerun);
}

void check_plan(const PlanFile& pf, const Measurements& m) {
  const ParallelPlan& p = pf.plan;
  const MeasuredPlan& q = m.plan;
  same(m, pf, "plan.tp", q.tp, p.tp, "TP");
  same(m, pf, "plan.pp", q.pp, p.pp, "PP");
  same(m, pf, "plan.dp", q.dp, p.dp, "DP");
  same(m, pf, "plan.cp", q.cp, p.cp, "CP");
  same(m, pf, "plan.world_size", q.world_size, p.world_size(), "world size");
  same(m, pf, "plan.micro_batch", q.micro_batch, p.micro_batch, "micro-batch");
  same(m, pf, "plan.global_batch", q.global_batch, p.global_batch, "global batch");
  same(m, pf, "plan.schedule", std::string(to_string(q.schedule)), std::string(to_string(p.schedule)), "schedule");
  same(m, pf, "plan.virtual_stages", q.virtual_stages, p.virtual_stages, "virtual stages");
  same(m, pf, "plan.zero_stage", q.zero_stage, p.zero_stage, "ZeRO stage");
  same(m, pf, "plan.recompute", std::string(to_string(q.recompute)), std::string(to_string(p.recompute)), "recompute");
  same(m, pf, "plan.sequence_parallel", q.sequence_parallel, p.sequence_parallel, "sequence parallel");
  same(m, pf, "plan.rank_order", q.rank_order, p.order.str(), "rank order");
  const std::string scaled = "the run was scaled down (cuboid run --layers / --seq-length) or is from another model; " + kRerun +
                             " without --layers / --seq-length, or make a plan for the smaller model";
  auto model_same = [&](const std::string& field, std::int64_t measured, std::int64_t planned, const char* what) {
    if (measured != planned)
      throw InputError(m.source, field,
                       fmt::format("the run had {} {} but plan file {} has {}", what, measured, pf.source, planned), scaled);
  };
  model_same("plan.seq_length", q.seq_length, p.seq_length, "sequence length");
  if (m.model.name != pf.model.name)
    throw InputError(m.source, "model.name",
                     fmt::format("the run was of model \"{}\" but plan file {} is for \"{}\"", m.model.name, pf.source,
                                 pf.model.name),
                     kRerun);
  model_same("model.num_layers", m.model.num_layers, pf.model.num_layers, "layers");
  model_same("model.hidden_size", m.model.hidden_size, pf.model.hidden_size, "hidden size");
  model_same("model.num_attention_heads", m.model.num_attention_heads, pf.model.num_attention_heads, "attention heads");
  model_same("model.ffn_hidden_size", m.model.ffn_hidden_size, pf.model.ffn_hidden_size, "FFN size");
  model_same("model.vocab_size", m.model.vocab_size, pf.model.vocab_size, "vocabulary");
  // The executor maps ranks with the planner's code; a different mapping
  // means another rank order or GPUs per node.
  const RankMapping map(p, pf.gpus_per_node);
  for (const MeasuredRank& r : m.ranks) {
    const RankCoord c = map.coord(r.rank);
    if (c.tp != r.coord.tp || c.pp != r.coord.pp || c.dp != r.coord.dp || c.cp != r.coord.cp)
    {
      auto cp_of = [&](int v) { return p.cp > 1 ? fmt::format(", cp {}", v) : std::string(); };
      throw InputError(m.source, fmt::format("ranks[{}].coord", r.rank),
                       fmt::format("rank {} ran as (tp {}, pp {}, dp {}{}) but plan file {} maps it to (tp {}, pp {}, dp {}{})",
                                   r.rank, r.coord.tp, r.coord.pp, r.coord.dp, cp_of(r.coord.cp), pf.source, c.tp, c.pp,
                                   c.dp, cp_of(c.cp)),
                       kRerun);
    }
  }
}

void check_cluster(const PlanFile& pf, const Cluster& cluster, const Measurements& m) {
  const std::string card = cluster.source_file.empty() ? cluster.name : cluster.source_file;
  const std::string have = card_backend(cluster);
  if (m.backend != have) {
    const std::string why = cluster.calibration ? "was calibrated on the " + have + " backend"
                                                : "describes " + std::string(have == "cpu" ? "CPU ranks" : "GPUs");
    throw InputError(m.source, "environment.backend",
                     fmt::format("the run used the {} backend but cluster card {} {}", m.backend, card, why),
                     fmt::format("validate against a card of the machines the run used (for the {} backend: "
                                 "cuboid calibrate --backend {} writes one), or rerun with --backend {}",
                                 m.backend, m.backend, have));
  }
  if (m.cluster_name && *m.cluster_name != pf.cluster_name)
    throw InputError(m.source, "cluster.name",
                     fmt::format("the run's plan was made for cluster \"{}\" but plan file {} is for \"{}\"",
                                 *m.cluster_name, pf.source, pf.cluster_name),
                     kRerun);
  // Ranks fill hosts in order, so the run spans ceil(world / GPUs per host)
  // hosts (a host is a node unless the card says a node has several).
  const int per_host = pf.host_gpus();
  const auto hosts = static_cast<std::size_t>((pf.plan.world_size() + per_host - 1) / per_host);
  if (!m.hostnames.empty() && m.hostnames.size() != hosts)
    throw InputError(m.source, "environment.hostnames",
                     fmt::format("the run spanned {} host(s) but plan file {} places its {} ranks on {} {}(s) of "
                                 "{} GPUs: the run was on another cluster",
                                 m.hostnames.size(), pf.source, pf.plan.world_size(), hosts,
                                 pf.gpus_per_host > 0 ? "host" : "node", per_host),
                     "run with as many ranks per node as the cluster card has GPUs per node, or plan for the "
                     "cluster the run used");
  check_plan_matches_cluster(pf, cluster);
}

void check_ops(const PlanFile& pf, const Measurements& m) {
  for (const MeasuredRank& r : m.ranks) {
    const int stage = r.coord.pp;
    const std::set<std::string> priced = priced_ops(pf.model, pf.plan, stage);
    for (const std::string& name : priced) {
      if (r.find(name) == nullptr && !listed(simulator_only_ops(), name))
        throw InputError(m.source, fmt::format("ranks[{}].ops", r.rank),
                         fmt::format("op \"{}\", which the simulator prices on pipeline stage {}, was not timed on "
                                     "rank {}: the run did other work than the plan describes",
                                     name, stage, r.rank),
                         name.rfind(op::attn_flash, 0) == 0
                             ? "the run had the unfused attention core and the plan the fused one: run this plan "
                               "file (the executor runs the core the plan names)"
                             : kRerun);
    }
    bool exchanged = false;
    for (const MeasuredOp& op : r.ops) {
      const bool pipeline = op::is_pipeline_exchange(op.name);
      exchanged = exchanged || pipeline;
      if (pipeline && pf.plan.pp > 1) continue;
      if (priced.count(op.name) == 0 && !listed(executor_only_ops(), op.name))
        throw InputError(m.source, fmt::format("ranks[{}].ops", r.rank),
                         fmt::format("op \"{}\" timed on rank {} is not an op the simulator prices on pipeline stage {}",
                                     op.name, r.rank, stage),
                         op.name.rfind(op::attn_qk, 0) == 0 && pf.plan.flash_attention
                             ? "the run had the unfused attention core and the plan the fused one: run this plan "
                               "file (the executor runs the core the plan names)"
                             : kRerun);
    }
    if (pf.plan.pp > 1 && !exchanged)
      throw InputError(m.source, fmt::format("ranks[{}].ops", r.rank),
                       fmt::format("rank {} timed no pipeline exchange although the plan has PP {}: the run did "
                                   "other work than the plan describes",
                                   r.rank, pf.plan.pp),
                       kRerun);
  }
}

}  // namespace

std::string card_backend(const Cluster& cluster) {
  if (cluster.calibration) return cluster.calibration->backend;
  return cluster.gpu.name == "cpu" ? "cpu" : "cuda";
}

void check_measurements(const PlanFile& pf, const Cluster& cluster, const Measurements& m) {
  check_cluster(pf, cluster, m);
  check_plan(pf, m);
  check_ops(pf, m);
}

namespace {

// The measured components of one rank (see validate.hpp).
struct Measured {
  double compute = 0, tp = 0, pp = 0, dp = 0, ep = 0, cp = 0, optimizer = 0, not_simulated = 0, ops_sum = 0, iteration = 0;
};

Measured measured_components(const MeasuredRank& r, Statistic stat) {
  Measured c;
  for (const MeasuredOp& op : r.ops) {
    const double t = pick(op.time_per_step, stat);
    c.ops_sum += t;
    if (is_optimizer_op(op.name))
      c.optimizer += t;
    else if (op.kind == OpKind::collective || op.kind == OpKind::p2p)
      (op.group == Group::tp   ? c.tp
       : op.group == Group::dp ? c.dp
       : op.group == Group::ep ? c.ep
       : op.group == Group::cp ? c.cp
                               : c.pp) += t;
    else if (listed(executor_only_ops(), op.name))
      c.not_simulated += t;
    else
      c.compute += t;
  }
  c.iteration = pick(r.iteration, stat);
  return c;
}

const MeasuredRank& slowest_of_stage(const Measurements& m, int stage, Statistic stat) {
  const MeasuredRank* best = nullptr;
  for (const MeasuredRank& r : m.ranks)
    if (r.coord.pp == stage && (best == nullptr || pick(r.iteration, stat) > pick(best->iteration, stat))) best = &r;
  return *best;  // every stage has ranks: check_plan compared the mapping
}

double ns_to_s(std::int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// Per-op prediction on a stage's simulated GPU: the cost model's time per
// call times the calls the run made. TP collectives are priced uncontended
// over the stage's TP group; PP and DP tasks are left to the component table.
std::vector<OpRow> op_rows(const PlanFile& pf, const Topology& topo, const Measurements& m, int stage,
                           Statistic stat) {
  const MeasuredRank& r = slowest_of_stage(m, stage, stat);
  const std::map<std::string, Op> work = stage_workload(pf.model, pf.plan, stage);
  const GpuProfile& gpu = topo.cluster().gpu;
  const RankMapping map(pf.plan, pf.gpus_per_node);
  std::vector<OpRow> rows;
  for (const MeasuredOp& op : r.ops) {
    OpRow row;
    row.stage = stage;
    row.name = op.name;
    row.kind = std::string(to_string(op.kind));
    row.calls_per_step = op.calls_per_step;
    row.measured_s = pick(op.time_per_step, stat);
    const auto calls = static_cast<double>(op.calls_per_step);
    if (const auto it = work.find(op.name); it != work.end()) {
      const Op& w = it->second;
      if (w.kind == OpKind::collective && w.group == Group::tp) {
        const std::vector<int> ranks = map.tp_group(stage, r.coord.dp);
        row.predicted_s = calls * ns_to_s(collective_time_ns(w.collective, comm_size_bytes(w, topo.cluster().calibration.get()), pf.plan.tp,
                                                             group_link_params(topo, w.collective, ranks)));
      } else if (w.kind == OpKind::collective && w.group == Group::ep) {
        // The EP group this rank dispatches over.
        std::vector<int> ranks;
        for (const std::vector<int>& g : map.ep_groups())
          if (std::find(g.begin(), g.end(), r.rank) != g.end()) ranks = g;
        row.predicted_s =
            calls * ns_to_s(collective_time_ns(w.collective, comm_size_bytes(w, topo.cluster().calibration.get()),
                                               pf.plan.ep, group_link_params(topo, w.collective, ranks)));
      } else if (w.group == Group::cp) {
        // One hop of the ring: this rank and its successor in the CP group.
        const std::vector<int> g = map.cp_group(r.coord.tp, stage, r.coord.dp);
        const std::vector<int> hop{g[static_cast<std::size_t>(r.coord.cp)],
                                   g[static_cast<std::size_t>((r.coord.cp + 1) % pf.plan.cp)]};
        row.predicted_s =
            calls * ns_to_s(collective_time_ns(w.collective, comm_size_bytes(w, topo.cluster().calibration.get()),
                                               pf.plan.cp, group_link_params(topo, w.collective, hop)));
      } else {
        row.predicted_s = calls * ns_to_s(op_time_ns(gpu, w));
      }
    } else if (is_optimizer_op(op.name)) {
      // As the simulator: the step's kernel of that name over the stage's
      // parameters (ZeRO: the DP shard), once per step.
      const int zero = pf.plan.dp_cp() > 1 ? pf.plan.zero_stage : 0;
      for (const Op& k :
           optimizer_step_ops(parameters_on_stage(pf.model, pf.plan, stage), pf.plan.dp_cp(), zero,
                              optimizer_precision(as_executor_runs(pf.plan))))
        if (k.name == op.name) row.predicted_s = ns_to_s(kernel_time_ns(gpu, k.name, k.bytes));
    } else {
      continue;  // PP / DP tasks and executor-only ops: no per-op prediction
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

ValidationReport validate_measurements(const PlanFile& pf, const Cluster& cluster, const Measurements& m,
                                       double tolerance, Statistic stat) {
  check_measurements(pf, cluster, m);
  const Topology card(cluster);
  const Topology& topo = topology_for_plan(card, pf.model, pf.plan);
  sim::SimOptions so;
  so.tp_backward_overlap = false;  // the executor runs every op of a rank in order
  const ParallelPlan as_run = as_executor_runs(pf.plan);
  sim::SimResult sim;
  try {
    sim = sim::run_simulation(pf.model, topo, as_run, so);
  } catch (const std::invalid_argument& e) {
    throw InputError(pf.source, "parallel", e.what(), "choose a plan the simulator can play");
  }
  ValidationReport rep;
  rep.plan_source = pf.source;
  rep.measurements_source = m.source;
  rep.cluster_name = cluster.source_file.empty() ? cluster.name : cluster.source_file;
  if (cluster.calibration) rep.ranks_per_core = cluster.calibration->ranks_per_core;
  if (card.has_operand_pool_views()) {
    rep.card_pools_bytes.push_back(cluster.calibration->gemm_operand_pool_bytes);
    for (const OperandPoolTables& t : cluster.calibration->other_pools)
      rep.card_pools_bytes.push_back(t.gemm_operand_pool_bytes);
    std::sort(rep.card_pools_bytes.begin(), rep.card_pools_bytes.end(), std::greater<>());
    rep.priced_pool_bytes = topo.cluster().calibration->gemm_operand_pool_bytes;
  }
  rep.backend = m.backend;
  rep.tolerance = tolerance;
  rep.statistic = stat;
  rep.critical_rank = sim.critical_rank;
  rep.context_parallel = pf.plan.cp > 1;
  for (const MeasuredRank& r : m.ranks)
    if (r.page_faults_per_step && *r.page_faults_per_step > rep.page_faults_per_step) {
      rep.page_faults_per_step = *r.page_faults_per_step;
      rep.page_fault_rank = r.rank;
    }
  const MeasuredRank& slow = m.slowest_rank(stat);
  rep.measured_rank = slow.rank;
  const Measured mc = measured_components(slow, stat);
  const Breakdown& b = sim.estimate.breakdown;
  rep.predicted_iteration_s = sim.estimate.iteration_time_s;
  rep.interval = prediction_interval(rep.predicted_iteration_s, cluster.gpu.name, pf.plan.world_size(),
                                     pf.plan.trainer.preset);
  rep.measured_iteration_s = pick(slow.iteration, stat);
  rep.components = {
      {"compute", b.compute_s, mc.compute},
      {"tp_comm", b.tp_comm_s, mc.tp},
      {"pp_comm+bubble", b.pp_comm_s + b.bubble_s, mc.pp},
      {"dp_comm", b.dp_comm_s, mc.dp},
      {"optimizer", b.optimizer_s, mc.optimizer},
      {"not simulated", 0.0, mc.not_simulated},
      {"untimed", 0.0, mc.iteration - mc.ops_sum},
      {"iteration", rep.predicted_iteration_s, rep.measured_iteration_s},
  };
  // An MoE plan's all-to-alls (the simulator's EP dispatch and combine on the critical path).
  if (pf.model.moe.enabled() && pf.plan.ep > 1)
    rep.components.insert(rep.components.begin() + 4, ComponentRow{"ep_comm", b.ep_comm_s, mc.ep});
  // A CP plan's ring sends (the simulator's exposed part of them; the executor overlaps none).
  if (pf.plan.cp > 1) rep.components.insert(rep.components.begin() + 2, ComponentRow{"cp_comm", b.cp_comm_s, mc.cp});
  // Below a microsecond a relative error says nothing.
  for (ComponentRow& row : rep.components) row.predicted_only = row.measured_s < 1e-6;
  for (const sim::StageStats& st : sim.stages) {
    const MeasuredRank& r = slowest_of_stage(m, st.stage, stat);
    const Measured c = measured_components(r, stat);
    StageRow row;
    row.stage = st.stage;
    row.measured_rank = r.rank;
    row.rows = {
        {"compute+optimizer", st.compute_busy_s, c.compute + c.optimizer},
        {"tp_comm", st.tp_busy_s, c.tp},
        {"pp_comm (+wait)", st.pp_busy_s, c.pp},
        {"dp_comm", st.dp_busy_s, c.dp},
        {"stage time", st.end_s, c.iteration},
    };
    for (ComponentRow& x : row.rows) x.predicted_only = x.measured_s < 1e-6;
    rep.stages.push_back(std::move(row));
    for (OpRow& o : op_rows(pf, topo, m, st.stage, stat)) rep.ops.push_back(std::move(o));
  }
  return rep;
}

std::string host_mismatch_warning(const Cluster& cluster, const Measurements& m) {
  if (!cluster.calibration || !cluster.calibration->host || !m.host) return "";
  const std::string diff = host_differences(*cluster.calibration->host, *m.host);
  if (diff.empty()) return "";
  return fmt::format("cuboid: warning: the card was calibrated on another host than {} ran on (card vs run: {}); "
                     "host drift counts in the errors below",
                     m.source, diff);
}

}  // namespace cuboid
