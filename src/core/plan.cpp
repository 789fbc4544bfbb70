#include "cuboid/core/plan.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"

namespace cuboid {

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
  }
  return "?";
}

std::string_view to_string(Dim d) {
  switch (d) {
    case Dim::tp: return "tp";
    case Dim::dp: return "dp";
    case Dim::pp: return "pp";
  }
  return "?";
}

std::string_view to_string(Zero3Unit u) { return u == Zero3Unit::tensor ? "tensor" : "block"; }

std::string_view to_string(CpComm c) { return c == CpComm::a2a ? "a2a" : "p2p"; }

CpComm parse_cp_comm(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "p2p") return CpComm::p2p;
  if (s == "a2a") return CpComm::a2a;
  if (s == "allgather" || s == "a2a+p2p")
    throw InputError(source, field, "CP communication \"" + std::string(s) + "\" is not modelled",
                     "use p2p (the ring, Megatron's default) or a2a");
  throw InputError(source, field, "unknown CP communication \"" + std::string(s) + "\"", "use p2p or a2a");
}

Zero3Unit parse_zero3_unit(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "block") return Zero3Unit::block;
  if (s == "tensor") return Zero3Unit::tensor;
  throw InputError(source, field, "unknown ZeRO-3 unit \"" + std::string(s) + "\"", "use block or tensor");
}

Recompute parse_recompute(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  throw InputError(source, field, "unknown recompute mode \"" + std::string(s) + "\"",
                   "use none, selective or full");
}

Schedule parse_schedule(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  if (s == "interleaved") return Schedule::interleaved;
  throw InputError(source, field, "unknown pipeline schedule \"" + std::string(s) + "\"",
                   "use gpipe, 1f1b or interleaved");
}

std::string RankOrder::str() const {
  std::string out;
  for (Dim d : inner_to_outer) {
    if (!out.empty()) out += "-";
    out += to_string(d);
  }
  return out;
}

RankOrder RankOrder::parse(std::string_view s, const std::string& source, const std::string& field) {
  const std::string fix = "give the three dimensions innermost first, e.g. tp-dp-pp (Megatron's default) or tp-pp-dp";
  RankOrder order;
  std::set<Dim> seen;
  std::size_t start = 0;
  int i = 0;
  while (start <= s.size()) {
    std::size_t dash = s.find('-', start);
    std::string_view part = s.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start);
    Dim d;
    if (part == "tp") d = Dim::tp;
    else if (part == "dp") d = Dim::dp;
    else if (part == "pp") d = Dim::pp;
    else throw InputError(source, field, "unknown dimension \"" + std::string(part) + "\" in rank order \"" + std::string(s) + "\"", fix);
    if (i >= 3 || !seen.insert(d).second)
      throw InputError(source, field, "rank order \"" + std::string(s) + "\" must name tp, dp and pp once each", fix);
    order.inner_to_outer[static_cast<std::size_t>(i++)] = d;
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  if (i != 3) throw InputError(source, field, "rank order \"" + std::string(s) + "\" must name tp, dp and pp once each", fix);
  return order;
}

bool has_uneven_stages(const ParallelPlan& plan) { return plan.first_stage_layers > 0 || plan.last_stage_layers > 0; }

int layers_on_stage(const ParallelPlan& plan, std::int64_t num_layers, int stage) {
  if (!has_uneven_stages(plan)) return static_cast<int>(num_layers / plan.pp);
  if (stage == 0 && plan.first_stage_layers > 0) return plan.first_stage_layers;
  if (stage == plan.pp - 1 && plan.last_stage_layers > 0) return plan.last_stage_layers;
  const int fixed_stages = (plan.first_stage_layers > 0 ? 1 : 0) + (plan.last_stage_layers > 0 ? 1 : 0);
  const int middle = plan.pp - fixed_stages;
  return middle > 0 ? static_cast<int>((num_layers - plan.first_stage_layers - plan.last_stage_layers) / middle) : 0;
}

int chunks_per_stage(const ParallelPlan& plan) {
  return plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
}

