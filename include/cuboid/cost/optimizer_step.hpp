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
#include "cuboid/cost/memory.hpp"

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
// `muon_params` of the stage's parameters step under Muon instead of Adam
// (muon_rank_work prices them): Adam's kernel runs on the rest.
TimeNs optimizer_step_time_ns(const GpuProfile& gpu, double stage_params, int dp, int zero_stage,
                              const OptimizerPrecision& o, double muon_params = 0);

// Muon as Megatron-Core steps it (ParallelPlan::optimizer; Megatron-LM
// cd4afffa megatron/core/optimizer/emerging_optimizers.py TensorParallelMuon,
// layer_wise_optimizer.py; NVIDIA-NeMo/Emerging-Optimizers fd77292
// orthogonalized_optimizers/orthogonalized_optimizer.py step, muon_utils.py
// newton_schulz). Per 2-D weight on its fp32 master copy, one PyTorch kernel
// each: weight decay `p.mul_` (read 4 + write 4), the momentum's `lerp_`
// (12), Nesterov's `grad.lerp` (12; Megatron-Bridge's recipes set it), the
// Frobenius normalisation (norm 4, divide 8), the cast to bf16 (6) for the
// Newton-Schulz steps at fp32_matmul_prec "medium" and back (6), the
// spectral scale times the extra factor (two multiplies, 16) and `p.add_`
// (12): kMuonBytesPerParam, 9 passes + the norm's reduction.
inline constexpr double kMuonBytesPerParam = 84;
inline constexpr int kMuonElementwiseKernels = 10;
// Megatron-LM's --muon-num-ns-steps default (arguments.py; Bridge's recipes keep it).
inline constexpr int kMuonNewtonSchulzSteps = 5;

// `count` 2-D weights of one shape that Muon orthogonalises on one GPU (its
// TP shard: tp_mode "blockwise", the default, orthogonalises each rank's
// block on its own).
struct MuonMatrix {
  std::int64_t rows = 0, cols = 0;
  bool expert = false;  // a routed expert's (stepped over the expert-DP group)
  std::int64_t count = 1;
  double elements() const { return static_cast<double>(rows) * static_cast<double>(cols); }
  double total_elements() const { return elements() * static_cast<double>(count); }
};

// The matrices of stage `stage` on one GPU, those of one shape and group in
// one entry, in the order the stage's layers hold them: each linear layer's
// weight but the embedding and the LM head (Adam's:
// _is_nonlinear_or_embedding), the fused QKV weight split into its Q, K and
// V blocks (muon_split_qkv, default on), each local expert's fc1 and fc2.
std::vector<MuonMatrix> muon_matrices(const ModelSpec& m, const ParallelPlan& plan, int stage);
// Their elements: the dense ones and the routed experts'.
StageParameters muon_elements(const ModelSpec& m, const ParallelPlan& plan, int stage);

// The Newton-Schulz FLOPs of one matrix: per step, with r the smaller side
// and c the larger (newton_schulz transposes to whiten the smaller), A = X
// X^T (2 r^2 c), B = b A + c A A (2 r^3), X = a X + B X (2 r^2 c).
double muon_newton_schulz_flops(const MuonMatrix& w, int steps = kMuonNewtonSchulzSteps);
// One matrix's step: the elementwise passes and the 3 x steps bf16 GEMMs.
TimeNs muon_matrix_time_ns(const GpuProfile& gpu, const MuonMatrix& w);

// The busiest rank's share when `ranks` ranks split `matrices` as the
// layer-wise optimizer does (layer_wise_optimizer.py _shard_params_ping_pong:
// sorted by size, ascending, dealt 0, 1, ..., R-1, R-1, ..., 0, 0, 1, ...;
// ranks 1: every matrix on one). Entries of equal size keep their order.
struct MuonRankWork {
  TimeNs ns = 0;          // that rank's Muon step
  double elements = 0;    // its matrices' elements
};
MuonRankWork muon_rank_work(const GpuProfile& gpu, std::vector<MuonMatrix> matrices, int ranks);

}  // namespace cuboid
