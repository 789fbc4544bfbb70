#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// One training iteration as the trainer issues it beside the layers' own ops
// (which core/workload lists, with their TP, CP and EP collectives): the
// data-parallel gradient reductions, the parameter gathers of ZeRO, the tied
// embedding's gradient all-reduce, the optimizer step and the pipeline's
// messages, each with its bytes, its group and what it waits for.
//
// The one description both readers take it from: the simulator's builder
// plays it as tasks, the estimator folds it in closed form. What each
// simplifies is said where it reads it (Builder::dp_bucket, estimator.cpp's
// fold_step_collectives). ZeRO-3's gathers and reductions follow the unit
// schedule of core/zero3.hpp, at the bytes per element given here.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/core/cluster.hpp"

namespace cuboid {

// The ranks a DP-side collective runs over.
enum class StepGroup : std::uint8_t {
  dp,         // the stage's DP x CP group (dense parameters)
  expert_dp,  // the experts' expert-DP group (other ranks than dp: EP > 1 or ETP != TP)
  embedding,  // the first and the last stage's ranks of one TP rank and data index
};

// When the trainer issues it, relative to the stage's passes.
enum class StepWhen : std::uint8_t {
  last_backward_buckets,   // bucket by bucket during the last micro-batch's backward (dp_overlap)
  every_backward_buckets,  // bucket by bucket during every micro-batch's backward (ZeRO-2)
  after_backward,          // once, after the stage's last backward (no overlap)
  zero3_units,             // unit by unit in every pass, as core/zero3.hpp schedules them
  after_all_backward,      // after every stage's backward, before the optimizer step
  after_optimizer,         // after the optimizer step (the distributed optimizer's gathers)
  // bucket by bucket in the next iteration's first forward of each model
  // chunk (--overlap-param-gather): one simulated iteration plays the gather
  // of the step before it there
  next_forward_buckets,
};

std::string_view to_string(StepGroup g);
std::string_view to_string(StepWhen w);

// One kind of DP-side collective of one stage, summed over the iteration.
struct StepCollective {
  std::string_view name;  // "grad reduce", "param all-gather", "embedding grad all-reduce", ...
  StepGroup group = StepGroup::dp;
  Collective collective = Collective::all_reduce;
  int ranks = 1;       // the group's size
  double bytes = 0;    // one issue's, on one GPU (buckets split it; zero3_units: the passes' units do)
  double issues = 1;   // per iteration: the micro-batches of ZeRO 2, the passes of ZeRO-3, else 1
  StepWhen when = StepWhen::after_backward;
  double iteration_bytes() const { return bytes * issues; }
};

// One stage's part of the iteration: its parameters on one GPU and its
// DP-side collectives (at most one of each kind; no allocation, as the
// search folds one per candidate).
struct StageStep {
  StageParameters params;
  std::array<StepCollective, 7> items{};
  std::size_t size = 0;
  std::span<const StepCollective> collectives() const& { return {items.data(), size}; }
  // A span into a temporary would dangle (a range-for over stage(s).collectives()).
  std::span<const StepCollective> collectives() const&& = delete;
  void add(const StepCollective& c) { items[size++] = c; }
};

class StepDescription {
 public:
  StepDescription(const ModelSpec& m, const ParallelPlan& plan, const Calibration* calibration);

  // Gradients to reduce at all: DP x CP or expert-DP above 1.
  bool reduces() const { return dp_ > 1 || edp_ > 1; }
  // The experts reduce over ranks of their own (else over the DP x CP group).
  bool expert_group() const { return expert_group_; }
  int dp() const { return dp_; }
  int expert_dp() const { return edp_; }

  // Bytes per element of a reduced gradient (TrainerSettings::dp_grad_bytes)
  // and of a gathered parameter (the compute dtype: bf16, f32 on the CPU
  // executor's calibrated card).
  double grad_bytes_per_param() const { return grad_bytes_; }
  double param_bytes_per_param() const { return param_bytes_; }
  // Bytes gathered for `params` parameters of which `quantized` are
  // quantized linear weights: those at the format's bytes with
  // --fp8-param-gather (the distributed optimizer's gather after the step;
  // ZeRO-3's per unit: Megatron-FSDP gathers the FP8 rowwise shard in the
  // forward, and in the backward the rowwise one again or, MXFP8, the
  // columnwise one), the rest at param_bytes_per_param().
  double gathered_bytes(double params, double quantized) const {
    return (params - quantized) * param_bytes_ + quantized * quantized_gather_bytes_;
  }
  // A pipeline message (an activation or its gradient) of one micro-batch.
  double pipeline_message_bytes() const { return message_bytes_; }