int first_layer_of_chunk(const ParallelPlan& plan, std::int64_t num_layers, int stage, int chunk) {
  const int v = chunks_per_stage(plan);
  int first = 0;
  for (int vs = 0; vs < chunk * plan.pp + stage; ++vs) first += layers_on_stage(plan, num_layers, vs % plan.pp) / v;
  return first;
}

std::array<int, 2> cp_chunks(int cp, int rank) { return {rank, 2 * cp - 1 - rank}; }

std::int64_t cp_causal_pairs(std::int64_t seq, int cp, int rank) {
  const std::int64_t chunk = seq / (2LL * cp);
  std::int64_t pairs = 0;
  // Query i (0-based) of the sequence sees keys 0..i: i + 1 of them.
  for (const int c : cp_chunks(cp, rank)) {
    const std::int64_t first = c * chunk, last = first + chunk - 1;
    pairs += (last + 1) * (last + 2) / 2 - first * (first + 1) / 2;
  }
  return pairs;
}

bool propose_uneven_stages(std::int64_t num_layers, int pp, int& first, int& last, int chunks) {
  // In units of `chunks` layers: every stage's count must be a multiple of it.
  const std::int64_t v = std::max(1, chunks);
  if (pp < 2 || num_layers % (pp * v) == 0 || num_layers % v != 0) return false;
  const std::int64_t units = num_layers / v;
  if (pp == 2) {
    last = static_cast<int>(units / 2 * v);  // the LM head's stage gets the smaller half
    first = static_cast<int>(num_layers - last);
    return last >= v;
  }
  const std::int64_t per_middle = ((num_layers + pp - 1) / pp + v - 1) / v;
  const std::int64_t rest = units - per_middle * (pp - 2);
  if (rest < 2) return false;
  first = static_cast<int>((rest + 1) / 2 * v);
  last = static_cast<int>(rest * v - first);
  return first < per_middle * v + 1;
}

namespace {

std::optional<PlanProblem> plan_problem(PlanField field, std::string what, std::string fix) {
  return PlanProblem{field, std::move(what), std::move(fix)};
}

// The experts' dimensions, as Megatron-Core constrains them (arguments.py,
// moe_layer.py, parallel_state.py at d98e8a64), and the ETP cuboid models.
std::optional<PlanProblem> check_experts(const ParallelPlan& p, const ModelSpec& m) {
  using F = PlanField;
  const std::string ep = std::to_string(p.ep), etp = std::to_string(p.expert_tp());
  if (p.ep <= 0) return plan_problem(F::ep, "must be positive, got " + ep, "give a value >= 1");
  if (p.etp < 0) return plan_problem(F::etp, "must be positive, got " + std::to_string(p.etp), "give a value >= 1");
  if (!m.moe.enabled()) {
    if (p.ep > 1 || (p.etp > 0 && p.etp != p.tp))
      return plan_problem(p.ep > 1 ? F::ep : F::etp,
                          "expert parallelism needs a mixture-of-experts model; " + m.name + " has no experts",
                          "drop EP / ETP (use EP 1)");
    return std::nullopt;
  }
  const std::string experts = std::to_string(m.moe.num_experts);
  if (m.moe.num_experts % p.ep != 0)
    return plan_problem(F::ep, "EP " + ep + " does not divide the " + experts + " experts of " + m.name,
                        "choose an EP that divides the number of experts");
  if (p.expert_tp() != 1 && p.expert_tp() != p.tp)
    return plan_problem(F::etp,
                        "ETP " + etp + " is neither 1 nor TP " + std::to_string(p.tp) +
                            " (cuboid prices the experts' TP on the attention's TP group, or none)",
                        "use ETP 1 or ETP = TP");
  if (m.moe.expert_ffn_hidden_size % p.expert_tp() != 0)
    return plan_problem(F::etp,
                        "ETP " + etp + " does not divide the experts' FFN size " +
                            std::to_string(m.moe.expert_ffn_hidden_size),
                        "choose an ETP that divides the experts' FFN size");
  if (m.moe.shared_expert_ffn_hidden_size % p.tp != 0)
    return plan_problem(F::tp,
                        "TP " + std::to_string(p.tp) + " does not divide the shared experts' FFN size " +
                            std::to_string(m.moe.shared_expert_ffn_hidden_size),
                        "choose a TP that divides the shared experts' FFN size");
  const long long dense = static_cast<long long>(p.tp) * p.cp * p.dp;
  const long long folded = static_cast<long long>(p.expert_tp()) * p.ep;
  if (dense % folded != 0)
    return plan_problem(F::ep,
                        "ETP x EP = " + std::to_string(folded) + " does not divide the TP x CP x DP = " +
                            std::to_string(dense) + " ranks of a pipeline stage, which the experts regroup",
                        "choose EP and ETP whose product divides TP x CP x DP");
  if (p.zero_stage >= 3)
    return plan_problem(F::zero_stage,
                        "ZeRO-3 of a mixture-of-experts model is not modelled (cuboid gathers whole dense layers)",
                        "use ZeRO 0-2 (Megatron's distributed optimizer is ZeRO 1)");
  if (p.tp > 1 && !p.sequence_parallel)
    return plan_problem(F::sequence_parallel,
                        "a mixture-of-experts layer with TP > 1 needs sequence parallelism (Megatron-Core refuses "
                        "to train without it)",
                        "turn sequence parallelism on");
  return std::nullopt;
}

}  // namespace

