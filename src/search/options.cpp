// The planner's options: the trainer they name, what it can run, the plan
// they describe with its defaults, and the fixed dimensions checked up front.
#include "options.hpp"

#include <algorithm>
#include <cmath>

#include "cuboid/search/planner.hpp"

namespace cuboid {

namespace {

using K = Rejection::Kind;

[[noreturn]] void refuse(const Rejection& r, const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  throw PlanRejected(r, describe(r, model, cluster, o));
}

Rejection trainer_limit(K kind, PlanField field = PlanField::world_size, std::int64_t a = 0, std::int64_t b = 0) {
  return Rejection{kind, field, {a, b, 0}, {}};
}

// What the trainer cannot run of what the options ask for, or none.
std::optional<Rejection> trainer_refusal(const PlannerOptions& o, const TrainerPreset& t) {
  using F = PlanField;
  if (o.pp.value_or(1) > 1 && !t.pipeline) return trainer_limit(K::trainer_no_pipeline, F::pp);
  if (o.sequence_parallel.value_or(false) && !t.sequence_parallel)
    return trainer_limit(K::trainer_no_sp, F::sequence_parallel);
  if (o.recompute == Recompute::selective && !t.selective_recompute) return trainer_limit(K::trainer_no_selective);
  if (!t.interleaved && (o.schedule == Schedule::interleaved || o.virtual_stages.value_or(1) > 1))
    return trainer_limit(K::trainer_no_interleaved,
                         o.schedule == Schedule::interleaved ? F::schedule : F::virtual_stages);
  if (o.flash_attention.value_or(false) && !t.flash_attention)
    return trainer_limit(K::trainer_no_flash, F::flash_attention);
  if (o.grad_accum_fusion.value_or(false) && !t.grad_accum_fusion)
    return trainer_limit(K::trainer_no_grad_accum_fusion);
  if ((o.cp.value_or(1) > 1 || o.cp_comm) && !t.context_parallel)
    return trainer_limit(K::trainer_no_cp, o.cp ? F::cp : F::cp_comm);
  if (o.cp_comm == CpComm::a2a && !t.context_parallel_a2a) return trainer_limit(K::trainer_no_cp_a2a, F::cp_comm);
  if ((o.ep.value_or(1) > 1 || o.etp) && !t.expert_parallel)
    return trainer_limit(K::trainer_no_ep, o.ep ? F::ep : F::etp);
  if (o.zero_stage && std::find(t.zero_stages.begin(), t.zero_stages.end(), *o.zero_stage) == t.zero_stages.end()) {
    std::int64_t stages = 0;
    for (int z : t.zero_stages) stages |= std::int64_t{1} << z;
    return trainer_limit(K::trainer_no_zero_stage, F::zero_stage, *o.zero_stage, stages);
  }
  return std::nullopt;
}

std::string trainer_words(const TrainerPreset& t, const std::string& what) {
  return std::string(t.name) + " " + what + " (" + std::string(t.description) + ")";
}

// The trainers' limits in words, "" for other kinds.
std::string describe_trainer_limit(const Rejection& r, const PlannerOptions& o) {
  if (r.kind == K::unknown_trainer) return "unknown trainer \"" + o.trainer.value_or("") + "\"";
  const TrainerPreset& t = trainer_of(o);
  switch (r.kind) {
    case K::trainer_no_pipeline: return trainer_words(t, "has no pipeline parallelism here");
    case K::trainer_no_sp: return trainer_words(t, "has no sequence parallelism");
    case K::trainer_no_selective: return trainer_words(t, "recomputes whole layers only (no selective recomputation)");
    case K::trainer_no_interleaved: return trainer_words(t, "has no interleaved schedule");
    case K::trainer_no_flash: return trainer_words(t, "runs the unfused attention core");
    case K::trainer_no_grad_accum_fusion: return trainer_words(t, "has no gradient-accumulation fusion");
    case K::trainer_no_cp: return trainer_words(t, "has no context parallelism here");
    case K::trainer_no_cp_a2a:
      return trainer_words(t, "exchanges K/V around the ring only (no all-to-all of attention heads)");
    case K::trainer_no_ep: return trainer_words(t, "has no expert parallelism here");
    case K::trainer_no_zero_stage: return trainer_words(t, "cannot run ZeRO stage " + std::to_string(r.values[0]));
    case K::trainer_even_stages: return trainer_words(t, "gives every pipeline stage the same number of layers");
    case K::trainer_even_chunks: return trainer_words(t, "has no uneven stages with the interleaved schedule");
    default: return "";
  }
}

std::string_view size_name(PlanField field) {
  switch (field) {
    case PlanField::tp: return "TP";
    case PlanField::pp: return "PP";
    case PlanField::dp: return "DP";
    default: return "CP";
  }
}

}  // namespace

std::string describe(const Rejection& r, const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::plan: return describe(r.plan, model, cluster);
    case K::fixed_not_dividing_gpus:
      return std::string(size_name(r.field)) + " " + std::to_string(v[0]) + " does not divide the " +
             std::to_string(v[1]) + " GPUs of " + cluster.name;
    case K::no_uneven_split:
      return "no first/last-stage split of the " + std::to_string(v[0]) + " layers over PP " + std::to_string(v[1]) +
             (v[2] > 1 ? " in " + std::to_string(v[2]) + " chunks per stage" : "") +
             " leaves the middle stages an equal share";
    case K::pp_not_dividing_layers: return "PP does not divide the layers";
    case K::batch_not_divisible: return "global batch not divisible by micro-batch x DP";
    case K::no_uneven_chunk_split: return "no uneven split of the layers into the virtual stages";
    case K::interleave_micro_batches: return "interleaving needs micro-batches divisible by PP";
    case K::not_accepted: return "";
    default: return describe_trainer_limit(r, o);
  }
}

