// The task graph of one iteration, set up: the plan's shape, the stages'
// representatives, programs and units (see simulator.cpp for the model it plays).
#include "builder.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/dispatch.hpp"
#include "cuboid/core/tp_overlap.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::sim::detail {

Builder::Builder(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan, const SimOptions& opts)
    : m_(m),
      topo_(topo),
      plan_(plan),
      opts_(opts),
      map_(plan, topo.cluster().gpus_per_node),
      step_(m, plan, topo.cluster().calibration.get()) {
  shape_.pp = std::max(1, plan.pp);
  shape_.v = plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
  shape_.vs_count = shape_.pp * shape_.v;
  shape_.mbs = static_cast<int>(std::max<std::int64_t>(1, plan.num_micro_batches()));
  shape_.tp = std::max(1, plan.tp);
  // The data index (DP x CP ranks): every DP loop below runs over it.
  shape_.dp = step_.dp();
  shape_.cp = std::max(1, plan.cp);
  shape_.edp = step_.expert_dp();
  shape_.expert_group = step_.expert_group();
  if (m.moe.enabled()) {
    shape_.ep = std::max(1, plan.ep);
    for (int s = 0; s < std::max(1, plan.pp); ++s) {
      const StageParameters sp = stage_parameters(m, plan, s);
      shape_.expert_share.push_back(sp.total() > 0 ? sp.expert / sp.total() : 0.0);
    }
  }
  if (plan.world_size() > topo.num_gpus()) {
    throw std::invalid_argument("simulate: the plan needs " + std::to_string(plan.world_size()) +
                                " GPUs but the cluster has " + std::to_string(topo.num_gpus()));
  }
  if (opts.straggler) {
    if (opts.straggler->rank < 0 || opts.straggler->rank >= plan.world_size()) {
      throw std::invalid_argument("simulate: straggler rank " + std::to_string(opts.straggler->rank) +
                                  " is outside the plan's ranks");
    }
    const RankCoord c = map_.coord(opts.straggler->rank);
    pacing_.straggler_stage = c.pp;
    pacing_.straggler_slowdown = opts.straggler->slowdown;
    shape_.rep_dp = c.dp * shape_.cp + c.cp;  // the slowest replica sets the pace of every DP collective
  }
  // The EP overlap's order: its extra warm-up step with PP > 1 (interleaved).
  const bool ep_overlap = plan.moe_ep_overlap && shape_.ep > 1;
  order_ = pipeline_order(plan.schedule, shape_.pp, shape_.mbs, shape_.v, ep_overlap);
  if (ep_overlap && (shape_.pp > 1 || shape_.mbs > 1)) pair_passes();
  pacing_.tp_probe = TpProbe(topo.cluster(), tp_group_of(0, shape_.rep_dp));
  net_ = std::make_unique<Network>(topo, NetworkOptions{}, &arena_);
  eng_ = std::make_unique<Engine>(*net_, &arena_);
}

// A task tagged after later ones (tag's usual case is the task just added).
TaskId Builder::tag_late(TaskId t, const TaskMeta& mt) {
  if (meta_.size() < t) meta_.resize(static_cast<std::size_t>(t) + 1);
  meta_[t] = mt;
  return t;
}

void Builder::label_traced(TaskId t, std::string_view name, std::string_view category) {
  TraceLabel& l = labels_[t];
  l.name = name;
  l.category = category;
}

