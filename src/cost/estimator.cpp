// The analytical estimator: one training iteration of a plan in closed form.
//
// Model (all times of the critical pipeline stage, the one with the largest
// forward + backward time per micro-batch):
// * t_f, t_b per micro-batch = compute ops (op_time_ns) + TP collectives
//   (collective_time_ns over the stage's TP group). Megatron does not overlap
//   TP communication with compute in these kernels, so it is added, and
//   reported apart as tp_comm; with Transformer Engine's userbuffers
//   (--tp-comm-overlap) an SP collective's pair with its GEMM adds what the
//   pair takes beyond the GEMM (tp_list_ns). Recomputation is part of t_b.
// * compute + tp_comm = m * (t_f + t_b); bubble = (p - 1) * (t_f + t_b) / v
//   (v = virtual stages for interleaved 1F1B, else 1; GPipe and 1F1B share
//   the same bubble and differ only in memory).
// * GPU speed spread: every TP collective, pipeline hop and DP reduction
//   synchronises, so the job computes at the pace of its slowest GPU: the
//   compute of t_f, t_b and the optimizer step (not communication) is
//   scaled by 1 + sigma x E[max of tp x pp x dp normals] (speed_spread.hpp).
//   It depends on the plan's world size, so it is applied where the stage
//   times are assembled, not in the cached layer costs.
// * pp_comm: Megatron's p2p is blocking, so every send sits on the critical
//   path: one forward and one backward message per micro-batch per model
//   chunk, 2 * m * v, plus the 2 * (p - 1) hops of the pipeline fill and
//   drain. Each costs a send_recv of pipeline_message_bytes over the slowest
//   link between consecutive stages, plus the TP all-gather that rebuilds the
//   activation when the scatter-gather optimisation is used without SP.
// * dp_comm: the gradients of the critical stage over its DP group, at the
//   trainer's bytes per element (fp32 for Megatron with bf16, TrainerSettings):
//     ZeRO 0: all-reduce once per iteration;
//     ZeRO 1 (distributed optimizer): reduce-scatter of grads, then an
//       all-gather of the bf16 parameters after the step;
//     ZeRO 2: grads are sharded, so each micro-batch reduce-scatters its own,
//       plus the bf16 parameter all-gather after the step;
//     ZeRO 3: as ZeRO 2 without the parameter all-gather after the step, and
//       each micro-batch gathers the parameters before each unit of its
//       forward and backward (zero3_exposed_ns below).
//   Overlap (TrainerSettings::dp_overlap, Megatron's --overlap-grad-reduce):
//   a grad reduction hides behind the backward it follows (the last
//   micro-batch's for once-per-iteration reductions); without it the
//   once-per-iteration reduction is exposed whole. ZeRO-3's gathers and
//   reduce-scatters are walked unit by unit as the trainer issues them
//   (zero3.hpp): what they add to each pass beyond its compute is exposed.
//   The parameter all-gather after the optimizer step is exposed; with
//   --overlap-param-gather it moves to the next forward's buckets
//   (next_forward_gather_ns).
//   Where the EP exchanges cross nodes, a reduction over a group that
//   crosses nodes shares the rank's NIC with them: it hides only under what
//   they leave of the pass (reduction_beside_exchanges_ns), and ZeRO-2's
//   reductions of an MoE plan run under their backward and the next forward
//   (the combined step with the EP overlap), as the simulator plays them.
// * optimizer: Megatron's step kernels (optimizer_step.hpp): the fp32 grad
//   buffer scaled and zeroed (8 + 4 B per parameter), and on this GPU's
//   shard (params / dp with ZeRO >= 1) the grad norm (4), Adam (28) and the
//   master -> bf16 copy (6), memory-bound (16-bit gradients and the
//   precision-aware optimizer move fewer: OptimizerPrecision); a calibrated
//   profile's kernel fits (by op name) price those bytes instead.
// * A calibrated card's collective fits replace the link model of the groups
//   they measured (group_link_params), its GEMM and kernel fits the compute.
#include "cuboid/cost/estimator.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cuboid/core/calibration.hpp"
#include "cuboid/cost/operand_pool.hpp"
#include "cuboid/core/dispatch.hpp"
#include "cuboid/core/ep_overlap.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/offload.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/cost/step.hpp"
#include "cuboid/core/tp_overlap.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/core/zero3.hpp"

namespace cuboid {

namespace {

constexpr std::size_t kCollectives = 6;

// Link parameters of one group, one entry per Collective.
using GroupLinks = std::array<LinkParams, kCollectives>;

// `cold_buffers`: the data-parallel groups (group_link_params).
GroupLinks group_links(const Topology& topo, const std::vector<int>& ranks, const UplinkLoad& load,
                       bool cold_buffers = false) {
  GroupLinks links{};
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                       Collective::broadcast, Collective::send_recv, Collective::all_to_all}) {
    links[static_cast<std::size_t>(c)] = group_link_params(topo, c, ranks, load, cold_buffers);
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
  double fwd_compute = 0, bwd_compute = 0, fwd_tp = 0, bwd_tp = 0, fwd_cp = 0, bwd_cp = 0, fwd_ep = 0, bwd_ep = 0;
  // Of fwd_ep / bwd_ep, the time the exchanges load the rank's NIC (EP
  // groups across nodes): a DP-side reduction over the NIC shares it.
  double fwd_ep_nic = 0, bwd_ep_nic = 0;
  double fwd() const { return fwd_compute + fwd_tp + fwd_cp + fwd_ep; }
  double bwd() const { return bwd_compute + bwd_tp + bwd_cp + bwd_ep; }
  double total() const { return fwd() + bwd(); }
};

void add_scaled(PassTimes& into, const PassTimes& x, double scale) {
  into.fwd_compute += scale * x.fwd_compute;
  into.bwd_compute += scale * x.bwd_compute;
  into.fwd_tp += scale * x.fwd_tp;
  into.bwd_tp += scale * x.bwd_tp;
  into.fwd_cp += scale * x.fwd_cp;
  into.bwd_cp += scale * x.bwd_cp;
  into.fwd_ep += scale * x.fwd_ep;
  into.bwd_ep += scale * x.bwd_ep;
  into.fwd_ep_nic += scale * x.fwd_ep_nic;
  into.bwd_ep_nic += scale * x.bwd_ep_nic;
}

// What a list's CP (or EP) exchanges add to its compute: a blocking
// all-to-all its whole time; a ring send/recv under the attention block
// after it what it outlasts the block (the block itself is in the compute).
double group_exposed_ns(const GpuProfile& gpu, const std::vector<Op>& ops, Group group, int size,
                        const GroupLinks& links) {
  double total = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.group != group || (op.kind != OpKind::collective && op.kind != OpKind::p2p)) continue;
    const double comm = comm_ns(op.collective, op.comm_bytes, size, links);
    if (op.overlaps_next && i + 1 < ops.size())
      total += std::max(0.0, comm - static_cast<double>(op_time_ns(gpu, ops[i + 1])));
    else
      total += comm;
  }
  return total;
}

void add_cp_times(PassTimes& into, const GpuProfile& gpu, const LayerOps& ops, int cp, const GroupLinks& links) {
  if (cp <= 1) return;
  into.fwd_cp += group_exposed_ns(gpu, ops.forward, Group::cp, cp, links);
  into.bwd_cp += group_exposed_ns(gpu, ops.backward, Group::cp, cp, links) +
                 group_exposed_ns(gpu, ops.recompute, Group::cp, cp, links);
}

// The links an EP group's allgather or flex exchange crosses: a rank's
// share of its node's NICs (its tier's oversubscription applied, as a
// send/recv's), NVLink (the card's intra-node busbw), and how the group
// spreads over nodes.
struct DispatchLinks {
  double nic_Bps = 0, nvlink_Bps = 0, latency_ns = 0;
  EpSpread spread;
};

DispatchLinks dispatch_links(const Topology& topo, const std::vector<int>& ranks) {
  DispatchLinks d;
  const Cluster& cl = topo.cluster();
  const int gpn = std::max(1, cl.gpus_per_node);
  std::vector<int> nodes;
  for (int r : ranks)
    if (std::find(nodes.begin(), nodes.end(), r / gpn) == nodes.end()) nodes.push_back(r / gpn);
  d.spread = EpSpread{static_cast<int>(ranks.size()), static_cast<int>(nodes.size())};
  d.nvlink_Bps = cl.intra.busbw_GBps * 1e9;
  d.latency_ns = cl.intra.latency_ns;
  if (nodes.size() > 1) {
    const LinkParams link = group_link_params(topo, Collective::send_recv, ranks);
    d.nic_Bps = link.busbw_Bps;
    d.latency_ns = link.latency_ns;
  }
  return d;
}

// What an allgather or flex exchange depends on beyond its op and links:
// the model's routing, its hidden size and the flex dispatcher's backend.
struct DispatchModel {
  const MoeSpec& moe;
  std::int64_t hidden;
  FlexSetting flex;
};

// The share of each link an exchange gets: flex at its backend's measured
// shares (flex_kernels), the others the links' busbw.
FlexKernels link_shares(const Op& op, const DispatchModel& dm, const DispatchLinks& links) {
  if (op.dispatcher != MoeDispatcher::flex) return FlexKernels{};
  return flex_kernels(dm.flex, links.spread.nodes);
}

// The seconds an allgather or flex exchange's copies load the rank's NIC.
double nic_leg_s(const Op& op, const DispatchTraffic& t, const DispatchLinks& links, const FlexKernels& k) {
  return op.comm_bytes * t.node_copies / (links.nic_Bps * k.rdma_efficiency);
}

// One exchange of the allgather or flex dispatcher: the slower of the
// rank's NIC and NVLink port under dispatch_traffic's copies (flex at its
// backend's measured share of each link), then one latency.
double dispatch_ns(const Op& op, const DispatchModel& dm, const DispatchLinks& links) {
  const DispatchTraffic t = dispatch_traffic(op.dispatcher, dm.moe, dm.hidden, 1.0, links.spread);
  const FlexKernels k = link_shares(op, dm, links);
  double s = 0;
  if (t.node_copies > 0) s = std::max(s, nic_leg_s(op, t, links, k));
  if (t.nvlink_copies > 0) s = std::max(s, op.comm_bytes * t.nvlink_copies / (links.nvlink_Bps * k.nvlink_efficiency));
  return s * 1e9 + links.latency_ns;
}

