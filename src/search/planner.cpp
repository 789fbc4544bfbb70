#include "cuboid/search/planner.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <array>
#include <atomic>
#include <chrono>
#include <thread>

#include "cuboid/core/error.hpp"
#include "cuboid/sim/simulator.hpp"

namespace cuboid {

std::string_view flag_of(PlanField field) {
  switch (field) {
    case PlanField::tp: return "--tp";
    case PlanField::pp: return "--pp";
    case PlanField::dp: return "--dp";
    case PlanField::cp: return "--cp";
    case PlanField::cp_comm: return "--cp-comm-type";
    case PlanField::ep: return "--ep";
    case PlanField::etp: return "--etp";
    case PlanField::micro_batch: return "--micro-batch";
    case PlanField::global_batch: return "--global-batch";
    case PlanField::seq_length: return "--seq-length";
    case PlanField::virtual_stages: return "--vpp";
    case PlanField::zero_stage: return "--zero";
    case PlanField::schedule: return "--schedule";
    case PlanField::sequence_parallel: return "--sequence-parallel";
    case PlanField::flash_attention: return "--flash-attention";
    case PlanField::uneven_stages: return "--uneven-stages";
    case PlanField::world_size: return "--tp/--pp/--dp";
  }
  return "--tp/--pp/--dp";
}

std::string flag_fix(const PlanProblem& p) {
  // check_plan's fixes that name a setting with a flag: the fix starting with
  // `plain` (for `field`) starts with `flags` instead; the rest is kept.
  struct Wording {
    PlanField field;
    std::string_view plain;
    std::string_view flags;
  };
  static constexpr Wording kWordings[] = {
      {PlanField::flash_attention, "turn flash attention off", "use --flash-attention off"},
      {PlanField::seq_length, "use a sequence length", "use --seq-length"},
      {PlanField::uneven_stages, "use PP >= 2 or an even split", "use --pp >= 2 or an even split"},
      {PlanField::uneven_stages, "drop the virtual stages or use an even split", "drop --vpp or use an even split"},
      {PlanField::pp, "choose PP x virtual stages that divides the number of layers, or split the stages unevenly",
       "choose PP x virtual stages that divides the number of layers, or add --uneven-stages"},
      {PlanField::schedule, "use 2 or more virtual stages, or the 1F1B schedule",
       "add --vpp 2 (or more), or use --schedule 1f1b"},
      {PlanField::virtual_stages, "use the interleaved schedule, or drop the virtual stages",
       "add --schedule interleaved, or drop --vpp"},
      {PlanField::virtual_stages, "drop the virtual stages or use PP >= 2", "drop --vpp or use --pp >= 2"},
      {PlanField::sequence_parallel, "turn sequence parallelism off with TP 1", "use --sequence-parallel off with TP 1"},
      {PlanField::world_size, "use fewer GPUs or more nodes", "use fewer GPUs or more nodes (--nodes N)"},
      {PlanField::world_size, "make TP x PP x DP equal the GPU count, or use a cluster with exactly that many GPUs",
       "make TP x PP x DP equal the GPU count, or set --nodes so the cluster has exactly that many GPUs"},
  };
  for (const Wording& w : kWordings)
    if (w.field == p.field && std::string_view(p.fix).substr(0, w.plain.size()) == w.plain)
      return std::string(w.flags) + p.fix.substr(w.plain.size());
  return p.fix;
}

void validate_plan(const ParallelPlan& plan, const ModelSpec& model, const Cluster& cluster, const std::string& source) {
  if (auto p = check_plan(plan, model, cluster)) throw InputError(source, std::string(flag_of(p->field)), p->problem, flag_fix(*p));
}

namespace {

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

bool same_but_order(const ParallelPlan& a, const ParallelPlan& b) {
  ParallelPlan x = a;
  x.order = b.order;
  return x == b;
}

// Plans that differ only in rank order often score alike (a dimension of size
// 1 or 2 placed differently crosses the same links). Within kRankOrderTie of
// each other they are one row: the trainers' order (Megatron's tp-dp-pp, which
// every export target expresses) when it is among them, else the fastest; the
// others are listed in tied_orders. `rows` are sorted by time within each of
// their two runs (simulated first, then analytical), so the rows a row can tie
// with are the kept rows just before it.
void fold_rank_order_ties(std::vector<Estimate>& rows) {
  const RankOrder trainers{};
  std::vector<Estimate> kept;
  kept.reserve(rows.size());
  for (Estimate& e : rows) {
    Estimate* twin = nullptr;
    for (auto it = kept.rbegin(); it != kept.rend() && it->simulated == e.simulated &&
                                  e.iteration_time_s <= it->iteration_time_s * (1 + kRankOrderTie);
         ++it) {
      if (same_but_order(it->plan, e.plan)) {
        twin = &*it;
        break;
      }
    }
    if (twin == nullptr) {
      kept.push_back(std::move(e));
      continue;
    }
    if (e.plan.order == trainers) {  // shown instead of the faster twin, in its place
      e.tied_orders = std::move(twin->tied_orders);
      e.tied_orders.push_back(twin->plan.order);
      *twin = std::move(e);
    } else {
      twin->tied_orders.push_back(e.plan.order);
    }
  }
  rows = std::move(kept);
}

}  // namespace

void attach_other_orders(Estimate& e, const SearchResult& r) {
  e.other_orders.clear();
  for (const Estimate& row : r.fitting) {
    if (row.plan.order == e.plan.order || !same_but_order(row.plan, e.plan)) continue;
    e.other_orders.push_back({row.plan.order, row.iteration_time_s, row.simulated});
    for (const RankOrder& o : row.tied_orders)
      if (o != e.plan.order) e.other_orders.push_back({o, row.iteration_time_s, row.simulated});
  }
  for (const RankOrder& o : e.tied_orders)
    if (std::none_of(e.other_orders.begin(), e.other_orders.end(), [&](const auto& x) { return x.order == o; }))
      e.other_orders.push_back({o, e.iteration_time_s, e.simulated});
  std::stable_sort(e.other_orders.begin(), e.other_orders.end(),
                   [](const auto& a, const auto& b) { return a.iteration_time_s < b.iteration_time_s; });
}

std::int64_t default_global_batch(std::int64_t seq_length, int total_gpus) {
  constexpr double kTargetTokens = 4.0 * 1024 * 1024;  // ~4M tokens: GPT-3 used 3.2M, Llama 3 started at 4M
  // Megatron-LM d98e8a64 examples/llama/train_llama3_8b_h100_fp8.sh: global
  // batch 128 on one node of 8 GPUs, 16 sequences per GPU.
  std::int64_t odd = total_gpus;
  while (odd % 2 == 0) odd /= 2;
  const double sequences = std::max(1.0, kTargetTokens / static_cast<double>(seq_length));
  const double cap = static_cast<double>(kDefaultSequencesPerGpu) * total_gpus;
  double power = std::max(0.0, std::round(std::log2(sequences / static_cast<double>(odd))));
  power = std::max(0.0, std::min(power, std::floor(std::log2(cap / static_cast<double>(odd)))));
  return odd * (std::int64_t{1} << static_cast<int>(power));
}

const TrainerPreset& trainer_of(const PlannerOptions& o) {
  if (!o.trainer) return default_trainer();
  const TrainerPreset* t = find_trainer(*o.trainer);
  if (!t)
    throw InputError("command line", "--trainer", "unknown trainer \"" + *o.trainer + "\"",
                     "use one of " + trainer_names() + " (cuboid plan --help)");
  return *t;
}

void check_trainer_options(const PlannerOptions& o) {
  const TrainerPreset& t = trainer_of(o);
  auto refuse = [&](const char* flag, const std::string& what, const std::string& fix) {
    throw InputError("command line", flag, std::string(t.name) + " " + what + " (" + std::string(t.description) + ")", fix);
  };
  const std::string other = "drop it, or choose a --trainer that has it";
  if (o.pp.value_or(1) > 1 && !t.pipeline)
    refuse("--pp", "has no pipeline parallelism here", "use --pp 1, or " + other);
  if (o.sequence_parallel.value_or(false) && !t.sequence_parallel)
    refuse("--sequence-parallel", "has no sequence parallelism", "use --sequence-parallel off, or " + other);
  if (o.recompute == Recompute::selective && !t.selective_recompute)
    refuse("--recompute", "recomputes whole layers only (no selective recomputation)", "use --recompute full or none");
  if (!t.interleaved && (o.schedule == Schedule::interleaved || o.virtual_stages.value_or(1) > 1))
    refuse(o.schedule == Schedule::interleaved ? "--schedule" : "--vpp", "has no interleaved schedule",
           "use --schedule 1f1b (or gpipe) without --vpp");
  if (o.flash_attention.value_or(false) && !t.flash_attention)
    refuse("--flash-attention", "runs the unfused attention core", "use --flash-attention off, or " + other);
  if (o.grad_accum_fusion.value_or(false) && !t.grad_accum_fusion)
    refuse("--grad-accum-fusion", "has no gradient-accumulation fusion", "use --grad-accum-fusion off, or " + other);
  if ((o.cp.value_or(1) > 1 || o.cp_comm) && !t.context_parallel)
    refuse(o.cp ? "--cp" : "--cp-comm-type", "has no context parallelism here", "use --cp 1, or " + other);
  if (o.cp_comm == CpComm::a2a && !t.context_parallel_a2a)
    refuse("--cp-comm-type", "exchanges K/V around the ring only (no all-to-all of attention heads)",
           "use --cp-comm-type p2p, or " + other);
  if ((o.ep.value_or(1) > 1 || o.etp) && !t.expert_parallel)
    refuse(o.ep ? "--ep" : "--etp", "has no expert parallelism here", "use --ep 1 without --etp, or " + other);
  if (o.zero_stage && std::find(t.zero_stages.begin(), t.zero_stages.end(), *o.zero_stage) == t.zero_stages.end()) {
    std::string stages;
    for (int z : t.zero_stages) stages += (stages.empty() ? "" : ", ") + std::to_string(z);
    refuse("--zero", "cannot run ZeRO stage " + std::to_string(*o.zero_stage), "use --zero " + stages);
  }
}

namespace {

// Uneven stages, and uneven stages in interleaved chunks, where the trainer builds them.
void check_uneven_interleaved(const TrainerPreset& t, const ParallelPlan& p) {
  if (!has_uneven_stages(p)) return;
  const auto refuse = [&](const std::string& what, const std::string& fix) {
    throw InputError("command line", "--uneven-stages", std::string(t.name) + " " + what + " (" +
                                                            std::string(t.description) + ")", fix);
  };
  if (!t.uneven_stages)
    refuse("gives every pipeline stage the same number of layers", "choose a PP that divides the layers");
  if (chunks_per_stage(p) > 1 && !t.uneven_interleaved)
    refuse("has no uneven stages with the interleaved schedule",
           "drop --vpp (1F1B with uneven stages), or choose a PP x virtual stages that divides the layers");
}

}  // namespace

TrainerSettings trainer_settings(const PlannerOptions& o) {
  TrainerSettings s = trainer_of(o).settings;
  if (o.dp_overlap) s.dp_overlap = *o.dp_overlap;
  return s;
}

ParallelPlan plan_from_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  check_trainer_options(o);
  const TrainerPreset& trainer = trainer_of(o);
  ParallelPlan p;
  p.tp = o.tp.value_or(1);
  p.pp = o.pp.value_or(1);
  p.cp = o.cp.value_or(1);
  p.cp_comm = o.cp_comm.value_or(CpComm::p2p);
  p.ep = o.ep.value_or(1);
  // An MoE model's plans name their ETP (default TP, Megatron's); a dense
  // model's leave it unset.
  p.etp = o.etp.value_or(model.moe.enabled() ? p.tp : 0);
  if (o.dp) {
    p.dp = *o.dp;
  } else {
    // 64-bit: a huge --tp x --pp (checked later by validate_plan) must not overflow here.
    const std::int64_t tp_pp = static_cast<std::int64_t>(p.tp) * p.pp * p.cp;
    p.dp = (tp_pp > 0 && cluster.total_gpus() % tp_pp == 0) ? static_cast<int>(cluster.total_gpus() / tp_pp) : 1;
  }
  p.seq_length = o.seq_length.value_or(model.seq_length);
  p.global_batch = o.global_batch.value_or(default_global_batch(p.seq_length, cluster.total_gpus()));
  p.micro_batch = o.micro_batch.value_or(1);
  p.virtual_stages = o.virtual_stages.value_or(1);
  p.first_stage_layers = o.first_stage_layers.value_or(0);
  p.last_stage_layers = o.last_stage_layers.value_or(0);
  if (!o.first_stage_layers && !o.last_stage_layers && o.uneven_stages && p.pp > 0 &&
      model.num_layers % (static_cast<std::int64_t>(p.pp) * p.virtual_stages) != 0) {
    int first = 0, last = 0;
    if (!propose_uneven_stages(model.num_layers, p.pp, first, last, p.virtual_stages))
      throw InputError("command line", "--uneven-stages",
                       "no first/last-stage split of the " + std::to_string(model.num_layers) + " layers over PP " +
                           std::to_string(p.pp) +
                           (p.virtual_stages > 1 ? " in " + std::to_string(p.virtual_stages) + " chunks per stage" : "") +
                           " leaves the middle stages an equal share",
                       "give --first-stage-layers and --last-stage-layers, or choose another PP" +
                           std::string(p.virtual_stages > 1 ? " or --vpp" : ""));
    p.first_stage_layers = first;
    p.last_stage_layers = last;
  }
  p.schedule = o.schedule.value_or(p.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b);
  p.zero_stage = o.zero_stage.value_or(trainer.zero_stages.front());
  p.recompute = o.recompute.value_or(trainer.selective_recompute ? Recompute::selective : Recompute::full);
  p.sequence_parallel = o.sequence_parallel.value_or(p.tp > 1 && trainer.sequence_parallel);
  p.flash_attention = o.flash_attention.value_or(cluster.gpu.flash_attention && trainer.flash_attention);
  p.grad_accum_fusion = o.grad_accum_fusion.value_or(trainer.default_grad_accum_fusion);
  p.order = o.order.value_or(RankOrder{});
  p.trainer = trainer_settings(o);
  check_uneven_interleaved(trainer, p);
  validate_plan(p, model, cluster);
  return p;
}