void Builder::make_representatives() {
  // The timeline shows every stage; a trace the stages of its ranks.
  const bool tracing = !opts_.trace_path.empty() || opts_.timeline;
  traced_stages_.assign(static_cast<std::size_t>(shape_.pp), tracing && (opts_.timeline || opts_.trace_ranks.empty()));
  for (int r : opts_.trace_ranks) {
    if (tracing && r >= 0 && r < plan_.world_size()) traced_stages_[static_cast<std::size_t>(map_.coord(r).pp)] = true;
  }
  if (!tracing) traced_stages_.clear();
  const bool folded = net_->rails_folded();
  const int mirrored_tp = this->mirrored_tp();
  // The SMs NCCL's kernel holds on a DP group's GPUs while a gradient
  // reduction or a ZeRO gather runs beside the compute (nccl_ring_channels).
  const int dp_sms = shape_.dp > 1 ? nccl_ring_channels(topo_.cluster(), map_.dp_group(0, 0)) : 0;
  // The EP overlap's exchanges hold theirs too (ep_exchange_sms). One held
  // pace per compute task: the larger of the two figures, whichever holds.
  const bool ep_overlap = plan_.moe_ep_overlap && shape_.ep > 1;
  const int ep_sms = ep_overlap ? ep_exchange_sms(topo_.cluster(), plan_.moe_dispatcher, plan_.moe_flex, map_.ep_group(0, 0, 0)) : 0;
  pacing_.held_sms = std::max(dp_sms, ep_sms);
  for (int s = 0; s < shape_.pp; ++s) {
    Representative r;
    r.stage = s;
    r.rank = map_.rank_of_data(0, s, shape_.rep_dp);
    r.compute = eng_->add_stream(r.rank, StreamKind::compute);
    r.tp = eng_->add_stream(r.rank, StreamKind::tp);
    r.pp_fwd = eng_->add_stream(r.rank, StreamKind::pp);
    r.pp_bwd = eng_->add_stream(r.rank, StreamKind::pp);
    r.dp = eng_->add_stream(r.rank, StreamKind::dp);
    if (dp_sms > 0) eng_->hold_sms(r.dp, r.compute);
    if (ep_overlap) {
      r.a2a = eng_->add_stream(r.rank, StreamKind::other);
      if (ep_sms > 0) eng_->hold_sms(r.a2a, r.compute);
    }
    // CPU offloading's one copy stream (offload.hpp); none otherwise, so
    // other plans' stream tables stay as they were.
    if (plan_.offloads_activations()) r.offload = eng_->add_stream(r.rank, StreamKind::other);
    if (shape_.tp > 1 && !pacing_.tp_fast) {
      CommGroup g;
      g.ranks = tp_group_of(s, shape_.rep_dp);
      for (int d = 0; d < shape_.dp; ++d) {
        if (d != shape_.rep_dp) g.mirrors.push_back(tp_group_of(s, d));
      }
      r.tp_group = eng_->add_group(std::move(g));
    }
    if (shape_.dp > 1) {
      CommGroup g;
      g.ranks = map_.dp_group(0, s);
      g.rail0_part = folded;
      g.cold_buffers = true;
      for (int t = 1; t < mirrored_tp; ++t) g.mirrors.push_back(map_.dp_group(t, s));
      r.dp_group = eng_->add_group(std::move(g));
    }
    if (shape_.cp > 1) {
      // The representative's CP ring; every other TP rank's and DP
      // replica's ring exchanges at the same time.
      CommGroup g;
      const int rep_d = shape_.rep_dp / shape_.cp;
      g.ranks = map_.cp_group(0, s, rep_d);
      g.rail0_part = folded;
      for (int d = 0; d < shape_.dp / shape_.cp; ++d) {
        for (int t = 0; t < mirrored_tp; ++t) {
          if (t == 0 && d == rep_d) continue;
          g.mirrors.push_back(map_.cp_group(t, s, d));
        }
      }
      r.cp_group = eng_->add_group(std::move(g));
    }
    if (shape_.ep > 1 || shape_.expert_group) add_expert_groups(r);
    representatives_.push_back(r);
  }
  if (shape_.pp > 1) {
    auto p2p_group = [&](int from, int to) {
      CommGroup g;
      g.ranks = {map_.rank_of_data(0, from, shape_.rep_dp), map_.rank_of_data(0, to, shape_.rep_dp)};
      g.rail0_part = folded;
      g.mirrors.reserve(static_cast<std::size_t>(shape_.dp * mirrored_tp), 2);
      for (int d = 0; d < shape_.dp; ++d) {
        for (int t = 0; t < mirrored_tp; ++t) {
          if (t == 0 && d == shape_.rep_dp) continue;
          g.mirrors.push_back({map_.rank_of_data(t, from, d), map_.rank_of_data(t, to, d)});
        }
      }
      return eng_->add_group(std::move(g));
    };
    for (int s = 0; s < shape_.pp; ++s) {
      // Forward s -> s+1 and backward s -> s-1; the wrap-around only with interleaving.
      const bool fwd = s + 1 < shape_.pp || shape_.v > 1;
      const bool bwd = s > 0 || shape_.v > 1;
      traffic_.p2p_fwd_group.push_back(fwd ? p2p_group(s, (s + 1) % shape_.pp) : 0);
      traffic_.p2p_bwd_group.push_back(bwd ? p2p_group(s, (s - 1 + shape_.pp) % shape_.pp) : 0);
    }
  }
}

