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

// How FSDP2 and Megatron-FSDP run ZeRO-3 (the defaults, spelled out so each
// preset cites them): a transformer block per gather, the next one
// prefetched (Megatron-FSDP: the next blocks up to `prefetch_params`
// elements), all_gather_into_tensor without host synchronisation.
void modern_zero3(TrainerSettings& s, std::int64_t prefetch_units, std::int64_t prefetch_params) {
  s.zero3_unit = Zero3Unit::block;
  s.zero3_prefetch_units = static_cast<int>(prefetch_units);
  s.zero3_prefetch_params = prefetch_params;
  s.zero3_sync = false;
  s.zero3_list_collectives = false;
}

// What DeepSpeed's pipeline engine runs in every version read (v0.5.4, v0.7.0,
// v0.16.0; each preset cites its own): TrainSchedule's non-interleaved 1F1B,
// ZeRO 0-1 only, ReduceGrads after the last backward with ZeRO-1's gradients
// all-reduced in full, and Megatron-DeepSpeed's linear layers without the fused
// wgrad accumulation. The name must be set first.
void deepspeed_pipeline_engine(TrainerPreset& t, int dp_grad_bytes, bool tp_backward_overlap, int grad_accum_bytes) {
  t.interleaved = false;
  t.grad_accum_fusion = false;
  t.default_grad_accum_fusion = false;
  t.zero_stages = {0, 1};
  t.settings = settings(t.name, false, dp_grad_bytes, true, tp_backward_overlap);
  t.settings.grad_accum_bytes = grad_accum_bytes;
}