const TrainerPreset& trainer_of(const PlannerOptions& o) {
  if (!o.trainer) return default_trainer();
  const TrainerPreset* t = find_trainer(*o.trainer);
  if (!t) {
    const Rejection r = trainer_limit(K::unknown_trainer);
    throw PlanRejected(r, describe_trainer_limit(r, o));
  }
  return *t;
}

void check_trainer_options(const PlannerOptions& o) {
  if (auto r = trainer_refusal(o, trainer_of(o))) throw PlanRejected(*r, describe_trainer_limit(*r, o));
}

TrainerSettings trainer_settings(const PlannerOptions& o) {
  TrainerSettings s = trainer_of(o).settings;
  if (o.dp_overlap) s.dp_overlap = *o.dp_overlap;
  return s;
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

std::optional<Rejection> check_uneven_trainer(const TrainerPreset& t, const ParallelPlan& p) {
  if (!has_uneven_stages(p)) return std::nullopt;
  if (!t.uneven_stages) return trainer_limit(K::trainer_even_stages, PlanField::uneven_stages);
  if (chunks_per_stage(p) > 1 && !t.uneven_interleaved)
    return trainer_limit(K::trainer_even_chunks, PlanField::uneven_stages);
  return std::nullopt;
}

ParallelPlan complete_plan(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
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
    // 64-bit: a huge TP x PP (checked later) must not overflow here.
    const std::int64_t tp_pp = static_cast<std::int64_t>(p.tp) * p.pp * p.cp;
    p.dp = (tp_pp > 0 && cluster.total_gpus() % tp_pp == 0) ? static_cast<int>(cluster.total_gpus() / tp_pp) : 1;
  }
  p.seq_length = o.seq_length.value_or(model.seq_length);
  p.global_batch = o.global_batch.value_or(default_global_batch(p.seq_length, cluster.total_gpus()));
  p.micro_batch = o.micro_batch.value_or(1);
  p.virtual_stages = o.virtual_stages.value_or(1);
  p.first_stage_layers = o.first_stage_layers.value_or(0);
  p.last_stage_layers = o.last_stage_layers.value_or(0);
  p.schedule = o.schedule.value_or(p.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b);
  p.zero_stage = o.zero_stage.value_or(trainer.zero_stages.front());
  p.recompute = o.recompute.value_or(trainer.selective_recompute ? Recompute::selective : Recompute::full);
  p.sequence_parallel = o.sequence_parallel.value_or(p.tp > 1 && trainer.sequence_parallel);
  p.flash_attention = o.flash_attention.value_or(cluster.gpu.flash_attention && trainer.flash_attention);
  p.grad_accum_fusion = o.grad_accum_fusion.value_or(trainer.default_grad_accum_fusion);
  p.order = o.order.value_or(RankOrder{});
  p.trainer = trainer_settings(o);
  return p;
}