// TP collectives can be priced off the shared network when no other traffic
// can touch their links: the TP group sits in one node (NVSwitch links only)
// and every DP group and pipeline has one member per node (their traffic
// leaves the GPU through its NIC, never over NVLink). The engine would then
// give each TP collective exactly its uncontended time, so it is measured
// once per (collective, size) on an otherwise empty network and played as a
// fixed-duration task: the same result at a fraction of the cost.
bool Builder::tp_isolated() const {
  if (shape_.tp <= 1) return true;
  if (map_.nodes_spanned(tp_group_of(0, shape_.rep_dp)) != 1) return false;
  if (shape_.dp > 1 && map_.nodes_spanned(map_.dp_group(0, 0)) != shape_.dp) return false;
  if (shape_.pp > 1 && map_.nodes_spanned(map_.pp_group(0, 0)) != shape_.pp) return false;
  return true;
}

// Can the network fold rails (Network::fold_rails)? Every set this builder
// registers must then be closed under the rotation of each node's GPUs. Its
// DP, pipeline and embedding groups list all TP ranks (as the group or its
// mirrors) and its TP groups stay off the network (pacing_.tp_fast), so that holds
// when TP rank t sits on local GPU t of a node the whole TP group fills:
// rotating the GPUs then maps TP rank t to t + 1 and each group onto another.
bool Builder::rails_foldable() const {
  const int gpn = topo_.cluster().gpus_per_node;
  if (shape_.ep > 1 || shape_.expert_group) return false;  // the experts' groups are not listed per TP rank
  if (!topo_.rail_symmetric() || !pacing_.tp_fast || shape_.tp != gpn) return false;
  for (int d = 0; d < shape_.dp; ++d) {
    for (int s = 0; s < shape_.pp; ++s) {
      const int base = map_.rank_of_data(0, s, d);
      if (base % gpn != 0) return false;
      for (int t = 1; t < shape_.tp; ++t) {
        if (map_.rank_of_data(t, s, d) != base + t) return false;
      }
    }
  }
  return true;
}

int Builder::mirrored_tp() const { return net_->rails_folded() ? 1 : shape_.tp; }