// The time one exchange loads the rank's NIC: none inside a node; NCCL's
// all-to-all across nodes all of it (its busbw is the NICs'); the allgather
// and flex dispatchers their NIC leg of dispatch_ns.
double dispatch_nic_ns(const Op& op, int ep, const GroupLinks& links, const DispatchModel& dm, const DispatchLinks& dl) {
  if (dl.spread.nodes <= 1) return 0.0;
  if (op.dispatcher == MoeDispatcher::alltoall) return comm_ns(op.collective, op.comm_bytes, ep, links);
  return nic_leg_s(op, dispatch_traffic(op.dispatcher, dm.moe, dm.hidden, 1.0, dl.spread), dl, link_shares(op, dm, dl)) *
         1e9;
}

// An MoE layer's dispatch and combine exchanges (blocking: Megatron's
// dispatchers wait for each): NCCL collectives for alltoall, dispatch_ns for
// the others; `nic_ns` adds their NIC time (dispatch_nic_ns).
double ep_exposed_ns(const std::vector<Op>& ops, int ep, const GroupLinks& links, const DispatchModel& dm,
                     const DispatchLinks& dl, double* nic_ns = nullptr) {
  double total = 0;
  for (const Op& op : ops) {
    if (op.group != Group::ep || op.kind != OpKind::collective) continue;
    total += op.dispatcher == MoeDispatcher::alltoall ? comm_ns(op.collective, op.comm_bytes, ep, links)
                                                      : dispatch_ns(op, dm, dl);
    if (nic_ns != nullptr) *nic_ns += dispatch_nic_ns(op, ep, links, dm, dl);
  }
  return total;
}

void add_ep_times(PassTimes& into, const LayerOps& ops, int ep, const GroupLinks& links, const DispatchModel& dm,
                  const DispatchLinks& dl) {
  if (ep <= 1) return;
  into.fwd_ep += ep_exposed_ns(ops.forward, ep, links, dm, dl, &into.fwd_ep_nic);
  into.bwd_ep += ep_exposed_ns(ops.backward, ep, links, dm, dl, &into.bwd_ep_nic) +
                 ep_exposed_ns(ops.recompute, ep, links, dm, dl, &into.bwd_ep_nic);
}

PassTimes compute_times(const GpuProfile& gpu, const LayerOps& ops) {
  PassTimes t;
  t.fwd_compute = compute_ns(gpu, ops.forward);
  t.bwd_compute = compute_ns(gpu, ops.backward) + compute_ns(gpu, ops.recompute);
  return t;
}

// A list's TP collectives, those Transformer Engine's userbuffers overlap
// with their GEMM (`ub`, core/tp_overlap.hpp) as what their pair takes
// beyond the GEMM's own time: the exposed steps, and the GEMM's chunking
// and its SMs left to the comm kernels. Simplified here only: the bulk
// pairs of the backward stay blocking, as every async backward collective
// is in this estimate.
double tp_list_ns(const GpuProfile& gpu, const std::vector<Op>& ops, int tp, const GroupLinks& links, bool ub) {
  double total = tp_comm_ns(ops, tp, links);
  if (!ub) return total;
  const SmsTakenPricer margin(gpu, kUbCommSms);
  for (const UbOverlap& u : ub_overlaps(ops, tp)) {
    const Op& comm = ops[u.comm];
    const Op& gemm = ops[u.gemm];
    const Op chunk = ub_chunk_gemm(gemm, u.chunks);
    const double g = static_cast<double>(u.comm_sms > 0 ? margin(chunk) : op_time_ns(gpu, chunk));
    const double c = comm_ns(u.chunk_collective(), ub_chunk_bytes(u, comm.comm_bytes), tp, links);
    total += ub_overlapped_ns(u, g, c) - static_cast<double>(op_time_ns(gpu, gemm)) -
             comm_ns(comm.collective, comm.comm_bytes, tp, links);
  }
  return total;
}

void add_tp_times(PassTimes& into, const GpuProfile& gpu, const LayerOps& ops, double scale, int tp,
                  const GroupLinks& links, bool ub) {
  if (tp <= 1) return;
  into.fwd_tp += scale * tp_list_ns(gpu, ops.forward, tp, links, ub);
  into.bwd_tp += scale * (tp_list_ns(gpu, ops.backward, tp, links, ub) + tp_list_ns(gpu, ops.recompute, tp, links, ub));
}


// What every plan with the same TP, micro-batch, sequence, SP, recompute and
// flash setting shares: the layer's ops and their compute times.
struct LayerCost {
  LayerOps layer, embed, head;
  PassTimes layer_compute, embed_compute, head_compute;
  // An MoE model with dense layers too (`mixed`): `layer` is its MoE
  // layer, `dense` its dense one.
  bool mixed = false;
  LayerOps dense;
  PassTimes dense_compute;
  // The multi-token prediction modules' (one module's ops, on the last stage).
  LayerOps mtp;
  PassTimes mtp_compute;
  // A full recomputation by block: the recompute alone of `layer` and
  // `dense` (their `recompute` list, the rest empty), which a stored layer
  // does not run (estimate_with subtracts it per stored layer).
  LayerOps layer_rc, dense_rc;
  PassTimes layer_rc_compute, dense_rc_compute;
  double pipeline_message = 0;
  // What the allgather / flex dispatchers' traffic depends on (dispatch_ns).
  MoeSpec moe;
  std::int64_t hidden = 0;
  FlexSetting flex;
  DispatchModel dispatch_model() const { return DispatchModel{moe, hidden, flex}; }
  // held_pace's results so far: {SMs taken, forward ratio, backward ratio}
  // (a search meets a handful of DP group shapes; each Estimator is one
  // thread's).
  mutable std::vector<std::array<double, 3>> held;
};

LayerCost make_layer_cost(const ModelSpec& m, const GpuProfile& gpu, const ParallelPlan& plan) {
  LayerCost c;
  c.layer = transformer_layer_ops(m, plan);
  c.embed = embedding_ops(m, plan);
  c.head = lm_head_ops(m, plan);
  c.layer_compute = compute_times(gpu, c.layer);
  c.mixed = m.has_dense_and_moe_layers();
  if (c.mixed) {
    c.dense = transformer_layer_ops(m, plan, false);
    c.dense_compute = compute_times(gpu, c.dense);
  }
  if (m.mtp_layers > 0) {
    c.mtp = mtp_ops(m, plan);
    c.mtp_compute = compute_times(gpu, c.mtp);
  }
  if (plan.recompute == Recompute::full) {
    c.layer_rc.recompute = c.layer.recompute;
    c.layer_rc_compute = compute_times(gpu, c.layer_rc);
    if (c.mixed) {
      c.dense_rc.recompute = c.dense.recompute;
      c.dense_rc_compute = compute_times(gpu, c.dense_rc);
    }
  }
  c.embed_compute = compute_times(gpu, c.embed);
  c.head_compute = compute_times(gpu, c.head);
  // A calibrated backend may move activations in another dtype than the
  // workload's bf16 (the CPU executor's f32): price the bytes it moves.
  const Calibration* cal = gpu.calibration.get();
  for (LayerOps* ops : {&c.layer, &c.embed, &c.head, &c.dense, &c.mtp, &c.layer_rc, &c.dense_rc}) {
    for (std::vector<Op>* list : {&ops->forward, &ops->backward, &ops->recompute}) {
      for (Op& op : *list) op.comm_bytes = comm_size_bytes(op, cal);
    }
  }
  c.pipeline_message = pipeline_message_bytes(m, plan) * activation_bytes_scale(cal);
  c.moe = m.moe;
  c.hidden = m.hidden_size;
  c.flex = plan.moe_flex;
  return c;
}

// What every plan with the same TP, PP, DP and rank order shares: where its
// groups sit, as link parameters. Stages whose groups see the same links
// share one entry.
struct Placement {
  HostLink host_link;                     // the card's, for offloaded activations
  std::vector<GroupLinks> tp_links;       // distinct TP group links
  std::vector<std::size_t> stage_tp;      // stage -> index into tp_links
  std::vector<LinkParams> p2p_links;      // distinct send/recv links between consecutive stages
  std::vector<GroupLinks> cp_links;       // distinct CP group links (empty without CP)
  std::vector<std::size_t> stage_cp;      // stage -> index into cp_links
  std::vector<GroupLinks> ep_links;       // distinct EP group links (empty without EP)
  std::vector<std::size_t> stage_ep;      // stage -> index into ep_links
  std::vector<DispatchLinks> ep_dispatch; // per entry of ep_links: its dispatcher's links
  std::vector<GroupLinks> dp_links;       // per stage (DP x CP group of TP rank 0)
  std::vector<GroupLinks> edp_links;      // per stage: the expert-DP group of EP and ETP rank 0 (MoE only)
  // Per stage: whether the DP x CP group, and the expert-DP group where the
  // experts have one, cross nodes (their reductions load the NICs).
  std::vector<char> dp_nic, edp_nic;
  GroupLinks embedding_links{};           // the first and the last stage's TP rank 0 (PP > 1)
  int dp_sms = 0;                         // SMs a DP collective holds on its GPUs (nccl_ring_channels)
  // SMs an EP exchange holds beside the EP overlap's compute, per dispatcher
  // (ep_exchange_sms of the first stage's EP group; EP > 1 only).
  std::array<int, 3> ep_sms{};
  // Stages that can differ: the first, the last, and the first middle stage
  // of each distinct TP and CP placement (middle stages hold equal layer
  // counts).
  std::vector<int> representatives;
};

bool same_link(const LinkParams& a, const LinkParams& b) {
  return a.busbw_Bps == b.busbw_Bps && a.latency_ns == b.latency_ns && a.fitted == b.fitted;
}

std::size_t intern(std::vector<GroupLinks>& pool, const GroupLinks& links) {
  for (std::size_t i = 0; i < pool.size(); ++i) {
    bool same = true;
    for (std::size_t c = 0; c < kCollectives && same; ++c)
      same = same_link(pool[i][c], links[c]);
    if (same) return i;
  }
  pool.push_back(links);
  return pool.size() - 1;
}

// The load each kind of group puts on oversubscribed uplinks when all the
// groups of that kind communicate at once (uplink_load): every TP group,
// every DP group, every pipeline pair of every stage boundary. Only needed
// (and only computed) where the fabric has an oversubscribed tier.
struct PhaseLoads {
  UplinkLoad tp, dp, pp, cp, ep, edp;
};

// The load of `groups` rings of `members` ranks each, member k of group g
// being rank(g, k).
template <class Rank>
UplinkLoad rings_load(const Topology& topo, int groups, int members, Rank rank) {
  UplinkCounter c(topo);
  for (int g = 0; g < groups; ++g) {
    c.begin_group();
    for (int k = 0; k < members; ++k) c.add(rank(g, k));
    c.end_group();
  }
  return c.load();
}

