// The search space as axes: one function per dimension lists the values the
// search tries for it (or the one fixed), and the walk composes them in a
// fixed order, dropping what the plan check refuses, as counted values.
#include <algorithm>
#include <numeric>

#include "cuboid/search/planner.hpp"
#include "options.hpp"

namespace cuboid {

namespace {

using K = Rejection::Kind;

std::vector<int> divisors(std::int64_t n) {
  std::vector<int> out;
  for (std::int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(static_cast<int>(d));
    if (d * d != n) out.push_back(static_cast<int>(n / d));
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <typename T>
std::vector<T> fixed_or(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

// What every axis reads.
struct Space {
  const ModelSpec& model;
  const Cluster& cluster;
  const PlannerOptions& o;
  const TrainerPreset& trainer;
  int gpus;
  bool flash;
  std::int64_t global_batch;
};

// TP: divisors of the GPU count that divide the heads, the key/value heads
// and the FFN, inside a node unless fixed.
std::vector<int> tp_axis(const Space& s) {
  const ModelSpec& m = s.model;
  const std::int64_t heads_gcd = std::gcd(std::gcd(m.num_attention_heads, m.num_kv_heads), m.ffn_hidden_size);
  std::vector<int> tps;
  for (int t : divisors(s.gpus))
    if (heads_gcd % t == 0 && (s.o.tp || t <= s.cluster.gpus_per_node)) tps.push_back(t);
  return fixed_or(s.o.tp, tps);
}

// CP: the powers of two whose 2 x CP chunks split the sequence and leave each
// rank at least kMinCpTokens tokens, where the trainer has context
// parallelism (with fused attention only). A bound of the search, like TP
// within a node: a fixed CP goes beyond it.
std::vector<int> cp_axis(const Space& s, std::int64_t seq_length) {
  std::vector<int> cps{1};
  if (s.trainer.context_parallel && s.flash)
    for (int c = 2; c <= s.gpus && seq_length % (2LL * c) == 0 && seq_length / c >= kMinCpTokens; c *= 2)
      if (s.gpus % c == 0) cps.push_back(c);
  return fixed_or(s.o.cp, cps);
}

// The layers the stage split shares out: with the embedding / the loss
// counted as layers, one more each (Megatron-Core's account_for_*).
std::int64_t counted_layers(const Space& s) {
  return s.model.num_layers + (s.o.embedding_in_split ? 1 : 0) + (s.o.loss_in_split ? 1 : 0);
}

// PP: divisors of the (counted) layers, or (with uneven stages) every PP that
// has a first/last-stage split; a layout's PP is fixed.
std::vector<int> pp_axis(const Space& s) {
  const std::int64_t layers = counted_layers(s);
  std::vector<int> pps = divisors(layers);
  if (s.o.uneven_stages) {
    pps.clear();
    for (int p = 1; p <= layers; ++p) {
      int first = 0, last = 0;
      if (layers % p == 0 || propose_uneven_stages(layers, p, first, last)) pps.push_back(p);
    }
  }
  return fixed_or(s.o.pp, pps);
}

std::vector<int> micro_batch_axis(const Space& s) {
  std::vector<int> micro_batches;
  for (int b = 1; b <= s.o.max_micro_batch; b *= 2) micro_batches.push_back(b);
  return fixed_or(s.o.micro_batch, micro_batches);
}

// With flash attention the attention scores are never stored, so selective
// recomputation is the same plan as none: searched only when asked for.
std::vector<Recompute> recompute_axis(const Space& s) {
  return fixed_or(s.o.recompute, s.flash || !s.trainer.selective_recompute
                                     ? std::vector<Recompute>{Recompute::none, Recompute::full}
                                     : std::vector<Recompute>{Recompute::none, Recompute::selective, Recompute::full});
}

// Rank orders: only those that place the groups differently. Axes of size 1
// do not move ranks: the first order of each class stands for it (with CP
// right outside TP in Megatron-Core's orders, tp-dp-pp and tp-pp-dp are one
// class when DP or PP is 1).
std::vector<RankOrder> rank_order_axis(const Space& s, int tp, int cp, int dp, int pp) {
  if (s.o.order) return {*s.o.order};
  if (!s.o.search_rank_order) return {RankOrder{}};
  using D = Dim;
  static constexpr std::array<std::array<Dim, 3>, 6> kOrders{{{D::tp, D::dp, D::pp},
                                                              {D::tp, D::pp, D::dp},
                                                              {D::dp, D::tp, D::pp},
                                                              {D::pp, D::tp, D::dp},
                                                              {D::dp, D::pp, D::tp},
                                                              {D::pp, D::dp, D::tp}}};
  // The order's axes of size > 1, innermost first (unused slots: tp).
  auto moving = [&](const RankOrder& order) {
    std::array<RankAxis, 4> key{};
    std::size_t k = 0;
    for (RankAxis a : order.axes())
      if ((a == RankAxis::tp ? tp : a == RankAxis::cp ? cp : a == RankAxis::dp ? dp : pp) > 1) key[k++] = a;
    return std::pair{key, k};
  };
  std::vector<RankOrder> orders;
  for (const auto& dims : kOrders) {
    const auto key = moving(RankOrder{dims});
    if (std::none_of(orders.begin(), orders.end(), [&](const RankOrder& e) { return moving(e) == key; }))
      orders.push_back(RankOrder{dims});
  }
  return orders;
}

// How a PP splits the layers: by hand (first/last stage layers, checked per
// candidate), proposed (uneven stages allowed), or even.
struct StageSplit {
  bool by_hand = false;
  bool uneven = false;
  int first = 0, last = 0;
};

std::optional<StageSplit> stage_split(const Space& s, int pp) {
  StageSplit split;
  split.by_hand = s.o.first_stage_layers || s.o.last_stage_layers;
  split.first = s.o.first_stage_layers.value_or(0);
  split.last = s.o.last_stage_layers.value_or(0);
  // A layout's split is its own (check_plan checks it against PP and v).
  split.uneven = split.by_hand || (s.o.pipeline_layout.empty() && counted_layers(s) % pp != 0);
  if (!split.by_hand && split.uneven &&
      !(s.o.uneven_stages && propose_uneven_stages(s.model.num_layers, pp, split.first, split.last)))
    return std::nullopt;
  return split;
}

// Virtual stages: 1 (1F1B or GPipe), or v > 1 with the interleaved schedule:
// every v whose chunks split the stages evenly and, with uneven stages where
// the trainer builds uneven chunks, every v that has an uneven split in
// v-layer units.
std::vector<int> virtual_stage_axis(const Space& s, int pp, const StageSplit& split) {
  if (s.o.virtual_stages) return {*s.o.virtual_stages};
  std::vector<int> vs{1};
  const std::int64_t layers = counted_layers(s);
  const bool uneven_chunks = s.o.uneven_stages && s.trainer.uneven_interleaved;
  if (pp < 2 || !s.trainer.interleaved || (s.o.schedule && *s.o.schedule != Schedule::interleaved) ||
      (split.uneven && !uneven_chunks))
    return vs;
  for (int v = 2; v <= (layers + pp - 1) / pp; ++v) {
    int f = 0, l = 0;
    if (split.by_hand ? uneven_chunks && split.first % v == 0 && split.last % v == 0
                      : layers % (static_cast<std::int64_t>(pp) * v) == 0 ||
                            (uneven_chunks && propose_uneven_stages(layers, pp, f, l, v)))
      vs.push_back(v);
  }
  return vs;
}

std::vector<int> zero_axis(const Space& s, int dp_cp) {
  if (s.o.zero_stage) return {*s.o.zero_stage};
  return dp_cp > 1 ? s.trainer.zero_stages : std::vector<int>{s.trainer.zero_stages.front()};
}

std::vector<bool> sequence_parallel_axis(const Space& s, int tp) {
  if (s.o.sequence_parallel) return {*s.o.sequence_parallel};
  return tp > 1 && s.trainer.sequence_parallel ? std::vector<bool>{true, false} : std::vector<bool>{false};
}

// The token dispatchers of an EP plan: the one fixed, else each the trainer
// has where EP > 1 (with EP 1 no token leaves its rank's TP group), else the
// trainer's first.
std::vector<MoeDispatcher> dispatcher_axis(const Space& s, int ep) {
  if (s.o.moe_dispatcher) return {*s.o.moe_dispatcher};
  if (!s.model.moe.enabled() || ep <= 1) return {s.trainer.moe_dispatchers.front()};
  return s.trainer.moe_dispatchers;
}

// The experts' regrouping of a stage's TP x CP x DP ranks, as (EP, ETP): EP
// dividing the experts, ETP = TP (Megatron's default) or 1; (1, 0) for a
// dense model.
std::vector<std::pair<int, int>> expert_axis(const Space& s, int tp, int cp, int dp) {
  const MoeSpec& moe = s.model.moe;
  if (!moe.enabled()) return {{1, 0}};
  if (!s.trainer.expert_parallel) return {{s.o.ep.value_or(1), s.o.etp.value_or(tp)}};
  std::vector<int> etps{tp};
  if (tp > 1) etps.push_back(1);
  if (s.o.etp) etps = {*s.o.etp};
  std::vector<std::pair<int, int>> experts;
  for (int etp : etps)
    for (int ep : divisors(static_cast<std::int64_t>(moe.num_experts)))
      if ((!s.o.ep || *s.o.ep == ep) &&
          (static_cast<std::int64_t>(tp) * cp * dp) % (static_cast<std::int64_t>(etp) * ep) == 0)
        experts.emplace_back(ep, etp);
  return experts;
}

// The walk: TP, CP, PP (DP the rest), micro-batch, virtual stages, then the
// settings of one shape; every candidate starts from complete_plan.
class Walk {
 public:
  Walk(const Space& s, const ParallelPlan& base, SearchResult& result)
      : s_(s),
        base_(base),
        result_(result),
        tps_(tp_axis(s)),
        cps_(cp_axis(s, base.seq_length)),
        pps_(pp_axis(s)),
        micro_batches_(micro_batch_axis(s)),
        recomputes_(recompute_axis(s)) {}

  std::vector<ParallelPlan> run() {
    for (int tp : tps_)
      for (int cp : cps_)
        for (int pp : pps_) shape(tp, cp, pp);
    return std::move(plans_);
  }

 private:
  void skip(const Rejection& why) {
    ++result_.skipped;
    ++result_.skips[why];
  }
  void skip(K kind) { skip(Rejection{kind, PlanField::world_size, {}, {}}); }

  void shape(int tp, int cp, int pp) {
    const std::int64_t model_parallel = static_cast<std::int64_t>(tp) * cp * pp;
    if (s_.gpus % model_parallel != 0) return;   // not a factorisation of this cluster
    if (pp > 1 && !s_.trainer.pipeline) return;  // the trainer runs no pipeline
    const int dp = static_cast<int>(s_.gpus / model_parallel);
    if (s_.o.dp && *s_.o.dp != dp) return;
    const std::optional<StageSplit> split = stage_split(s_, pp);
    if (!split) return skip(K::pp_not_dividing_layers);
    ParallelPlan p = base_;
    p.tp = tp;
    p.cp = cp;
    p.cp_comm = cp > 1 ? base_.cp_comm : CpComm::p2p;  // the exchange asked for applies to CP > 1
    p.pp = pp;
    p.dp = dp;
    const std::vector<RankOrder> orders = rank_order_axis(s_, tp, cp, dp, pp);
    const std::vector<int> vs = virtual_stage_axis(s_, pp, *split);
    for (int mb : micro_batches_) {
      if (s_.global_batch % (static_cast<std::int64_t>(mb) * dp) != 0) {
        skip(K::batch_not_divisible);
        continue;
      }
      p.micro_batch = mb;
      for (int v : vs) stages(p, v, *split, orders);
    }
  }

  // The stage split for v chunks (even, or the uneven one in v-layer units)
  // and the schedule.
  void stages(ParallelPlan p, int v, const StageSplit& split, const std::vector<RankOrder>& orders) {
    const std::int64_t layers = counted_layers(s_);
    p.first_stage_layers = split.first;
    p.last_stage_layers = split.last;
    if (v > 1 && !split.by_hand) {
      p.first_stage_layers = p.last_stage_layers = 0;
      if (layers % (static_cast<std::int64_t>(p.pp) * v) != 0 && s_.o.uneven_stages &&
          !propose_uneven_stages(layers, p.pp, p.first_stage_layers, p.last_stage_layers, v))
        return skip(K::no_uneven_chunk_split);
    }
    p.virtual_stages = v;
    p.schedule = v > 1 ? Schedule::interleaved : s_.o.schedule.value_or(Schedule::one_f_one_b);
    if (v == 1 && p.schedule == Schedule::interleaved) return;
    const std::int64_t micro_batches = s_.global_batch / (static_cast<std::int64_t>(p.micro_batch) * p.dp);
    if (v > 1 && micro_batches % p.pp != 0) return skip(K::interleave_micro_batches);
    settings(p, orders);
  }

  // Rank order x ZeRO x recomputation x SP x experts of one shape.
  void settings(ParallelPlan& p, const std::vector<RankOrder>& orders) {
    const std::vector<int> zeros = zero_axis(s_, p.dp_cp());
    const std::vector<bool> sps = sequence_parallel_axis(s_, p.tp);
    const std::vector<std::pair<int, int>> experts = expert_axis(s_, p.tp, p.cp, p.dp);
    for (const RankOrder& order : orders)
      for (int zero : zeros)
        for (Recompute rc : recomputes_)
          for (bool sp : sps)
            for (const auto& [ep, etp] : experts)
              for (MoeDispatcher d : dispatcher_axis(s_, ep)) {
                p.order = order;
                p.zero_stage = zero;
                p.recompute = rc;
                p.sequence_parallel = sp;
                p.ep = ep;
                p.etp = etp;
                p.moe_dispatcher = d;
                consider(p);
              }
  }

  void consider(const ParallelPlan& p) {
    if (auto why = check_plan(p, s_.model, s_.cluster)) return skip(Rejection{K::plan, why->field, {}, *why});
    if (s_.o.accept && !s_.o.accept(p)) return skip(K::not_accepted);
    plans_.push_back(p);
  }

  const Space& s_;
  const ParallelPlan& base_;
  SearchResult& result_;
  // The axes that do not depend on the shape.
  const std::vector<int> tps_, cps_, pps_, micro_batches_;
  const std::vector<Recompute> recomputes_;
  std::vector<ParallelPlan> plans_;
};

}  // namespace

std::vector<ParallelPlan> enumerate_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& o,
                                          SearchResult& result) {
  const Cluster& cluster = topo.cluster();
  check_trainer_options(model, cluster, o);
  const ParallelPlan base = complete_plan(model, cluster, o);
  result.seq_length = base.seq_length;
  result.global_batch = base.global_batch;
  check_fixed_options(model, cluster, o);
  const Space space{model, cluster, o, trainer_of(o), cluster.total_gpus(), base.flash_attention, base.global_batch};
  return Walk(space, base, result).run();
}

}  // namespace cuboid