void Builder::make_programs() {
  const GpuProfile& gpu = topo_.cluster().gpu;
  const bool sp = plan_.sequence_parallel && shape_.tp > 1;
  const bool ov = opts_.tp_backward_overlap && plan_.trainer.tp_backward_overlap;
  const LayerOps layer = transformer_layer_ops(m_, plan_);
  const bool mixed = m_.has_dense_and_moe_layers();
  const LayerOps dense = mixed ? transformer_layer_ops(m_, plan_, false) : LayerOps{};
  const LayerOps mtp = m_.mtp_layers > 0 ? mtp_ops(m_, plan_) : LayerOps{};
  const LayerOps embed = embedding_ops(m_, plan_);
  const LayerOps head = lm_head_ops(m_, plan_);
  // A full recomputation of some layers of each chunk (block) stores the
  // others: their backward without the recompute (make_units).
  const bool partial = plan_.partial_full_recompute();
  // A GEMM under an async TP collective gets the SMs NCCL's kernel leaves
  // (the intra-node tier's nccl_channels; a TP group across nodes has no
  // such figure and keeps every SM).
  const int gpn = std::max(1, topo_.cluster().gpus_per_node);
  // With Transformer Engine's userbuffers the backward's bulk collectives
  // run on TE's comm kernels' SMs instead (core/tp_overlap.hpp kUbCommSms),
  // and `ub` plays the SP collectives it overlaps with their GEMM.
  const int ub = plan_.trainer.tp_comm_overlap && sp ? shape_.tp : 0;
  pacing_.overlap_sms = shape_.tp > 1 && ov && map_.nodes_spanned(tp_group_of(0, shape_.rep_dp)) == 1 && shape_.tp <= gpn
                     ? (ub > 1 ? kUbCommSms : topo_.cluster().intra.nccl_channels)
                     : 0;
  const int sms = pacing_.overlap_sms;
  const int held = pacing_.held_sms;
  auto fill = [&](Programs& p, double slow) {
    p.layer_fwd = compile(gpu, layer.forward, sp, ov, slow, sms, held, ub);
    // Recomputation runs right before the layer's backward (Megatron's
    // checkpointing recomputes a layer's forward when its backward starts).
    p.layer_bwd = compile(gpu, layer.recompute, sp, ov, slow, sms, held, ub);
    append(p.layer_bwd, compile(gpu, layer.backward, sp, ov, slow, sms, held, ub));
    if (m_.mtp_layers > 0) {
      p.mtp_fwd = compile(gpu, mtp.forward, sp, ov, slow, sms, held, ub);
      p.mtp_bwd = compile(gpu, mtp.recompute, sp, ov, slow, sms, held, ub);
      append(p.mtp_bwd, compile(gpu, mtp.backward, sp, ov, slow, sms, held, ub));
    }
    if (mixed) {
      p.dense_fwd = compile(gpu, dense.forward, sp, ov, slow, sms, held, ub);
      p.dense_bwd = compile(gpu, dense.recompute, sp, ov, slow, sms, held, ub);
      append(p.dense_bwd, compile(gpu, dense.backward, sp, ov, slow, sms, held, ub));
    }
    if (partial) {
      p.layer_bwd_stored = compile(gpu, layer.backward, sp, ov, slow, sms, held, ub);
      if (mixed) p.dense_bwd_stored = compile(gpu, dense.backward, sp, ov, slow, sms, held, ub);
    }
    p.embed_fwd = compile(gpu, embed.forward, sp, ov, slow, sms, held, ub);
    p.embed_bwd = compile(gpu, embed.backward, sp, ov, slow, sms, held, ub);
    p.head_fwd = compile(gpu, head.forward, sp, ov, slow, sms, held, ub);
    p.head_bwd = compile(gpu, head.backward, sp, ov, slow, sms, held, ub);
    if (zero3_tensor()) {
      auto parts = [&](std::vector<Program>& out, const std::vector<Op>& ops, Pass pass) {
        for (const WeightPart& w : split_by_weight(ops, pass)) {
          const std::vector<Op> slice(ops.begin() + static_cast<std::ptrdiff_t>(w.first),
                                      ops.begin() + static_cast<std::ptrdiff_t>(w.end));
          out.push_back(compile(gpu, slice, sp, ov, slow, sms, held, ub));
        }
      };
      parts(p.layer_fwd_parts, layer.forward, Pass::forward);
      parts(p.layer_bwd_parts, layer.recompute, Pass::forward);
      parts(p.layer_bwd_parts, layer.backward, Pass::backward);
      if (partial) parts(p.layer_bwd_stored_parts, layer.backward, Pass::backward);
    }
  };
  if (zero3_tensor()) {
    for (const WeightPart& w : split_by_weight(layer.forward, Pass::forward))
      work_.fwd_part_weights.push_back({w.weight, false});
    for (const WeightPart& w : split_by_weight(layer.recompute, Pass::forward))
      work_.bwd_part_weights.push_back({w.weight, false});
    for (const WeightPart& w : split_by_weight(layer.backward, Pass::backward)) {
      work_.bwd_part_weights.push_back({w.weight, true});
      if (partial) work_.bwd_stored_part_weights.push_back({w.weight, true});
    }
  }
  // Each stage's simulated GPU stands for its tp x dp GPUs and waits for the
  // slowest of them at every TP collective and DP reduction: it computes at
  // its stratum's slowest-of-tp x dp speed (speed_spread.hpp), so which stage
  // paces the pipeline comes out of the schedule. A straggler multiplies in.
  pacing_.compute_factor = stage_spread_factors(gpu.speed_spread, shape_.tp, shape_.pp, shape_.dp);
  if (pacing_.straggler_stage >= 0) pacing_.compute_factor[static_cast<std::size_t>(pacing_.straggler_stage)] *= pacing_.straggler_slowdown;
  std::vector<double> factors;
  work_.stage_programs.clear();
  for (double f : pacing_.compute_factor) {
    const auto it = std::find(factors.begin(), factors.end(), f);
    work_.stage_programs.push_back(static_cast<std::size_t>(it - factors.begin()));
    if (it == factors.end()) factors.push_back(f);
  }
  work_.programs.assign(factors.size(), Programs{});
  for (std::size_t i = 0; i < factors.size(); ++i) fill(work_.programs[i], factors[i]);
}

