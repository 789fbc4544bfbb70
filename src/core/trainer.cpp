#include "cuboid/core/trainer.hpp"

#include <array>

namespace cuboid {

namespace {

TrainerSettings settings(std::string_view name, bool dp_overlap, int dp_grad_bytes, bool zero1_grad_all_reduce = false,
                         bool tp_backward_overlap = true) {
  TrainerSettings s;
  s.tp_backward_overlap = tp_backward_overlap;
  s.preset = std::string(name);
  s.dp_overlap = dp_overlap;
  s.dp_grad_bytes = dp_grad_bytes;
  s.zero1_grad_all_reduce = zero1_grad_all_reduce;
  return s;
}

std::array<TrainerPreset, 6> make_presets() {
  std::array<TrainerPreset, 6> p;

  TrainerPreset& core = p[0];
  core.name = "megatron-core";
  core.description = "Megatron-LM / Megatron-Core of 2026, bf16 (NeMo runs the same core)";
  core.settings = settings(core.name, true, 4);
  core.sources = {
      {"dp_overlap", "Megatron-LM d98e8a64 megatron/training/arguments.py --overlap-grad-reduce (off unless given; "
                     "examples/llama/train_llama3_8b_h100_fp8.sh gives it, as production recipes do)"},
      {"dp_grad_bytes", "Megatron-LM d98e8a64 megatron/training/arguments.py: bf16 sets accumulate_allreduce_grads_in_fp32 "
                        "(fp32 main_grad reduced in fp32) unless --grad-reduce-in-bf16"},
      {"grad_accum_fusion", "Megatron-LM d98e8a64 megatron/training/arguments.py --no-gradient-accumulation-fusion "
                            "(store_false: on by default)"},
      {"flash_attention", "Transformer Engine's fused attention, Megatron-Core's default spec"},
  };

  TrainerPreset& m22 = p[1];
  m22.name = "megatron-2022";
  m22.description = "Megatron-LM of early 2022 (Korthikanti et al.'s sequence parallelism), bf16";
  m22.flash_attention = false;
  m22.grad_accum_fusion = false;
  m22.default_grad_accum_fusion = false;
  m22.zero_stages = {0};
  m22.settings = settings(m22.name, false, 4);
  m22.sources = {
      {"dp_overlap", "Megatron-LM 02bb1f5c megatron/model/distributed.py: the local DDP all-reduces the grad buffers "
                     "once, after the last backward (allreduce_gradients)"},
      {"dp_grad_bytes", "Megatron-LM 02bb1f5c megatron/model/distributed.py _get_buffer_type: fp32 buffers "
                        "(bf16 forces accumulate_allreduce_grads_in_fp32, megatron/arguments.py)"},
      {"grad_accum_fusion", "Megatron-LM 02bb1f5c megatron/mpu/layers.py: the wgrad is a plain matmul; the fusion "
                            "(83b1e42f, 2022-02-16) is not in this code"},
      {"sequence_parallel", "Megatron-LM 02bb1f5c megatron/mpu/layers.py reduce_scatter_to_sequence_parallel_region"},
      {"tp_backward_overlap", "Megatron-LM 02bb1f5c megatron/mpu/layers.py: the input gradient's all-reduce / "
                              "reduce-scatter is issued with async_op=True and waited after the wgrad GEMM"},
      {"flash_attention", "Megatron-LM 02bb1f5c megatron/model/transformer.py CoreAttention: baddbmm, fused softmax, bmm"},
      {"zero_stages", "Megatron-LM 02bb1f5c: no distributed optimizer yet"},
  };

  TrainerPreset& m21 = p[2];
  m21.name = "megatron-2021";
  m21.description = "Megatron-LM of 2021 (Narayanan et al. SC'21 scripts), fp16";
  m21.sequence_parallel = false;
  m21.selective_recompute = false;
  m21.flash_attention = false;
  m21.grad_accum_fusion = false;
  m21.default_grad_accum_fusion = false;
  m21.zero_stages = {0};
  m21.settings = settings(m21.name, false, 2, false, false);
  m21.sources = {
      {"dp_overlap", "Megatron-LM de7dc40f (examples/sc21, 2021-08-10) megatron/model/distributed.py: --DDP-impl local "
                     "(the default) all-reduces once after the last backward; the SC'21 scripts use torch DDP (overlapped: "
                     "--dp-overlap on) only for PP = 1"},
      {"dp_grad_bytes", "Megatron-LM de7dc40f megatron/model/distributed.py: without --accumulate-allreduce-grads-in-fp32 "
                        "(not set by examples/sc21/CONFIG.sh, which sets --fp16) the gradients are reduced in the "
                        "parameter dtype, fp16"},
      {"grad_accum_fusion", "Megatron-LM de7dc40f megatron/mpu/layers.py: no fused wgrad accumulation"},
      {"tp_backward_overlap", "Megatron-LM de7dc40f megatron/mpu/layers.py ColumnParallelLinear: the input gradient's "
                              "all-reduce is copy_to_tensor_model_parallel_region's backward, synchronous (no async_op)"},
      {"sequence_parallel", "Megatron-LM de7dc40f: no sequence parallelism (added 2022)"},
      {"selective_recompute", "Megatron-LM de7dc40f megatron/arguments.py: --checkpoint-activations / "
                              "--activations-checkpoint-method only (whole layers)"},
      {"flash_attention", "Megatron-LM de7dc40f megatron/model/transformer.py: unfused attention core"},
      {"zero_stages", "Megatron-LM de7dc40f: no distributed optimizer"},
  };

  TrainerPreset& mds = p[3];
  mds.name = "megatron-deepspeed";
  mds.description = "Megatron-DeepSpeed on DeepSpeed's pipeline engine (2024-25), bf16";
  mds.interleaved = false;
  mds.grad_accum_fusion = false;
  mds.default_grad_accum_fusion = false;
  mds.zero_stages = {0, 1};
  mds.settings = settings(mds.name, false, 4, true);
  mds.sources = {
      {"dp_overlap", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceGrads after the last "
                     "micro-batch's backward"},
      {"dp_grad_bytes", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: the bf16 optimizer's "
                        "fp32 gradients"},
      {"zero1_grad_all_reduce", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: "
                                "buffered_allreduce_fallback, an all-reduce of the full gradients although the optimizer "
                                "states are partitioned (ZeRO-1)"},
      {"interleaved", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/schedule.py: TrainSchedule is non-interleaved 1F1B"},
      {"zero_stages", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/engine.py: \"ZeRO-2 and ZeRO-3 are incompatible with "
                      "pipeline parallelism\""},
      {"grad_accum_fusion", "microsoft/Megatron-DeepSpeed f4157bea megatron/core/tensor_parallel/layers.py: the fused "
                            "wgrad accumulation is commented out"},
      {"tp_backward_overlap", "microsoft/Megatron-DeepSpeed f4157bea megatron/core/tensor_parallel/layers.py: "
                              "async_op=True in the linear layers' backward"},
      {"sequence_parallel", "microsoft/Megatron-DeepSpeed f4157bea megatron/arguments.py --sequence-parallel, "
                            "--recompute-granularity, --use-flash-attn-v2"},
  };

  TrainerPreset& bloom = p[4];
  bloom.name = "megatron-deepspeed-2022";
  bloom.description = "Megatron-DeepSpeed of 2022 (BigScience's fork, BLOOM) on DeepSpeed's pipeline engine, bf16";
  bloom.sequence_parallel = false;
  bloom.selective_recompute = false;
  bloom.interleaved = false;
  bloom.flash_attention = false;
  bloom.grad_accum_fusion = false;
  bloom.default_grad_accum_fusion = false;
  bloom.zero_stages = {0, 1};
  bloom.settings = settings(bloom.name, false, 4, true, false);
  bloom.sources = {
      {"dp_overlap", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceGrads after the last "
                     "micro-batch's backward"},
      {"dp_grad_bytes", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: the BF16Optimizer's fp32 "
                        "gradients (get_grads_for_reduction)"},
      {"zero1_grad_all_reduce", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: "
                                "buffered_allreduce_fallback, an all-reduce of the full fp32 gradients although the "
                                "BF16Optimizer partitions the optimizer states (ZeRO-1)"},
      {"interleaved", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/schedule.py: TrainSchedule is non-interleaved 1F1B"},
      {"zero_stages", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/engine.py: \"ZeRO-2 and ZeRO-3 are incompatible with "
                      "pipeline parallelism\""},
      {"sequence_parallel", "bigscience-workshop/Megatron-DeepSpeed 8387ae17 megatron/arguments.py: no "
                            "--sequence-parallel; --checkpoint-activations recomputes whole layers"},
      {"flash_attention", "bigscience-workshop/Megatron-DeepSpeed 8387ae17 megatron/model/transformer.py: unfused "
                          "attention core (fused scale-mask-softmax)"},
      {"tp_backward_overlap", "bigscience-workshop/Megatron-DeepSpeed 8387ae17 megatron/mpu/layers.py: no async_op in "
                              "the linear layers' backward"},
      {"grad_accum_fusion", "bigscience-workshop/Megatron-DeepSpeed 8387ae17: no gradient-accumulation fusion; the "
                            "BF16Optimizer adds each micro-batch's bf16 gradients to its fp32 copy"},
  };

  TrainerPreset& tt = p[5];
  tt.name = "torchtitan";
  tt.description = "torchtitan with FSDP2 (v0.2), bf16 parameters, fp32 reduction";
  tt.grad_accum_fusion = false;
  tt.default_grad_accum_fusion = false;
  tt.zero_stages = {0, 2, 3};
  tt.settings = settings(tt.name, true, 4);
  tt.sources = {
      {"dp_overlap", "torchtitan b5bcd76c torchtitan/distributed/fsdp.py: FSDP2 reduce-scatters each unit's "
                     "gradients during the backward"},
      {"dp_grad_bytes", "torchtitan b5bcd76c torchtitan/config/configs.py mixed_precision_reduce = \"float32\""},
      {"grad_accum_fusion", "torchtitan: autograd accumulates .grad; no fused main_grad"},
      {"zero_stages", "torchtitan: FSDP2 (reshard after forward: ZeRO-3, or not: ZeRO-2) or DDP; no ZeRO-1"},
  };
  return p;
}

const std::array<TrainerPreset, 6>& presets() {
  static const std::array<TrainerPreset, 6> p = make_presets();
  return p;
}

}  // namespace

std::span<const TrainerPreset> trainer_presets() { return presets(); }

const TrainerPreset& default_trainer() { return presets()[0]; }

const TrainerPreset* find_trainer(std::string_view name) {
  for (const TrainerPreset& t : presets())
    if (t.name == name) return &t;
  return nullptr;
}

std::string trainer_names() {
  std::string out;
  for (const TrainerPreset& t : presets()) {
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

}  // namespace cuboid
