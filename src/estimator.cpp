// The analytical estimator: one training iteration of a plan in closed form.
//
// Model (all times of the critical pipeline stage, the one with the largest
// forward + backward time per micro-batch):
// * t_f, t_b per micro-batch = compute ops (op_time_ns) + TP collectives
//   (collective_time_ns over the stage's TP group). Megatron does not overlap
//   TP communication with compute in these kernels, so it is added, and
//   reported apart as tp_comm. Recomputation is part of t_b.
// * compute + tp_comm = m * (t_f + t_b); bubble = (p - 1) * (t_f + t_b) / v
//   (v = virtual stages for interleaved 1F1B, else 1; GPipe and 1F1B share
//   the same bubble and differ only in memory).
// * pp_comm: Megatron's p2p is blocking, so every send sits on the critical
//   path: one forward and one backward message per micro-batch per model
//   chunk, 2 * m * v, plus the 2 * (p - 1) hops of the pipeline fill and
//   drain. Each costs a send_recv of pipeline_message_bytes over the slowest
//   link between consecutive stages, plus the TP all-gather that rebuilds the
//   activation when the scatter-gather optimisation is used without SP.
// * dp_comm: fp32 gradients (Megatron accumulates and reduces in fp32 with
//   bf16 training) of the critical stage over its DP group:
//     ZeRO 0: all-reduce once per iteration;
//     ZeRO 1 (distributed optimizer): reduce-scatter of grads, then an
//       all-gather of the bf16 parameters after the step;
//     ZeRO 2: grads are sharded, so each micro-batch reduce-scatters its own,
//       plus the bf16 parameter all-gather after the step;
//     ZeRO 3: as ZeRO 2, and each micro-batch all-gathers the bf16 parameters
//       before its forward and again before its backward.
//   Overlap (Megatron's --overlap-grad-reduce; the plan has no flag for it,
//   so it is assumed on): a grad reduction hides behind the backward it
//   follows (the last micro-batch's for once-per-iteration reductions), a
//   ZeRO-3 gather behind the pass it feeds; only the excess is exposed. The
//   parameter all-gather after the optimizer step is exposed
//   (--overlap-param-gather is off by default).
// * optimizer: Adam over this GPU's shard (params / dp with ZeRO >= 1),
//   memory-bound at 32 bytes per parameter: read bf16 weight, fp32 grad,
//   fp32 master, m, v (2+4+4+4+4) and write bf16 weight, master, m, v (2+4+4+4).
#include "cuboid/estimator.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "cuboid/cost.hpp"
#include "cuboid/flops.hpp"
#include "cuboid/workload.hpp"

namespace cuboid {

namespace {

constexpr double kGradBytesPerParam = 4.0;   // fp32 main_grad
constexpr double kParamBytesPerParam = 2.0;  // bf16 weights
constexpr double kAdamBytesPerParam = (2 + 4 + 4 + 4 + 4) + (2 + 4 + 4 + 4);
constexpr std::size_t kCollectives = 5;

// Link parameters of one group, one entry per Collective.
using GroupLinks = std::array<LinkParams, kCollectives>;

GroupLinks group_links(const Topology& topo, const std::vector<int>& ranks) {
  GroupLinks links{};
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                       Collective::broadcast, Collective::send_recv}) {
    links[static_cast<std::size_t>(c)] = group_link_params(topo, c, ranks);
  }
  return links;
}

double comm_ns(Collective c, double bytes, int size, const GroupLinks& links) {
  return static_cast<double>(collective_time_ns(c, bytes, size, links[static_cast<std::size_t>(c)]));
}

// Compute time of a list of ops, and the ops' TP communication time.
double compute_ns(const GpuProfile& gpu, const std::vector<Op>& ops) {
  double total = 0;
  for (const Op& op : ops) total += static_cast<double>(op_time_ns(gpu, op));
  return total;
}

double tp_comm_ns(const std::vector<Op>& ops, int tp, const GroupLinks& links) {
  double total = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::collective && op.group == Group::tp) total += comm_ns(op.collective, op.comm_bytes, tp, links);
  }
  return total;
}

struct PassTimes {
  double fwd_compute = 0, bwd_compute = 0, fwd_tp = 0, bwd_tp = 0;
  double fwd() const { return fwd_compute + fwd_tp; }
  double bwd() const { return bwd_compute + bwd_tp; }
  double total() const { return fwd() + bwd(); }
};

void add_scaled(PassTimes& into, const PassTimes& x, double scale) {
  into.fwd_compute += scale * x.fwd_compute;
  into.bwd_compute += scale * x.bwd_compute;
  into.fwd_tp += scale * x.fwd_tp;
  into.bwd_tp += scale * x.bwd_tp;
}

PassTimes compute_times(const GpuProfile& gpu, const LayerOps& ops) {
  PassTimes t;
  t.fwd_compute = compute_ns(gpu, ops.forward);
  t.bwd_compute = compute_ns(gpu, ops.backward) + compute_ns(gpu, ops.recompute);
  return t;
}

void add_tp_times(PassTimes& into, const LayerOps& ops, double scale, int tp, const GroupLinks& links) {
  if (tp <= 1) return;
  into.fwd_tp += scale * tp_comm_ns(ops.forward, tp, links);
  into.bwd_tp += scale * (tp_comm_ns(ops.backward, tp, links) + tp_comm_ns(ops.recompute, tp, links));
}

}  // namespace