PhaseLoads phase_loads(const Topology& topo, const ParallelPlan& plan, const RankMapping& mapping) {
  PhaseLoads loads;
  const Cluster& cl = topo.cluster();
  if (cl.inter.oversubscription <= 1.0 && cl.inter.core_oversubscription <= 1.0) return loads;
  // dp: the data index (DP x CP ranks).
  const int tp = std::max(1, plan.tp), pp = std::max(1, plan.pp), dp = std::max(1, plan.dp_cp());
  const int cp = std::max(1, plan.cp);
  if (tp > cl.gpus_per_node)
    loads.tp = rings_load(topo, pp * dp, tp, [&](int g, int k) { return mapping.rank_of_data(k, g / dp, g % dp); });
  if (dp > 1)
    loads.dp = rings_load(topo, pp * tp, dp, [&](int g, int k) { return mapping.rank_of_data(g % tp, g / tp, k); });
  if (cp > 1)  // groups: (tp, pp, dp); members: the CP ranks
    loads.cp = rings_load(topo, pp * tp * (dp / cp), cp, [&](int g, int k) {
      return mapping.rank_of(g % tp, g / (tp * (dp / cp)), g / tp % (dp / cp), k);
    });
  if (plan.ep > 1) {
    std::vector<std::vector<int>> groups = mapping.ep_groups();
    loads.ep = rings_load(topo, static_cast<int>(groups.size()), plan.ep,
                          [&](int g, int k) { return groups[static_cast<std::size_t>(g)][static_cast<std::size_t>(k)]; });
  }
  if (const int edp = plan.expert_dp(); edp > 1 && (plan.ep > 1 || plan.expert_tp() != plan.tp)) {
    const int per_stage = plan.tp * plan.cp * plan.dp / edp;
    loads.edp = rings_load(topo, pp * per_stage, edp, [&](int g, int k) {
      const int ep = g % per_stage / plan.expert_tp(), etp = g % plan.expert_tp();
      return mapping.expert_dp_group(g / per_stage, ep, etp)[static_cast<std::size_t>(k)];
    });
  }
  if (pp > 1)  // a pair of neighbouring stages: (s, s + 1) for every TP and data rank
    loads.pp = rings_load(topo, (pp - 1) * dp * tp, 2,
                          [&](int g, int k) { return mapping.rank_of_data(g % tp, g / (tp * dp) + k, g / tp % dp); });
  return loads;
}

Placement make_placement(const Topology& topo, const ParallelPlan& plan) {
  const RankMapping mapping(plan, topo.cluster().gpus_per_node);
  const PhaseLoads loads = phase_loads(topo, plan, mapping);
  Placement pl;
  pl.host_link = topo.cluster().host_link;
  const int pp = std::max(1, plan.pp);
  if (plan.dp_cp() > 1) pl.dp_sms = nccl_ring_channels(topo.cluster(), mapping.dp_group(0, 0));
  for (int stage = 0; stage < pp; ++stage) {
    GroupLinks links{};
    if (plan.tp > 1) links = group_links(topo, mapping.tp_group(stage, 0), loads.tp);
    pl.stage_tp.push_back(intern(pl.tp_links, links));
    if (plan.cp > 1) pl.stage_cp.push_back(intern(pl.cp_links, group_links(topo, mapping.cp_group(0, stage, 0), loads.cp)));
    if (plan.ep > 1) {
      const std::vector<int> ranks = mapping.ep_group(stage, 0, 0);
      pl.stage_ep.push_back(intern(pl.ep_links, group_links(topo, ranks, loads.ep)));
      if (pl.ep_dispatch.size() < pl.ep_links.size()) pl.ep_dispatch.push_back(dispatch_links(topo, ranks));
      if (stage == 0)
        for (MoeDispatcher d : {MoeDispatcher::alltoall, MoeDispatcher::allgather, MoeDispatcher::flex})
          pl.ep_sms[static_cast<std::size_t>(d)] = ep_exchange_sms(topo.cluster(), d, plan.moe_flex, ranks);
    }
    if (plan.expert_dp() > 1 && (plan.ep > 1 || plan.expert_tp() != plan.tp)) {
      const std::vector<int> edp_ranks = mapping.expert_dp_group(stage, 0, 0);
      pl.edp_links.push_back(group_links(topo, edp_ranks, loads.edp, true));
      pl.edp_nic.push_back(mapping.nodes_spanned(edp_ranks) > 1 ? 1 : 0);
    }
    GroupLinks dp{};
    if (plan.dp_cp() > 1) dp = group_links(topo, mapping.dp_group(0, stage), loads.dp, true);
    pl.dp_links.push_back(dp);
    pl.dp_nic.push_back(plan.dp_cp() > 1 && mapping.nodes_spanned(mapping.dp_group(0, stage)) > 1 ? 1 : 0);
    if (stage + 1 < pp) {
      const std::vector<int> pair{mapping.rank_of(0, stage, 0), mapping.rank_of(0, stage + 1, 0)};
      const LinkParams link = group_link_params(topo, Collective::send_recv, pair, loads.pp);
      bool seen = false;
      for (const LinkParams& l : pl.p2p_links) seen = seen || same_link(l, link);
      if (!seen) pl.p2p_links.push_back(link);
    }
  }
  if (pp > 1) {
    const std::vector<int> ends{mapping.rank_of(0, 0, 0), mapping.rank_of(0, pp - 1, 0)};
    pl.embedding_links = group_links(topo, ends, loads.pp, true);
  }
  std::vector<std::array<std::size_t, 3>> seen_links;
  for (int stage = 0; stage < pp; ++stage) {
    const auto s = static_cast<std::size_t>(stage);
    const std::array<std::size_t, 3> idx{pl.stage_tp[s], pl.stage_cp.empty() ? 0 : pl.stage_cp[s],
                                         pl.stage_ep.empty() ? 0 : pl.stage_ep[s]};
    const bool seen = std::find(seen_links.begin(), seen_links.end(), idx) != seen_links.end();
    if (stage == 0 || stage == pp - 1 || !seen) pl.representatives.push_back(stage);
    if (stage != 0 && !seen) seen_links.push_back(idx);
  }
  return pl;
}

// The TP collective times (per distinct TP placement: a layer's, the
// embedding's and the LM head's) and the pipeline hop of one (layer cost,
// placement) pair. They depend on nothing else, and pricing them (the busbw
// curve's interpolation and logarithms per collective) was most of a
// candidate's scoring, so the Estimator keeps them per pair.
struct TpTimes {
  PassTimes layer, embed, head;
  PassTimes dense;  // LayerCost::mixed: a dense layer's
  PassTimes mtp;    // one multi-token prediction module's
  PassTimes layer_rc, dense_rc;  // LayerCost::layer_rc, dense_rc
};
struct CommTimes {
  std::vector<TpTimes> tp;  // per entry of Placement::tp_links
  std::vector<PassTimes> cp;  // a layer's CP exchanges, per entry of Placement::cp_links
  std::vector<PassTimes> ep;  // a layer's EP all-to-alls, per entry of Placement::ep_links
  std::vector<PassTimes> cp_rc, ep_rc;  // the same of LayerCost::layer_rc
  double hop_ns = 0;        // one pipeline message (and its TP gather), 0 without PP
  // How much slower a layer's forward and backward compute run while a DP
  // collective holds Placement::dp_sms SMs (1: not slowed).
  double held_fwd = 1.0, held_bwd = 1.0;
};

// Compute time of a list of ops while a collective holds SMs.
double held_compute_ns(const SmsTakenPricer& price, const std::vector<Op>& ops) {
  double total = 0;
  for (const Op& op : ops) total += static_cast<double>(price(op));
  return total;
}

// How much slower a layer's forward and backward compute run while a
// collective holds `sms` SMs, remembered in the layer cost.
std::array<double, 3> held_pace(const GpuProfile& gpu, const LayerCost& lc, int sms) {
  for (const auto& h : lc.held)
    if (h[0] == sms) return h;
  std::array<double, 3> h{static_cast<double>(sms), 1.0, 1.0};
  const PassTimes& c = lc.layer_compute;
  const SmsTakenPricer price(gpu, sms);
  if (c.fwd_compute > 0) h[1] = held_compute_ns(price, lc.layer.forward) / c.fwd_compute;
  if (c.bwd_compute > 0)
    h[2] = (held_compute_ns(price, lc.layer.backward) + held_compute_ns(price, lc.layer.recompute)) / c.bwd_compute;
  lc.held.push_back(h);
  return h;
}

CommTimes make_comm_times(const GpuProfile& gpu, const ParallelPlan& plan, const LayerCost& lc, const Placement& pl) {
  const int tp = plan.tp;
  CommTimes ct;
  if (pl.dp_sms > 0) {
    const std::array<double, 3> h = held_pace(gpu, lc, pl.dp_sms);
    ct.held_fwd = h[1];
    ct.held_bwd = h[2];
  }
  ct.tp.resize(pl.tp_links.size());
  for (std::size_t i = 0; i < pl.tp_links.size(); ++i) {
    const bool ub = plan.trainer.tp_comm_overlap;
    add_tp_times(ct.tp[i].layer, gpu, lc.layer, 1.0, tp, pl.tp_links[i], ub);
    if (lc.mixed) add_tp_times(ct.tp[i].dense, gpu, lc.dense, 1.0, tp, pl.tp_links[i], ub);
    add_tp_times(ct.tp[i].mtp, gpu, lc.mtp, 1.0, tp, pl.tp_links[i], ub);
    add_tp_times(ct.tp[i].embed, gpu, lc.embed, 1.0, tp, pl.tp_links[i], ub);
    add_tp_times(ct.tp[i].head, gpu, lc.head, 1.0, tp, pl.tp_links[i], ub);
    add_tp_times(ct.tp[i].layer_rc, gpu, lc.layer_rc, 1.0, tp, pl.tp_links[i], ub);
    if (lc.mixed) add_tp_times(ct.tp[i].dense_rc, gpu, lc.dense_rc, 1.0, tp, pl.tp_links[i], ub);
  }
  for (const GroupLinks& links : pl.cp_links) {
    add_cp_times(ct.cp.emplace_back(), gpu, lc.layer, plan.cp, links);
    add_cp_times(ct.cp_rc.emplace_back(), gpu, lc.layer_rc, plan.cp, links);
  }
  for (std::size_t i = 0; i < pl.ep_links.size(); ++i) {
    add_ep_times(ct.ep.emplace_back(), lc.layer, plan.ep, pl.ep_links[i], lc.dispatch_model(), pl.ep_dispatch[i]);
    add_ep_times(ct.ep_rc.emplace_back(), lc.layer_rc, plan.ep, pl.ep_links[i], lc.dispatch_model(), pl.ep_dispatch[i]);
  }
  if (std::max(1, plan.pp) > 1) {
    const double msg = lc.pipeline_message;
    double hop_ns = 0;
    for (const LinkParams& link : pl.p2p_links)
      hop_ns = std::max(hop_ns, static_cast<double>(collective_time_ns(Collective::send_recv, msg, 2, link)));
    if (tp > 1 && !plan.sequence_parallel) {
      // Scatter-gather: the receiver all-gathers the t shards over its TP group.
      double gather_ns = 0;
      for (const GroupLinks& links : pl.tp_links) {
        gather_ns = std::max(gather_ns, comm_ns(Collective::all_gather, msg * tp, tp, links));
      }
      hop_ns += gather_ns;
    }
    ct.hop_ns = hop_ns;
  }
  return ct;
}

