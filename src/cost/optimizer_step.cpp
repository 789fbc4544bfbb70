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
// Not charged: _copy_model_grads_to_main_grads (`main_grad.float()` of an
// fp32 buffer returns the same tensor: no kernel); unscale + found-inf
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

namespace cuboid {

namespace {


// One kernel of the step: its op name and HBM bytes.
struct StepKernel {
  const char* name;
  double bytes;
};

// The five kernels in Megatron's order. A fixed array, not Ops: the
// estimator prices a step for every candidate plan it scores.
std::array<StepKernel, 5> step_kernels(double stage_params, int dp, int zero_stage) {
  const double groups = static_cast<double>(std::max(1, dp));
  // The parameters whose master weights and moments this GPU updates, and
  // the elements of its fp32 gradient buffer (whole up to ZeRO 1).
  const double shard = zero_stage >= 1 ? stage_params / groups : stage_params;
  const double buffer = zero_stage >= 2 ? shard : stage_params;
  return {{{op::grad_scale, buffer * (kFp32Bytes + kFp32Bytes)},
           {op::grad_norm, shard * kFp32Bytes},
           {op::adam, shard * kAdamBytesPerParam},
           {op::param_copy, shard * (kFp32Bytes + kBf16Bytes)},
           {op::grad_zero, buffer * kFp32Bytes}}};
}

}  // namespace

std::vector<Op> optimizer_step_ops(double stage_params, int dp, int zero_stage) {
  std::vector<Op> ops;
  ops.reserve(5);
  for (const StepKernel& k : step_kernels(stage_params, dp, zero_stage)) {
    Op op;
    op.name = k.name;
    op.kind = OpKind::memory_bound;
    op.pass = Pass::backward;
    op.bytes = k.bytes;
    ops.push_back(std::move(op));
  }
  return ops;
}

TimeNs optimizer_step_time_ns(const GpuProfile& gpu, double stage_params, int dp, int zero_stage) {
  TimeNs ns = 0;
  for (const StepKernel& k : step_kernels(stage_params, dp, zero_stage)) ns += kernel_time_ns(gpu, k.name, k.bytes);
  return ns;
}

}  // namespace cuboid