void Builder::make_units() {
  // A layer's parameters on the GPU (an MoE model's: its MoE layers' and
  // its dense layers').
  const double per_layer = layer_parameters_on_gpu(m_, plan_, m_.moe.enabled());
  const double per_layer_expert = layer_parameter_split(m_, plan_, m_.moe.enabled()).expert;
  const double per_dense_layer = layer_parameters_on_gpu(m_, plan_, false);
  auto is_moe = [&](int layer) { return m_.moe.enabled() && m_.moe.moe_layers[static_cast<std::size_t>(layer)]; };
  work_.units.assign(static_cast<std::size_t>(shape_.pp), {});
  for (int s = 0; s < shape_.pp; ++s) {
    const Programs& p = work_.programs[work_.stage_programs[static_cast<std::size_t>(s)]];
    const int layers_stage = layers_on_stage(plan_, m_.num_layers, s);
    // Parameters beyond the layers: embedding (first stage) and LM head (last).
    const int moe_layers = moe_layers_on_stage(m_, plan_, s);
    double extra = parameters_on_stage(m_, plan_, s) -
                   (m_.moe.enabled() ? per_layer * moe_layers + per_dense_layer * (layers_stage - moe_layers)
                                     : per_layer * layers_stage);
    const double embed_params =
        static_cast<double>(padded_vocab_size(m_.vocab_size, shape_.tp)) / shape_.tp * static_cast<double>(m_.hidden_size);
    auto& chunks = work_.units[static_cast<std::size_t>(s)];
    chunks.resize(static_cast<std::size_t>(shape_.v));
    for (int c = 0; c < shape_.v; ++c) {
      const int vs = c * shape_.pp + s;
      auto& units = chunks[static_cast<std::size_t>(c)];
      if (vs == 0) {
        const double e = shape_.vs_count == 1 ? std::min(extra, embed_params) : extra;
        units.push_back(Unit{&p.embed_fwd, &p.embed_bwd, std::max(0.0, e), "embedding", {}, {}});
        extra -= e;
      }
      const int first = first_layer_of_chunk(plan_, m_.num_layers, s, c);
      const int per_chunk = layers_in_chunk(plan_, m_.num_layers, s, c);
      for (int l = 0; l < per_chunk; ++l) {
        const std::string label = "layer " + std::to_string(first + l);  // the layer's index in the model
        // Uniform groups of N re-run each layer's forward before its own
        // backward here (the group's N forwards before its N backwards in
        // Megatron-Core: the same work, in another order).
        const bool stored = plan_.recompute == Recompute::full && !recomputes_layer(plan_, l);
        if (!is_moe(first + l) && m_.moe.enabled())
          units.push_back(Unit{&p.dense_fwd, stored ? &p.dense_bwd_stored : &p.dense_bwd, per_dense_layer, label, {}, {}});
        else
          units.push_back(Unit{&p.layer_fwd, stored ? &p.layer_bwd_stored : &p.layer_bwd, per_layer, label, {}, {}});
        units.back().layer = first + l;
        if (units.back().fwd == &p.layer_fwd) units.back().expert = per_layer_expert;
      }
      if (vs == shape_.vs_count - 1) {
        // The multi-token prediction modules after the layers (each with its
        // own lookup, layer and loss), then the LM head.
        const StageParameters mtp = mtp_parameters(m_, plan_);
        const auto mtp_count = static_cast<double>(std::max<std::int64_t>(1, m_.mtp_layers));
        const double mtp_params = mtp.total() / mtp_count;
        for (std::int64_t k = 0; k < m_.mtp_layers; ++k) {
          units.push_back(Unit{&p.mtp_fwd, &p.mtp_bwd, mtp_params, "mtp " + std::to_string(k), {}, {}});
          units.back().expert = mtp.expert / mtp_count;
          extra -= mtp_params;
        }
        units.push_back(Unit{&p.head_fwd, &p.head_bwd, std::max(0.0, extra), "lm_head", {}, {}});
      }
      if (shape_.dp > 1 && plan_.zero_stage >= 3) make_parts(units, p);
    }
  }
}

bool Builder::zero3_tensor() const {
  return shape_.dp > 1 && plan_.zero_stage >= 3 && plan_.trainer.zero3_unit == Zero3Unit::tensor;
}