std::vector<ParallelPlan> enumerate_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& o,
                                          SearchResult& result) {
  const Cluster& cluster = topo.cluster();
  const int gpus = cluster.total_gpus();
  check_trainer_options(o);
  const TrainerPreset& trainer = trainer_of(o);
  const TrainerSettings trainer_set = trainer_settings(o);
  const bool flash = o.flash_attention.value_or(cluster.gpu.flash_attention && trainer.flash_attention);
  result.seq_length = o.seq_length.value_or(model.seq_length);
  result.global_batch = o.global_batch.value_or(default_global_batch(result.seq_length, gpus));

  // Fixed dimensions are checked up front with the plan validator's messages,
  // so "--tp 3" fails with the reason instead of "no candidates".
  {
    ParallelPlan probe;
    probe.seq_length = result.seq_length;
    probe.global_batch = result.global_batch;
    probe.tp = o.tp.value_or(1);
    probe.pp = o.pp.value_or(1);
    // Virtual stages are only checkable here together with a fixed PP.
    probe.virtual_stages = o.pp ? o.virtual_stages.value_or(1) : 1;
    if (o.uneven_stages && o.pp && model.num_layers % (static_cast<std::int64_t>(*o.pp) * probe.virtual_stages) != 0) {
      int first = 0, last = 0;
      if (propose_uneven_stages(model.num_layers, *o.pp, first, last, probe.virtual_stages)) {
        probe.first_stage_layers = first;
        probe.last_stage_layers = last;
      }
    }
    probe.schedule = probe.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
    probe.micro_batch = o.micro_batch.value_or(1);
    probe.dp = o.dp.value_or(1);
    probe.cp = o.cp.value_or(1);
    probe.cp_comm = o.cp_comm.value_or(CpComm::p2p);
    probe.ep = o.ep.value_or(1);
    probe.etp = o.etp.value_or(model.moe.enabled() ? probe.tp : 0);
    probe.zero_stage = o.zero_stage.value_or(0);
    // SP as fixed, else as the search may pick it (an MoE layer with TP > 1 needs it).
    probe.sequence_parallel = o.sequence_parallel.value_or(probe.tp > 1);
    probe.flash_attention = flash;
    Cluster relaxed = cluster;  // the GPU-count check is the search's job
    relaxed.nodes = 1;
    relaxed.gpus_per_node = probe.world_size();
    ParallelPlan checked = probe;
    // Batch divisibility (and interleaving's micro-batches % PP) is checked
    // per candidate: here give PP micro-batches so only the fixed flags count.
    checked.global_batch = static_cast<std::int64_t>(probe.micro_batch) * probe.dp * probe.pp;
    check_uneven_interleaved(trainer, checked);
    validate_plan(checked, model, relaxed);
    if (o.tp && gpus % *o.tp != 0)
      throw InputError("command line", "--tp", "TP " + std::to_string(*o.tp) + " does not divide the " + std::to_string(gpus) + " GPUs of " + cluster.name,
                       "choose a TP that divides the GPU count");
    // A fixed PP or DP that cannot divide the GPUs leaves no candidate: say
    // which flag, rather than print an empty ranking and exit 0.
    if (o.pp && gpus % *o.pp != 0)
      throw InputError("command line", "--pp", "PP " + std::to_string(*o.pp) + " does not divide the " + std::to_string(gpus) + " GPUs of " + cluster.name,
                       "choose a PP that divides the GPU count");
    if (o.dp && gpus % *o.dp != 0)
      throw InputError("command line", "--dp", "DP " + std::to_string(*o.dp) + " does not divide the " + std::to_string(gpus) + " GPUs of " + cluster.name,
                       "choose a DP that divides the GPU count");
    if (o.cp && gpus % *o.cp != 0)
      throw InputError("command line", "--cp", "CP " + std::to_string(*o.cp) + " does not divide the " + std::to_string(gpus) + " GPUs of " + cluster.name,
                       "choose a CP that divides the GPU count");
  }

  const std::int64_t heads_gcd = std::gcd(std::gcd(model.num_attention_heads, model.num_kv_heads), model.ffn_hidden_size);
  std::vector<int> tps;
  for (int t : divisors(gpus))
    if (heads_gcd % t == 0 && (o.tp || t <= cluster.gpus_per_node)) tps.push_back(t);
  // CP sizes: the powers of two whose 2 x CP chunks split the sequence and
  // leave each rank at least kMinCpTokens tokens, where the trainer has
  // context parallelism (with fused attention only). A bound of the search,
  // like TP within a node: --cp goes beyond it.
  std::vector<int> cps{1};
  if (trainer.context_parallel && flash)
    for (int c = 2; c <= gpus && result.seq_length % (2LL * c) == 0 && result.seq_length / c >= kMinCpTokens; c *= 2)
      if (gpus % c == 0) cps.push_back(c);
  std::vector<int> micro_batches;
  for (int b = 1; b <= o.max_micro_batch; b *= 2) micro_batches.push_back(b);
  // With flash attention the attention scores are never stored, so selective
  // recomputation is the same plan as none: search it only when asked for.
  const std::vector<Recompute> recomputes =
      fixed_or(o.recompute, flash || !trainer.selective_recompute
                                ? std::vector<Recompute>{Recompute::none, Recompute::full}
                                : std::vector<Recompute>{Recompute::none, Recompute::selective, Recompute::full});
  // PP sizes: divisors of the layers, plus (with uneven stages) every PP that
  // has a first/last-stage split.
  std::vector<int> pps = divisors(model.num_layers);
  if (o.uneven_stages) {
    pps.clear();
    for (int p = 1; p <= model.num_layers; ++p) {
      int first = 0, last = 0;
      if (model.num_layers % p == 0 || propose_uneven_stages(model.num_layers, p, first, last)) pps.push_back(p);
    }
  }

  auto skip = [&](const std::string& reason) {
    ++result.skipped;
    ++result.skip_reasons[reason];
  };

  // 1. Enumerate (cheap, sequential, deterministic order).
  std::vector<ParallelPlan> plans;
  for (int tp : fixed_or(o.tp, tps)) {
   for (int cp : fixed_or(o.cp, cps)) {
    for (int pp : fixed_or(o.pp, pps)) {
      if (gpus % (static_cast<std::int64_t>(tp) * cp * pp) != 0) continue;  // not a factorisation of this cluster
      if (pp > 1 && !trainer.pipeline) continue;  // the trainer runs no pipeline
      const int dp = static_cast<int>(gpus / (static_cast<std::int64_t>(tp) * cp * pp));
      if (o.dp && *o.dp != dp) continue;
      // The split of the layers: given by hand (--first/--last-stage-layers,
      // checked per candidate), proposed (--uneven-stages), or even.
      const bool by_hand = o.first_stage_layers || o.last_stage_layers;
      int first_layers = o.first_stage_layers.value_or(0), last_layers = o.last_stage_layers.value_or(0);
      const bool uneven = by_hand || model.num_layers % pp != 0;
      if (!by_hand && uneven &&
          !(o.uneven_stages && propose_uneven_stages(model.num_layers, pp, first_layers, last_layers))) {
        skip("PP does not divide the layers (allow --uneven-stages)");
        continue;
      }
      // Rank orders: only those that place the groups differently.
      std::vector<RankOrder> orders;
      if (o.order) {
        orders = {*o.order};
      } else if (!o.search_rank_order) {
        orders = {RankOrder{}};
      } else {
        for (const char* name : {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-tp-dp", "dp-pp-tp", "pp-dp-tp"}) {
          RankOrder ord = RankOrder::parse(name, "planner", "order");
          // Dimensions of size 1 do not move ranks: keep the first order of each class.
          std::array<Dim, 3> key{};
          std::size_t k = 0;
          for (Dim d : ord.inner_to_outer)
            if ((d == Dim::tp ? tp : d == Dim::pp ? pp : dp * cp) > 1) key[k++] = d;
          bool seen = false;
          for (const RankOrder& e : orders) {
            std::array<Dim, 3> ekey{};
            std::size_t ek = 0;
            for (Dim d : e.inner_to_outer)
              if ((d == Dim::tp ? tp : d == Dim::pp ? pp : dp * cp) > 1) ekey[ek++] = d;
            seen = seen || (ek == k && std::equal(key.begin(), key.begin() + static_cast<long>(k), ekey.begin()));
          }
          if (!seen) orders.push_back(ord);
        }
      }
      for (int mb : fixed_or(o.micro_batch, micro_batches)) {
        if (result.global_batch % (static_cast<std::int64_t>(mb) * dp) != 0) {
          skip("global batch not divisible by micro-batch x DP");
          continue;
        }
        const std::int64_t m = result.global_batch / (static_cast<std::int64_t>(mb) * dp);
        // Virtual stages: 1 (1F1B or GPipe), or v > 1 with the interleaved
        // schedule: every v whose chunks split the stages evenly, and with
        // --uneven-stages (where the trainer builds uneven chunks) every v
        // that has an uneven split in v-layer units.
        std::vector<int> vs;
        if (o.virtual_stages) {
          vs = {*o.virtual_stages};
        } else {
          vs = {1};
          const bool uneven_chunks = o.uneven_stages && trainer.uneven_interleaved;
          if (pp > 1 && trainer.interleaved && (!o.schedule || *o.schedule == Schedule::interleaved) &&
              (!uneven || uneven_chunks)) {
            const std::int64_t most = (model.num_layers + pp - 1) / pp;
            for (int v = 2; v <= most; ++v) {
              int f = 0, l = 0;
              if (by_hand ? uneven_chunks && first_layers % v == 0 && last_layers % v == 0
                          : model.num_layers % (static_cast<std::int64_t>(pp) * v) == 0 ||
                                (uneven_chunks && propose_uneven_stages(model.num_layers, pp, f, l, v)))
                vs.push_back(v);
            }
          }
        }
        for (int v : vs) {
          // The stage split for v chunks: even, or the uneven one in v-layer units.
          int first_v = first_layers, last_v = last_layers;
          if (v > 1 && !by_hand) {
            first_v = last_v = 0;
            if (model.num_layers % (static_cast<std::int64_t>(pp) * v) != 0 && o.uneven_stages &&
                !propose_uneven_stages(model.num_layers, pp, first_v, last_v, v)) {
              skip("no uneven split of the layers into the virtual stages");
              continue;
            }
          }
          Schedule schedule = v > 1 ? Schedule::interleaved : o.schedule.value_or(Schedule::one_f_one_b);
          if (v == 1 && schedule == Schedule::interleaved) continue;
          if (v > 1 && m % pp != 0) {
            skip("interleaving needs micro-batches divisible by PP");
            continue;
          }
          std::vector<int> zeros = dp * cp > 1 ? trainer.zero_stages : std::vector<int>{trainer.zero_stages.front()};
          if (o.zero_stage) zeros = {*o.zero_stage};
          std::vector<bool> sps =
              tp > 1 && trainer.sequence_parallel ? std::vector<bool>{true, false} : std::vector<bool>{false};
          if (o.sequence_parallel) sps = {*o.sequence_parallel};
          // The experts' regrouping of the stage's TP x CP x DP ranks: EP
          // dividing the experts, ETP = TP (Megatron's default) or 1.
          std::vector<std::pair<int, int>> experts{{1, 0}};
          if (model.moe.enabled() && trainer.expert_parallel) {
            experts.clear();
            std::vector<int> etps{tp};
            if (tp > 1) etps.push_back(1);
            if (o.etp) etps = {*o.etp};
            for (int etp : etps)
              for (int ep : divisors(static_cast<std::int64_t>(model.moe.num_experts)))
                if ((!o.ep || *o.ep == ep) && (static_cast<std::int64_t>(tp) * cp * dp) % (static_cast<std::int64_t>(etp) * ep) == 0)
                  experts.emplace_back(ep, etp);
          } else if (model.moe.enabled()) {
            experts = {{o.ep.value_or(1), o.etp.value_or(tp)}};
          }
          for (const RankOrder& order : orders) {
            for (int zero : zeros) {
              for (Recompute rc : recomputes) {
                for (bool sp : sps) {
                 for (const auto& [ep, etp] : experts) {
                  ParallelPlan p;
                  p.tp = tp;
                  p.pp = pp;
                  p.dp = dp;
                  p.cp = cp;
                  p.cp_comm = o.cp_comm.value_or(CpComm::p2p);
                  p.ep = ep;
                  p.etp = etp;
                  p.micro_batch = mb;
                  p.global_batch = result.global_batch;
                  p.seq_length = result.seq_length;
                  p.virtual_stages = v;
                  p.first_stage_layers = first_v;
                  p.last_stage_layers = last_v;
                  p.schedule = schedule;
                  p.zero_stage = zero;
                  p.recompute = rc;
                  p.sequence_parallel = sp;
                  p.flash_attention = flash;
                  p.grad_accum_fusion = o.grad_accum_fusion.value_or(trainer.default_grad_accum_fusion);
                  p.order = order;
                  p.trainer = trainer_set;
                  try {
                    check_uneven_interleaved(trainer, p);
                    validate_plan(p, model, cluster);
                  } catch (const InputError& e) {
                    skip("invalid for " + e.field() + ": " + e.problem());
                    continue;
                  }
                  if (o.accept && !o.accept(p)) {
                    skip(o.accept_reason);
                    continue;
                  }
                  plans.push_back(p);
                 }
                }
              }
            }
          }
        }
      }
    }
   }
  }

  return plans;
}

SearchResult search_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& o) {
  SearchResult result;
  const std::vector<ParallelPlan> plans = enumerate_plans(model, topo, o, result);

  // 2. Score every plan on all cores. Each worker writes only its own slots,
  //    so the result does not depend on the thread count.
  std::vector<Estimate> scored(plans.size());
  const unsigned threads = std::max(1u, std::min<unsigned>(o.threads > 0 ? static_cast<unsigned>(o.threads)
                                                                        : std::thread::hardware_concurrency(),
                                                           static_cast<unsigned>((plans.size() + 255) / 256)));
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  constexpr std::size_t kChunk = 256;
  auto worker = [&] {
    Estimator score(model, topo);  // per-thread caches
    for (;;) {
      const std::size_t begin = next.fetch_add(kChunk);
      if (begin >= plans.size()) return;
      const std::size_t end = std::min(plans.size(), begin + kChunk);
      for (std::size_t i = begin; i < end; ++i) scored[i] = score(plans[i]);
      done.fetch_add(end - begin);
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
    if (o.progress) {
      // The calling thread reports progress and then helps.
      std::jthread reporter([&] {
        while (done.load() < plans.size()) {
          o.progress(done.load(), plans.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      worker();
    } else {
      worker();
    }
  }
  if (o.progress) o.progress(plans.size(), plans.size());
  result.candidates = static_cast<std::int64_t>(scored.size());
  for (Estimate& e : scored) {
    if (e.memory.fits())
      result.fitting.push_back(std::move(e));
    else
      result.not_fitting.push_back(std::move(e));
  }

  // Best first; ties broken by less memory, then by the plan's order of
  // enumeration (stable) so results are deterministic.
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const Estimate& a, const Estimate& b) {
    if (a.iteration_time_s != b.iteration_time_s) return a.iteration_time_s < b.iteration_time_s;
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  // 3. Re-rank the best K with the discrete-event simulator (in parallel; each
  //    worker writes its own slots, so the order does not depend on threads).
  const std::size_t k = std::min<std::size_t>(result.fitting.size(), static_cast<std::size_t>(std::max(0, o.simulate_top)));
  if (k > 0) {
    std::atomic<std::size_t> next_sim{0};
    auto sim_worker = [&] {
      for (std::size_t i = next_sim.fetch_add(1); i < k; i = next_sim.fetch_add(1)) {
        try {
          result.fitting[i] = sim::simulate(model, topo, result.fitting[i].plan);
        } catch (const std::invalid_argument&) {
          // A plan the simulator cannot play keeps its analytical score.
        }
      }
    };
    const unsigned sim_threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(k)));
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < sim_threads; ++t) pool.emplace_back(sim_worker);
    sim_worker();
    pool.clear();
    std::stable_sort(result.fitting.begin(), result.fitting.begin() + static_cast<std::ptrdiff_t>(k),
                     [](const Estimate& a, const Estimate& b) {
                       if (a.simulated != b.simulated) return a.simulated;
                       if (a.iteration_time_s != b.iteration_time_s) return a.iteration_time_s < b.iteration_time_s;
                       return a.memory.total_bytes < b.memory.total_bytes;
                     });
    for (std::size_t i = 0; i < k; ++i) result.simulated += result.fitting[i].simulated ? 1 : 0;
  }
  result.fitting_plans = static_cast<std::int64_t>(result.fitting.size());
  fold_rank_order_ties(result.fitting);
  std::stable_sort(result.not_fitting.begin(), result.not_fitting.end(), [](const Estimate& a, const Estimate& b) {
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  if (result.not_fitting.size() > 16) result.not_fitting.resize(16);
  return result;
}

}  // namespace cuboid