std::optional<PlanProblem> check_plan(const ParallelPlan& p, const ModelSpec& m, const Cluster& c) {
  using F = PlanField;
  auto problem = [](PlanField field, std::string what, std::string fix) {
    return std::optional<PlanProblem>(PlanProblem{field, std::move(what), std::move(fix)});
  };
  const std::pair<long long, PlanField> sizes[] = {{p.tp, F::tp},
                                                   {p.pp, F::pp},
                                                   {p.dp, F::dp},
                                                   {p.cp, F::cp},
                                                   {p.micro_batch, F::micro_batch},
                                                   {p.global_batch, F::global_batch},
                                                   {p.seq_length, F::seq_length},
                                                   {p.virtual_stages, F::virtual_stages}};
  for (const auto& [v, field] : sizes)
    if (v <= 0) return problem(field, "must be positive, got " + std::to_string(v), "give a value >= 1");
  if (p.zero_stage < 0 || p.zero_stage > 3)
    return problem(F::zero_stage, "ZeRO stage must be 0, 1, 2 or 3, got " + std::to_string(p.zero_stage),
                   "use 0, 1, 2 or 3");
  if (p.seq_length > m.max_position_embeddings)
    return problem(F::seq_length,
                   "sequence length " + std::to_string(p.seq_length) + " exceeds the model's max_position_embeddings " +
                       std::to_string(m.max_position_embeddings) + " (" + m.name + ")",
                   "use a sequence length <= " + std::to_string(m.max_position_embeddings));
  const std::string tp = std::to_string(p.tp);
  if (m.num_attention_heads % p.tp != 0)
    return problem(F::tp,
                   "TP " + tp + " does not divide the " + std::to_string(m.num_attention_heads) +
                       " attention heads of " + m.name,
                   "choose a TP that divides the number of heads");
  if (m.num_kv_heads % p.tp != 0)
    return problem(F::tp,
                   "TP " + tp + " does not divide the " + std::to_string(m.num_kv_heads) + " key/value heads of " +
                       m.name + " (Megatron-LM requires num_query_groups % TP == 0)",
                   "choose a TP that divides the number of key/value heads");
  if (m.ffn_hidden_size % p.tp != 0)
    return problem(F::tp, "TP " + tp + " does not divide ffn_hidden_size " + std::to_string(m.ffn_hidden_size),
                   "choose a TP that divides the FFN size");
  if (p.cp > 1) {
    const std::string cp = std::to_string(p.cp);
    // Megatron-LM runs context parallelism in Transformer Engine's fused
    // attention only, and splits each sequence into 2 x CP chunks
    // (arguments.py: seq_length % (2 x context_parallel_size) == 0).
    if (!p.flash_attention)
      return problem(F::cp, "context parallelism needs fused (flash) attention (Transformer Engine's)",
                     "turn flash attention on, or use CP 1");
    if (p.seq_length % (2LL * p.cp) != 0)
      return problem(F::cp,
                     "sequence length " + std::to_string(p.seq_length) + " does not split into 2 x CP = " +
                         std::to_string(2LL * p.cp) + " chunks",
                     "choose a CP for which 2 x CP divides the sequence length");
    if (p.sequence_parallel && (p.seq_length / p.cp) % p.tp != 0)
      return problem(F::cp,
                     "the " + std::to_string(p.seq_length / p.cp) + " tokens of a CP rank do not split over TP " +
                         std::to_string(p.tp) + " for sequence parallelism",
                     "choose CP and TP so that TP divides sequence length / CP");
    // The all-to-all gives each rank heads / (TP x CP) query and key/value
    // heads of the whole sequence.
    if (p.cp_comm == CpComm::a2a &&
        ((m.num_attention_heads / p.tp) % p.cp != 0 || (m.num_kv_heads / p.tp) % p.cp != 0))
      return problem(F::cp_comm,
                     "the a2a exchange needs CP " + cp + " to divide the heads per TP rank (" +
                         std::to_string(m.num_attention_heads / p.tp) + " query, " +
                         std::to_string(m.num_kv_heads / p.tp) + " key/value)",
                     "use the p2p ring, or a CP that divides the key/value heads per TP rank");
  }
  if (auto moe = check_experts(p, m)) return moe;
  if (m.mla.enabled() && p.cp > 1)
    return plan_problem(F::cp, "context parallelism with latent attention is not modelled",
                        "use CP 1 for a latent-attention model");
  if (m.mla.enabled() && p.zero_stage >= 3)
    return plan_problem(F::zero_stage, "ZeRO-3 of a latent-attention model is not modelled",
                        "use ZeRO 0-2 (Megatron's distributed optimizer is ZeRO 1)");
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0)
    return problem(F::uneven_stages, "stage layer counts must not be negative", "give positive layer counts");
  if (has_uneven_stages(p)) {
    const std::string layers = std::to_string(m.num_layers);
    if (p.pp < 2) return problem(F::uneven_stages, "uneven stages need PP >= 2", "use PP >= 2 or an even split");
    const int fixed_stages = (p.first_stage_layers > 0 ? 1 : 0) + (p.last_stage_layers > 0 ? 1 : 0);
    const long long rest = m.num_layers - p.first_stage_layers - p.last_stage_layers;
    const int middle = p.pp - fixed_stages;
    if (rest < middle || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0))
      return problem(F::uneven_stages,
                     "first stage " + std::to_string(p.first_stage_layers) + " + last stage " +
                         std::to_string(p.last_stage_layers) + " layers leave " + std::to_string(rest) + " of the " +
                         layers + " layers of " + m.name + ", which do not split evenly over the other " +
                         std::to_string(middle) + " stages",
                     "choose first/last stage layers so that the remaining layers divide by the middle stages");
    // Megatron-Core builds every stage's layers as `v` equal chunks
    // (transformer_config.py __post_init__: the first / last stage's layers
    // divisible by the virtual pipeline size; transformer_block.py
    // get_num_layers_to_build: every stage's).
    if (const int v = p.virtual_stages; v > 1) {
      for (const auto& [what, n] : {std::pair<const char*, long long>{"first stage", p.first_stage_layers},
                                    {"last stage", p.last_stage_layers},
                                    {"each middle stage", middle > 0 ? rest / middle : 0}})
        if (n % v != 0)
          return problem(F::uneven_stages,
                         std::string(what) + "'s " + std::to_string(n) + " layers do not split into " +
                             std::to_string(v) + " virtual stages (every stage holds its layers as " +
                             std::to_string(v) + " equal chunks)",
                         "choose first/last stage layers and virtual stages so that every stage's layers divide by "
                         "the virtual stages");
    }
  } else {
    const long long chunks = static_cast<long long>(p.pp) * p.virtual_stages;
    if (m.num_layers % chunks != 0)
      return problem(p.virtual_stages > 1 ? F::virtual_stages : F::pp,
                     "PP " + std::to_string(p.pp) + " x virtual stages " + std::to_string(p.virtual_stages) + " = " +
                         std::to_string(chunks) + " does not divide the " + std::to_string(m.num_layers) +
                         " layers of " + m.name + " (Megatron-LM once trained a silently smaller model here)",
                     p.virtual_stages > 1 ? "choose PP x virtual stages that divides the number of layers"
                                          : "choose PP x virtual stages that divides the number of layers, or split "
                                            "the stages unevenly");
  }
  if (p.schedule == Schedule::interleaved && p.virtual_stages < 2)
    return problem(F::schedule, "the interleaved schedule needs virtual stages >= 2",
                   "use 2 or more virtual stages, or the 1F1B schedule");
  if (p.schedule != Schedule::interleaved && p.virtual_stages > 1)
    return problem(F::virtual_stages,
                   "virtual stages " + std::to_string(p.virtual_stages) + " need the interleaved schedule",
                   "use the interleaved schedule, or drop the virtual stages");
  if (p.virtual_stages > 1 && p.pp < 2)
    return problem(F::virtual_stages, "virtual stages need pipeline parallelism (PP >= 2)",
                   "drop the virtual stages or use PP >= 2");
  if (p.sequence_parallel && p.tp == 1)
    return problem(F::sequence_parallel, "sequence parallelism needs TP > 1",
                   "turn sequence parallelism off with TP 1");
  const long long gpus = c.total_gpus();
  // In floating point: the factors are positive ints, so the product cannot
  // overflow (world_size() can, for a DP of 2147483647), and it is exact
  // whenever it is at most the GPU count.
  const double world = static_cast<double>(p.tp) * p.pp * p.dp * p.cp;
  const std::string dims = p.cp > 1 ? "TP x CP x PP x DP" : "TP x PP x DP";
  if (world > static_cast<double>(gpus))
    return problem(F::world_size,
                   dims + " = " + fmt::format("{:.0f}", world) + " GPUs but cluster " + c.name + " has " +
                       std::to_string(gpus),
                   "use fewer GPUs or more nodes");
  if (p.world_size() != gpus)
    return problem(F::world_size,
                   dims + " = " + std::to_string(p.world_size()) + " does not use all " + std::to_string(gpus) +
                       " GPUs of " + c.name,
                   "make " + dims + " equal the GPU count, or use a cluster with exactly that many GPUs");
  const long long per_step = static_cast<long long>(p.micro_batch) * p.dp;
  if (p.global_batch % per_step != 0)
    return problem(F::global_batch,
                   "global batch " + std::to_string(p.global_batch) + " is not divisible by micro-batch x DP = " +
                       std::to_string(per_step),
                   "choose a global batch that is a multiple of " + std::to_string(per_step));
  if (p.schedule == Schedule::interleaved && p.num_micro_batches() % p.pp != 0)
    return problem(F::global_batch,
                   "the interleaved schedule needs the number of micro-batches (" +
                       std::to_string(p.num_micro_batches()) + ") to be a multiple of PP " + std::to_string(p.pp),
                   "choose a global batch that is a multiple of micro-batch x DP x PP = " +
                       std::to_string(per_step * p.pp));
  return std::nullopt;
}