// One unit of a ZeRO-3 pass for the recurrence below: its compute with its
// TP collectives (blocking, as everywhere in this estimate), what it
// gathers and the gradients ready after it (Builder's Part).
struct Zero3Step {
  double compute_ns = 0;
  double tp_ns = 0;  // the blocking TP collectives' share of compute_ns
  double params = 0;
  std::vector<double> grads;  // per parameter tensor
  std::int64_t tensor = -1;
  double quantized = 0;  // of `params`, the quantized linear weights (StepDescription::gathered_bytes)
  // Of `params` and `quantized`, the routed experts' (gathered over
  // expert-DP), and the experts' gradients ready after it (reduced there);
  // the rest over DP x CP (Megatron-FSDP's buckets per unit and group).
  double expert = 0, expert_quantized = 0, expert_grads = 0;
};

// `pace`: the compute's slowdown at the job's slowest GPU (speed spread);
// the TP collectives are not scaled, as in the simulator.
// `tp_ns` (if given) adds the TP collectives' share.
double ops_ns(const GpuProfile& gpu, const std::vector<Op>& ops, std::size_t first, std::size_t end, int tp,
              const GroupLinks& tp_links, double pace, double* tp_ns = nullptr) {
  double t = 0;
  for (std::size_t i = first; i < end; ++i) {
    const Op& op = ops[i];
    t += static_cast<double>(op_time_ns(gpu, op)) * pace;
    if (tp > 1 && op.kind == OpKind::collective && op.group == Group::tp) {
      const double c = comm_ns(op.collective, op.comm_bytes, tp, tp_links);
      t += c;
      if (tp_ns != nullptr) *tp_ns += c;
    }
  }
  return t;
}

// A layer's steps: one block, or (tensor units) its weights' parts as the
// simulator cuts them (split_by_weight), recompute then backward.
// A block's routed experts (`expert` of `params`; `expert_quantized` of its
// quantized weights) are gathered and reduced over expert-DP, and only
// where expert-DP shards them (more than one rank).
void layer_steps(const ModelSpec& m, const GpuProfile& gpu, const ParallelPlan& plan, const LayerOps& ops,
                 const GroupLinks& tp_links, double params, std::int64_t id, bool forward, double pace,
                 std::vector<Zero3Step>& out, double expert = 0, double expert_quantized = 0) {
  const TrainerSettings& ts = plan.trainer;
  if (ts.zero3_unit == Zero3Unit::block) {
    double t = 0, tp_ns = 0;
    for (const std::vector<Op>* list : forward ? std::vector<const std::vector<Op>*>{&ops.forward}
                                               : std::vector<const std::vector<Op>*>{&ops.recompute, &ops.backward})
      t += ops_ns(gpu, *list, 0, list->size(), plan.tp, tp_links, pace, &tp_ns);
    if (plan.expert_dp() <= 1) params -= expert, expert = 0, expert_quantized = 0;
    const double dense = params - expert;
    out.push_back(Zero3Step{t, tp_ns, params, forward ? std::vector<double>{} : std::vector<double>{dense}, -1,
                            quantized_weight_elements(ops), expert, expert_quantized, forward ? 0.0 : expert});
    return;
  }
  const std::vector<LayerWeight> weights = layer_weights(m, plan);
  const auto persist = static_cast<double>(ts.zero3_persist_params);
  double grads = 0;
  auto add = [&](const std::vector<Op>& list, Pass pass, bool with_grads) {
    for (const WeightPart& w : split_by_weight(list, pass)) {
      Zero3Step st;
      st.compute_ns = ops_ns(gpu, list, w.first, w.end, plan.tp, tp_links, pace, &st.tp_ns);
      if (w.weight >= 0) {
        const LayerWeight& lw = weights[static_cast<std::size_t>(w.weight)];
        st.params = (lw.weight >= persist ? lw.weight : 0.0) + (lw.bias >= persist ? lw.bias : 0.0);
        st.quantized = plan.precision != Precision::bf16 && lw.weight >= persist ? lw.weight : 0.0;
        st.tensor = id * 8 + w.weight;
        if (with_grads) {
          st.grads.push_back(lw.weight);
          if (lw.bias > 0) st.grads.push_back(lw.bias);
          grads += lw.weight + lw.bias;
        }
      }
      out.push_back(st);
    }
  };
  if (forward) {
    add(ops.forward, Pass::forward, false);
  } else {
    add(ops.recompute, Pass::forward, false);
    add(ops.backward, Pass::backward, true);
    // The norms' gradients, with the last part (as the simulator's Part).
    const double norms = std::max(0.0, params - grads);
    const int norm_tensors = m.normalization == Normalization::layernorm ? 4 : 2;
    for (int i = 0; i < norm_tensors && norms > 0; ++i) out.back().grads.push_back(norms / norm_tensors);
  }
}

// One pass as the simulator's task graph plays it, on two clocks: the
// compute stream (with the host work that holds it) and the DP stream
// (gathers and reduce-scatters, one after another). Returns the pass's
// length, from its start to the later of both streams, and what the DP
// collectives' SMs added to its compute: a step that starts while the DP
// stream is still busy runs its compute (not its blocking TP collectives)
// `held_pace` times slower (CommTimes::held_fwd / held_bwd) until the
// stream's queued collectives end, at its own pace after (the simulator's
// hold_sms, with the stream taken as busy until then).
struct Zero3Pass {
  double length_ns = 0, sm_ns = 0;
};

Zero3Pass zero3_pass_ns(const std::vector<Zero3Step>& steps, bool reducing, const ParallelPlan& plan,
                     const GpuProfile& gpu, const GroupLinks& dp_links, const GroupLinks& expert_links,
                     const StepDescription& step, double held_pace) {
  const double param_bytes = step.param_bytes_per_param(), grad_bytes = step.grad_bytes_per_param();
  const TrainerSettings& ts = plan.trainer;
  const int dp = plan.dp_cp();
  const int edp = step.expert_dp();
  std::vector<Zero3Use> uses;
  uses.reserve(steps.size());
  for (const Zero3Step& st : steps) uses.push_back(Zero3Use{st.params, st.tensor});
  const Zero3PassPlan zp = plan_zero3_pass(uses, ts);
  double c = 0, d = 0;  // when the compute stream and the DP stream are free
  double sm = 0;        // what the DP collectives' SMs added to the compute
  double issue = 0;     // without zero3_sync: when the chain a gather depends on ends
  std::vector<double> ready(steps.size(), 0.0);
  auto gather = [&](std::size_t j) {
    const Zero3Step& st = steps[j];
    // The routed experts' bucket after the rest, on the same stream.
    if (st.expert > 0) {
      const double own = step.gathered_bytes(st.params - st.expert, st.quantized - st.expert_quantized);
      const double experts = step.gathered_bytes(st.expert, st.expert_quantized);
      d = std::max(d, issue) + comm_ns(Collective::all_gather, own, dp, dp_links) +
          comm_ns(Collective::all_gather, experts, edp, expert_links);
      ready[j] = d;
      return;
    }
    const double bytes = step.gathered_bytes(st.params, st.quantized);
    if (ts.zero3_sync) {
      c = std::max(c, d) + static_cast<double>(memory_bound_time_ns(gpu, bytes));
      issue = c;
    }
    const double g = comm_ns(Collective::all_gather, bytes, dp, dp_links);
    d = std::max(d, issue) + g;
    ready[j] = d;
    if (ts.zero3_list_collectives) {
      c += static_cast<double>(list_collective_copies_ns(gpu, bytes, dp));
      issue = c;
    }
  };
  auto reduce_one = [&](double elements) {
    const double bytes = elements * grad_bytes;
    if (ts.zero3_list_collectives) d += static_cast<double>(list_collective_copies_ns(gpu, bytes, dp));
    d += comm_ns(Collective::reduce_scatter, bytes, dp, dp_links);
  };
  auto reduce = [&](const std::vector<double>& tensors, double after, double experts = 0) {
    d = std::max(d, after);
    if (ts.zero3_reduce_per_tensor) {
      for (const double t : tensors) reduce_one(t);
    } else {
      double all = 0;
      for (const double t : tensors) all += t;
      reduce_one(all);
    }
    if (experts > 0) d += comm_ns(Collective::reduce_scatter, experts * grad_bytes, edp, expert_links);
  };
  const auto bucket = static_cast<double>(ts.zero3_reduce_bucket_params);
  double acc = 0, held_ready = 0;
  std::vector<double> held;
  bool held_current = false;
  std::vector<std::vector<double>> after;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const std::span<const std::uint32_t> issued = zp.issued_at(k);
    for (const std::uint32_t j : issued)
      if (j == k) gather(j);
    if (zp.waits[k]) c = std::max(c, d);
    if (ts.zero3_fetch_norm && steps[k].params > 0) {
      c += static_cast<double>(memory_bound_time_ns(gpu, steps[k].params * param_bytes));
      issue = c;
    }
    if (ts.zero3_sync) issue = c;
    for (const std::uint32_t j : issued)
      if (j != k) gather(j);
    if (!ts.zero3_sync && zp.gathered[k]) c = std::max(c, ready[k]);
    issue = c;
    const Zero3Step& st = steps[k];
    after.clear();
    if (reducing && bucket > 0) {
      for (const double t : st.grads) {
        if (acc > 0 && acc + t > bucket) {
          if (held_current) after.push_back(held);
          else reduce(held, std::max(held_ready, c));
          acc = 0;
          held.clear();
        }
        acc += t;
        held.push_back(t);
        held_current = true;
      }
    }
    const double w = st.compute_ns;
    if (held_pace > 1.0 && d > c && w > 0) {
      const double held_w = st.tp_ns + (w - st.tp_ns) * held_pace;
      const double beside = d - c;
      const double t = beside >= held_w ? held_w : beside + (1.0 - beside / held_w) * w;
      sm += t - w;
      c += t;
    } else {
      c += w;
    }
    if (reducing && !st.grads.empty()) {
      issue = c;
      if (bucket > 0) {
        for (const std::vector<double>& b : after) reduce(b, c);
        if (held_current) held_ready = c;
        held_current = false;
      } else {
        reduce(st.grads, c, st.expert_grads);
      }
    }
  }
  if (acc > 0) reduce(held, held_ready);
  return Zero3Pass{std::max(c, d), sm};
}