std::array<TrainerPreset, 8> make_presets() {
  std::array<TrainerPreset, 8> p;

  TrainerPreset& core = p[0];
  core.name = "megatron-core";
  core.description = "Megatron-LM / Megatron-Core of 2026, bf16 (NeMo runs the same core)";
  core.settings = settings(core.name, true, 4);
  // max(1e9, 2 x a TransformerLayer's elements) / 2: the next layers up to
  // 5e8 elements, or one layer when it holds more.
  modern_zero3(core.settings, 0, 500'000'000);
  core.uneven_interleaved = true;
  core.context_parallel = true;
  core.context_parallel_a2a = true;
  core.expert_parallel = true;
  core.sources = {
      {"expert_parallel", "Megatron-LM d98e8a64 megatron/training/arguments.py --expert-model-parallel-size (num_experts "
                          "% EP == 0), --expert-tensor-parallel-size (default TP); megatron/core/parallel_state.py: "
                          "the experts regroup a stage's TP x CP x DP ranks as ETP x EP x expert-DP; "
                          "megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher"},
      {"context_parallel", "Megatron-LM d98e8a64 megatron/training/arguments.py --context-parallel-size (seq_length "
                           "% 2 x CP == 0) and --cp-comm-type p2p | a2a | allgather | a2a+p2p (default p2p); the "
                           "attention is Transformer Engine's DotProductAttention with its context-parallel paths"},
      {"uneven_stages", "Megatron-LM d98e8a64 megatron/training/arguments.py --decoder-first-pipeline-num-layers / "
                        "--decoder-last-pipeline-num-layers (fa8bb592, 2024-09); megatron/core/transformer/"
                        "transformer_block.py get_num_layers_to_build: the middle stages share the rest evenly"},
      {"uneven_interleaved", "Megatron-LM d98e8a64 (ef490839, 2025-02, 'Uneven Virtual Pipeline Parallelism'): "
                             "--num-virtual-stages-per-pipeline-rank with uneven stages; transformer_config.py "
                             "__post_init__ and transformer_block.py get_num_layers_to_build: every stage's layers "
                             "divisible by the virtual pipeline size, each chunk a stage's layers / that size"},
      {"dp_overlap", "Megatron-LM d98e8a64 megatron/training/arguments.py --overlap-grad-reduce (off unless given; "
                     "examples/llama/train_llama3_8b_h100_fp8.sh gives it, as production recipes do)"},
      {"dp_grad_bytes", "Megatron-LM d98e8a64 megatron/training/arguments.py: bf16 sets accumulate_allreduce_grads_in_fp32 "
                        "(fp32 main_grad reduced in fp32) unless --grad-reduce-in-bf16"},
      {"grad_accum_fusion", "Megatron-LM d98e8a64 megatron/training/arguments.py --no-gradient-accumulation-fusion "
                            "(store_false: on by default)"},
      {"flash_attention", "Transformer Engine's fused attention, Megatron-Core's default spec"},
      {"zero3_unit", "Megatron-LM d98e8a64 megatron/core/distributed/fsdp/mcore_fsdp_adapter.py: fsdp_unit_modules = "
                     "[TransformerLayer, ...] (ZeRO-3 = Megatron-FSDP, --data-parallel-sharding-strategy "
                     "optim_grads_params)"},
      {"zero3_prefetch_params", "Megatron-LM d98e8a64 megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py: "
                                "suggested_AG_prefetch_size = max(1e9, 2 x the mean FSDP unit's elements) // 2; "
                                "param_and_grad_buffer.py all_gather_params adds the next buckets until the prefetched "
                                "size reaches it"},
      {"zero3_sync", "Megatron-LM d98e8a64 megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py: "
                     "one torch.distributed.all_gather_into_tensor(async_op=True) per bucket, waited for by the stream "
                     "that needs it; no device synchronisation per gather"},
  };

  TrainerPreset& m22 = p[1];
  m22.name = "megatron-2022";
  m22.description = "Megatron-LM of early 2022 (Korthikanti et al.'s sequence parallelism), bf16";
  m22.flash_attention = false;
  m22.grad_accum_fusion = false;
  m22.default_grad_accum_fusion = false;
  m22.zero_stages = {0};
  m22.uneven_stages = false;
  m22.settings = settings(m22.name, false, 4);
  m22.sources = {
      {"uneven_stages", "Megatron-LM 02bb1f5c megatron/mpu/initialize.py get_num_layers: assert num_layers % "
                        "transformer_pipeline_model_parallel_size == 0 (decoder-only models)"},
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
  m21.uneven_stages = false;
  m21.settings = settings(m21.name, false, 2, false, false);
  m21.settings.grad_accum_bytes = 6;
  m21.sources = {
      {"dp_overlap", "Megatron-LM de7dc40f (examples/sc21, 2021-08-10) megatron/model/distributed.py: --DDP-impl local "
                     "(the default) all-reduces once after the last backward; the SC'21 scripts use torch DDP (overlapped: "
                     "--dp-overlap on) only for PP = 1"},
      {"dp_grad_bytes", "Megatron-LM de7dc40f megatron/model/distributed.py: without --accumulate-allreduce-grads-in-fp32 "
                        "(not set by examples/sc21/CONFIG.sh, which sets --fp16) the gradients are reduced in the "
                        "parameter dtype, fp16"},
      {"grad_accum_fusion", "Megatron-LM de7dc40f megatron/mpu/layers.py: no fused wgrad accumulation"},
      {"grad_accum_bytes", "Megatron-LM de7dc40f megatron/model/distributed.py: without --use-contiguous-buffers-in-ddp "
                           "(not set by examples/sc21, and forced only by --accumulate-allreduce-grads-in-fp32) there is "
                           "no main_grad hook: autograd adds each micro-batch's fp16 gradient to param.grad in place "
                           "(read 2 + 2, write 2)"},
      {"tp_backward_overlap", "Megatron-LM de7dc40f megatron/mpu/layers.py ColumnParallelLinear: the input gradient's "
                              "all-reduce is copy_to_tensor_model_parallel_region's backward, synchronous (no async_op)"},
      {"sequence_parallel", "Megatron-LM de7dc40f: no sequence parallelism (added 2022)"},
      {"selective_recompute", "Megatron-LM de7dc40f megatron/arguments.py: --checkpoint-activations / "
                              "--activations-checkpoint-method only (whole layers)"},
      {"flash_attention", "Megatron-LM de7dc40f megatron/model/transformer.py: unfused attention core"},
      {"zero_stages", "Megatron-LM de7dc40f: no distributed optimizer"},
      {"uneven_stages", "Megatron-LM de7dc40f megatron/model/transformer.py ParallelTransformer: assert num_layers % "
                        "pipeline_model_parallel_size == 0"},
  };

  TrainerPreset& mds = p[3];
  mds.name = "megatron-deepspeed";
  mds.description = "Megatron-DeepSpeed on DeepSpeed's pipeline engine (2024-25), bf16";
  deepspeed_pipeline_engine(mds, 4, true, 18);
  mds.sources = {
      {"dp_overlap", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceGrads after the last "
                     "micro-batch's backward"},
      {"dp_grad_bytes", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: the bf16 optimizer's "
                        "fp32 gradients"},
      {"zero1_grad_all_reduce", "DeepSpeed v0.16.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: "
                                "buffered_allreduce_fallback, an all-reduce of the full gradients although the optimizer "
                                "states are partitioned (ZeRO-1)"},
      {"grad_accum_bytes", "DeepSpeed v0.16.0 deepspeed/runtime/bf16_optimizer.py _update_hp_grad: "
                           "hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype)) after each micro-batch's backward "
                           "(runtime/pipe/engine.py _exec_backward_pass), an fp32 copy of the bf16 gradient then the add"},
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
  bloom.flash_attention = false;
  deepspeed_pipeline_engine(bloom, 4, false, 18);
  bloom.sources = {
      {"dp_overlap", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceGrads after the last "
                     "micro-batch's backward"},
      {"dp_grad_bytes", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: the BF16Optimizer's fp32 "
                        "gradients (get_grads_for_reduction)"},
      {"zero1_grad_all_reduce", "DeepSpeed v0.7.0 deepspeed/runtime/pipe/engine.py _bf16_reduce_grads: "
                                "buffered_allreduce_fallback, an all-reduce of the full fp32 gradients although the "
                                "BF16Optimizer partitions the optimizer states (ZeRO-1)"},
      {"grad_accum_bytes", "DeepSpeed v0.7.0 deepspeed/runtime/bf16_optimizer.py update_hp_grads: "
                           "hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype)) for each parameter after each "
                           "micro-batch's backward (runtime/pipe/engine.py _exec_backward_pass)"},
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

  TrainerPreset& mds21 = p[5];
  mds21.name = "megatron-deepspeed-2021";
  mds21.description = "Megatron-DeepSpeed of 2021 (MT-NLG's) on DeepSpeed v0.5.4's pipeline engine, fp16";
  mds21.sequence_parallel = false;
  mds21.selective_recompute = false;
  mds21.flash_attention = false;
  deepspeed_pipeline_engine(mds21, 2, false, 6);
  mds21.sources = {
      {"dp_overlap", "DeepSpeed v0.5.4 deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceGrads after the last "
                     "micro-batch's backward; runtime/engine.py _configure_zero_optimizer: \"Pipeline parallelism does "
                     "not support overlapped communication\""},
      {"dp_grad_bytes", "DeepSpeed v0.5.4 deepspeed/runtime/engine.py _configure_zero_optimizer: 'Creating fp16 ZeRO stage "
                        "{} optimizer', fp32_allreduce refused (bf16 arrived in v0.5.10, its pipeline support in PR "
                        "#1801, 56c5223, 2022-04)"},
      {"zero1_grad_all_reduce", "DeepSpeed v0.5.4 deepspeed/runtime/pipe/engine.py _exec_reduce_grads -> "
                                "runtime/engine.py allreduce_gradients -> zero/stage2.py reduce_gradients: ZeRO-1 forces "
                                "contiguous_gradients off, so buffered_reduce_fallback -> allreduce_bucket, which sets "
                                "rank = None: dist.all_reduce of the full fp16 gradients; step() then all-gathers the "
                                "updated fp16 partitions (dist.all_gather)"},
      {"grad_accum_bytes", "DeepSpeed v0.5.4 deepspeed/runtime/pipe/engine.py _exec_backward_pass: "
                           "torch.autograd.backward into the fp16 param.grad; ZeRO-1 registers no gradient hooks "
                           "(zero/stage2.py: only with partition_grads or overlap_comm), so each micro-batch's fp16 "
                           "gradient is added in place (read 2 + 2, write 2)"},
      {"interleaved", "DeepSpeed v0.5.4 deepspeed/runtime/pipe/schedule.py: TrainSchedule is non-interleaved 1F1B"},
      {"zero_stages", "DeepSpeed v0.5.4 deepspeed/runtime/pipe/engine.py: \"ZeRO-2 and ZeRO-3 are incompatible with "
                      "pipeline parallelism\""},
      {"tp_backward_overlap", "microsoft/Megatron-DeepSpeed ec166f1c megatron/mpu/layers.py: no async_op in the linear "
                              "layers' backward"},
      {"sequence_parallel", "microsoft/Megatron-DeepSpeed ec166f1c (2021-09-02) megatron/arguments.py: no sequence "
                            "parallelism; --checkpoint-activations recomputes whole layers"},
      {"flash_attention", "microsoft/Megatron-DeepSpeed ec166f1c megatron/model/transformer.py: torch.baddbmm, fused "
                          "scale-mask-softmax (unfused attention core)"},
      {"grad_accum_fusion", "microsoft/Megatron-DeepSpeed ec166f1c megatron/mpu/layers.py: no fused wgrad accumulation"},
  };

  TrainerPreset& tt = p[6];
  tt.name = "torchtitan";
  tt.description = "torchtitan with FSDP2 (v0.2), bf16 parameters, fp32 reduction";
  tt.grad_accum_fusion = false;
  tt.default_grad_accum_fusion = false;
  tt.zero_stages = {0, 2, 3};
  tt.context_parallel = true;
  tt.expert_parallel = true;
  tt.settings = settings(tt.name, true, 4);
  modern_zero3(tt.settings, 1, 0);
  tt.sources = {
      {"context_parallel", "torchtitan v0.2.2 torchtitan/config/job_config.py context_parallel_degree, "
                           "context_parallel_rotate_method \"alltoall\" (PyTorch's ring attention, "
                           "torch/distributed/tensor/experimental/_attention.py: K/V passed one rank per step, "
                           "overlapped with the block), context_parallel_load_balancer \"headtail\" (2 x CP chunks); "
                           "no all-to-all of heads (a2a)"},
      {"expert_parallel", "torchtitan v0.2.2 torchtitan/config/job_config.py expert_parallel_degree, "
                          "expert_tensor_parallel_degree; torchtitan/distributed/parallel_dims.py: the experts regroup "
                          "the FSDP ranks (dp_shard x cp x tp) as efsdp x ep x etp, ETP = TP or 1; all-to-all token "
                          "dispatch (expert_parallel_comm_backend \"standard\")"},
      {"dp_overlap", "torchtitan b5bcd76c torchtitan/distributed/fsdp.py: FSDP2 reduce-scatters each unit's "
                     "gradients during the backward"},
      {"dp_grad_bytes", "torchtitan b5bcd76c torchtitan/config/configs.py mixed_precision_reduce = \"float32\""},
      {"grad_accum_fusion", "torchtitan: autograd accumulates .grad; no fused main_grad"},
      {"zero_stages", "torchtitan: FSDP2 (reshard after forward: ZeRO-3, or not: ZeRO-2) or DDP; no ZeRO-1"},
      {"zero3_unit", "torchtitan b5bcd76c torchtitan/distributed/fsdp.py apply_fsdp_to_decoder: fully_shard(transformer_block) "
                     "for each block (the embedding and the norm + output each a unit of their own)"},
      {"zero3_prefetch_units", "FSDP2's implicit prefetching: the next block's all-gather is issued from its pre-forward "
                               "(pre-backward) hook while the current block runs on the GPU, one block ahead"},
      {"zero3_sync", "pytorch/pytorch 8fc2039d torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather: "
                     "one dist.all_gather_into_tensor per block into one flat buffer on the all-gather stream, no per-rank "
                     "copies, the compute stream waits on its event (no host synchronisation)"},
  };

  TrainerPreset& ds = p[7];
  ds.name = "deepspeed-2021";
  ds.description = "DeepSpeed v0.5.4 (2021-10) ZeRO 0-3 without its pipeline engine, fp16, Megatron-DeepSpeed's model "
                   "code of 2021 (Megatron-style TP)";
  ds.pipeline = false;
  ds.sequence_parallel = false;
  ds.selective_recompute = false;
  ds.interleaved = false;
  ds.flash_attention = false;
  ds.grad_accum_fusion = false;
  ds.default_grad_accum_fusion = false;
  ds.uneven_stages = false;
  ds.zero_stages = {0, 1, 2, 3};
  ds.settings = settings(ds.name, false, 2, false, false);
  ds.settings.zero3_unit = Zero3Unit::tensor;
  ds.settings.zero3_persist_params = 100'000;
  ds.settings.zero3_prefetch_units = 0;
  ds.settings.zero3_prefetch_params = 50'000'000;
  ds.settings.zero3_reuse_params = 1'000'000'000;
  ds.settings.zero3_reduce_bucket_params = 500'000'000;
  ds.settings.zero3_reduce_per_tensor = true;
  ds.settings.zero3_sync = true;
  ds.settings.zero3_list_collectives = true;
  ds.settings.zero3_fetch_norm = true;
  ds.sources = {
      {"pipeline", "DeepSpeed v0.5.4 deepspeed/runtime/pipe/engine.py: \"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                   "parallelism\"; the preset is DeepSpeed's ZeRO engine (deepspeed/runtime/engine.py) without it"},
      {"dp_overlap", "DeepSpeed v0.5.4 deepspeed/runtime/engine.py backward: allreduce_gradients() after the whole "
                     "backward (ZeRO 0 and 1; ZeRO-3 reduces from its gradient hooks during each backward)"},
      {"dp_grad_bytes", "DeepSpeed v0.5.4 deepspeed/runtime/engine.py _configure_zero_optimizer: 'Creating fp16 ZeRO stage "
                        "{} optimizer', fp32_allreduce refused; deepspeed/runtime/zero/partition_parameters.py "
                        "_reduce_scatter_gradient reduce-scatters param.grad in the parameter dtype (fp16)"},
      {"zero3_unit", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py _register_hooks_recursively: pre-forward and "
                     "pre-backward hooks on every module; fetch_sub_module gathers the module's own parameters "
                     "(named_parameters(recurse=False)): each Linear's weight and bias"},
      {"zero3_persist_params", "DeepSpeed v0.5.4 deepspeed/runtime/zero/constants.py stage3_param_persistence_threshold "
                               "100000; stage3.py persistent_parameters: ds_numel below it sets ds_persist (never released)"},
      {"zero3_prefetch_params", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py prefetch_next_sub_modules: only when no "
                                "handle is in flight, get_params_to_prefetch takes the trace's next parameters that are not "
                                "available until their numel reaches stage3_prefetch_bucket_size (constants.py 50000000), "
                                "with no bound by count"},
      {"zero3_reuse_params", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py release_sub_module / _keep_for_later: a "
                             "parameter stays gathered when the numel of the modules up to its next use in the trace is "
                             "below stage3_max_reuse_distance (constants.py 1000000000)"},
      {"zero3_reduce_bucket_params", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py "
                                     "reduce_independent_p_g_buckets_and_remove_grads: the bucket is reduced when the next "
                                     "gradient would overflow reduce_bucket_size (constants.py 500000000)"},
      {"zero3_reduce_per_tensor", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py average_tensor -> "
                                  "partition_parameters.py _reduce_scatter_gradients: one _reduce_scatter_gradient "
                                  "(torch.distributed.reduce_scatter, async) per parameter of the bucket, persistent "
                                  "biases and norms included (create_reduce_and_remove_grad_hooks hooks every parameter)"},
      {"zero3_sync", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py fetch_sub_module -> _synchronize_communication "
                     "(handle.wait, comm_stream.synchronize, torch.cuda.synchronize); partition_parameters.py _allgather_param: "
                     "torch.zeros of the whole tensor, then torch.cuda.synchronize, before each gather. Removed in v0.5.5 "
                     "(c0eeb69, PR #1188: 'the async version is not async at all, because each all_gather calls "
                     "torch.cuda.synchronize()')"},
      {"zero3_list_collectives", "DeepSpeed v0.5.4 deepspeed/runtime/zero/partition_parameters.py: "
                                 "torch.distributed.all_gather(partitions, ...) and reduce_scatter(input_list[rank], "
                                 "input_list), list form; pytorch/pytorch 00f5dfd5 torch/lib/c10d/ProcessGroupNCCL.cpp "
                                 "allgather / reduce_scatter: flatten_for_scatter_gather, then one copy_ per rank"},
      {"zero3_fetch_norm", "DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py fetch_sub_module: print_rank_0(f\"Param "
                           "... norm={param.norm()}\", force=False) for every parameter of the module, the f-string "
                           "evaluated (a norm kernel and, formatting a CUDA scalar, .item()) although rank 0 prints only "
                           "with force; removed in v0.5.5 (c0eeb69: 'remove norm()')"},
      {"tp_backward_overlap", "microsoft/Megatron-DeepSpeed ec166f1c megatron/mpu/layers.py: no async_op in the linear "
                              "layers' backward"},
      {"sequence_parallel", "microsoft/Megatron-DeepSpeed ec166f1c (2021-09-02) megatron/arguments.py: no sequence "
                            "parallelism; --checkpoint-activations recomputes whole layers; pretrain_gpt.py builds the "
                            "model under deepspeed.zero.Init(mpu=mpu) (Megatron TP)"},
      {"flash_attention", "microsoft/Megatron-DeepSpeed ec166f1c megatron/model/transformer.py: torch.baddbmm, fused "
                          "scale-mask-softmax (unfused attention core)"},
      {"grad_accum_fusion", "microsoft/Megatron-DeepSpeed ec166f1c megatron/mpu/layers.py: no fused wgrad accumulation"},
  };
  return p;
}

const std::array<TrainerPreset, 8>& presets() {
  static const std::array<TrainerPreset, 8> p = make_presets();
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