ParallelPlan plan_from_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  check_trainer_options(o);
  const TrainerPreset& trainer = trainer_of(o);
  ParallelPlan p = complete_plan(model, cluster, o);
  if (!o.first_stage_layers && !o.last_stage_layers && o.uneven_stages && p.pp > 0 &&
      model.num_layers % (static_cast<std::int64_t>(p.pp) * p.virtual_stages) != 0 &&
      !propose_uneven_stages(model.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers, p.virtual_stages)) {
    refuse(Rejection{K::no_uneven_split, PlanField::uneven_stages, {model.num_layers, p.pp, p.virtual_stages}, {}},
           model, cluster, o);
  }
  if (auto r = check_uneven_trainer(trainer, p)) refuse(*r, model, cluster, o);
  if (auto r = check_plan(p, model, cluster)) refuse(Rejection{K::plan, r->field, {}, *r}, model, cluster, o);
  return p;
}

void check_fixed_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  // The plan of the fixed options alone: the search's other dimensions at
  // values that pass (DP 1, v only with a fixed PP, ZeRO 0, SP where TP > 1
  // unless fixed), on a cluster of exactly its GPUs (the GPU count is the
  // search's to check) and PP micro-batches (batch divisibility is checked
  // per candidate).
  ParallelPlan probe = complete_plan(model, cluster, o);
  probe.dp = o.dp.value_or(1);
  probe.virtual_stages = o.pp ? o.virtual_stages.value_or(1) : 1;
  probe.first_stage_layers = probe.last_stage_layers = 0;
  if (o.uneven_stages && o.pp && model.num_layers % (static_cast<std::int64_t>(*o.pp) * probe.virtual_stages) != 0) {
    int first = 0, last = 0;
    if (propose_uneven_stages(model.num_layers, *o.pp, first, last, probe.virtual_stages)) {
      probe.first_stage_layers = first;
      probe.last_stage_layers = last;
    }
  }
  probe.schedule = probe.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
  probe.zero_stage = o.zero_stage.value_or(0);
  probe.sequence_parallel = o.sequence_parallel.value_or(probe.tp > 1);
  probe.global_batch = static_cast<std::int64_t>(probe.micro_batch) * probe.dp * probe.pp;
  Cluster relaxed = cluster;
  relaxed.nodes = 1;
  relaxed.gpus_per_node = probe.world_size();
  if (auto r = check_uneven_trainer(trainer_of(o), probe)) refuse(*r, model, relaxed, o);
  if (auto r = check_plan(probe, model, relaxed)) refuse(Rejection{K::plan, r->field, {}, *r}, model, relaxed, o);
  // A fixed size that cannot divide the GPUs leaves no candidate: say which,
  // rather than print an empty ranking and exit 0.
  const int gpus = cluster.total_gpus();
  for (const auto& [size, field] : {std::pair{o.tp, PlanField::tp}, std::pair{o.pp, PlanField::pp},
                                    std::pair{o.dp, PlanField::dp}, std::pair{o.cp, PlanField::cp}})
    if (size && gpus % *size != 0)
      refuse(Rejection{K::fixed_not_dividing_gpus, field, {*size, gpus, 0}, {}}, model, cluster, o);
}

}  // namespace cuboid