// What ZeRO-3 adds to an iteration beyond the critical stage's compute (and
// of it, in sm_ns, the DP collectives' SMs' cost to the compute):
// per micro-batch and model chunk, a forward and a backward pass over the
// stage's units (the embedding and the LM head on their stages' first and
// last chunk, as the simulator's units).
// An MoE model's layers: its MoE layers' and its dense layers' parameters
// (layer_parameter_split), each block's routed experts over expert-DP; an
// MoE layer's blocking dispatch and combine (`ep_layer`, one layer's, null
// without EP; `ep_layer_rc`, those of its recomputed forward, which a
// partial full recomputation's stored layers do not run) are part of its
// step, the DP stream running beside them as beside its compute (priced in
// ep_comm_s, not here).
double zero3_exposed_ns(const ModelSpec& m, const GpuProfile& gpu, const ParallelPlan& plan, const LayerCost& lc,
                        const GroupLinks& tp_links, const GroupLinks& dp_links, const GroupLinks& expert_links,
                        const PassTimes* ep_layer, const PassTimes* ep_layer_rc, int stage, double pace,
                        const CommTimes& ct,
                        const StepDescription& step, double& sm_ns) {
  const int pp = std::max(1, plan.pp);
  const int v = plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
  const int tp = std::max(1, plan.tp);
  const bool moe = m.moe.enabled();
  const StageParameters moe_layer = layer_parameter_split(m, plan, moe);
  const StageParameters dense_layer = moe ? layer_parameter_split(m, plan, false) : moe_layer;
  const double per_layer = moe_layer.total();
  const int layers = layers_on_stage(plan, m.num_layers, stage);
  const int moe_layers = moe ? moe_layers_on_stage(m, plan, stage) : layers;
  const double extra =
      parameters_on_stage(m, plan, stage) - per_layer * moe_layers - dense_layer.total() * (layers - moe_layers);
  // The stage's routed experts beyond its layers' (multi-token prediction's
  // MoE layer), gathered with the LM head.
  const double extra_expert =
      moe ? std::max(0.0, stage_parameters(m, plan, stage).expert - moe_layer.expert * moe_layers) : 0.0;
  const double moe_quantized_expert = quantized_layer_weights(m, plan, moe).expert;
  const double embed_params =
      static_cast<double>(padded_vocab_size(m.vocab_size, tp)) / tp * static_cast<double>(m.hidden_size);
  const double micro_batches = static_cast<double>(plan.num_micro_batches());
  double exposed = 0;
  std::vector<Zero3Step> steps;
  // A unit that is one step: the embedding or the LM head.
  auto whole = [&](const LayerOps& ops, const PassTimes& t, double params, bool forward) {
    double tp_ns = 0;
    if (tp > 1)
      tp_ns = forward ? tp_comm_ns(ops.forward, tp, tp_links)
                      : tp_comm_ns(ops.backward, tp, tp_links) + tp_comm_ns(ops.recompute, tp, tp_links);
    steps.push_back(Zero3Step{(forward ? t.fwd_compute : t.bwd_compute) * pace + tp_ns, tp_ns, params,
                              forward ? std::vector<double>{} : std::vector<double>{params}, -1, 0.0});
  };
  // Of a unit's parameters, `expert` routed experts' (where expert-DP shards them).
  auto add_expert = [&](Zero3Step& st, double expert, bool forward) {
    if (plan.expert_dp() <= 1) {
      st.params -= expert;
      if (!forward) st.grads.assign(1, st.params);
      return;
    }
    st.expert = expert;
    if (!forward) {
      st.grads.assign(1, st.params - expert);
      st.expert_grads = expert;
    }
  };
  // One layer's steps, priced once (tensor ids of layer 0: the weight index).
  std::vector<Zero3Step> layer_fwd, layer_bwd, layer_bwd_stored, dense_fwd, dense_bwd, dense_bwd_stored;
  layer_steps(m, gpu, plan, lc.layer, tp_links, per_layer, 0, true, pace, layer_fwd, moe_layer.expert,
              moe_quantized_expert);
  layer_steps(m, gpu, plan, lc.layer, tp_links, per_layer, 0, false, pace, layer_bwd, moe_layer.expert,
              moe_quantized_expert);
  // A partial full recomputation's stored layers (the block method's): the backward alone.
  const bool partial = plan.partial_full_recompute();
  if (partial) {
    LayerOps stored = lc.layer;
    stored.recompute.clear();
    layer_steps(m, gpu, plan, stored, tp_links, per_layer, 0, false, pace, layer_bwd_stored, moe_layer.expert,
                moe_quantized_expert);
  }
  if (lc.mixed) {
    layer_steps(m, gpu, plan, lc.dense, tp_links, dense_layer.total(), 0, true, pace, dense_fwd);
    layer_steps(m, gpu, plan, lc.dense, tp_links, dense_layer.total(), 0, false, pace, dense_bwd);
    if (partial) {
      LayerOps stored = lc.dense;
      stored.recompute.clear();
      layer_steps(m, gpu, plan, stored, tp_links, dense_layer.total(), 0, false, pace, dense_bwd_stored);
    }
  }
  if (ep_layer != nullptr && plan.trainer.zero3_unit == Zero3Unit::block) {
    for (Zero3Step& st : layer_fwd) st.compute_ns += ep_layer->fwd_ep, st.tp_ns += ep_layer->fwd_ep;
    for (Zero3Step& st : layer_bwd) st.compute_ns += ep_layer->bwd_ep, st.tp_ns += ep_layer->bwd_ep;
    // A stored layer's backward has no recomputed forward's exchanges.
    const double stored_ep = ep_layer->bwd_ep - (ep_layer_rc != nullptr ? ep_layer_rc->bwd_ep : 0.0);
    for (Zero3Step& st : layer_bwd_stored) st.compute_ns += stored_ep, st.tp_ns += stored_ep;
  }
  for (int chunk = 0; chunk < v; ++chunk) {
    const int vs = chunk * pp + stage;
    const bool first = vs == 0, last = vs == pp * v - 1;
    const double e = first ? std::max(0.0, pp * v == 1 ? std::min(extra, embed_params) : extra) : 0.0;
    const double h = last ? std::max(0.0, extra - e) : 0.0;
    for (const bool forward : {true, false}) {
      // Units in execution order: the backward walks them last to first,
      // each unit's own steps (recompute, then backward) in order.
      steps.clear();
      if (forward && first) whole(lc.embed, lc.embed_compute, e, true);
      if (!forward && last) whole(lc.head, lc.head_compute, h, false);
      if (!forward && last && extra_expert > 0) add_expert(steps.back(), extra_expert, false);
      // Every layer of a kind has the same steps; only the tensor ids differ.
      const int chunk_layers = layers_in_chunk(plan, m.num_layers, stage, chunk);
      const int first_layer = first_layer_of_chunk(plan, m.num_layers, stage, chunk);
      for (int l = 0; l < chunk_layers; ++l) {
        const std::int64_t id = forward ? l + 1 : chunk_layers - l;
        const int layer = first_layer + static_cast<int>(id) - 1;
        const bool dense = lc.mixed && !m.moe.moe_layers[static_cast<std::size_t>(layer)];
        const bool stored = !forward && partial && !recomputes_layer(plan, layer - first_layer);
        const std::vector<Zero3Step>& one = forward ? (dense ? dense_fwd : layer_fwd)
                                            : dense ? (stored ? dense_bwd_stored : dense_bwd)
                                                    : (stored ? layer_bwd_stored : layer_bwd);
        for (Zero3Step st : one) {
          if (st.tensor >= 0) st.tensor += id * 8;
          steps.push_back(std::move(st));
        }
      }
      if (forward && last) whole(lc.head, lc.head_compute, h, true);
      if (forward && last && extra_expert > 0) add_expert(steps.back(), extra_expert, true);
      if (!forward && first) whole(lc.embed, lc.embed_compute, e, false);
      double compute = 0;
      for (const Zero3Step& st : steps) compute += st.compute_ns;
      const Zero3Pass pass = zero3_pass_ns(steps, !forward, plan, gpu, dp_links, expert_links, step,
                                           forward ? ct.held_fwd : ct.held_bwd);
      exposed += micro_batches * std::max(0.0, pass.length_ns - compute - pass.sm_ns);
      sm_ns += micro_batches * pass.sm_ns;
    }
  }
  return exposed;
}

