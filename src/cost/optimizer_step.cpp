// Megatron-LM's optimizer step as it ran in 2022 (the code of Korthikanti et
// al.): bf16 training with fp32 gradient accumulation (main_grad, the local
// DDP's contiguous fp32 buffer), Float16OptimizerWithFloat16Params or the
// distributed optimizer, apex FusedAdam. Per parameter, per step:
//
//   grad_scale  megatron/model/distributed.py allreduce_gradients:
//               `buffer_.data /= get_data_parallel_world_size()` before the
//               DP all-reduce, in place over the fp32 buffer (read 4 + write
//               4); it runs at DP = 1 too (dividing by 1 is still a kernel).
//   grad_norm   megatron/optimizer/clip_grads.py clip_grad_norm_fp32:
//               multi_tensor_l2norm reads the fp32 grads once (4).
//   adam        apex FusedAdam.step, multi_tensor_adam on fp32 p, g, m, v:
//               reads 16, writes 12 (kAdamBytesPerParam).
//   param_copy  optimizer.py _copy_main_params_to_model_params: fp32 master
//               -> bf16 model weight (read 4 + write 2).
//   grad_zero   training.py train_step: model.zero_grad_buffer() zeroes the
//               fp32 buffer for the next step (write 4).
//
// With 16-bit gradients (grad_bytes 2: Megatron-Core's DDP without
// grad_reduce_in_fp32, Megatron-FSDP's default main-grads dtype) the buffer
// ops move 2 B an element, and the optimizer's fp32 main grads are a cast of
// this GPU's shard of the buffer:
//   grad_cast   distrib_optimizer.py _copy_model_grads_to_main_grads
//               `shard_model_grad.float()` (optimizer.py's Float16Optimizer
//               `main_grad.float()`; Megatron-FSDP's optimizer
//               `grad.to(dtype=parameter.data.dtype)`,
//               fully_sharded_optimizer.py; Megatron-LM d98e8a64): read 2 +
//               write 4 over the shard (ParallelPlan::optimizer_casts_gradients).
// The precision-aware optimizer (Transformer Engine's FusedAdam,
// multi_tensor_adam with exp_avg_dtype / exp_avg_sq_dtype) reads and writes
// Adam's moments at their bytes; where it holds the master weights it reads
// the gradient buffer as it is (decoupled_grad: no grad_cast, grad_norm and
// Adam read 2 B), keeps the master weight as the bf16 weight plus a 16-bit
// remainder (read 2 + 2, write 2 + 2: the model's weight written in the same
// kernel) and so runs no param_copy.
// Not charged: that cast of an fp32 buffer (`.float()` returns the same
// tensor: no kernel); unscale + found-inf
// (fp16 only: bf16 runs without a grad scaler); the clip itself
// (multi_tensor_scale only when the norm exceeds the threshold, a data-
// dependent branch); count_zeros (off by default). Launches: the multi-tensor
// kernels handle 320 chunks of 64 K elements per launch (apex
// multi_tensor_apply), milliseconds of work each, so their launches hide
// behind the previous kernel; one launch per op is charged. With fp16 the
// step would add `.float()` of an fp16 buffer (2 + 4) and the unscale
// (4 + 4), and the buffer ops would move 2 B instead of 4.
#include "cuboid/cost/optimizer_step.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/memory.hpp"

