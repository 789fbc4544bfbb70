#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// The kernels of one optimizer step on one GPU, as Megatron-LM (2022) runs
// them after the last backward: memory-bound passes over the gradient
// buffer (fp32, or 16-bit in Megatron-Core without grad_reduce_in_fp32), the
// fp32 master weights and Adam's moments. The estimator and the
// simulator price the step as the sum of these kernels.
#include <cstdint>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/time.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

// apex FusedAdam (multi_tensor_adam) on fp32 tensors: reads the gradient,
// master weight, m and v (4 x 4 B), writes master, m and v (3 x 4 B).
inline constexpr double kAdamBytesPerParam = 4 * kFp32Bytes + 3 * kFp32Bytes;

// How a plan keeps the step's tensors.
struct OptimizerPrecision {
  double grad_bytes = kFp32Bytes;    // per element of the gradient buffer (ParallelPlan::grad_element_bytes)
  bool cast_grads = false;           // grad_cast: fp32 main grads copied from 16-bit ones (optimizer_casts_gradients)
  double moment_bytes = kFp32Bytes;  // each of Adam's moments (adam_moment_bytes)
  bool copy_params = true;           // param_copy: the master weight written to the model's by a kernel of its own
};
// The plan's; a default OptimizerPrecision is the executor's (fp32
// gradients and moments).
OptimizerPrecision optimizer_precision(const ParallelPlan& plan);

// The step's kernels for `stage_params` parameters on this GPU (its pipeline
// stage after TP sharding), DP size `dp` and ZeRO stage `zero_stage`
// (1 = Megatron's distributed optimizer: the gradient buffer stays whole,
// the update runs on a 1/dp shard; 2, 3: the gradient buffer is sharded too),
// with the tensors kept as `o` says. Op names: grad_scale, grad_cast (16-bit
// gradients only), grad_norm, adam, param_copy (not under FusedAdam's own
// master weights), grad_zero (kind memory_bound, pass backward; bytes = HBM
// reads + writes).
std::vector<Op> optimizer_step_ops(double stage_params, int dp, int zero_stage, const OptimizerPrecision& o);

// Sum of kernel_time_ns over optimizer_step_ops (a calibrated profile's fit
// by op name, else HBM streaming bandwidth plus one launch per kernel).
TimeNs optimizer_step_time_ns(const GpuProfile& gpu, double stage_params, int dp, int zero_stage,
                              const OptimizerPrecision& o);

}  // namespace cuboid
