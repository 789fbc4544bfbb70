// The planner's options: the trainer they name, what it can run, the plan
// they describe with its defaults, and the fixed dimensions checked up front.
#include "options.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuboid/search/planner.hpp"

namespace cuboid {

namespace {

using K = Rejection::Kind;

[[noreturn]] void refuse(const Rejection& r, const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  throw PlanRejected(r, describe(r, model, cluster, o));
}

std::string unknown_trainer_words(const PlannerOptions& o) { return "unknown trainer " + quote_value(o.trainer.value_or("")); }

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
    case K::unknown_trainer: return unknown_trainer_words(o);
    case K::not_accepted: return "";
  }
  return "";
}

const TrainerPreset& trainer_of(const PlannerOptions& o) {
  if (!o.trainer) return default_trainer();
  const TrainerPreset* t = find_trainer(*o.trainer);
  if (!t) {
    throw PlanRejected(Rejection{K::unknown_trainer, PlanField::trainer, {}, {}}, unknown_trainer_words(o));
  }
  return *t;
}

void check_trainer_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  const TrainerPreset& trainer = trainer_of(o);
  ParallelPlan asked = complete_plan(model, cluster, o);
  // The exchange applies to the plans with CP > 1: a trainer must have them.
  if (o.cp_comm && !o.cp) asked.cp = 2;
  if (auto r = check_trainer(asked, trainer)) {
    if (r->field == PlanField::cp && !o.cp) r->field = PlanField::cp_comm;  // the CP the exchange asked for
    refuse(Rejection{K::plan, r->field, {}, *r}, model, cluster, o);
  }
}

TrainerSettings trainer_settings(const PlannerOptions& o) {
  TrainerSettings s = trainer_of(o).settings;
  if (o.dp_overlap) s.dp_overlap = *o.dp_overlap;
  if (o.dp_grad_bytes) s.dp_grad_bytes = *o.dp_grad_bytes;
  if (o.fsdp_grad_bytes) s.fsdp_grad_bytes = *o.fsdp_grad_bytes;
  if (o.cuda_graphs) s.cuda_graphs = *o.cuda_graphs;
  if (o.tp_comm_overlap) s.tp_comm_overlap = *o.tp_comm_overlap;
  if (o.overlap_param_gather) s.overlap_param_gather = *o.overlap_param_gather;
  if (o.overlap_param_gather_with_optimizer_step)
    s.overlap_param_gather_with_optimizer_step = *o.overlap_param_gather_with_optimizer_step;
  if (o.align_param_gather) s.align_param_gather = *o.align_param_gather;
  if (o.ddp_bucket_params) s.ddp_bucket_params = *o.ddp_bucket_params;
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

// The attention core: --attention-kernel, else the preset's kernel; unfused
// is flash off. --flash-attention on with a preset that runs the unfused
// core by default takes the first fused kernel its code calls (auto if it
// lists none, which the plan check refuses as flash on that trainer).
namespace {
void resolve_attention(ParallelPlan& p, const PlannerOptions& o, const Cluster& cluster, const TrainerPreset& trainer) {
  AttentionKernel k = o.attention_kernel.value_or(AttentionKernel::auto_);
  if (k == AttentionKernel::auto_) {
    k = trainer.attention_kernel;
    if (k == AttentionKernel::unfused && o.flash_attention.value_or(false)) {
      k = AttentionKernel::auto_;
      for (AttentionKernel runs : trainer.attention_kernels)
        if (runs != AttentionKernel::unfused) {
          k = runs;
          break;
        }
    }
  }
  if (k == AttentionKernel::unfused) {
    p.flash_attention = false;
    p.attention_kernel = AttentionKernel::auto_;
    return;
  }
  p.flash_attention = o.flash_attention.value_or(cluster.gpu.flash_attention && trainer.flash_attention);
  p.attention_kernel = p.flash_attention ? k : AttentionKernel::auto_;
}

}  // namespace

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
  // A dense model's plans keep alltoall, which nothing reads.
  if (model.moe.enabled()) p.moe_dispatcher = o.moe_dispatcher.value_or(trainer.moe_dispatchers.front());
  else if (o.moe_dispatcher) p.moe_dispatcher = *o.moe_dispatcher;
  p.moe_ep_overlap = o.moe_ep_overlap.value_or(model.moe.enabled() && trainer.default_moe_ep_overlap);
  p.moe_delay_wgrad = o.moe_delay_wgrad.value_or(true);
  p.moe_flex = FlexSetting{o.moe_flex_backend.value_or(FlexBackend::deepep), o.moe_flex_sms.value_or(0),
                           o.moe_rank_capacity_factor.value_or(0.0), o.moe_paged_stash.value_or(false),
                           o.moe_paged_stash_buffer_factor.value_or(FlexSetting{}.stash_buffer_factor)};
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
  p.embedding_in_split = o.embedding_in_split;
  p.loss_in_split = o.loss_in_split;
  p.pipeline_layout = o.pipeline_layout;
  p.schedule = o.schedule.value_or(p.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b);
  p.zero_stage = o.zero_stage.value_or(trainer.zero_stages.front());
  p.recompute = o.recompute.value_or(trainer.selective_recompute ? Recompute::selective : Recompute::full);
  p.recompute_modules = o.recompute_modules.value_or(0);
  p.recompute_method = o.recompute_method.value_or(RecomputeMethod::uniform);
  p.recompute_num_layers = o.recompute_num_layers.value_or(1);
  p.offload_layers = o.offload_layers.value_or(0);
  p.offload_modules = o.offload_modules.value_or(0);
  p.sequence_parallel = o.sequence_parallel.value_or(p.tp > 1 && trainer.sequence_parallel);
  resolve_attention(p, o, cluster, trainer);
  p.grad_accum_fusion = o.grad_accum_fusion.value_or(trainer.default_grad_accum_fusion);
  p.precision = o.precision.value_or(Precision::bf16);
  p.fp8_param_gather = o.fp8_param_gather.value_or(false);
  p.precision_aware_optimizer = o.precision_aware_optimizer.value_or(false);
  p.fp8_attention = o.fp8_attention.value_or(false);
  p.adam_moment_bytes = o.adam_moment_bytes.value_or(4);
  p.optimizer = o.optimizer.value_or(OptimizerKind::adam);
  p.order = o.order.value_or(RankOrder{});
  p.trainer = trainer_settings(o);
  return p;
}

