#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// The kernels of one optimizer step on one GPU, as Megatron-LM (2022) runs
// them after the last backward: memory-bound passes over the fp32 gradient
// buffer, the fp32 master weights and Adam's moments. The estimator and the
// simulator price the step as the sum of these kernels.
#include <cstdint>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/time.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

// apex FusedAdam (multi_tensor_adam) on fp32 tensors: reads the gradient,
// master weight, m and v (4 x 4 B), writes master, m and v (3 x 4 B).
inline constexpr double kAdamBytesPerParam = 4 * kFp32Bytes + 3 * kFp32Bytes;

// The step's kernels for `stage_params` parameters on this GPU (its pipeline
// stage after TP sharding), DP size `dp` and ZeRO stage `zero_stage`
// (1 = Megatron's distributed optimizer: the gradient buffer stays whole,
// the update runs on a 1/dp shard; 2, 3: the gradient buffer is sharded too).
// Op names: grad_scale, grad_norm, adam, param_copy, grad_zero (kind
// memory_bound, pass backward; bytes = HBM reads + writes).
std::vector<Op> optimizer_step_ops(double stage_params, int dp, int zero_stage);

// Sum of kernel_time_ns over optimizer_step_ops (a calibrated profile's fit
// by op name, else HBM streaming bandwidth plus one launch per kernel).
TimeNs optimizer_step_time_ns(const GpuProfile& gpu, double stage_params, int dp, int zero_stage);

}  // namespace cuboid