// ZeRO-3's parts of a chunk's units. Block units are one part each. Tensor
// units cut a layer per weight: each weight and bias is gathered unless it
// is below the persistence threshold, and the part after a weight's
// backward carries its gradients, weight then bias (the last one also those
// of the layer's norms, which are reduced too). The embedding and the LM
// head stay one part each, one tensor each.
void Builder::make_parts(std::vector<Unit>& units, const Programs& p) {
  const bool tensor = zero3_tensor();
  const std::vector<LayerWeight> weights = tensor ? layer_weights(m_, plan_) : std::vector<LayerWeight>{};
  const auto persist = static_cast<double>(plan_.trainer.zero3_persist_params);
  auto gathered = [&](const LayerWeight& w) {
    return (w.weight >= persist ? w.weight : 0.0) + (w.bias >= persist ? w.bias : 0.0);
  };
  // A layer's quantized linear weights (FP8 / FP4 plans), per GPU.
  const bool quantizes = plan_.precision != Precision::bf16;
  const double quantized_layer = quantizes ? quantized_weight_elements(transformer_layer_ops(m_, plan_, m_.moe.enabled())) : 0.0;
  const double quantized_dense = quantizes ? quantized_weight_elements(transformer_layer_ops(m_, plan_, false)) : 0.0;
  const double quantized_expert = quantized_layer_weights(m_, plan_, m_.moe.enabled()).expert;
  for (std::size_t k = 0; k < units.size(); ++k) {
    Unit& u = units[k];
    u.fwd_parts.clear();
    u.bwd_parts.clear();
    if (!tensor || u.fwd != &p.layer_fwd) {
      const double q = u.fwd == &p.layer_fwd ? quantized_layer : u.fwd == &p.dense_fwd ? quantized_dense : 0.0;
      // The routed experts: gathered and reduced over expert-DP where it
      // shards them, resident (and reduced nowhere) where it is one rank.
      const bool sharded = shape_.edp > 1;
      const double expert = sharded ? u.expert : 0.0;
      const double params = u.params - (sharded ? 0.0 : u.expert);
      const double eq = expert > 0 && u.fwd == &p.layer_fwd ? quantized_expert : 0.0;
      Part fp{u.fwd, params, 0, {}, -1, u.name, q};
      Part bp{u.bwd, params, params, {params - expert}, -1, u.name, q};
      fp.expert = bp.expert = expert;
      fp.expert_quantized = bp.expert_quantized = eq;
      bp.expert_grads = expert;
      u.fwd_parts.push_back(std::move(fp));
      u.bwd_parts.push_back(std::move(bp));
      continue;
    }
    const auto base = static_cast<std::int64_t>(k) * 8;
    auto part = [&](const Program& prog, const PartWeight& pw) {
      if (pw.weight < 0) return Part{&prog, 0, 0, {}, -1, u.name, 0};
      const LayerWeight& w = weights[static_cast<std::size_t>(pw.weight)];
      Part pt{&prog, gathered(w), 0, {}, base + pw.weight, u.name + " " + w.op,
              quantizes && w.weight >= persist ? w.weight : 0.0};
      if (pw.grads) {
        pt.grad_tensors.push_back(w.weight);
        if (w.bias > 0) pt.grad_tensors.push_back(w.bias);
        pt.grads = w.weight + w.bias;
      }
      return pt;
    };
    for (std::size_t i = 0; i < work_.fwd_part_weights.size(); ++i)
      u.fwd_parts.push_back(part(p.layer_fwd_parts[i], work_.fwd_part_weights[i]));
    double grads = 0;
    const bool stored = u.bwd == &p.layer_bwd_stored;
    const std::vector<PartWeight>& weights_bwd = stored ? work_.bwd_stored_part_weights : work_.bwd_part_weights;
    for (std::size_t i = 0; i < weights_bwd.size(); ++i) {
      u.bwd_parts.push_back(part(stored ? p.layer_bwd_stored_parts[i] : p.layer_bwd_parts[i], weights_bwd[i]));
      grads += u.bwd_parts.back().grads;
    }
    // The rest of the layer: its two norms' weights (and LayerNorm's biases).
    const double norms = std::max(0.0, u.params - grads);
    const int norm_tensors = m_.normalization == Normalization::layernorm ? 4 : 2;
    Part& last = u.bwd_parts.back();
    for (int i = 0; i < norm_tensors && norms > 0; ++i) last.grad_tensors.push_back(norms / norm_tensors);
    last.grads += norms;
  }
}