RankMapping::RankMapping(const ParallelPlan& plan, int gpus_per_node)
    : tp_(plan.tp),
      pp_(plan.pp),
      dp_(plan.dp),
      cp_(plan.cp),
      ep_(plan.ep),
      etp_(plan.expert_tp()),
      gpus_per_node_(gpus_per_node) {
  if (tp_ <= 0 || pp_ <= 0 || dp_ <= 0 || cp_ <= 0 || ep_ <= 0 || etp_ <= 0 || gpus_per_node_ <= 0)
    throw std::invalid_argument("RankMapping: sizes must be positive");
  if ((tp_ * cp_ * dp_) % (ep_ * etp_) != 0)
    throw std::invalid_argument("RankMapping: ETP x EP must divide TP x CP x DP");
  auto size_of = [&](Dim d) { return d == Dim::tp ? tp_ : d == Dim::dp ? dp_ * cp_ : pp_; };
  int stride = 1;
  for (Dim d : plan.order.inner_to_outer) {
    stride_[static_cast<std::size_t>(d)] = stride;
    stride *= size_of(d);
  }
}

RankCoord RankMapping::coord(int rank) const {
  if (rank < 0 || rank >= world_size()) throw std::out_of_range("RankMapping::coord: rank out of range");
  RankCoord c;
  c.rank = rank;
  c.node = rank / gpus_per_node_;
  c.gpu = rank % gpus_per_node_;
  c.tp = (rank / stride_[static_cast<std::size_t>(Dim::tp)]) % tp_;
  const int data = (rank / stride_[static_cast<std::size_t>(Dim::dp)]) % (dp_ * cp_);
  c.dp = data / cp_;
  c.cp = data % cp_;
  c.pp = (rank / stride_[static_cast<std::size_t>(Dim::pp)]) % pp_;
  return c;
}