namespace cuboid {

namespace {


// One kernel of the step: its op name and HBM bytes.
struct StepKernel {
  const char* name;
  double bytes;
};

// The six kernels in Megatron's order (0 bytes: not run). A fixed array,
// not Ops: the estimator prices a step for every candidate plan it scores.
std::array<StepKernel, 6> step_kernels(double stage_params, int dp, int zero_stage, const OptimizerPrecision& o,
                                        double muon_params = 0) {
  const double groups = static_cast<double>(std::max(1, dp));
  // The parameters whose master weights and moments this GPU updates, and
  // the elements of its gradient buffer (whole up to ZeRO 1).
  const double shard = zero_stage >= 1 ? stage_params / groups : stage_params;
  const double buffer = zero_stage >= 2 ? shard : stage_params;
  const double g = o.grad_bytes;
  // What the norm and Adam read: the fp32 cast, else the buffer.
  const double read = o.cast_grads ? kFp32Bytes : g;
  // Adam's share: the parameters Muon does not step.
  const double rest = std::max(0.0, stage_params - muon_params);
  const double adam = zero_stage >= 1 ? rest / groups : rest;
  return {{{op::grad_scale, buffer * (g + g)},
           {op::grad_cast, o.cast_grads ? shard * (g + kFp32Bytes) : 0.0},
           {op::grad_norm, shard * read},
           {op::adam, adam * (read + 2 * kFp32Bytes + 4 * o.moment_bytes)},
           {op::param_copy, o.copy_params ? shard * (kFp32Bytes + kBf16Bytes) : 0.0},
           {op::grad_zero, buffer * g}}};
}

}  // namespace

OptimizerPrecision optimizer_precision(const ParallelPlan& plan) {
  return {static_cast<double>(plan.grad_element_bytes()), plan.optimizer_casts_gradients(),
          static_cast<double>(plan.adam_moment_bytes), !plan.optimizer_holds_master_weights()};
}

std::vector<Op> optimizer_step_ops(double stage_params, int dp, int zero_stage, const OptimizerPrecision& o) {
  std::vector<Op> ops;
  ops.reserve(6);
  for (const StepKernel& k : step_kernels(stage_params, dp, zero_stage, o)) {
    if (!(k.bytes > 0)) continue;
    Op op;
    op.name = k.name;
    op.kind = OpKind::memory_bound;
    op.pass = Pass::backward;
    op.bytes = k.bytes;
    ops.push_back(std::move(op));
  }
  return ops;
}

TimeNs optimizer_step_time_ns(const GpuProfile& gpu, double stage_params, int dp, int zero_stage,
                              const OptimizerPrecision& o, double muon_params) {
  TimeNs ns = 0;
  for (const StepKernel& k : step_kernels(stage_params, dp, zero_stage, o, muon_params))
    ns += kernel_time_ns(gpu, k.name, k.bytes);
  return ns;
}

std::vector<MuonMatrix> muon_matrices(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  std::vector<MuonMatrix> out;
  const auto add = [&](MuonMatrix w) {
    for (MuonMatrix& e : out)
      if (e.rows == w.rows && e.cols == w.cols && e.expert == w.expert) {
        e.count += w.count;
        return;
      }
    out.push_back(w);
  };
  const auto add_layer = [&](bool moe_layer, std::int64_t times) {
    if (times <= 0) return;
    for (const Op& op : transformer_layer_ops(m, plan, moe_layer).forward) {
      if (op.kind != OpKind::gemm || op.name == op::attn_qk || op.name == op::attn_av) continue;
      // The weight of y = x W^T: n outputs x k inputs, one per local expert.
      if (op.name == op::qkv) {
        const std::int64_t tp = std::max(1, plan.tp);
        const std::int64_t q = m.query_projection_size() / tp, kv = m.kv_projection_size() / tp;
        add({q, op.k, false, times});
        add({kv, op.k, false, 2 * times});
        continue;
      }
      add({op.n, op.k, op.grouped, op.batch * times});
    }
  };
  const int moe = moe_layers_on_stage(m, plan, stage);
  add_layer(false, layers_on_stage(plan, m.num_layers, stage) - moe);
  add_layer(true, moe);
  if (stage == plan.pp - 1 && m.mtp_layers > 0)
    add_layer(m.moe.enabled() && m.moe.moe_layers.back(), m.mtp_layers);
  return out;
}

StageParameters muon_elements(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  StageParameters e;
  for (const MuonMatrix& w : muon_matrices(m, plan, stage))
    (w.expert ? e.expert : e.dense) += w.total_elements();
  return e;
}

double muon_newton_schulz_flops(const MuonMatrix& w, int steps) {
  const double r = static_cast<double>(std::min(w.rows, w.cols)), c = static_cast<double>(std::max(w.rows, w.cols));
  return steps * (4 * r * r * c + 2 * r * r * r);
}

TimeNs muon_matrix_time_ns(const GpuProfile& gpu, const MuonMatrix& w) {
  const std::int64_t r = std::min(w.rows, w.cols), c = std::max(w.rows, w.cols);
  const TimeNs step = gemm_time_ns(gpu, r, r, c) + gemm_time_ns(gpu, r, r, r) + gemm_time_ns(gpu, r, c, r);
  const double elements = w.elements();
  return kMuonNewtonSchulzSteps * step + memory_bound_time_ns(gpu, elements * kMuonBytesPerParam) +
         (kMuonElementwiseKernels - 1) * static_cast<TimeNs>(gpu.kernel_launch_ns);
}

MuonRankWork muon_rank_work(const GpuProfile& gpu, std::vector<MuonMatrix> matrices, int ranks) {
  const std::int64_t r = std::max(1, ranks), period = 2 * r;
  std::stable_sort(matrices.begin(), matrices.end(),
                   [](const MuonMatrix& a, const MuonMatrix& b) { return a.elements() < b.elements(); });
  std::vector<MuonRankWork> work(static_cast<std::size_t>(r));
  const auto rank_at = [&](std::int64_t position) {
    const std::int64_t turn = position % period;
    return static_cast<std::size_t>(turn < r ? turn : period - 1 - turn);
  };
  std::int64_t position = 0;
  for (const MuonMatrix& w : matrices) {
    if (w.count <= 0) continue;
    const TimeNs ns = muon_matrix_time_ns(gpu, w);
    // Each whole round of 2R gives every rank two; the rest one at a time.
    const std::int64_t rounds = w.count / period, rest = w.count % period;
    for (MuonRankWork& rank : work) {
      rank.ns += 2 * rounds * ns;
      rank.elements += 2.0 * static_cast<double>(rounds) * w.elements();
    }
    for (std::int64_t i = 0; i < rest; ++i) {
      MuonRankWork& rank = work[rank_at(position + i)];
      rank.ns += ns;
      rank.elements += w.elements();
    }
    position += w.count;
  }
  return *std::max_element(work.begin(), work.end(),
                           [](const MuonRankWork& a, const MuonRankWork& b) { return a.ns < b.ns; });
}

}  // namespace cuboid
