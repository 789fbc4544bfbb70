// The task graph of one iteration (see simulator.cpp for the model it plays).
#include "builder.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cuboid/core/calibration.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::sim::detail {

namespace {

constexpr TaskId kNoTask = std::numeric_limits<TaskId>::max();

std::string step_name(Direction d, int mb, int chunk, int v) {
  std::string s = d == Direction::forward ? "F" : "B";
  s += std::to_string(mb);
  if (v > 1) s += "." + std::to_string(chunk);
  return s;
}

}  // namespace

Builder::Builder(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan, const SimOptions& opts)
    : m_(m),
      topo_(topo),
      plan_(plan),
      opts_(opts),
      map_(plan, topo.cluster().gpus_per_node),
      step_(m, plan, topo.cluster().calibration.get()) {
  pp_ = std::max(1, plan.pp);
  v_ = plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
  vs_count_ = pp_ * v_;
  mbs_ = static_cast<int>(std::max<std::int64_t>(1, plan.num_micro_batches()));
  tp_ = std::max(1, plan.tp);
  // The data index (DP x CP ranks): every DP loop below runs over it.
  dp_ = std::max(1, plan.dp_cp());
  cp_ = std::max(1, plan.cp);
  if (m.moe.enabled()) {
    ep_ = std::max(1, plan.ep);
    edp_ = plan.expert_dp();
    expert_group_ = edp_ > 1 && (ep_ > 1 || plan.expert_tp() != tp_);
    for (int s = 0; s < std::max(1, plan.pp); ++s) {
      const StageParameters sp = stage_parameters(m, plan, s);
      expert_share_.push_back(sp.total() > 0 ? sp.expert / sp.total() : 0.0);
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
    straggler_stage_ = c.pp;
    straggler_slowdown_ = opts.straggler->slowdown;
    rep_dp_ = c.dp * cp_ + c.cp;  // the slowest replica sets the pace of every DP collective
  }
  order_ = pipeline_order(plan.schedule, pp_, mbs_, v_);
  tp_probe_ = TpProbe(topo.cluster(), tp_group_of(0, rep_dp_));
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
  traced_stages_.assign(static_cast<std::size_t>(pp_), tracing && (opts_.timeline || opts_.trace_ranks.empty()));
  for (int r : opts_.trace_ranks) {
    if (tracing && r >= 0 && r < plan_.world_size()) traced_stages_[static_cast<std::size_t>(map_.coord(r).pp)] = true;
  }
  if (!tracing) traced_stages_.clear();
  const bool folded = net_->rails_folded();
  const int mirrored_tp = this->mirrored_tp();
  // The SMs NCCL's kernel holds on a DP group's GPUs while a gradient
  // reduction or a ZeRO gather runs beside the compute (nccl_ring_channels).
  if (dp_ > 1) held_sms_ = nccl_ring_channels(topo_.cluster(), map_.dp_group(0, 0));
  for (int s = 0; s < pp_; ++s) {
    Representative r;
    r.stage = s;
    r.rank = map_.rank_of_data(0, s, rep_dp_);
    r.compute = eng_->add_stream(r.rank, StreamKind::compute);
    r.tp = eng_->add_stream(r.rank, StreamKind::tp);
    r.pp_fwd = eng_->add_stream(r.rank, StreamKind::pp);
    r.pp_bwd = eng_->add_stream(r.rank, StreamKind::pp);
    r.dp = eng_->add_stream(r.rank, StreamKind::dp);
    if (held_sms_ > 0) eng_->hold_sms(r.dp, r.compute);
    if (tp_ > 1 && !tp_fast_) {
      CommGroup g;
      g.ranks = tp_group_of(s, rep_dp_);
      for (int d = 0; d < dp_; ++d) {
        if (d != rep_dp_) g.mirrors.push_back(tp_group_of(s, d));
      }
      r.tp_group = eng_->add_group(std::move(g));
    }
    if (dp_ > 1) {
      CommGroup g;
      g.ranks = map_.dp_group(0, s);
      g.rail0_part = folded;
      for (int t = 1; t < mirrored_tp; ++t) g.mirrors.push_back(map_.dp_group(t, s));
      r.dp_group = eng_->add_group(std::move(g));
    }
    if (cp_ > 1) {
      // The representative's CP ring; every other TP rank's and DP
      // replica's ring exchanges at the same time.
      CommGroup g;
      const int rep_d = rep_dp_ / cp_;
      g.ranks = map_.cp_group(0, s, rep_d);
      g.rail0_part = folded;
      for (int d = 0; d < dp_ / cp_; ++d) {
        for (int t = 0; t < mirrored_tp; ++t) {
          if (t == 0 && d == rep_d) continue;
          g.mirrors.push_back(map_.cp_group(t, s, d));
        }
      }
      r.cp_group = eng_->add_group(std::move(g));
    }
    if (ep_ > 1 || expert_group_) add_expert_groups(r);
    representatives_.push_back(r);
  }
  if (pp_ > 1) {
    auto p2p_group = [&](int from, int to) {
      CommGroup g;
      g.ranks = {map_.rank_of_data(0, from, rep_dp_), map_.rank_of_data(0, to, rep_dp_)};
      g.rail0_part = folded;
      g.mirrors.reserve(static_cast<std::size_t>(dp_ * mirrored_tp), 2);
      for (int d = 0; d < dp_; ++d) {
        for (int t = 0; t < mirrored_tp; ++t) {
          if (t == 0 && d == rep_dp_) continue;
          g.mirrors.push_back({map_.rank_of_data(t, from, d), map_.rank_of_data(t, to, d)});
        }
      }
      return eng_->add_group(std::move(g));
    };
    for (int s = 0; s < pp_; ++s) {
      // Forward s -> s+1 and backward s -> s-1; the wrap-around only with interleaving.
      const bool fwd = s + 1 < pp_ || v_ > 1;
      const bool bwd = s > 0 || v_ > 1;
      p2p_fwd_group_.push_back(fwd ? p2p_group(s, (s + 1) % pp_) : 0);
      p2p_bwd_group_.push_back(bwd ? p2p_group(s, (s - 1 + pp_) % pp_) : 0);
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
  if (tp_ <= 1) return true;
  if (map_.nodes_spanned(tp_group_of(0, rep_dp_)) != 1) return false;
  if (dp_ > 1 && map_.nodes_spanned(map_.dp_group(0, 0)) != dp_) return false;
  if (pp_ > 1 && map_.nodes_spanned(map_.pp_group(0, 0)) != pp_) return false;
  return true;
}

// Can the network fold rails (Network::fold_rails)? Every set this builder
// registers must then be closed under the rotation of each node's GPUs. Its
// DP, pipeline and embedding groups list all TP ranks (as the group or its
// mirrors) and its TP groups stay off the network (tp_fast_), so that holds
// when TP rank t sits on local GPU t of a node the whole TP group fills:
// rotating the GPUs then maps TP rank t to t + 1 and each group onto another.
bool Builder::rails_foldable() const {
  const int gpn = topo_.cluster().gpus_per_node;
  if (ep_ > 1 || expert_group_) return false;  // the experts' groups are not listed per TP rank
  if (!topo_.rail_symmetric() || !tp_fast_ || tp_ != gpn) return false;
  for (int d = 0; d < dp_; ++d) {
    for (int s = 0; s < pp_; ++s) {
      const int base = map_.rank_of_data(0, s, d);
      if (base % gpn != 0) return false;
      for (int t = 1; t < tp_; ++t) {
        if (map_.rank_of_data(t, s, d) != base + t) return false;
      }
    }
  }
  return true;
}

int Builder::mirrored_tp() const { return net_->rails_folded() ? 1 : tp_; }

void Builder::make_programs() {
  const GpuProfile& gpu = topo_.cluster().gpu;
  const bool sp = plan_.sequence_parallel && tp_ > 1;
  const bool ov = opts_.tp_backward_overlap && plan_.trainer.tp_backward_overlap;
  const LayerOps layer = transformer_layer_ops(m_, plan_);
  const bool mixed = m_.has_dense_and_moe_layers();
  const LayerOps dense = mixed ? transformer_layer_ops(m_, plan_, false) : LayerOps{};
  const LayerOps mtp = m_.mtp_layers > 0 ? mtp_ops(m_, plan_) : LayerOps{};
  const LayerOps embed = embedding_ops(m_, plan_);
  const LayerOps head = lm_head_ops(m_, plan_);
  // A GEMM under an async TP collective gets the SMs NCCL's kernel leaves
  // (the intra-node tier's nccl_channels; a TP group across nodes has no
  // such figure and keeps every SM).
  const int gpn = std::max(1, topo_.cluster().gpus_per_node);
  overlap_sms_ = tp_ > 1 && ov && map_.nodes_spanned(tp_group_of(0, rep_dp_)) == 1 && tp_ <= gpn
                     ? topo_.cluster().intra.nccl_channels
                     : 0;
  const int sms = overlap_sms_;
  const int held = held_sms_;
  auto fill = [&](Programs& p, double slow) {
    p.layer_fwd = compile(gpu, layer.forward, sp, ov, slow, sms, held);
    // Recomputation runs right before the layer's backward (Megatron's
    // checkpointing recomputes a layer's forward when its backward starts).
    p.layer_bwd = compile(gpu, layer.recompute, sp, ov, slow, sms, held);
    append(p.layer_bwd, compile(gpu, layer.backward, sp, ov, slow, sms, held));
    if (m_.mtp_layers > 0) {
      p.mtp_fwd = compile(gpu, mtp.forward, sp, ov, slow, sms, held);
      p.mtp_bwd = compile(gpu, mtp.recompute, sp, ov, slow, sms, held);
      append(p.mtp_bwd, compile(gpu, mtp.backward, sp, ov, slow, sms, held));
    }
    if (mixed) {
      p.dense_fwd = compile(gpu, dense.forward, sp, ov, slow, sms, held);
      p.dense_bwd = compile(gpu, dense.recompute, sp, ov, slow, sms, held);
      append(p.dense_bwd, compile(gpu, dense.backward, sp, ov, slow, sms, held));
    }
    p.embed_fwd = compile(gpu, embed.forward, sp, ov, slow, sms, held);
    p.embed_bwd = compile(gpu, embed.backward, sp, ov, slow, sms, held);
    p.head_fwd = compile(gpu, head.forward, sp, ov, slow, sms, held);
    p.head_bwd = compile(gpu, head.backward, sp, ov, slow, sms, held);
    if (zero3_tensor()) {
      auto parts = [&](std::vector<Program>& out, const std::vector<Op>& ops, Pass pass) {
        for (const WeightPart& w : split_by_weight(ops, pass)) {
          const std::vector<Op> slice(ops.begin() + static_cast<std::ptrdiff_t>(w.first),
                                      ops.begin() + static_cast<std::ptrdiff_t>(w.end));
          out.push_back(compile(gpu, slice, sp, ov, slow, sms, held));
        }
      };
      parts(p.layer_fwd_parts, layer.forward, Pass::forward);
      parts(p.layer_bwd_parts, layer.recompute, Pass::forward);
      parts(p.layer_bwd_parts, layer.backward, Pass::backward);
    }
  };
  if (zero3_tensor()) {
    for (const WeightPart& w : split_by_weight(layer.forward, Pass::forward))
      fwd_part_weights_.push_back({w.weight, false});
    for (const WeightPart& w : split_by_weight(layer.recompute, Pass::forward))
      bwd_part_weights_.push_back({w.weight, false});
    for (const WeightPart& w : split_by_weight(layer.backward, Pass::backward))
      bwd_part_weights_.push_back({w.weight, true});
  }
  // Each stage's simulated GPU stands for its tp x dp GPUs and waits for the
  // slowest of them at every TP collective and DP reduction: it computes at
  // its stratum's slowest-of-tp x dp speed (speed_spread.hpp), so which stage
  // paces the pipeline comes out of the schedule. A straggler multiplies in.
  compute_factor_ = stage_spread_factors(gpu.speed_spread, tp_, pp_, dp_);
  if (straggler_stage_ >= 0) compute_factor_[static_cast<std::size_t>(straggler_stage_)] *= straggler_slowdown_;
  std::vector<double> factors;
  stage_programs_.clear();
  for (double f : compute_factor_) {
    const auto it = std::find(factors.begin(), factors.end(), f);
    stage_programs_.push_back(static_cast<std::size_t>(it - factors.begin()));
    if (it == factors.end()) factors.push_back(f);
  }
  programs_.assign(factors.size(), Programs{});
  for (std::size_t i = 0; i < factors.size(); ++i) fill(programs_[i], factors[i]);
}

void Builder::make_units() {
  // A layer's parameters on the GPU (an MoE model's: its MoE layers' and
  // its dense layers').
  const double per_layer = layer_parameters_on_gpu(m_, plan_, m_.moe.enabled());
  const double per_dense_layer = layer_parameters_on_gpu(m_, plan_, false);
  auto is_moe = [&](int layer) { return m_.moe.enabled() && m_.moe.moe_layers[static_cast<std::size_t>(layer)]; };
  units_.assign(static_cast<std::size_t>(pp_), {});
  for (int s = 0; s < pp_; ++s) {
    const Programs& p = programs_[stage_programs_[static_cast<std::size_t>(s)]];
    const int layers_stage = layers_on_stage(plan_, m_.num_layers, s);
    const int per_chunk = layers_stage / v_;
    // Parameters beyond the layers: embedding (first stage) and LM head (last).
    const int moe_layers = moe_layers_on_stage(m_, plan_, s);
    double extra = parameters_on_stage(m_, plan_, s) -
                   (m_.moe.enabled() ? per_layer * moe_layers + per_dense_layer * (layers_stage - moe_layers)
                                     : per_layer * layers_stage);
    const double embed_params =
        static_cast<double>(padded_vocab_size(m_.vocab_size, tp_)) / tp_ * static_cast<double>(m_.hidden_size);
    auto& chunks = units_[static_cast<std::size_t>(s)];
    chunks.resize(static_cast<std::size_t>(v_));
    for (int c = 0; c < v_; ++c) {
      const int vs = c * pp_ + s;
      auto& units = chunks[static_cast<std::size_t>(c)];
      if (vs == 0) {
        const double e = vs_count_ == 1 ? std::min(extra, embed_params) : extra;
        units.push_back(Unit{&p.embed_fwd, &p.embed_bwd, std::max(0.0, e), "embedding", {}, {}});
        extra -= e;
      }
      const int first = first_layer_of_chunk(plan_, m_.num_layers, s, c);
      for (int l = 0; l < per_chunk; ++l) {
        const std::string label = "layer " + std::to_string(first + l);  // the layer's index in the model
        if (!is_moe(first + l) && m_.moe.enabled())
          units.push_back(Unit{&p.dense_fwd, &p.dense_bwd, per_dense_layer, label, {}, {}});
        else
          units.push_back(Unit{&p.layer_fwd, &p.layer_bwd, per_layer, label, {}, {}});
      }
      if (vs == vs_count_ - 1) {
        // The multi-token prediction modules after the layers (each with its
        // own lookup, layer and loss), then the LM head.
        const double mtp_params = mtp_parameters(m_, plan_).total() / static_cast<double>(std::max<std::int64_t>(1, m_.mtp_layers));
        for (std::int64_t k = 0; k < m_.mtp_layers; ++k) {
          units.push_back(Unit{&p.mtp_fwd, &p.mtp_bwd, mtp_params, "mtp " + std::to_string(k), {}, {}});
          extra -= mtp_params;
        }
        units.push_back(Unit{&p.head_fwd, &p.head_bwd, std::max(0.0, extra), "lm_head", {}, {}});
      }
      if (dp_ > 1 && plan_.zero_stage >= 3) make_parts(units, p);
    }
  }
}

bool Builder::zero3_tensor() const {
  return dp_ > 1 && plan_.zero_stage >= 3 && plan_.trainer.zero3_unit == Zero3Unit::tensor;
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
  for (std::size_t k = 0; k < units.size(); ++k) {
    Unit& u = units[k];
    u.fwd_parts.clear();
    u.bwd_parts.clear();
    if (!tensor || u.fwd != &p.layer_fwd) {
      u.fwd_parts.push_back(Part{u.fwd, u.params, 0, {}, -1, u.name});
      u.bwd_parts.push_back(Part{u.bwd, u.params, u.params, {u.params}, -1, u.name});
      continue;
    }
    const auto base = static_cast<std::int64_t>(k) * 8;
    auto part = [&](const Program& prog, const PartWeight& pw) {
      if (pw.weight < 0) return Part{&prog, 0, 0, {}, -1, u.name};
      const LayerWeight& w = weights[static_cast<std::size_t>(pw.weight)];
      Part pt{&prog, gathered(w), 0, {}, base + pw.weight, u.name + " " + w.op};
      if (pw.grads) {
        pt.grad_tensors.push_back(w.weight);
        if (w.bias > 0) pt.grad_tensors.push_back(w.bias);
        pt.grads = w.weight + w.bias;
      }
      return pt;
    };
    for (std::size_t i = 0; i < fwd_part_weights_.size(); ++i)
      u.fwd_parts.push_back(part(p.layer_fwd_parts[i], fwd_part_weights_[i]));
    double grads = 0;
    for (std::size_t i = 0; i < bwd_part_weights_.size(); ++i) {
      u.bwd_parts.push_back(part(p.layer_bwd_parts[i], bwd_part_weights_[i]));
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
  tp_fast_ = tp_isolated();
  if (opts_.fold_rails && rails_foldable()) net_->fold_rails();
  make_representatives();
  make_programs();
  make_units();
  passes_.assign(static_cast<std::size_t>(2 * mbs_ * vs_count_), PassState{});
  cursor_.assign(static_cast<std::size_t>(pp_), 0);
  stage_end_.assign(static_cast<std::size_t>(pp_), {});
  dp_tasks_.assign(static_cast<std::size_t>(pp_), {});
  played_bytes_.assign(static_cast<std::size_t>(pp_) * 3 * kCollectiveKinds, 0.0);
  messages_.plan(order_, plan_.schedule, pp_, mbs_, v_);
  reserve_tasks();
  // Add passes in an order consistent with their dependencies: round-robin
  // over the stages, each as far as its next pass's inputs already exist.
  bool progress = true;
  std::size_t remaining = 0;
  for (const StageOrder& o : order_) remaining += o.size();
  while (remaining > 0 && progress) {
    progress = false;
    for (int s = 0; s < pp_; ++s) {
      const auto us = static_cast<std::size_t>(s);
      while (cursor_[us] < order_[us].size() && can_add(s, cursor_[us])) {
        const std::size_t pos = cursor_[us];
        add_step(s, pos);
        ++cursor_[us];
        --remaining;
        progress = true;
        for (std::uint32_t id : messages_.messages_at(messages_.point(s, static_cast<int>(pos)))) try_message(id);
      }
    }
  }
  if (remaining > 0) throw std::logic_error("simulate: the pipeline schedule deadlocks (a bug in the schedule)");
  finish_iteration();
}

// An upper bound on the tasks build() adds (each program item is at most one
// task; each message a send/recv and a gather; a few per stage at the end),
// reserved up front: regrowing the task tables of a million-task iteration
// would copy them and touch twice the memory.
void Builder::reserve_tasks() {
  std::size_t n = 2 * messages_.num_messages() + 8 * static_cast<std::size_t>(pp_) + 16;
  for (int s = 0; s < pp_; ++s) {
    const auto us = static_cast<std::size_t>(s);
    for (const ScheduleStep& st : order_[us]) {
      const bool fwd = st.dir == Direction::forward;
      const auto& units = units_[us][static_cast<std::size_t>(st.chunk)];
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

Builder::PassState& Builder::pass(Direction d, int mb, int vs) {
  return passes_[pass_index(d, mb, vs, mbs_, vs_count_)];
}

bool Builder::can_add(int stage, std::size_t idx) {
  const auto us = static_cast<std::size_t>(stage);
  if (!messages_.complete(messages_.point(stage, static_cast<int>(idx) - 1))) return false;  // the previous point's messages
  const ScheduleStep& st = order_[us][idx];
  const int vs = st.chunk * pp_ + stage;
  const int from_vs = st.dir == Direction::forward ? vs - 1 : vs + 1;
  if (from_vs < 0 || from_vs >= vs_count_) return true;
  const PassState& src = pass(st.dir, st.micro_batch, from_vs);
  return stage_of(from_vs) == stage ? src.added : src.ready != kNoTask;
}

// Creates a message once the sender and the receiver have both reached its
// point: the send/recv on both GPUs' PP streams and, without SP, the TP
// all-gather that rebuilds the activation from the shards (scatter-gather).
void Builder::try_message(std::uint32_t id) {
  Message& msg = messages_.message(id);
  if (msg.created) return;
  const auto uf = static_cast<std::size_t>(msg.from);
  const auto ur = static_cast<std::size_t>(msg.to);
  if (cursor_[uf] <= static_cast<std::size_t>(msg.send_pos)) return;
  if (msg.recv_pos >= 0 && cursor_[ur] <= static_cast<std::size_t>(msg.recv_pos)) return;
  msg.created = true;
  const bool fwd = msg.consumer.dir == Direction::forward;
  const Representative& me = representatives_[ur];
  const Representative& peer = representatives_[uf];
  auto pass_end = [&](int stage, int pos) {
    const ScheduleStep& st = order_[static_cast<std::size_t>(stage)][static_cast<std::size_t>(pos)];
    return end_of(pass(st.dir, st.micro_batch, st.chunk * pp_ + stage));
  };
  std::vector<TaskId>& deps = message_deps_;  // reused: one allocation for every message
  const auto sent = pass_end(msg.from, msg.send_pos);
  deps.assign(sent.begin(), sent.end());
  if (msg.recv_pos >= 0) {
    const auto e = pass_end(msg.to, msg.recv_pos);
    deps.insert(deps.end(), e.begin(), e.end());
  }
  const StreamId streams[2] = {fwd ? peer.pp_fwd : peer.pp_bwd, fwd ? me.pp_fwd : me.pp_bwd};
  const GroupId g = fwd ? p2p_fwd_group_[uf] : p2p_bwd_group_[uf];
  const double bytes = step_.pipeline_message_bytes();
  TaskId t = eng_->add_collective(Collective::send_recv, g, bytes, streams, deps, Algorithm::ring);
  // Named only when either side is traced (a name is two strings per message).
  const std::string name = traced(msg.to) || traced(msg.from)
                               ? (fwd ? "act " : "grad ") + step_name(msg.consumer.dir, msg.consumer.micro_batch,
                                                                      msg.consumer.chunk, v_)
                               : std::string();
  tag(t, Category::pp, fwd ? kThreadPpFwd : kThreadPpBwd, msg.from, msg.to);
  label(t, msg.to, name, "pp");
  label(t, msg.from, name, "pp");
  passes_[msg.producer].p2p = t;
  messages_.add_to_block(messages_.point(msg.from, msg.send_pos), t);
  if (tp_ > 1 && !plan_.sequence_parallel) {
    const std::vector<TaskId> d{t};
    TaskId gt;
    if (tp_fast_) {
      gt = eng_->add_compute(me.tp, tp_probe_.time_ns(Collective::all_gather, bytes * tp_), d);
    } else {
      const StreamId s1[1] = {me.tp};
      gt = eng_->add_collective(Collective::all_gather, me.tp_group, bytes * tp_, s1, d);
    }
    tag(gt, Category::pp, kThreadTp, msg.to);
    label(gt, msg.to, "pp_gather " + name, "pp");
    t = gt;
  }
  passes_[msg.producer].ready = t;
  messages_.add_to_block(messages_.point(msg.to, msg.recv_pos), t);
}

void Builder::flush(Chain& ch) {
  if (!ch.pending) return;
  const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
  const TaskId t = emit_compute(r.compute, ch.pending_ns, ch.deps, meta_of(Category::compute, kThreadCompute, ch.stage),
                                ch.pending_held_ns);
  if (traced(ch.stage)) {
    TraceLabel& l = labels_[t];
    l.category = "compute";
    l.parts = std::move(ch.parts);
    const auto& [p0, f0, n0] = l.parts.front();
    const auto& [p1, f1, n1] = l.parts.back();
    const std::string& first = p0->ops[f0].name;
    const std::string& last = p1->ops[f1 + n1 - 1].name;
    l.name = first == last ? first : first + ".." + last;
  }
  ch.parts.clear();
  if (ch.first == kNoTask) ch.first = t;
  ch.last_compute = t;
  ch.deps.clear();
  ch.deps.push_back(t);
  ch.pending = false;
  ch.pending_ns = 0;
  ch.pending_held_ns = 0;
}

TaskId Builder::add_tp(Chain& ch, const Item& it, const Program& prog, const std::vector<TaskId>& deps) {
  const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
  if (it.group == Group::ep) {
    // An MoE all-to-all: on the network, on the TP stream.
    const TaskId t = emit_collective(it.collective, r.ep_group, it.bytes, r.tp, deps,
                                     meta_of(Category::ep, kThreadTp, ch.stage));
    label(t, ch.stage, prog.ops[it.name_op].name, "ep");
    return t;
  }
  if (it.group == Group::cp) {
    // A CP exchange: on the network (its group may leave the node), on the
    // TP stream (a layer's TP and CP collectives never run at once).
    const TaskId t = emit_collective(it.collective, r.cp_group, it.bytes, r.tp, deps,
                                     meta_of(Category::cp, kThreadTp, ch.stage));
    label(t, ch.stage, prog.ops[it.name_op].name, "cp");
    return t;
  }
  const TaskMeta mt = meta_of(Category::tp, kThreadTp, ch.stage);
  TaskId t;
  if (tp_fast_) {
    // Priced once per item: the probe's cache is a map, and TP tasks are many.
    if (it.probe_ns < 0) it.probe_ns = tp_probe_.time_ns(it.collective, it.bytes);
    t = emit_compute(r.tp, it.probe_ns, deps, mt);
  } else {
    t = emit_collective(it.collective, r.tp_group, it.bytes, r.tp, deps, mt);
  }
  label(t, ch.stage, prog.ops[it.name_op].name, "tp");
  return t;
}

void Builder::play(Chain& ch, const Program& prog) {
  for (const Item& it : prog.items) {
    switch (it.kind) {
      case ItemKind::compute:
        ch.pending = true;
        // Under an async collective: the collective's uncontended time
        // (static, so the task keeps one fixed duration and the run stays
        // deterministic; a contended collective would hold the SMs longer).
        ch.pending_ns += it.reduced_ns >= 0 && ch.overlap_ns >= 0
                             ? overlapped_time_ns(ch.overlap_ns, it.reduced_ns, it.duration_ns)
                             : it.duration_ns;
        if (held_sms_ > 0) {
          ch.pending_held_ns += it.reduced_held_ns >= 0 && ch.overlap_ns >= 0
                                    ? overlapped_time_ns(ch.overlap_ns, it.reduced_held_ns, it.held_ns)
                                    : it.held_ns;
        }
        if (traced(ch.stage)) ch.parts.emplace_back(&prog, it.first_op, it.num_ops);
        break;
      case ItemKind::collective: {
        flush(ch);
        const TaskId t = add_tp(ch, it, prog, ch.deps);
        ch.deps.clear();
        ch.deps.push_back(t);
        break;
      }
      case ItemKind::async: {
        flush(ch);
        ch.async.push_back(add_tp(ch, it, prog, ch.deps));
        // (a CP exchange takes no SMs from the block under it: reduced_ns -1)
        if (it.group == Group::tp && it.probe_ns < 0 && overlap_sms_ > 0) it.probe_ns = tp_probe_.time_ns(it.collective, it.bytes);
        ch.overlap_ns = it.probe_ns;
        break;
      }
      case ItemKind::join:
        ch.overlap_ns = -1;
        flush(ch);
        ch.deps.insert(ch.deps.end(), ch.async.begin(), ch.async.end());
        ch.async.clear();
        break;
    }
  }
}

void Builder::dp_bucket(int stage, double params, const std::vector<TaskId>& deps, const std::string& name) {
  if (!reduces() || params <= 0) return;
  const Representative& r = representatives_[static_cast<std::size_t>(stage)];
  const Collective c = step_.grad_collective();
  // An MoE model's bucket holds dense and expert gradients in the stage's
  // proportion; the experts' are reduced over expert-DP (Megatron keeps them
  // in buffers of their own), after the dense ones on the same stream.
  const double expert = expert_share_.empty() ? 0.0 : params * expert_share_[static_cast<std::size_t>(stage)];
  const double dense = params - expert;
  const double grad_bytes = step_.grad_bytes_per_param();
  if (dp_ > 1 && dense > 0) {
    const TaskId t = emit_collective(c, r.dp_group, dense * grad_bytes, r.dp, deps,
                                     meta_of(Category::dp, kThreadDp, stage), /*dp_reduction=*/true);
    label(t, stage, name, "dp");
  }
  if (edp_ > 1 && expert > 0) {
    const TaskId t = emit_collective(c, expert_group_ ? r.edp_group : r.dp_group, expert * grad_bytes,
                                     r.dp, deps, meta_of(Category::dp, kThreadDp, stage), /*dp_reduction=*/true);
    label(t, stage, name + " (experts)", "dp");
  }
}

void Builder::count_played(int stage, GroupId group, Collective c, double bytes) {
  const Representative& r = representatives_[static_cast<std::size_t>(stage)];
  if (dp_ > 1 && group == r.dp_group)
    played_bytes_[played_index(stage, StepGroup::dp, c)] += bytes;
  else if (expert_group_ && group == r.edp_group)
    played_bytes_[played_index(stage, StepGroup::expert_dp, c)] += bytes;
}

void Builder::add_expert_groups(Representative& r) {
  const int s = r.stage;
  const int etp = plan_.expert_tp();
  const int index = tp_ * rep_dp_;  // the representative's index among the stage's TP x CP x DP ranks
  const int rep_etp = index % etp, rep_ep = index / etp % ep_, rep_edp = index / (etp * ep_);
  if (ep_ > 1) {
    // The representative's EP group; every other EP group of the stage
    // exchanges at the same time.
    CommGroup g;
    g.ranks = map_.ep_group(s, rep_edp, rep_etp);
    for (int d = 0; d < edp_; ++d)
      for (int t = 0; t < etp; ++t)
        if (d != rep_edp || t != rep_etp) g.mirrors.push_back(map_.ep_group(s, d, t));
    r.ep_group = eng_->add_group(std::move(g));
  }
  if (expert_group_) {
    CommGroup g;
    g.ranks = map_.expert_dp_group(s, rep_ep, rep_etp);
    for (int e = 0; e < ep_; ++e)
      for (int t = 0; t < etp; ++t)
        if (e != rep_ep || t != rep_etp) g.mirrors.push_back(map_.expert_dp_group(s, e, t));
    r.edp_group = eng_->add_group(std::move(g));
  }
}

void Builder::add_step(int stage, std::size_t idx) {
  const auto us = static_cast<std::size_t>(stage);
  const ScheduleStep& st = order_[us][idx];
  const int vs = st.chunk * pp_ + stage;
  // The entry dependencies: the stage's previous pass and, as Megatron's p2p
  // is synchronous, the messages of the point before this pass.
  std::vector<TaskId>& entry = entry_;
  entry.assign(stage_end_[us].begin(), stage_end_[us].end());
  const auto blocking = messages_.block_of(messages_.point(stage, static_cast<int>(idx) - 1));
  entry.insert(entry.end(), blocking.begin(), blocking.end());
  // The input from the neighbouring virtual stage.
  const int from_vs = st.dir == Direction::forward ? vs - 1 : vs + 1;
  if (from_vs >= 0 && from_vs < vs_count_) {
    const PassState& src = pass(st.dir, st.micro_batch, from_vs);
    if (stage_of(from_vs) == stage) {
      const auto e = end_of(src);
      entry.insert(entry.end(), e.begin(), e.end());
    } else {
      entry.push_back(src.ready);
    }
  }
  const bool last_mb = st.micro_batch == mbs_ - 1;
  const StepWhen when = step_.grad_when();
  const bool reduce_now = reduces() && (when == StepWhen::every_backward_buckets || when == StepWhen::zero3_units ||
                                        (when == StepWhen::last_backward_buckets && last_mb));
  PassState& out = pass(st.dir, st.micro_batch, vs);
  out.end_off = static_cast<std::uint32_t>(ends_.size());
  if (stamp_ && !traced(stage)) {
    stamp(pass_template(stage, st, reduce_now), stage, entry, ends_);
  } else {
    play_pass(stage, st, reduce_now, entry);
    ends_.insert(ends_.end(), chain_.deps.begin(), chain_.deps.end());
  }
  out.end_len = static_cast<std::uint32_t>(ends_.size() - out.end_off);
  out.added = true;
  const auto end = end_of(out);
  stage_end_[us].assign(end.begin(), end.end());
}

PassTemplate& Builder::pass_template(int stage, const ScheduleStep& st, bool reduce_now) {
  if (templates_.empty()) {
    templates_.reserve(static_cast<std::size_t>(pp_ * v_ * 4));
    for (int i = 0; i < pp_ * v_ * 4; ++i) templates_.emplace_back(&arena_);
  }
  const int key = ((stage * v_ + st.chunk) * 2 + (st.dir == Direction::forward ? 0 : 1)) * 2 + (reduce_now ? 1 : 0);
  PassTemplate& pt = templates_[static_cast<std::size_t>(key)];
  if (!pt.recorded) {
    recording_ = &pt;
    const std::vector<TaskId> entry{PassTemplate::kEntryRef};
    play_pass(stage, st, reduce_now, entry);
    PassTemplate::to_refs(chain_.deps, pt.end);
    recording_ = nullptr;
    pt.recorded = true;
  }
  return pt;
}

TaskId Builder::emit_compute(StreamId stream, TimeNs ns, const std::vector<TaskId>& deps, const TaskMeta& mt,
                             TimeNs held_ns) {
  if (recording_ == nullptr) return tag(eng_->add_compute(stream, ns, deps, 0, held_ns), mt);
  const TaskId t = recording_->record(stream, ns, deps, mt);
  recording_->tasks.back().held_ns = held_ns;
  return t;
}

TaskId Builder::emit_collective(Collective c, GroupId group, double bytes, StreamId stream, const std::vector<TaskId>& deps,
                                const TaskMeta& mt, bool dp_reduction) {
  if (recording_ == nullptr) {
    const StreamId streams[1] = {stream};
    const TaskId t = tag(eng_->add_collective(c, group, bytes, streams, deps), mt);
    if (dp_reduction) dp_tasks_[mt.stage].push_back(t);
    count_played(mt.stage, group, c, bytes);
    return t;
  }
  const TaskId t = emit_compute(stream, 0, deps, mt);
  PassTemplate::Task& rt = recording_->tasks.back();
  rt.compute = false;
  rt.op = c;
  rt.group = group;
  rt.bytes = bytes;
  rt.dp_reduction = dp_reduction;
  return t;
}

// The recorded pass's engine calls, with the entry dependencies and ids
// filled in; its end dependencies are appended to `end`.
void Builder::stamp(const PassTemplate& pt, int stage, const std::vector<TaskId>& entry, std::pmr::vector<TaskId>& end) {
  const auto base = static_cast<TaskId>(eng_->num_tasks());
  const auto add = [&](const PassTemplate::Task& t, std::span<const TaskId> ds) {
    TaskId id;
    if (t.compute) {
      id = eng_->add_compute(t.stream, t.duration_ns, ds, 0, t.held_ns);
    } else {
      const StreamId streams[1] = {t.stream};
      id = eng_->add_collective(t.op, t.group, t.bytes, streams, ds);
      if (t.dp_reduction) dp_tasks_[static_cast<std::size_t>(stage)].push_back(id);
      count_played(stage, t.group, t.op, t.bytes);
    }
    tag(id, t.meta);
  };
  const std::span<const TaskId> e = pt.stamp(base, entry, stamp_deps_, add);
  end.insert(end.end(), e.begin(), e.end());
}

void Builder::play_pass(int stage, const ScheduleStep& st, bool reduce_now, const std::vector<TaskId>& entry) {
  const auto us = static_cast<std::size_t>(stage);
  const bool fwd = st.dir == Direction::forward;
  // One chain object reused by every pass: its vectors keep their capacity
  // instead of being allocated and freed per pass.
  Chain& ch = chain_;
  ch.stage = stage;
  ch.deps.assign(entry.begin(), entry.end());
  ch.async.clear();
  ch.overlap_ns = -1;
  ch.pending_ns = 0;
  ch.pending_held_ns = 0;
  ch.pending = false;
  ch.parts.clear();
  ch.first = kNoTask;
  ch.last_compute = kNoTask;

  const auto& units = units_[us][static_cast<std::size_t>(st.chunk)];
  const int zero = reduces() ? plan_.zero_stage : 0;
  if (zero >= 3) {
    play_zero3(stage, st, reduce_now);
  } else {
    const double bucket = step_.bucket_params(stage, st.chunk);
    double acc = 0;
    for (std::size_t k = 0; k < units.size(); ++k) {
      const std::size_t u = fwd ? k : units.size() - 1 - k;
      play(ch, fwd ? *units[u].fwd : *units[u].bwd);
      if (!fwd && reduce_now) {
        acc += units[u].params;
        if (acc >= bucket || k + 1 == units.size()) {
          flush(ch);
          std::vector<TaskId> deps = ch.deps;
          deps.insert(deps.end(), ch.async.begin(), ch.async.end());
          dp_bucket(stage, acc, deps, "grad bucket " + step_name(st.dir, st.micro_batch, st.chunk, v_));
          acc = 0;
        }
      }
    }
  }
  flush(ch);
  ch.deps.insert(ch.deps.end(), ch.async.begin(), ch.async.end());
  if (traced(stage) && ch.first != kNoTask) {
    spans_.push_back(StepSpan{stage, ch.first, ch.last_compute, step_name(st.dir, st.micro_batch, st.chunk, v_), fwd});
  }
}

// ZeRO-3, part by part (zero3.hpp decides which parts gather, where the
// gathers are issued and where the host waits). A gather is issued when the
// host reaches the part that issues it: without zero3_sync once the compute
// before that part is issued (FSDP2's CPU thread runs ahead of the GPU), so
// it depends on the chain so far; with it after a full wait for the device
// (torch.cuda.synchronize, modelled as a dependency on everything issued),
// then the buffer's zero fill on the compute stream (DeepSpeed v0.5.4
// _allgather_param: torch.zeros of the whole tensor, then synchronize). The
// list form's per-rank copies are launched by the host right after the
// collective: with zero3_sync nothing else is queued on the device, so they
// hold the compute stream (host time); a reduce-scatter's, launched while
// the device works through a backward, delay only the collective, so they
// sit before it on the DP stream. Gathers and reduce-scatters share the DP
// stream: c10d runs every collective of a process group on its one NCCL
// stream, one after another.
void Builder::play_zero3(int stage, const ScheduleStep& st, bool reduce_now) {
  const auto us = static_cast<std::size_t>(stage);
  const bool fwd = st.dir == Direction::forward;
  const Representative& me = representatives_[us];
  const GpuProfile& gpu = topo_.cluster().gpu;
  const TrainerSettings& ts = plan_.trainer;
  Chain& ch = chain_;
  const auto& units = units_[us][static_cast<std::size_t>(st.chunk)];
  std::vector<const Part*>& parts = zero3_parts_;
  parts.clear();
  zero3_uses_.clear();
  for (std::size_t k = 0; k < units.size(); ++k) {
    const Unit& unit = units[fwd ? k : units.size() - 1 - k];
    for (const Part& pt : fwd ? unit.fwd_parts : unit.bwd_parts) {
      parts.push_back(&pt);
      zero3_uses_.push_back(Zero3Use{pt.params, pt.tensor});
    }
  }
  const Zero3PassPlan plan = plan_zero3_pass(zero3_uses_, ts);
  // Gathered parameters are in the compute dtype (bf16; f32 on the CPU executor).
  const double param_bytes = step_.param_bytes_per_param();
  const TaskMeta dp_meta = meta_of(Category::dp, kThreadDp, stage);
  const TaskMeta host_meta = meta_of(Category::dp, kThreadCompute, stage);  // DP work holding the compute stream
  const std::string pass_name = step_name(st.dir, st.micro_batch, st.chunk, v_);
  std::vector<TaskId>& gathers = gathers_;
  gathers.assign(parts.size(), kNoTask);
  TaskId dp_tail = kNoTask;  // the DP stream's last task in this pass
  std::vector<TaskId> deps;
  // Everything issued so far, what torch.cuda.synchronize waits for.
  auto drain = [&] {
    flush(ch);
    deps.assign(ch.deps.begin(), ch.deps.end());
    deps.insert(deps.end(), ch.async.begin(), ch.async.end());
    if (dp_tail != kNoTask) deps.push_back(dp_tail);
  };
  auto gather = [&](std::size_t j) {
    const Part& pt = *parts[j];
    const double bytes = pt.params * param_bytes;
    if (ts.zero3_sync) {
      drain();
      const TaskId z = emit_compute(me.compute, memory_bound_time_ns(gpu, bytes), deps, host_meta);
      label(z, stage, "zero3_zero_fill " + pt.name, "dp");
      ch.deps.assign(1, z);
      ch.async.clear();
    }
    const TaskId g = emit_collective(Collective::all_gather, me.dp_group, bytes, me.dp, ch.deps, dp_meta);
    label(g, stage, "zero3_gather " + pt.name, "dp");
    gathers[j] = g;
    dp_tail = g;
    if (ts.zero3_list_collectives) {
      flush(ch);
      const TaskId h = emit_compute(me.compute, list_collective_copies_ns(gpu, bytes, dp_), ch.deps, host_meta);
      label(h, stage, "zero3_gather_copies " + pt.name, "dp");
      ch.deps.assign(1, h);
    }
  };
  // One reduce-scatter per tensor (zero3_reduce_per_tensor) or of them all,
  // each after its list-form copies; the DP stream runs them in turn.
  auto reduce = [&](const std::vector<double>& tensors, const std::vector<TaskId>& d) {
    double all = 0;
    for (const double t : tensors) all += t;
    const std::size_t n = ts.zero3_reduce_per_tensor ? tensors.size() : 1;
    for (std::size_t i = 0; i < n; ++i) {
      const double bytes = (ts.zero3_reduce_per_tensor ? tensors[i] : all) * step_.grad_bytes_per_param();
      deps.assign(d.begin(), d.end());
      if (ts.zero3_list_collectives) {
        const TaskId c = emit_compute(me.dp, list_collective_copies_ns(gpu, bytes, dp_), deps, dp_meta);
        label(c, stage, "grad reduce copies " + pass_name, "dp");
        deps.assign(1, c);
      }
      const TaskId t = emit_collective(Collective::reduce_scatter, me.dp_group, bytes, me.dp, deps, dp_meta,
                                       /*dp_reduction=*/true);
      label(t, stage, "grad bucket " + pass_name, "dp");
      dp_tail = t;
    }
  };
  const bool reducing = !fwd && reduce_now;
  const auto bucket = static_cast<double>(ts.zero3_reduce_bucket_params);
  // DeepSpeed's bucket: the gradient tensors waiting in it, what they
  // depend on, and whether the current part added some.
  double acc = 0;
  std::vector<double> held;
  std::vector<TaskId> held_deps, end_deps;
  bool held_current = false;
  std::vector<std::vector<double>> after;  // buckets that hold the current part's gradients: reduced after it
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const Part& pt = *parts[k];
    const std::span<const std::uint32_t> issued = plan.issued_at(k);
    for (const std::uint32_t j : issued) {
      if (j == k) gather(j);  // not prefetched: fetched now
    }
    if (plan.waits[k]) {
      drain();
      const TaskId b = emit_compute(kNoStream, 0, deps, meta_of(Category::none, kThreadCompute, stage));
      ch.deps.assign(1, b);
      ch.async.clear();
    }
    if (ts.zero3_fetch_norm && pt.params > 0) {
      // The norm's kernel reads the tensor; formatting it waits for the compute stream.
      flush(ch);
      const TimeNs ns = memory_bound_time_ns(gpu, pt.params * param_bytes);
      const TaskId nrm = emit_compute(me.compute, ns, ch.deps, host_meta);
      label(nrm, stage, "zero3_fetch_norm " + pt.name, "dp");
      ch.deps.assign(1, nrm);
    }
    for (const std::uint32_t j : issued) {
      if (j != k) gather(j);  // the prefetch window
    }
    if (!ts.zero3_sync) {
      flush(ch);
      if (plan.gathered[k]) ch.deps.push_back(gathers[k]);
    }
    // DeepSpeed's bucket is reduced when the next gradient would overflow
    // it, from the hook of the parameter whose gradient arrives: the host
    // runs the hooks of a part as it issues the part's backward, so the
    // reduction starts with the part, after the gradients it holds.
    after.clear();
    if (reducing && bucket > 0) {
      flush(ch);
      for (const double t : pt.grad_tensors) {
        if (acc > 0 && acc + t > bucket) {
          if (held_current) {
            after.push_back(held);
          } else {
            held_deps.insert(held_deps.end(), ch.deps.begin(), ch.deps.end());
            reduce(held, held_deps);
          }
          acc = 0;
          held.clear();
          held_deps.clear();
        }
        acc += t;
        held.push_back(t);
        held_current = true;
      }
    }
    play(ch, *pt.prog);
    if (reducing && pt.grads > 0) {
      flush(ch);
      end_deps.assign(ch.deps.begin(), ch.deps.end());
      end_deps.insert(end_deps.end(), ch.async.begin(), ch.async.end());
      if (bucket > 0) {
        for (const std::vector<double>& b : after) reduce(b, end_deps);
        if (held_current) held_deps = end_deps;
        held_current = false;
      } else {
        reduce(pt.grad_tensors, end_deps);
      }
    }
  }
  if (acc > 0) reduce(held, held_deps);
}

void Builder::finish_iteration() {
  const GpuProfile& gpu = topo_.cluster().gpu;
  std::vector<TaskId> all;
  for (int s = 0; s < pp_; ++s) {
    const auto us = static_cast<std::size_t>(s);
    // The last pass's outgoing message must be done too.
    const auto tail = messages_.block_of(messages_.point(s, static_cast<int>(order_[us].size()) - 1));
    stage_end_[us].insert(stage_end_[us].end(), tail.begin(), tail.end());
    if (reduces() && step_.grad_when() == StepWhen::after_backward) {
      dp_bucket(s, parameters_on_stage(m_, plan_, s), stage_end_[us], "grad reduce");
    }
    all.insert(all.end(), stage_end_[us].begin(), stage_end_[us].end());
    all.insert(all.end(), dp_tasks_[us].begin(), dp_tasks_[us].end());
  }
  // Tied embeddings across stages: Megatron all-reduces the word-embedding
  // gradient between the first and the last stage (fp32) after backward.
  if (const double bytes = step_.tied_embedding_bytes(); bytes > 0) {
    CommGroup g;
    g.ranks = {representatives_.front().rank, representatives_.back().rank};
    g.rail0_part = net_->rails_folded();
    for (int d = 0; d < dp_; ++d) {
      for (int t = 0; t < mirrored_tp(); ++t) {
        if (t == 0 && d == rep_dp_) continue;
        g.mirrors.push_back({map_.rank_of_data(t, 0, d), map_.rank_of_data(t, pp_ - 1, d)});
      }
    }
    const GroupId gid = eng_->add_group(std::move(g));
    const StreamId streams[2] = {representatives_.front().dp, representatives_.back().dp};
    const TaskId t = eng_->add_collective(Collective::all_reduce, gid, bytes, streams, all);
    for (const int s : {0, pp_ - 1})
      played_bytes_[played_index(s, StepGroup::embedding, Collective::all_reduce)] += bytes;
    tag(t, Category::dp, kThreadDp, 0, pp_ - 1);
    label(t, 0, "embedding grad all-reduce", "dp");
    label(t, pp_ - 1, "embedding grad all-reduce", "dp");
    all.push_back(t);
  }
  // The optimizer step starts everywhere after the global gradient-norm
  // reduction, i.e. after every stage's gradients are reduced.
  const std::vector<TaskId> join{eng_->add_compute(kNoStream, 0, all)};
  tag(join.back(), Category::none, 0, -1);
  for (int s = 0; s < pp_; ++s) {
    const Representative& r = representatives_[static_cast<std::size_t>(s)];
    const StageParameters sp = stage_parameters(m_, plan_, s);
    const double params = sp.dense;
    // Megatron's step kernels (optimizer_step.cpp), the experts' on their expert-DP shard.
    TimeNs ns = step_.optimizer_ns(gpu, sp);
    if (const double f = compute_factor(s); f != 1.0) ns = static_cast<TimeNs>(std::llround(static_cast<double>(ns) * f));
    const TaskId opt = eng_->add_compute(r.compute, ns, join);
    tag(opt, Category::optimizer, kThreadCompute, s);
    label(opt, s, "optimizer step", "optimizer");
    if (step_.gathers_after_step()) {
      // Distributed optimizer: gather the updated bf16 parameters (not overlapped).
      const StreamId s1[1] = {r.dp};
      const std::vector<TaskId> d{opt};
      std::vector<TaskId> d2 = d;
      if (dp_ > 1) {
        const TaskId g = eng_->add_collective(Collective::all_gather, r.dp_group,
                                              params * step_.param_bytes_per_param(), s1, d);
        count_played(s, r.dp_group, Collective::all_gather, params * step_.param_bytes_per_param());
        tag(g, Category::dp, kThreadDp, s);
        label(g, s, "param all-gather", "dp");
        d2 = {g};
      }
      if (sp.expert > 0 && edp_ > 1) {
        const GroupId group = expert_group_ ? r.edp_group : r.dp_group;
        const TaskId g = eng_->add_collective(Collective::all_gather, group, sp.expert * step_.param_bytes_per_param(),
                                              s1, d2);
        count_played(s, group, Collective::all_gather, sp.expert * step_.param_bytes_per_param());
        tag(g, Category::dp, kThreadDp, s);
        label(g, s, "expert param all-gather", "dp");
      }
    }
  }
}

}  // namespace cuboid::sim::detail