int RankMapping::rank_of(int tp, int pp, int dp, int cp) const {
  return tp * stride_[static_cast<std::size_t>(Dim::tp)] + (dp * cp_ + cp) * stride_[static_cast<std::size_t>(Dim::dp)] +
         pp * stride_[static_cast<std::size_t>(Dim::pp)];
}

std::vector<int> RankMapping::tp_group(int pp, int dp, int cp) const {
  std::vector<int> g;
  for (int t = 0; t < tp_; ++t) g.push_back(rank_of(t, pp, dp, cp));
  return g;
}

std::vector<int> RankMapping::pp_group(int tp, int dp, int cp) const {
  std::vector<int> g;
  for (int p = 0; p < pp_; ++p) g.push_back(rank_of(tp, p, dp, cp));
  return g;
}

std::vector<int> RankMapping::dp_group(int tp, int pp) const {
  std::vector<int> g;
  for (int d = 0; d < dp_ * cp_; ++d) g.push_back(rank_of_data(tp, pp, d));
  return g;
}

std::vector<int> RankMapping::cp_group(int tp, int pp, int dp) const {
  std::vector<int> g;
  for (int k = 0; k < cp_; ++k) g.push_back(rank_of(tp, pp, dp, k));
  return g;
}

std::vector<int> RankMapping::ep_group(int pp, int edp, int etp) const {
  std::vector<int> g;
  for (int e = 0; e < ep_; ++e) g.push_back(rank_of_stage_index(pp, etp + etp_ * (e + ep_ * edp)));
  return g;
}