  // ZeRO 0 and ZeRO-1 with zero1_grad_all_reduce all-reduce the gradients;
  // ZeRO 1-3 otherwise reduce-scatter them.
  Collective grad_collective() const;
  // When a stage's gradient reduction runs (ZeRO 0-2; ZeRO-3: zero3_units).
  StepWhen grad_when() const;
  // Megatron-Core's DDP bucket for one pass of a model chunk, in parameters:
  // max(40M, 1M x DP) on the first stage's first chunk (bucket_size in
  // DistributedDataParallelConfig), the whole chunk elsewhere (infinity), and
  // everywhere with the gather under the step (Megatron-LM d98e8a64
  // megatron/training/training.py per_chunk_disable_bucketing).
  double bucket_params(int stage, int chunk) const;
  // The updated parameters are gathered after the step (ZeRO 1 and 2).
  bool gathers_after_step() const { return reduces() && (zero_ == 1 || zero_ == 2); }
  // ... in the next forward instead (TrainerSettings::overlap_param_gather;
  // Megatron-Core's param_and_grad_buffer.py finish_param_sync: each chunk's
  // first bucket is issued at its first forward, the next one when the one
  // before it completes, and each bucket's forward waits for its own).
  bool gathers_in_next_forward() const { return gathers_after_step() && plan_.trainer.overlap_param_gather; }
  // ... except the first model chunk's, issued inside the optimizer step
  // (TrainerSettings::overlap_param_gather_with_optimizer_step; Megatron-Core
  // optimizer/__init__.py:1063 gives that chunk's dense parameters an
  // optimizer of their own, chained first; ChainedOptimizer._step dispatches
  // the chunk's gathers, its expert buckets too, once that one has stepped,
  // and the other chunks' dense and then every expert parameter step beside
  // them; the chunk's first forward waits for them).
  bool gathers_in_step() const {
    return gathers_in_next_forward() && plan_.trainer.overlap_param_gather_with_optimizer_step;
  }
  // ... and the interleaved schedule issues each chunk's ahead of its first
  // forward (ParallelPlan::aligns_param_gather).
  bool gathers_aligned() const { return gathers_in_next_forward() && plan_.aligns_param_gather(); }
  int pipeline_stages() const { return pp_; }
  // The tied word embedding's gradient all-reduce between the first and the
  // last stage (Megatron: fp32 main_grad, after every backward), per GPU; 0
  // when the model does not tie it or PP is 1.
  double tied_embedding_bytes() const { return tied_bytes_; }
  // That all-reduce as a collective of the first and the last stage.
  StepCollective tied_embedding() const;

  // The stage's parameters and its DP-side collectives over the iteration
  // (the bytes of each add up every bucket and micro-batch).
  StageStep stage(int stage) const;
  // The optimizer step's kernels on one GPU of stage `stage` with these
  // parameters (optimizer_step.hpp): the dense ones on their DP x CP shard,
  // the experts on their expert-DP shard. An FP8 / FP4 plan adds the cast of
  // the stage's quantized weights, once per step (Megatron-Core sets
  // is_first_microbatch for the first micro-batch only; Transformer Engine
  // casts the weights then and reuses the copies): it runs in the first
  // micro-batch's forward, priced here, with the step.
  std::int64_t optimizer_ns(const GpuProfile& gpu, const StageParameters& sp, int stage) const;
  // Of it, the first model chunk's own optimizer (gathers_in_step): the step
  // of its `dense` parameters and their share of the FP8 cast.
  std::int64_t first_chunk_step_ns(const GpuProfile& gpu, double dense, int stage) const;

 private:
  const ModelSpec& m_;
  const ParallelPlan& plan_;
  int pp_ = 1, dp_ = 1, edp_ = 1, zero_ = 0;
  bool expert_group_ = false;
  double grad_bytes_ = 0, param_bytes_ = 0, message_bytes_ = 0, tied_bytes_ = 0, quantized_gather_bytes_ = 0;
  // The step's cast of `quantized` linear weights into their FP8 / FP4 copies.
  std::int64_t weight_cast_ns(const GpuProfile& gpu, double quantized) const;
};

}  // namespace cuboid
