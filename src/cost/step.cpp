#include "cuboid/cost/step.hpp"

#include <algorithm>
#include <limits>


#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/precision.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/optimizer_step.hpp"

namespace cuboid {

namespace {

// Megatron-Core's default DDP bucket: max(40M, 1M x DP x CP) parameters
// (Megatron-LM d98e8a64 training.py resolve_ddp_bucket_size), first pipeline
// stage's first chunk only (TrainerSettings::ddp_bucket_params sets another).
constexpr double kBucketParams = 40e6;
constexpr double kBucketParamsPerDpRank = 1e6;

}  // namespace

std::string_view to_string(StepGroup g) {
  switch (g) {
    case StepGroup::dp: return "dp";
    case StepGroup::expert_dp: return "expert_dp";
    case StepGroup::embedding: return "embedding";
  }
  return "?";
}

std::string_view to_string(StepWhen w) {
  switch (w) {
    case StepWhen::last_backward_buckets: return "last_backward_buckets";
    case StepWhen::every_backward_buckets: return "every_backward_buckets";
    case StepWhen::after_backward: return "after_backward";
    case StepWhen::zero3_units: return "zero3_units";
    case StepWhen::after_all_backward: return "after_all_backward";
    case StepWhen::after_optimizer: return "after_optimizer";
    case StepWhen::next_forward_buckets: return "next_forward_buckets";
  }
  return "?";
}

StepDescription::StepDescription(const ModelSpec& m, const ParallelPlan& plan, const Calibration* calibration)
    : m_(m), plan_(plan) {
  pp_ = std::max(1, plan.pp);
  dp_ = std::max(1, plan.dp_cp());
  zero_ = plan.zero_stage;
  if (m.moe.enabled()) {
    edp_ = plan.expert_dp();
    expert_group_ = edp_ > 1 && (std::max(1, plan.ep) > 1 || plan.expert_tp() != std::max(1, plan.tp));
  }
  grad_bytes_ = plan.grad_element_bytes();
  const double act_scale = activation_bytes_scale(calibration);
  param_bytes_ = kBf16Bytes * act_scale;
  quantized_gather_bytes_ = plan.fp8_param_gather ? quantized_element_bytes(plan.precision) : param_bytes_;
  message_bytes_ = cuboid::pipeline_message_bytes(m, plan) * act_scale;
  if (pp_ > 1 && m.tied_embeddings) {
    const int tp = std::max(1, plan.tp);
    tied_bytes_ = static_cast<double>(padded_vocab_size(m.vocab_size, tp)) / tp * static_cast<double>(m.hidden_size) *
                  grad_bytes_;
  }
}

Collective StepDescription::grad_collective() const {
  // DeepSpeed's pipeline engine with bf16 all-reduces ZeRO-1's gradients in
  // full before each rank updates its shard (zero1_grad_all_reduce).
  // So does Megatron-Core's layer-wise Muon (layer_wise_optimizer.py: "Megatron
  // DDP handle allreduce grad, note that each rank have full model and grad").
  const bool all_reduce = zero_ == 0 || (zero_ == 1 && (plan_.trainer.zero1_grad_all_reduce ||
                                                        plan_.optimizer == OptimizerKind::muon));
  return all_reduce ? Collective::all_reduce : Collective::reduce_scatter;
}

StepWhen StepDescription::grad_when() const {
  if (zero_ >= 3) return StepWhen::zero3_units;
  if (zero_ == 2) return StepWhen::every_backward_buckets;
  return plan_.trainer.dp_overlap ? StepWhen::last_backward_buckets : StepWhen::after_backward;
}

double StepDescription::bucket_params(int stage, int chunk) const {
  if (stage == 0 && chunk == 0 && !plan_.trainer.overlap_param_gather_with_optimizer_step) {
    if (plan_.trainer.ddp_bucket_params > 0) return static_cast<double>(plan_.trainer.ddp_bucket_params);
    return std::max(kBucketParams, kBucketParamsPerDpRank * dp_);
  }
  return std::numeric_limits<double>::infinity();
}

StageStep StepDescription::stage(int stage) const {
  StageStep out;
  out.params = stage_parameters(m_, plan_, stage);
  const StageParameters& sp = out.params;
  const StepGroup expert_group = expert_group_ ? StepGroup::expert_dp : StepGroup::dp;
  const auto micro_batches = static_cast<double>(plan_.num_micro_batches());
  if (reduces()) {
    const StepWhen when = grad_when();
    const Collective c = grad_collective();
    // Every micro-batch's gradients with ZeRO 2 and 3, the accumulated ones otherwise.
    const double times = zero_ >= 2 ? micro_batches : 1.0;
    if (dp_ > 1 && sp.dense > 0) out.add({"grad reduce", StepGroup::dp, c, dp_, sp.dense * grad_bytes_, times, when});
    if (edp_ > 1 && sp.expert > 0)
      out.add({"grad reduce (experts)", expert_group, c, edp_, sp.expert * grad_bytes_, times, when});
    // FSDP's and Megatron-FSDP's blocks: the forward and the backward of
    // every micro-batch gather each unit they use. An MoE model's routed
    // experts are a bucket of their own per unit, sharded and gathered over
    // expert-DP (Megatron-LM d98e8a64 megatron_fsdp/param_and_grad_buffer.py:
    // bucket groups keyed by (fsdp_unit_id, is_expert_param), is_expert_param
    // for names with ".experts."; each group's collectives on
    // dist_index.get_fsdp_group(is_expert_parallel=group.is_expert_param));
    // where expert-DP is one rank they stay whole and gather nothing.
    if (zero_ >= 3 && dp_ > 1) {
      const StageParameters quantized = quantized_stage_weights(m_, plan_, stage);
      const bool experts_apart = edp_ > 1 && sp.expert > 0;
      out.add({"zero3 gather", StepGroup::dp, Collective::all_gather, dp_, gathered_bytes(sp.dense, quantized.dense),
               2.0 * micro_batches, StepWhen::zero3_units});
      if (experts_apart)
        out.add({"zero3 gather (experts)", expert_group, Collective::all_gather, edp_,
                 gathered_bytes(sp.expert, quantized.expert), 2.0 * micro_batches, StepWhen::zero3_units});
    }
  }
  if (tied_bytes_ > 0 && (stage == 0 || stage == pp_ - 1)) out.add(tied_embedding());
  if (gathers_after_step()) {
    // --fp8-param-gather: the quantized weights travel as their FP8 rowwise
    // data (Megatron-Core's distributed optimizer gathers the FP8 parameters).
    const StageParameters quantized = quantized_stage_weights(m_, plan_, stage);
    const StepWhen gather_when = gathers_in_next_forward() ? StepWhen::next_forward_buckets : StepWhen::after_optimizer;
    if (dp_ > 1)
      out.add({"param all-gather", StepGroup::dp, Collective::all_gather, dp_, gathered_bytes(sp.dense, quantized.dense), 1.0,
               gather_when});
    if (edp_ > 1 && sp.expert > 0)
      out.add({"expert param all-gather", expert_group, Collective::all_gather, edp_,
               gathered_bytes(sp.expert, quantized.expert), 1.0,
               gather_when});
  }
  return out;
}

StepCollective StepDescription::tied_embedding() const {
  return {"embedding grad all-reduce", StepGroup::embedding, Collective::all_reduce, 2, tied_bytes_, 1.0,
          StepWhen::after_all_backward};
}

std::int64_t StepDescription::optimizer_ns(const GpuProfile& gpu, const StageParameters& sp, int stage) const {
  const OptimizerPrecision precision = optimizer_precision(plan_);
  std::int64_t ns = weight_cast_ns(gpu, quantized_weights_on_stage(m_, plan_, stage));
  if (plan_.optimizer == OptimizerKind::muon) {
    // The dense matrices dealt over DP x CP, the experts' over expert-DP
    // (ZeRO 0: all on every rank); the slowest rank of each, as the gather
    // after the step waits for every rank. Adam steps the rest.
    std::vector<MuonMatrix> dense, expert;
    StageParameters muon;
    for (const MuonMatrix& w : muon_matrices(m_, plan_, stage)) {
      (w.expert ? expert : dense).push_back(w);
      (w.expert ? muon.expert : muon.dense) += w.total_elements();
    }
    const int ranks = zero_ >= 1 ? dp_ : 1, expert_ranks = zero_ >= 1 ? edp_ : 1;
    ns += muon_rank_work(gpu, std::move(dense), ranks).ns + muon_rank_work(gpu, std::move(expert), expert_ranks).ns;
    ns += optimizer_step_time_ns(gpu, sp.dense, dp_, zero_, precision, muon.dense);
    if (sp.expert > 0) ns += optimizer_step_time_ns(gpu, sp.expert, edp_, zero_, precision, muon.expert);
    return ns;
  }
  ns += optimizer_step_time_ns(gpu, sp.dense, dp_, zero_, precision);
  if (sp.expert > 0) ns += optimizer_step_time_ns(gpu, sp.expert, edp_, zero_, precision);
  return ns;
}

std::int64_t StepDescription::first_chunk_step_ns(const GpuProfile& gpu, double dense, int stage) const {
  const double stage_dense = stage_parameters(m_, plan_, stage).dense;
  if (dense <= 0 || stage_dense <= 0) return 0;
  const std::int64_t ns = optimizer_step_time_ns(gpu, dense, dp_, zero_, optimizer_precision(plan_));
  return ns + weight_cast_ns(gpu, quantized_stage_weights(m_, plan_, stage).dense * std::min(1.0, dense / stage_dense));
}

std::int64_t StepDescription::weight_cast_ns(const GpuProfile& gpu, double quantized) const {
  // Megatron-FSDP with --fp8-param-gather has no per-step cast: the
  // optimizer writes the FP8 shard (param_copy, priced as bf16) and each
  // backward gather is transposed (workload.cpp, op::fp8_weight_transpose).
  if (plan_.precision == Precision::bf16 || (zero_ >= 3 && plan_.fp8_param_gather) || quantized <= 0) return 0;
  // Read the bf16 weight (twice where the recipe scans it for its amax
  // first), write the rowwise and columnwise copies (precision.hpp).
  // With --fp8-param-gather the optimizer's param_copy writes the FP8
  // weight (priced as the bf16 one) and the step's cast only transposes
  // the gathered FP8 data into the columnwise copy.
  const double e = quantized_element_bytes(plan_.precision);
  const double per_element = plan_.fp8_param_gather ? e + e
                                                    : (separate_amax(plan_.precision) ? 2 * kBf16Bytes : kBf16Bytes) + 2 * e;
  return kernel_time_ns(gpu, op::fp8_weight_cast, quantized * per_element);
}

}  // namespace cuboid