std::vector<int> RankMapping::expert_dp_group(int pp, int ep, int etp) const {
  std::vector<int> g;
  const int edp = tp_ * cp_ * dp_ / (etp_ * ep_);
  for (int d = 0; d < edp; ++d) g.push_back(rank_of_stage_index(pp, etp + etp_ * (ep + ep_ * d)));
  return g;
}

std::vector<std::vector<int>> RankMapping::ep_groups() const {
  std::vector<std::vector<int>> out;
  const int edp = tp_ * cp_ * dp_ / (etp_ * ep_);
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < edp; ++d)
      for (int t = 0; t < etp_; ++t) out.push_back(ep_group(p, d, t));
  return out;
}

std::vector<std::vector<int>> RankMapping::expert_dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int e = 0; e < ep_; ++e)
      for (int t = 0; t < etp_; ++t) out.push_back(expert_dp_group(p, e, t));
  return out;
}

std::vector<std::vector<int>> RankMapping::tp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < dp_; ++d)
      for (int k = 0; k < cp_; ++k) out.push_back(tp_group(p, d, k));
  return out;
}

std::vector<std::vector<int>> RankMapping::pp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_; ++d)
    for (int k = 0; k < cp_; ++k)
      for (int t = 0; t < tp_; ++t) out.push_back(pp_group(t, d, k));
  return out;
}

std::vector<std::vector<int>> RankMapping::dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int t = 0; t < tp_; ++t) out.push_back(dp_group(t, p));
  return out;
}

std::vector<std::vector<int>> RankMapping::cp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < dp_; ++d)
      for (int t = 0; t < tp_; ++t) out.push_back(cp_group(t, p, d));
  return out;
}

int RankMapping::nodes_spanned(const std::vector<int>& ranks) const {
  std::set<int> nodes;
  for (int r : ranks) nodes.insert(r / gpus_per_node_);
  return static_cast<int>(nodes.size());
}

bool RankMapping::tp_crosses_nodes() const {
  for (const auto& g : tp_groups())
    if (nodes_spanned(g) > 1) return true;
  return false;
}

}  // namespace cuboid