// `pace`: spread_slowdown(gpu.speed_spread, plan.world_size()), which the
// Estimator keeps per world size (a normal quantile takes more than half as
// long as the rest of a candidate's scoring, and a search's candidates share
// one size).
// The critical stage's DP-side collectives (step.hpp) as time past its
// compute, summed by when the trainer issues them. Simplifications, here
// only: a reduction under a backward is one collective of the stage's
// gradients hidden behind that whole backward (the simulator plays
// Megatron's buckets, whose last one shows past it); its SMs' cost to the
// compute beside it is added to `compute_s`. Dense collectives come before
// the experts' (step.hpp's order): both on one stream.
// The distributed optimizer's gather issued in the next forward
// (--overlap-param-gather; the simulator plays it bucket by bucket): per
// model chunk, issued when the host reaches its first forward, the buckets
// back to back, each bucket's layers waiting for theirs. Simplified here
// only: on the first stage's first chunk the first bucket holds the
// embedding (`first_params`, at least bucket_params) and the rest split
// into B equal buckets of gather a under equal forward shares f, the
// embedding's own forward taken as nothing: a0 + a + (B - 1) max(0, a - f);
// a later stage's first chunk hides its one gather behind the pipeline's
// fill, `critical` forwards of a chunk of this stage's; the other chunks'
// gathers find nothing issued ahead of them: exposed whole, unless the
// schedule aligns them (StepDescription::gathers_aligned). With the first
// chunk's gather under the step (StepDescription::gathers_in_step) that
// chunk's gather shows past the rest of the step, `step_window` (what the
// dense and the expert gathers, one after the other on the DP stream, leave
// of it is passed on), and on a later stage past its fill wait too; chunks
// taken as equal.
double next_forward_gather_ns(const StepCollective& sc, const GroupLinks& links, const StepDescription& step,
                              const StageStep& stage, const PassTimes& crit, int critical, double v,
                              double first_params, double& step_window) {
  const double chunk_bytes = sc.bytes / v;
  const double chunk_ns = comm_ns(sc.collective, chunk_bytes, sc.ranks, links);
  const double chunk_fwd_ns = crit.fwd() / v;
  double exposed = (v - 1) * chunk_ns;
  if (step.gathers_aligned() && v > 1) {
    // Aligned: the second chunk's issued at the start behind the first's
    // (not under the step), used PP forwards later; chunk c's issued PP +
    // the stage's rank forwards before its first.
    const double pp = step.pipeline_stages();
    exposed = std::max(0.0, (step.gathers_in_step() ? 1.0 : 2.0) * chunk_ns - pp * chunk_fwd_ns) +
              (v - 2) * std::max(0.0, chunk_ns - (pp + critical) * chunk_fwd_ns);
  }
  if (step.gathers_in_step()) {
    // A later stage's runs on through its wait for the pipeline's fill.
    const double hidden = std::min(chunk_ns, step_window + critical * chunk_fwd_ns);
    step_window = std::max(0.0, step_window - hidden);
    return exposed + chunk_ns - hidden;
  }
  if (critical > 0) return exposed + std::max(0.0, chunk_ns - critical * chunk_fwd_ns);
  const double chunk_params = stage.params.total() / v;
  if (chunk_params <= 0) return exposed;
  const double bucket = step.bucket_params(0, 0);
  const double first = std::min(chunk_params, std::max(bucket, first_params));
  const double a0 = comm_ns(sc.collective, chunk_bytes * first / chunk_params, sc.ranks, links);
  const double rest = chunk_params - first;
  if (rest <= 0) return exposed + a0;
  const double buckets = std::max(1.0, std::ceil(rest / bucket));
  const double a = comm_ns(sc.collective, chunk_bytes * rest / chunk_params / buckets, sc.ranks, links);
  return exposed + a0 + a + (buckets - 1) * std::max(0.0, a - chunk_fwd_ns / buckets);
}

// Where the critical stage's DP-side groups sit, and what each of the EP
// overlap's combined steps hides (0 without it).
struct StepLinks {
  const GroupLinks* dp = nullptr;
  const GroupLinks* expert = nullptr;
  bool dp_nic = false, expert_nic = false;  // the group crosses nodes
  double pair_hidden_ns = 0;
};

template <class Zero3>
double fold_step_collectives(const StageStep& stage, const StepDescription& step, const PassTimes& crit,
                             const CommTimes& ct, double micro_batches, const StepLinks& sl, Zero3 zero3_exposed,
                             double& compute_s, std::vector<StepCollective>* folded, int critical, double v,
                             double first_params, double step_window) {
  double sum[7] = {};
  double nic[7] = {};  // of sum, the collectives over groups that cross nodes
  double next_forward_ns = 0;
  bool zero3 = false;
  for (const StepCollective& sc : stage.collectives()) {
    const bool expert = sc.group == StepGroup::expert_dp;
    const GroupLinks& links = expert ? *sl.expert : *sl.dp;
    if (folded != nullptr && sc.when != StepWhen::after_all_backward) folded->push_back(sc);
    switch (sc.when) {
      case StepWhen::zero3_units:
        zero3 = true;  // walked unit by unit below
        break;
      case StepWhen::after_all_backward:
        // The tied embedding's all-reduce: once per iteration, whichever
        // stage is critical (estimate_with).
        break;
      case StepWhen::next_forward_buckets:
        next_forward_ns += next_forward_gather_ns(sc, links, step, stage, crit, critical, v, first_params, step_window);
        break;
      default: {
        const double ns = comm_ns(sc.collective, sc.bytes, sc.ranks, links);
        sum[static_cast<std::size_t>(sc.when)] += ns;
        if (expert ? sl.expert_nic : sl.dp_nic) nic[static_cast<std::size_t>(sc.when)] += ns;
        break;
      }
    }
  }
  // What the DP collectives' SMs cost the compute beside them.
  double sm_ns = 0;
  // A reduction of `comm` under a backward of `backward`: what shows past it;
  // its SMs slow the backward's compute for as long as both run (its blocking
  // TP collectives' share of that time aside).
  auto under_backward = [&](double comm, double backward, double times) {
    if (backward > 0)
      sm_ns += times * sm_contention_ns(std::min(comm, backward) * crit.bwd_compute / crit.bwd(), crit.bwd_compute,
                                        ct.held_bwd);
    return times * std::max(0.0, comm - backward);
  };
  const auto at = [&](StepWhen w) { return sum[static_cast<std::size_t>(w)]; };
  const auto beside_exchanges = [&](StepWhen w, double window, double ep_nic) {
    return reduction_beside_exchanges_ns(at(w), nic[static_cast<std::size_t>(w)], window, ep_nic);
  };
  double exposed_ns = 0;
  switch (step.grad_when()) {
    case StepWhen::last_backward_buckets:
      exposed_ns = under_backward(at(StepWhen::last_backward_buckets), crit.bwd(), 1.0);
      // The last backward runs alone, also with the EP overlap.
      if (crit.bwd_ep_nic > 0) exposed_ns = beside_exchanges(StepWhen::last_backward_buckets, crit.bwd(), crit.bwd_ep_nic);
      break;
    case StepWhen::after_backward:
      exposed_ns = under_backward(at(StepWhen::after_backward), 0.0, 1.0);
      break;
    case StepWhen::every_backward_buckets:
      exposed_ns = under_backward(at(StepWhen::every_backward_buckets), crit.bwd(), micro_batches);
      if (crit.bwd_ep_nic > 0 || sl.pair_hidden_ns > 0) {
        // Each micro-batch's reduction runs on the DP stream until the next
        // one's is issued, as the simulator plays it: under its backward and
        // the next forward (with the EP overlap one combined step, shorter
        // by what it hides), beside both passes' exchanges; the last one
        // under its backward alone. Simplified: a dense plan's reduction
        // keeps the backward alone as its window.
        const StepWhen w = StepWhen::every_backward_buckets;
        const double step_ns = crit.fwd() + crit.bwd() - sl.pair_hidden_ns;
        exposed_ns = (micro_batches - 1) * beside_exchanges(w, step_ns, crit.fwd_ep_nic + crit.bwd_ep_nic) +
                     beside_exchanges(w, crit.bwd(), crit.bwd_ep_nic);
      }
      break;
    default:
      break;
  }
  if (step.gathers_after_step()) exposed_ns += step.gathers_in_next_forward() ? next_forward_ns : at(StepWhen::after_optimizer);
  if (zero3) exposed_ns = zero3_exposed(sm_ns);
  compute_s += sm_ns * 1e-9;
  return exposed_ns;
}

// One pass of a layer cut at its EP exchanges (core/ep_overlap.hpp): each
// compute node's kernels alone and under the exchange's `held` SMs, its TP
// and CP collectives (blocking), each exchange as ep_exposed_ns prices it
// (with any kernel between the dispatch's exchanges: the host sync).
struct EpLinks {
  const GroupLinks* tp;
  const GroupLinks* cp;
  const GroupLinks* ep;
  const DispatchLinks* dispatch;
};
EpPassTimes ep_pass_times(const GpuProfile& gpu, const ParallelPlan& plan, const LayerCost& lc, const EpLinks& links,
                          const SmsTakenPricer& held, double pace, const std::vector<Op>& ops, bool forward) {
  const auto is_ep = [&](std::size_t i) { return ops[i].group == Group::ep && ops[i].kind == OpKind::collective; };
  const EpSplit split = ep_split(ops.size(), forward, is_ep);
  const bool delayed = !forward && plan.moe_delay_wgrad;
  EpPassTimes t;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const bool comm = op.kind == OpKind::collective || op.kind == OpKind::p2p;
    const EpNode node =
        delayed ? ep_delayed_node(ep_node(split, i), !comm && op.name.ends_with(op::wgrad_suffix)) : ep_node(split, i);
    double ns = 0;
    if (is_ep(i)) {
      ns = op.dispatcher == MoeDispatcher::alltoall ? comm_ns(op.collective, op.comm_bytes, plan.ep, *links.ep)
                                                    : dispatch_ns(op, lc.dispatch_model(), *links.dispatch);
    } else if (comm && op.group == Group::tp) {
      ns = comm_ns(op.collective, op.comm_bytes, plan.tp, *links.tp);
    } else if (comm && op.group == Group::cp && links.cp != nullptr) {
      ns = comm_ns(op.collective, op.comm_bytes, plan.cp, *links.cp);
    } else if (!comm) {
      ns = static_cast<double>(op_time_ns(gpu, op)) * pace;
    }
    if (is_exchange(node)) {
      t.ex[node == EpNode::ex0 ? 0 : 1] += ns;
      continue;
    }
    EpSegment& g = t.seg[static_cast<std::size_t>(ep_seg_index(node))];
    if (comm) {
      g.blocking_ns += ns;
    } else {
      g.compute_ns += ns;
      g.held_ns += static_cast<double>(held(op)) * pace;
    }
  }
  return t;
}

std::vector<Op> backward_list(const LayerOps& ops) {
  std::vector<Op> out = ops.recompute;
  out.insert(out.end(), ops.backward.begin(), ops.backward.end());
  return out;
}