Estimate estimate(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan) {
  const Cluster& cluster = topo.cluster();
  const GpuProfile& gpu = cluster.gpu;
  const RankMapping mapping(plan, cluster.gpus_per_node);
  const int tp = plan.tp;
  const int pp = std::max(1, plan.pp);
  const int dp = std::max(1, plan.dp);
  const double v = plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
  const double micro_batches = static_cast<double>(plan.num_micro_batches());

  const LayerOps layer = transformer_layer_ops(m, plan);
  const LayerOps embed = embedding_ops(m, plan);
  const LayerOps head = lm_head_ops(m, plan);
  const double layers_per_stage = static_cast<double>(m.num_layers) / pp;

  // Compute time does not depend on the stage; TP comm depends on where the
  // stage's TP group sits.
  const PassTimes layer_compute = compute_times(gpu, layer);
  const PassTimes embed_compute = compute_times(gpu, embed);
  const PassTimes head_compute = compute_times(gpu, head);
  int critical = 0;
  PassTimes crit{};
  std::vector<GroupLinks> tp_links(static_cast<std::size_t>(pp));
  for (int stage = 0; stage < pp; ++stage) {
    GroupLinks& links = tp_links[static_cast<std::size_t>(stage)];
    if (tp > 1) links = group_links(topo, mapping.tp_group(stage, 0));
    PassTimes st;
    add_scaled(st, layer_compute, layers_per_stage);
    add_tp_times(st, layer, layers_per_stage, tp, links);
    if (stage == 0) {
      add_scaled(st, embed_compute, 1.0);
      add_tp_times(st, embed, 1.0, tp, links);
    }
    if (stage == pp - 1) {
      add_scaled(st, head_compute, 1.0);
      add_tp_times(st, head, 1.0, tp, links);
    }
    if (stage == 0 || st.total() > crit.total()) {
      crit = st;
      critical = stage;
    }
  }

  Breakdown bd;
  bd.compute_s = micro_batches * (crit.fwd_compute + crit.bwd_compute) * 1e-9;
  bd.tp_comm_s = micro_batches * (crit.fwd_tp + crit.bwd_tp) * 1e-9;
  bd.bubble_s = (pp - 1) * crit.total() / v * 1e-9;

  // Pipeline p2p on the critical path.
  if (pp > 1) {
    const double msg = pipeline_message_bytes(m, plan);
    double hop_ns = 0;
    for (int stage = 0; stage + 1 < pp; ++stage) {
      const std::vector<int> pair{mapping.rank_of(0, stage, 0), mapping.rank_of(0, stage + 1, 0)};
      const LinkParams link = group_link_params(topo, Collective::send_recv, pair);
      hop_ns = std::max(hop_ns, static_cast<double>(collective_time_ns(Collective::send_recv, msg, 2, link)));
    }
    if (tp > 1 && !plan.sequence_parallel) {
      // Scatter-gather: the receiver all-gathers the t shards over its TP group.
      double gather_ns = 0;
      for (const GroupLinks& links : tp_links) {
        gather_ns = std::max(gather_ns, comm_ns(Collective::all_gather, msg * tp, tp, links));
      }
      hop_ns += gather_ns;
    }
    bd.pp_comm_s = 2.0 * (micro_batches * v + (pp - 1)) * hop_ns * 1e-9;
  }

  // Data-parallel gradient reduction and ZeRO gathers of the critical stage.
  const double params = parameters_on_stage(m, plan, critical);
  if (dp > 1) {
    const GroupLinks links = group_links(topo, mapping.dp_group(0, critical));
    const double grad_bytes = params * kGradBytesPerParam;
    const double param_bytes = params * kParamBytesPerParam;
    const double rs = comm_ns(Collective::reduce_scatter, grad_bytes, dp, links);
    const double ag = comm_ns(Collective::all_gather, param_bytes, dp, links);
    double exposed_ns = 0;
    switch (plan.zero_stage) {
      case 0:
        exposed_ns = std::max(0.0, comm_ns(Collective::all_reduce, grad_bytes, dp, links) - crit.bwd());
        break;
      case 1:
        exposed_ns = std::max(0.0, rs - crit.bwd()) + ag;
        break;
      case 2:
        exposed_ns = micro_batches * std::max(0.0, rs - crit.bwd()) + ag;
        break;
      default:
        exposed_ns = micro_batches * (std::max(0.0, ag - crit.fwd()) + std::max(0.0, ag + rs - crit.bwd()));
        break;
    }
    bd.dp_comm_s = exposed_ns * 1e-9;
  }

  const double shard = plan.zero_stage >= 1 ? params / dp : params;
  bd.optimizer_s = static_cast<double>(memory_bound_time_ns(gpu, shard * kAdamBytesPerParam)) * 1e-9;

  Estimate e;
  e.plan = plan;
  e.breakdown = bd;
  e.iteration_time_s = bd.total();
  const double world = static_cast<double>(plan.world_size());
  const double seq = static_cast<double>(plan.seq_length > 0 ? plan.seq_length : m.seq_length);
  e.model_flops = model_flops_per_iteration(m, plan);
  e.hardware_flops = hardware_flops_per_iteration(m, plan);
  if (e.iteration_time_s > 0) {
    e.tokens_per_s = static_cast<double>(plan.global_batch) * seq / e.iteration_time_s;
    e.model_tflops_per_gpu = e.model_flops / e.iteration_time_s / world / 1e12;
    e.hardware_tflops_per_gpu = e.hardware_flops / e.iteration_time_s / world / 1e12;
    e.mfu = e.model_tflops_per_gpu * 1e12 / gpu.peak_bf16_flops;
    e.hfu = e.hardware_tflops_per_gpu * 1e12 / gpu.peak_bf16_flops;
  }
  e.memory = memory_per_gpu(m, plan, gpu);
  return e;
}

}  // namespace cuboid