ParallelPlan plan_from_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  ParallelPlan p = complete_plan(model, cluster, o);
  if (!o.first_stage_layers && !o.last_stage_layers && o.uneven_stages && p.pp > 0 &&
      model.num_layers % (static_cast<std::int64_t>(p.pp) * p.virtual_stages) != 0 &&
      !propose_uneven_stages(model.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers, p.virtual_stages)) {
    refuse(Rejection{K::no_uneven_split, PlanField::uneven_stages, {model.num_layers, p.pp, p.virtual_stages}, {}},
           model, cluster, o);
  }
  if (auto r = check_plan(p, model, cluster)) refuse(Rejection{K::plan, r->field, {}, *r}, model, cluster, o);
  return p;
}

void check_fixed_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  // The plan of the fixed options alone: the search's other dimensions at
  // values that pass (DP 1, v only with a fixed PP, ZeRO 0, SP where TP > 1
  // and the trainer has it, unless fixed), on a cluster of exactly its GPUs
  // (the GPU count is the search's to check) and PP micro-batches (batch
  // divisibility is checked per candidate).
  ParallelPlan probe = complete_plan(model, cluster, o);
  // The experts' axis: an unset ETP is searched at 1 too, which every EP
  // allows; an unset DP at the least that lets TP x CP x DP hold ETP x EP
  // (the search's DP is the GPUs' to set).
  if (!o.etp && model.moe.enabled()) probe.etp = 1;
  // The EP overlap needs EP > 1: an unset EP at the least that divides the experts.
  if (!o.ep && probe.moe_ep_overlap && model.moe.enabled())
    for (std::int64_t e = 2; e <= model.moe.num_experts; ++e)
      if (model.moe.num_experts % e == 0) {
        probe.ep = static_cast<int>(e);
        break;
      }
  probe.dp = o.dp.value_or(1);
  if (!o.dp && probe.ep > 0 && probe.expert_tp() > 0) {
    const std::int64_t folded = static_cast<std::int64_t>(probe.ep) * probe.expert_tp();
    const std::int64_t ranks = static_cast<std::int64_t>(std::max(1, probe.tp)) * std::max(1, probe.cp);
    probe.dp = static_cast<int>(folded / std::gcd(ranks, folded));
  }
  if (!o.cp) probe.cp_comm = CpComm::p2p;  // a searched CP: the exchange applies to its CP > 1 candidates
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
  probe.sequence_parallel = o.sequence_parallel.value_or(probe.tp > 1 && trainer_of(o).sequence_parallel);
  probe.global_batch = static_cast<std::int64_t>(probe.micro_batch) * probe.dp * probe.pp;
  // TP communication overlap and the overlapped parameter gather apply to the
  // candidates that run them (TP > 1 with SP; ZeRO 1-2): a searched TP or
  // ZeRO stage is the search's to meet, candidate by candidate.
  if (!o.tp && o.sequence_parallel.value_or(true)) probe.trainer.tp_comm_overlap = false;
  if (!o.zero_stage) probe.trainer.overlap_param_gather = false;
  // ... and the gather under the step, the candidates with virtual stages
  // (a fixed --vpp 1 is refused here).
  const bool one_chunk = o.virtual_stages && *o.virtual_stages < 2;
  if (!o.zero_stage || (probe.virtual_stages < 2 && !one_chunk)) probe.trainer.overlap_param_gather_with_optimizer_step = false;
  Cluster relaxed = cluster;
  relaxed.nodes = 1;
  relaxed.gpus_per_node = probe.world_size();
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