// The EP overlap (core/ep_overlap.hpp) on the critical stage: its combined
// steps (PP 1: m - 1; interleaved: the steady state's, ep_overlap_chunk_steps),
// each pairing the forward chunk's layer i with the backward chunk's layer
// n_b - 1 - i (TransformerModelChunkSchedulePlan.run), a pair at a time (the
// simulator also lets one pair's tail run under the next one's head). Adds
// to `bd` what the exchanges hide (off ep_comm_s) and what the compute loses
// under their SMs (onto compute_s); returns what one combined step hides
// (PP > 1: what a micro-batch's steps hide on average, the window
// fold_step_collectives takes).
double fold_ep_overlap(const ModelSpec& m, const GpuProfile& gpu, const ParallelPlan& plan, const LayerCost& lc,
                       const Placement& pl, double pace, int critical, Breakdown& bd) {
  if (!plan.moe_ep_overlap || pl.ep_links.empty()) return 0.0;
  const auto c = static_cast<std::size_t>(critical);
  const GroupLinks no_links{};
  const EpLinks links{pl.tp_links.empty() ? &no_links : &pl.tp_links[pl.stage_tp[c]],
                      pl.cp_links.empty() ? nullptr : &pl.cp_links[pl.stage_cp[c]], &pl.ep_links[pl.stage_ep[c]],
                      &pl.ep_dispatch[pl.stage_ep[c]]};
  const SmsTakenPricer held(gpu, plan.moe_dispatcher == MoeDispatcher::flex
                                     ? flex_exchange_sms(gpu.sm_count, plan.moe_flex, links.dispatch->spread.nodes)
                                     : pl.ep_sms[static_cast<std::size_t>(plan.moe_dispatcher)]);
  // [0]: a dense layer's passes, [1]: an MoE layer's.
  std::array<EpPassTimes, 2> fwd{}, bwd{};
  const LayerOps* kinds[2] = {lc.mixed ? &lc.dense : nullptr, &lc.layer};
  for (std::size_t k = 0; k < 2; ++k) {
    if (kinds[k] == nullptr) continue;
    fwd[k] = ep_pass_times(gpu, plan, lc, links, held, pace, kinds[k]->forward, true);
    bwd[k] = ep_pass_times(gpu, plan, lc, links, held, pace, backward_list(*kinds[k]), false);
  }
  const auto moe_layer = [&](std::int64_t i) {
    return !lc.mixed || m.moe.moe_layers[static_cast<std::size_t>(i)] ? std::size_t{1} : std::size_t{0};
  };
  std::array<std::array<double, 2>, 2> count{};  // [forward kind][backward kind], over the iteration
  // PP 1: the counts are one step's, `per` the steps; else the iteration's, `steps` of them.
  double steps = 0, per = 1;
  if (plan.pp <= 1) {
    per = ep_overlap_pairs(static_cast<int>(plan.num_micro_batches()));
    steps = 1;
    for (std::int64_t i = 0; i < m.num_layers; ++i) count[moe_layer(i)][moe_layer(m.num_layers - 1 - i)] += 1;
  } else {
    const int v = chunks_per_stage(plan);
    const std::vector<int> chunk_steps =
        ep_overlap_chunk_steps(plan.pp, critical, static_cast<int>(plan.num_micro_batches()), v);
    for (int fc = 0; fc < v; ++fc)
      for (int bc = 0; bc < v; ++bc) {
        const double n = chunk_steps[static_cast<std::size_t>(fc * v + bc)];
        if (n == 0) continue;
        steps += n;
        const int nf = layers_in_chunk(plan, m.num_layers, critical, fc);
        const int nb = layers_in_chunk(plan, m.num_layers, critical, bc);
        const int f0 = first_layer_of_chunk(plan, m.num_layers, critical, fc);
        const int b0 = first_layer_of_chunk(plan, m.num_layers, critical, bc);
        for (int i = 0; i < std::min(nf, nb); ++i) count[moe_layer(f0 + i)][moe_layer(b0 + nb - 1 - i)] += n;
      }
  }
  double hidden = 0, sm = 0;
  for (std::size_t f = 0; f < 2; ++f)
    for (std::size_t b = 0; b < 2; ++b) {
      if (count[f][b] == 0) continue;
      const EpPairTime t = ep_pair_time(fwd[f], bwd[b], plan.moe_delay_wgrad);
      hidden += count[f][b] * t.hidden_ns();
      sm += count[f][b] * t.sm_cost_ns;
    }
  bd.ep_hidden_s = per * hidden * 1e-9;
  bd.ep_overlap_sm_s = std::max(0.0, per * sm * 1e-9);  // no SMs held: 0, not a rounding's -1e-15
  bd.ep_comm_s -= bd.ep_hidden_s;
  bd.compute_s += bd.ep_overlap_sm_s;
  // PP 1: one combined step's; else per micro-batch (its v chunks' steps on the stage).
  return plan.pp <= 1 ? hidden : steps > 0 ? hidden / static_cast<double>(plan.num_micro_batches()) : 0.0;
}

// What one micro-batch's compute waits for the activation copies of CPU
// offloading or fine-grained offloading (offload.hpp), from each decoder
// layer's forward and backward as the estimate prices them (compute, TP, CP
// and EP) on stage `stage` (CPU offloading runs with PP 1: stage 0 holds
// every layer), chunk by chunk. Simplified: ZeRO-3's gathers and the
// embedding and LM head are not in the layers' times.
double offload_exposed_s(const ModelSpec& m, const ParallelPlan& plan, const LayerCost& lc, const CommTimes& ct,
                         const Placement& pl, double pace, int stage) {
  const TpTimes& t = ct.tp[pl.stage_tp[stage]];
  const bool fine = plan.offload_modules != 0;
  const int chunks = fine ? chunks_per_stage(plan) : 1;
  TimeNs exposed = 0;
  for (int c = 0; c < chunks; ++c) {
    const int first = fine ? first_layer_of_chunk(plan, m.num_layers, stage, c) : 0;
    const int n = fine ? layers_in_chunk(plan, m.num_layers, stage, c) : static_cast<int>(m.num_layers);
    const ActivationOffload off = fine ? fine_offload_chunk(n) : activation_offload(m, plan);
    std::vector<TimeNs> fwd, bwd, to_host, from_host;
    for (int i = 0; i < n; ++i) {
      const int j = first + i;
      const bool moe = m.moe.enabled() && m.moe.moe_layers[static_cast<std::size_t>(j)];
      PassTimes layer;
      add_scaled(layer, lc.mixed && !moe ? lc.dense_compute : lc.layer_compute, pace);
      add_scaled(layer, lc.mixed && !moe ? t.dense : t.layer, 1.0);
      if (!ct.cp.empty()) add_scaled(layer, ct.cp[pl.stage_cp[stage]], 1.0);
      if (!ct.ep.empty() && moe) add_scaled(layer, ct.ep[pl.stage_ep[stage]], 1.0);
      fwd.push_back(static_cast<TimeNs>(std::llround(layer.fwd())));
      bwd.push_back(static_cast<TimeNs>(std::llround(layer.bwd())));
      if (off.offloads(i) || (fine && i + 1 == n)) {
        const double bytes = off.offloads(i) ? offloaded_layer_bytes(m, plan, j) : 0.0;
        to_host.push_back(host_copy_ns(pl.host_link, bytes, true));
        from_host.push_back(host_copy_ns(pl.host_link, bytes, false));
      }
    }
    exposed += offload_exposure(off, fwd, bwd, to_host, from_host).total();
  }
  return static_cast<double>(exposed) * 1e-9;
}

