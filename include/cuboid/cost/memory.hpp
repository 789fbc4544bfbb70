#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// Per-GPU memory, reported like Megatron-LM's theoretical memory report
// (megatron/training/theoretical_memory_usage.py) in two parts, weights +
// optimizer and activations, plus a workspace reserve; generalised to ZeRO
// stages, recompute modes, schedules and every pipeline stage.
#include <cstdint>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

struct MemoryReport {
  double parameters = 0;                  // parameters held by the peak GPU (before ZeRO-3 sharding)
  double weight_and_optimizer_bytes = 0;  // bf16 weights + fp32 grads + fp32 master + Adam m, v (per ZeRO)
  double activation_bytes = 0;            // all micro-batches in flight on the peak stage
  double reserve_bytes = 0;               // GPU profile's workspace reserve
  double total_bytes = 0;                 // sum of the three on the peak stage
  double capacity_bytes = 0;              // GPU HBM
  int peak_stage = 0;                     // pipeline stage with the largest total

  bool fits() const { return total_bytes <= capacity_bytes; }
  double headroom_bytes() const { return capacity_bytes - total_bytes; }
};

// Bytes per parameter for weights + gradients + optimizer states with mixed
// precision Adam: 18 without sharding (2 bf16 weight + 4 fp32 grad + 4 fp32
// master + 4 + 4 Adam moments), Megatron's distributed optimizer / ZeRO-1
// 6 + 12/dp, ZeRO-2 2 + 16/dp, ZeRO-3 18/dp.
double bytes_per_parameter(int zero_stage, int dp);

// Parameters on one GPU of pipeline stage `stage` (transformer layers of the
// stage / tp, plus the embedding on the first stage and the LM head on the
// last stage unless tied and pp == 1). Follows Megatron's counting
// (everything divided by tp).
double parameters_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage);

// Activation bytes of one transformer layer for one micro-batch on one GPU
// (Korthikanti et al. 2022, Table 2, generalised to GQA and gated MLPs):
//   no recompute, no SP: s*b*h*(10 + P/t) + A/t, P = 24 for GPT; A = 5*a*s^2*b (0 with flash attention)
//   sequence parallel:   s*b*h*(10 + P)/t + A/t
//   selective recompute: the attention-core term A is dropped
//   full recompute:      2*s*b*h (the layer input; / t with SP)
double activation_bytes_per_layer(const ModelSpec& m, const ParallelPlan& plan);

// Micro-batches whose activations stage `stage` holds at its peak under the
// plan's schedule: GPipe: all m; 1F1B: min(m, pp - stage); interleaved:
// pp * (1 + (pp-1)/(pp*v)) on the first stage (Megatron's penalty).
// Activations of a stage =
// per-layer bytes x layers on the stage x this count.
double in_flight_micro_batches(const ParallelPlan& plan, int stage);

MemoryReport memory_per_gpu(const ModelSpec& m, const ParallelPlan& plan, const GpuProfile& gpu);

}  // namespace cuboid