void Builder::build() {
  pacing_.tp_fast = tp_isolated();
  if (opts_.fold_rails && rails_foldable()) net_->fold_rails();
  make_representatives();
  make_programs();
  make_units();
  if (plan_.offloads_activations()) {
    offload_ = activation_offload(m_, plan_);
    const HostLink& link = topo_.cluster().host_link;
    for (int i = 0; i < offload_.offloaded; ++i) {
      const double bytes = offloaded_layer_bytes(m_, plan_, i);
      offload_ns_.push_back(host_copy_ns(link, bytes, true));
      reload_ns_.push_back(host_copy_ns(link, bytes, false));
    }
  }
  passes_.assign(static_cast<std::size_t>(2 * shape_.mbs * shape_.vs_count), PassState{});
  cursor_.assign(static_cast<std::size_t>(shape_.pp), 0);
  stage_end_.assign(static_cast<std::size_t>(shape_.pp), {});
  traffic_.dp_tasks.assign(static_cast<std::size_t>(shape_.pp), {});
  traffic_.played_bytes.assign(static_cast<std::size_t>(shape_.pp) * 3 * kCollectiveKinds, 0.0);
  traffic_.messages.plan(order_, plan_.schedule, shape_.pp, shape_.mbs, shape_.v, plan_.moe_ep_overlap && shape_.ep > 1);
  reserve_tasks();
  plan_gathers_ahead();
  // The step before the schedule where the first chunk's gather runs under it (optimizer_step).
  if (step_.gathers_in_step())
    for (int s = 0; s < shape_.pp; ++s) optimizer_step(s, {});
  // Add passes in an order consistent with their dependencies: round-robin
  // over the stages, each as far as its next pass's inputs already exist.
  bool progress = true;
  std::size_t remaining = 0;
  for (const StageOrder& o : order_) remaining += o.size();
  while (remaining > 0 && progress) {
    progress = false;
    for (int s = 0; s < shape_.pp; ++s) {
      const auto us = static_cast<std::size_t>(s);
      while (cursor_[us] < order_[us].size() && can_add(s, cursor_[us])) {
        const std::size_t pos = cursor_[us];
        add_step(s, pos);
        ++cursor_[us];
        --remaining;
        progress = true;
        for (std::uint32_t id : traffic_.messages.messages_at(traffic_.messages.point(s, static_cast<int>(pos)))) try_message(id);
      }
    }
  }
  if (remaining > 0) throw std::logic_error("simulate: the pipeline schedule deadlocks (a bug in the schedule)");
  finish_iteration();
}

// Where the aligned interleaved schedule issues each chunk's gathers
// (Megatron-LM d98e8a64 pipeline_parallel/schedules.py: the first two
// chunks' at its start, :1219-1221; before virtual micro-batch k, chunk
// c + 1's where k + the stage's rank is chunk c's first, :1341-1353, so that
// every stage issues it at once); chunk_gathers_ empty for each chunk.
void Builder::plan_gathers_ahead() {
  const auto pp = static_cast<std::size_t>(shape_.pp);
  const auto v = static_cast<std::size_t>(shape_.v);
  chunk_gathers_.assign(pp, std::vector<ChunkGathers>(v));
  gathers_ahead_.clear();
  if (!step_.gathers_in_next_forward() || !plan_.aligns_param_gather()) return;
  gathers_ahead_.resize(pp);
  for (std::size_t s = 0; s < pp; ++s) {
    const StageOrder& order = order_[s];
    gathers_ahead_[s].assign(order.size(), {});
    std::vector<std::size_t> forwards;  // the steps of the stage's forwards, in order
    std::vector<int> first(v, -1);      // each chunk's first forward, as an index into `forwards`
    for (std::size_t idx = 0; idx < order.size(); ++idx) {
      if (order[idx].dir != Direction::forward) continue;
      const auto c = static_cast<std::size_t>(order[idx].chunk);
      if (order[idx].micro_batch == 0 && first[c] < 0) first[c] = static_cast<int>(forwards.size());
      forwards.push_back(idx);
    }
    if (forwards.empty()) continue;
    for (int c = 0; c < std::min(2, shape_.v); ++c)
      if (!(c == 0 && step_.gathers_in_step())) gathers_ahead_[s][forwards.front()].push_back(c);
    for (std::size_t c = 2; c < v; ++c) {
      const int k = first[c - 1] - static_cast<int>(s);
      if (first[c - 1] >= 0 && k >= 0 && static_cast<std::size_t>(k) < forwards.size())
        gathers_ahead_[s][forwards[static_cast<std::size_t>(k)]].push_back(static_cast<int>(c));
    }
  }
}