Estimate estimate_with(const ModelSpec& m, const GpuProfile& gpu, const ParallelPlan& plan, const LayerCost& lc,
                       const Placement& pl, const CommTimes& ct, double pace, FoldedStep* folded = nullptr) {
  const int pp = std::max(1, plan.pp);
  const double v = plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
  const double micro_batches = static_cast<double>(plan.num_micro_batches());
  const TpTimes* tp_times = ct.tp.data();

  int critical = 0;
  PassTimes crit{};
  // With dense and MoE layers the stages' mixes differ, and a layout's
  // middle stages may hold different layer counts: every stage.
  const bool every_stage = lc.mixed || !plan.pipeline_layout.empty();
  const bool partial = plan.partial_full_recompute();
  std::vector<int> all_stages;
  if (every_stage)
    for (int s = 0; s < pp; ++s) all_stages.push_back(s);
  for (int stage : every_stage ? all_stages : pl.representatives) {
    const TpTimes& t = tp_times[pl.stage_tp[static_cast<std::size_t>(stage)]];
    PassTimes st;
    const double layers_per_stage = layers_on_stage(plan, m.num_layers, stage);
    if (lc.mixed) {
      const double moe = moe_layers_on_stage(m, plan, stage);
      add_scaled(st, lc.layer_compute, moe * pace);
      add_scaled(st, t.layer, moe);
      add_scaled(st, lc.dense_compute, (layers_per_stage - moe) * pace);
      add_scaled(st, t.dense, layers_per_stage - moe);
    } else {
      add_scaled(st, lc.layer_compute, layers_per_stage * pace);
      add_scaled(st, t.layer, layers_per_stage);
    }
    if (!ct.cp.empty()) add_scaled(st, ct.cp[pl.stage_cp[static_cast<std::size_t>(stage)]], layers_per_stage);
    if (!ct.ep.empty())
      add_scaled(st, ct.ep[pl.stage_ep[static_cast<std::size_t>(stage)]], moe_layers_on_stage(m, plan, stage));
    if (partial) {
      // Block's stored layers run no recompute: each kind's taken off.
      const StageRecompute rc = stage_recompute(m, plan, stage);
      const double stored = rc.stored[0] + rc.stored[1];
      // `layer` is every layer's kind but a mixed model's dense ones.
      const double on_layer = lc.mixed ? rc.stored[1] : stored;
      add_scaled(st, lc.layer_rc_compute, -on_layer * pace);
      add_scaled(st, t.layer_rc, -on_layer);
      if (lc.mixed) {
        add_scaled(st, lc.dense_rc_compute, -rc.stored[0] * pace);
        add_scaled(st, t.dense_rc, -rc.stored[0]);
      }
      if (!ct.cp_rc.empty()) add_scaled(st, ct.cp_rc[pl.stage_cp[static_cast<std::size_t>(stage)]], -stored);
      if (!ct.ep_rc.empty()) add_scaled(st, ct.ep_rc[pl.stage_ep[static_cast<std::size_t>(stage)]], -rc.stored[1]);
    }
    if (stage == 0) {
      add_scaled(st, lc.embed_compute, pace);
      add_scaled(st, t.embed, 1.0);
    }
    if (stage == pp - 1) {
      add_scaled(st, lc.head_compute, pace);
      add_scaled(st, t.head, 1.0);
      if (const double mtp = m.mtp_layers; mtp > 0) {
        // Each module's layer exchanges as the stage's layers do.
        const bool moe = m.moe.enabled() && m.moe.moe_layers.back();
        const auto s = static_cast<std::size_t>(stage);
        add_scaled(st, lc.mtp_compute, mtp * pace);
        add_scaled(st, t.mtp, mtp);
        if (!ct.cp.empty()) add_scaled(st, ct.cp[pl.stage_cp[s]], mtp);
        if (!ct.ep.empty() && moe) add_scaled(st, ct.ep[pl.stage_ep[s]], mtp);
      }
    }
    if (stage == 0 || st.total() > crit.total()) {
      crit = st;
      critical = stage;
    }
  }

  Breakdown bd;
  bd.compute_s = micro_batches * (crit.fwd_compute + crit.bwd_compute) * 1e-9;
  bd.tp_comm_s = micro_batches * (crit.fwd_tp + crit.bwd_tp) * 1e-9;
  bd.cp_comm_s = micro_batches * (crit.fwd_cp + crit.bwd_cp) * 1e-9;
  bd.ep_comm_s = micro_batches * (crit.fwd_ep + crit.bwd_ep) * 1e-9;
  bd.bubble_s = (pp - 1) * crit.total() / v * 1e-9;

  // Pipeline p2p on the critical path.
  if (pp > 1) bd.pp_comm_s = 2.0 * (micro_batches * v + (pp - 1)) * ct.hop_ns * 1e-9;

  // The critical stage's DP-side collectives (step.hpp), folded by when the
  // trainer issues them.
  const StepDescription step(m, plan, gpu.calibration.get());
  const StageStep stage_step = step.stage(critical);
  // The word embedding on one TP rank: the first bucket of the first stage's gather.
  const double embedding_params = static_cast<double>(padded_vocab_size(m.vocab_size, plan.tp)) / plan.tp *
                                  static_cast<double>(m.hidden_size);
  // The EP overlap first: its combined steps are what a reduction under
  // every backward runs beside.
  const double pair_hidden_ns = fold_ep_overlap(m, gpu, plan, lc, pl, pace, critical, bd);
  // With the first chunk's gather under the step: the rest of the step, past
  // that chunk's own optimizer (chunks taken as equal).
  const double step_window_ns =
      step.gathers_in_step()
          ? static_cast<double>(step.optimizer_ns(gpu, stage_step.params, critical) -
                                step.first_chunk_step_ns(gpu, stage_step.params.dense / v, critical)) *
                pace
          : 0.0;
  if (stage_step.size > 0) {
    const auto c = static_cast<std::size_t>(critical);
    StepLinks sl;
    sl.dp = &pl.dp_links[c];
    sl.expert = pl.edp_links.empty() ? sl.dp : &pl.edp_links[c];
    sl.dp_nic = pl.dp_nic[c] != 0;
    sl.expert_nic = pl.edp_nic.empty() ? sl.dp_nic : pl.edp_nic[c] != 0;
    sl.pair_hidden_ns = pair_hidden_ns;
    bd.dp_comm_s = fold_step_collectives(stage_step, step, crit, ct, micro_batches, sl, [&](double& sm_ns) {
                                           return zero3_exposed_ns(m, gpu, plan, lc, pl.tp_links[pl.stage_tp[c]],
                                                                   pl.dp_links[c], *sl.expert,
                                                                   ct.ep.empty() ? nullptr : &ct.ep[pl.stage_ep[c]],
                                                                   ct.ep_rc.empty() ? nullptr : &ct.ep_rc[pl.stage_ep[c]],
                                                                   critical, pace, ct, step, sm_ns);
                                         }, bd.compute_s, folded != nullptr ? &folded->collectives : nullptr,
                                         critical, v, embedding_params, step_window_ns) *
                   1e-9;
  }
  // The tied embedding's all-reduce follows the first stage's last backward,
  // which ends the pipeline's flush, and the optimizer step waits for it:
  // exposed, whichever stage is critical.
  if (const StepCollective tied = step.tied_embedding(); tied.bytes > 0) {
    bd.dp_comm_s += comm_ns(tied.collective, tied.bytes, tied.ranks, pl.embedding_links) * 1e-9;
    if (folded != nullptr) folded->collectives.push_back(tied);
  }
  if (folded != nullptr) folded->critical_stage = critical;
  if (plan.offloads_activations()) bd.offload_s = micro_batches * offload_exposed_s(m, plan, lc, ct, pl, pace, critical);
  bd.optimizer_s = static_cast<double>(step.optimizer_ns(gpu, stage_step.params, critical)) * pace * 1e-9;

  Estimate e;
  e.plan = plan;
  e.breakdown = bd;
  e.iteration_time_s = bd.total();
  e.gpu_spread = gpu.speed_spread;
  e.gpu_spread_slowdown = pace;
  fill_throughput(e, m, plan, gpu);
  e.memory = memory_per_gpu(m, plan, gpu);
  return e;
}

struct LayerKey {
  int tp, cp, ep, etp, micro_batch;
  CpComm cp_comm;
  MoeDispatcher dispatcher;
  FlexSetting flex;  // compared, not hashed
  std::int64_t seq_length;
  bool sp, flash, fused_wgrad;
  Recompute recompute;
  Precision precision;  // one per search: compared, not hashed
  CudaGraphs cuda_graphs;  // so are these two
  bool tp_comm_overlap;
  bool fp8_attention;  // one per search too
  bool operator==(const LayerKey&) const = default;
};

struct PlacementKey {
  int tp, pp, dp, cp, ep, etp;
  RankOrder order;
  bool operator==(const PlacementKey&) const = default;
};

struct KeyHash {
  std::size_t operator()(const LayerKey& k) const noexcept {
    std::size_t h = static_cast<std::size_t>(k.seq_length);
    h = h * 1000003u ^ static_cast<std::size_t>(k.tp);
    h = h * 1000003u ^ static_cast<std::size_t>(k.cp * 2 + (k.cp_comm == CpComm::a2a ? 1 : 0));
    h = h * 1000003u ^ static_cast<std::size_t>(k.micro_batch);
    h = h * 1000003u ^ static_cast<std::size_t>((k.ep * 64 + k.etp) * 4 + static_cast<int>(k.dispatcher));
    h = h * 1000003u ^ (static_cast<std::size_t>(k.recompute) << 3 | (k.fused_wgrad ? 4u : 0u) | (k.sp ? 2u : 0u) |
                        (k.flash ? 1u : 0u));
    return h;
  }
  std::size_t operator()(const PlacementKey& k) const noexcept {
    std::size_t h = static_cast<std::size_t>(k.tp);
    h = h * 1000003u ^ static_cast<std::size_t>(k.pp);
    h = h * 1000003u ^ static_cast<std::size_t>(k.dp);
    h = h * 1000003u ^ static_cast<std::size_t>(k.cp);
    h = h * 1000003u ^ static_cast<std::size_t>(k.ep * 64 + k.etp);
    for (Dim d : k.order.inner_to_outer) h = h * 31u + static_cast<std::size_t>(d);
    return h;
  }
};

// The pair's entries are node-based map values: their addresses are stable keys.
struct PairKey {
  const LayerCost* layer;
  const Placement* placement;
  bool operator==(const PairKey&) const = default;
};

struct PairHash {
  std::size_t operator()(const PairKey& k) const noexcept {
    return std::hash<const void*>{}(k.layer) * 1000003u ^ std::hash<const void*>{}(k.placement);
  }
};

}  // namespace

double reduction_beside_exchanges_ns(double comm_ns, double nic_ns, double window_ns, double ep_nic_ns) {
  return std::max({0.0, comm_ns - window_ns, nic_ns - (window_ns - ep_nic_ns)});
}

void fill_throughput(Estimate& e, const ModelSpec& m, const ParallelPlan& plan, const GpuProfile& gpu) {
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
}

Estimate estimate(const ModelSpec& m, const Topology& card, const ParallelPlan& plan) {
  const Topology& topo = topology_for_plan(card, m, plan);
  const GpuProfile& gpu = topo.cluster().gpu;
  const LayerCost lc = make_layer_cost(m, gpu, plan);
  const Placement pl = make_placement(topo, plan);
  return estimate_with(m, gpu, plan, lc, pl, make_comm_times(gpu, plan, lc, pl),
                       spread_slowdown(gpu.speed_spread, plan.world_size()));
}

FoldedStep folded_step(const ModelSpec& m, const Topology& card, const ParallelPlan& plan) {
  const Topology& topo = topology_for_plan(card, m, plan);
  const GpuProfile& gpu = topo.cluster().gpu;
  const LayerCost lc = make_layer_cost(m, gpu, plan);
  const Placement pl = make_placement(topo, plan);
  FoldedStep folded;
  estimate_with(m, gpu, plan, lc, pl, make_comm_times(gpu, plan, lc, pl),
                spread_slowdown(gpu.speed_spread, plan.world_size()), &folded);
  return folded;
}

struct Estimator::Caches {
  std::unordered_map<LayerKey, LayerCost, KeyHash> layers;
  std::unordered_map<PlacementKey, Placement, KeyHash> placements;
  std::unordered_map<PairKey, CommTimes, PairHash> comm;
  int pace_world = 0;  // the world size `pace` is for (0: none yet)
  double pace = 1.0;
};

Estimator::Estimator(const ModelSpec& m, const Topology& topo)
    : model_(m), topo_(topo), caches_(std::make_unique<Caches>()) {}
Estimator::~Estimator() = default;
Estimator::Estimator(Estimator&&) noexcept = default;

Estimate Estimator::operator()(const ParallelPlan& plan) {
  // A card of several operand pools prices each plan from its own pool's
  // tables: the caches below hold one card's costs.
  if (topo_.has_operand_pool_views()) return estimate(model_, topo_, plan);
  const GpuProfile& gpu = topo_.cluster().gpu;
  const LayerKey lk{plan.tp,         plan.cp,        plan.ep,
                    plan.expert_tp(), plan.micro_batch, plan.cp_comm, plan.moe_dispatcher, plan.moe_flex,
                    plan.seq_length,  plan.sequence_parallel, plan.flash_attention,
                    plan.grad_accum_fusion, plan.recompute, plan.precision,
                    plan.trainer.cuda_graphs, plan.trainer.tp_comm_overlap, plan.fp8_attention};
  auto li = caches_->layers.find(lk);
  if (li == caches_->layers.end()) li = caches_->layers.emplace(lk, make_layer_cost(model_, gpu, plan)).first;
  const PlacementKey pk{plan.tp, plan.pp, plan.dp, plan.cp, plan.ep, plan.expert_tp(), plan.order};
  auto pi = caches_->placements.find(pk);
  if (pi == caches_->placements.end()) pi = caches_->placements.emplace(pk, make_placement(topo_, plan)).first;
  const PairKey ck{&li->second, &pi->second};
  auto ci = caches_->comm.find(ck);
  if (ci == caches_->comm.end()) ci = caches_->comm.emplace(ck, make_comm_times(gpu, plan, li->second, pi->second)).first;
  if (plan.world_size() != caches_->pace_world) {
    caches_->pace_world = plan.world_size();
    caches_->pace = spread_slowdown(gpu.speed_spread, plan.world_size());
  }
  return estimate_with(model_, gpu, plan, li->second, pi->second, ci->second, caches_->pace);
}

}  // namespace cuboid