// An upper bound on the tasks build() adds (each program item is at most one
// task; each message a send/recv and a gather; a few per stage at the end),
// reserved up front: regrowing the task tables of a million-task iteration
// would copy them and touch twice the memory.
void Builder::reserve_tasks() {
  std::size_t n = 2 * traffic_.messages.num_messages() + 8 * static_cast<std::size_t>(shape_.pp) + 16;
  for (int s = 0; s < shape_.pp; ++s) {
    const auto us = static_cast<std::size_t>(s);
    for (const ScheduleStep& st : order_[us]) {
      const bool fwd = st.dir == Direction::forward;
      const auto& units = work_.units[us][static_cast<std::size_t>(st.chunk)];
      n += 4 * units.size() + 2;  // ZeRO gathers, DP buckets, joins
      for (const Unit& u : units) {
        n += (fwd ? u.fwd : u.bwd)->items.size();
        // ZeRO-3 parts: gather, zero fill, copies, wait, reduction and its copies.
        for (const Part& pt : fwd ? u.fwd_parts : u.bwd_parts) n += 8 + pt.prog->items.size();
      }
    }
  }
  eng_->reserve(n, n + n / 2);
  meta_.reserve(n);
}

void Builder::add_expert_groups(Representative& r) {
  const int s = r.stage;
  const int etp = plan_.expert_tp();
  const int index = shape_.tp * shape_.rep_dp;  // the representative's index among the stage's TP x CP x DP ranks
  const int rep_etp = index % etp, rep_ep = index / etp % shape_.ep, rep_edp = index / (etp * shape_.ep);
  if (shape_.ep > 1) {
    // The representative's EP group; every other EP group of the stage
    // exchanges at the same time.
    CommGroup g;
    g.ranks = map_.ep_group(s, rep_edp, rep_etp);
    for (int d = 0; d < shape_.edp; ++d)
      for (int t = 0; t < etp; ++t)
        if (d != rep_edp || t != rep_etp) g.mirrors.push_back(map_.ep_group(s, d, t));
    const bool own_dispatch = plan_.moe_dispatcher != MoeDispatcher::alltoall;
    if (own_dispatch) {
      // The dispatcher's flows: copies per node and per NVLink peer
      // (dispatch_traffic), at the flex backend's measured share of each link
      // (flex_kernels: NVLink domains are the nodes).
      const int gpn = std::max(1, topo_.cluster().gpus_per_node);
      std::vector<int> nodes;
      for (int x : g.ranks)
        if (std::find(nodes.begin(), nodes.end(), x / gpn) == nodes.end()) nodes.push_back(x / gpn);
      const EpSpread spread{static_cast<int>(g.ranks.size()), static_cast<int>(nodes.size())};
      const DispatchTraffic t = dispatch_traffic(plan_.moe_dispatcher, m_.moe, m_.hidden_size, 1.0, spread);
      const FlexKernels k =
          plan_.moe_dispatcher == MoeDispatcher::flex ? flex_kernels(plan_.moe_flex, spread.nodes) : FlexKernels{};
      CommGroup d = g;
      d.dispatch = CommGroup::DispatchWeights{};
      if (spread.nodes > 1) d.dispatch->node = t.node_copies / (spread.nodes - 1) / k.rdma_efficiency;
      if (spread.per_node() > 1) d.dispatch->nvlink = t.nvlink_copies / (spread.per_node() - 1) / k.nvlink_efficiency;
      r.ep_dispatch_group = eng_->add_group(std::move(d));
    }
    r.ep_group = eng_->add_group(std::move(g));
    if (!own_dispatch) r.ep_dispatch_group = r.ep_group;
  }
  if (shape_.expert_group) {
    CommGroup g;
    g.ranks = map_.expert_dp_group(s, rep_ep, rep_etp);
    g.cold_buffers = true;
    for (int e = 0; e < shape_.ep; ++e)
      for (int t = 0; t < etp; ++t)
        if (e != rep_ep || t != rep_etp) g.mirrors.push_back(map_.expert_dp_group(s, e, t));
    r.edp_group = eng_->add_group(std::move(g));
  }
}

}  // namespace cuboid::sim::detail
