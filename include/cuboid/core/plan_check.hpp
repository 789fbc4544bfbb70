#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// check_plan: whether a ParallelPlan can run its model on a cluster. A
// refusal is a value, a kind and the numbers it names, so that the planner
// can count millions of them without building a string; each boundary puts
// it into its reader's words (the command line: flags and fixes, src/cli; a
// plan file: its keys, io/planfile).
#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/trainer.hpp"

namespace cuboid {

// The plan setting a problem is about; each caller names it in its own
// terms (the command line: a flag; a plan file: a JSON key).
enum class PlanField {
  tp, pp, dp, cp, cp_comm, ep, etp, micro_batch, global_batch, seq_length, virtual_stages, zero_stage, schedule,
  sequence_parallel, flash_attention, uneven_stages, world_size, recompute, grad_accum_fusion, trainer, precision,
  fp8_param_gather,
  attention_kernel,
  recompute_modules,
  pipeline_layout,  // the embedding or the loss counted as a layer, or the layout
  moe_dispatcher,
  cuda_graphs,
  tp_comm_overlap,
  overlap_param_gather,
  moe_ep_overlap,
  offload_layers,
  offload_modules,       // Megatron-Core's --offload-modules
  recompute_method,      // Megatron-Core's --recompute-method
  recompute_num_layers,  // and --recompute-num-layers
  dp_grad_bytes,         // the DP gradient reduction's dtype (TrainerSettings::dp_grad_bytes)
  fsdp_grad_bytes,       // Megatron-FSDP's gradient dtype (TrainerSettings::fsdp_grad_bytes)
  moe_rank_capacity_factor,  // Megatron-Core's --moe-expert-rank-capacity-factor
  moe_paged_stash,           // and --moe-paged-stash
  precision_aware_optimizer,  // Megatron-Core's --use-precision-aware-optimizer
  adam_moment_bytes,          // and its --exp-avg-dtype / --exp-avg-sq-dtype
  fp8_attention,              // Megatron-Core's --fp8-dot-product-attention
  overlap_param_gather_with_optimizer_step,  // and --overlap-param-gather-with-optimizer-step
  ddp_bucket_size,                           // and --ddp-bucket-size (TrainerSettings::ddp_bucket_params)
  optimizer,                                 // the optimizer (--optimizer)
};

// Why Megatron-Core cannot step a plan with Muon (PlanCheck::muon_refused;
// Megatron-LM cd4afffa megatron/training/arguments.py and
// megatron/core/optimizer/__init__.py).
enum class MuonRefusal : std::uint8_t {
  zero_stage,            // ZeRO 2 or 3: the emerging optimizers assert no Megatron-FSDP / FSDP2
  precision_aware,       // Transformer Engine's FusedAdam is Adam's; Muon keeps fp32 states of its own
  param_gather_in_step,  // --overlap-param-gather-with-optimizer-step (asserted against the layer-wise optimizer)
};

// Why a plan cannot overlap its EP exchanges (PlanCheck::ep_overlap_refused).
enum class EpOverlapRefusal : std::uint8_t {
  needs_moe,          // a dense model
  needs_ep,           // EP 1 (Megatron-Core asserts EP > 1)
  dispatcher,         // allgather (Megatron-Core: alltoall or flex only)
  full_recompute,     // full recomputation (Megatron-Core refuses it)
  moe_recompute,      // --recompute-modules moe (Megatron-Core refuses it)
  mtp_layers,         // more than one MTP layer (Megatron-Core refuses it)
  needs_interleaved,  // PP > 1 without virtual stages (Megatron-Core refuses it)
};

// Why Megatron-Core refuses a plan's per-layer CUDA graph modules
// (PlanCheck::cuda_graph_module_refused; transformer_config.py at d98e8a64).
enum class CudaGraphRefusal : std::uint8_t {
  moe_needs_moe,          // moe or moe_router on a dense model
  mlp_needs_dense,        // mlp where every layer is an MoE layer
  moe_needs_drop_pad,     // moe without the padded (capacity) routing cuboid does not model
  preprocess_host_sync,   // moe_preprocess with the alltoall dispatcher and a capacity factor
  router_with_moe_recompute,  // moe_router with transformer_engine and --recompute-modules moe
  ep_overlap,             // moe or mlp with transformer_engine and the EP overlap
  full_recompute,         // full recomputation under per-layer graphs (only the full-iteration graph)
  graphed_attn_dropout,   // core_attn recomputed inside a graph with attention dropout
  graphed_hidden_dropout, // mlp or moe recomputed inside a graph with hidden dropout
};

// Why a plan cannot take its rank capacity factor or paged stash
// (PlanCheck::moe_static_refused; transformer_config.py at d98e8a64).
enum class MoeStaticRefusal : std::uint8_t {
  needs_moe,           // a dense model
  needs_hybridep,      // the factor without the flex dispatcher's HybridEP (1868-1874; ncclep is not modelled)
  stash_needs_factor,  // the paged stash without a factor (2213-2217)
  stash_with_offload,  // the paged stash with CPU offloading (2211-2212)
  stash_with_moe_offload,  // the paged stash with expert_fc1 or moe_act in --offload-modules (2218-2226)
  over_budget,         // the busiest rank's token copies above the budget: dropped, the step rerun
};

// Why Megatron-Core refuses fine-grained activation offloading with a plan's
// CUDA graphs (PlanCheck::offload_modules_graphs; transformer_config.py
// :2929-2962 at d98e8a64).
enum class OffloadGraphRefusal : std::uint8_t {
  local_attention,   // local graphs with a module outside the experts (only expert_fc1, moe_act)
  local_whole_layer, // local graphs of the whole layer
  local_moe,         // local graphs capturing the MoE MLP
  moe_captured,      // any graph capturing the MoE MLP ("Token-drop MoE ... not supported")
};

// What check_plan refuses; the comment names what PlanRejection::values
// holds for the kind, in order.
enum class PlanCheck : std::uint8_t {
  not_positive,           // the field's value
  zero_stage_range,       // the stage
  seq_over_max,           // sequence length, the model's max_position_embeddings
  tp_heads,               // TP, attention heads
  tp_kv_heads,            // TP, key/value heads
  tp_ffn,                 // TP, ffn_hidden_size
  cp_needs_flash,         // -
  cp_chunks,              // sequence length, 2 x CP
  cp_sp_tokens,           // tokens per CP rank, TP
  cp_a2a_heads,           // CP, query heads per TP rank, key/value heads per TP rank
  cp_comm_needs_cp,       // -
  ep_needs_moe,           // -
  ep_experts,             // EP, experts
  etp_not_1_or_tp,        // ETP, TP
  etp_ffn,                // ETP, the experts' FFN size
  tp_shared_ffn,          // TP, the shared experts' FFN size
  ep_fold,                // ETP x EP, TP x CP x DP
  moe_zero3,              // -
  moe_needs_sp,           // -
  dispatcher_needs_moe,   // -
  mla_cp,                 // -
  mla_zero3,              // -
  precision_no_fp8,       // - (the GPU has no FP8 tensor cores)
  precision_no_microscaling,  // - (MXFP8 / NVFP4 on a GPU without block-scaled formats)
  precision_no_fp4,       // - (NVFP4 on a GPU without FP4 tensor cores)
  param_gather_needs_fp8,       // -
  param_gather_needs_dist_opt,  // the ZeRO stage
  moments_need_precision_aware,  // the bytes per moment (not 4 without the precision-aware optimizer)
  fp8_attention_recipe,   // the precision (Precision): no FP8 attention under it
  fp8_attention_cudnn,    // the kernel (AttentionKernel) the plan's attention core runs: not cuDNN's fused one
  fp8_attention_cp,       // CP (FP8 attention under context parallelism: not modelled)
  fp8_attention_rates,    // the format (Fp8AttentionFormat): the GPU profile has no rates for it
  stage_layers_negative,  // -
  uneven_needs_pp,        // -
  uneven_rest,            // first stage layers, last stage layers, the rest, layers, middle stages
  uneven_chunks,          // which stage (0 first, 1 last, 2 each middle one), its layers, virtual stages
  layers_split,           // PP, virtual stages, PP x virtual stages, layers
  layout_with_uneven,     // - (first / last stage layers with a layout or the embedding / loss counted)
  layout_with_counted,    // - (a layout with the embedding / loss counted too)
  counted_split,          // layers, layers + counted embedding / loss, PP, virtual stages
  layout_stages,          // the layout's virtual stages, PP, virtual stages
  layout_layers,          // the layout's decoder layers, the model's
  layout_mtp,             // the layout's MTP modules, the model's
  interleaved_needs_v,    // -
  v_needs_interleaved,    // virtual stages
  v_needs_pp,             // -
  sp_needs_tp,            // -
  world_over_gpus,        // TP, PP, DP, CP, GPUs
  world_not_gpus,         // TP x CP x PP x DP, GPUs, CP
  batch_split,            // global batch, micro-batch x DP
  interleaved_batches,    // micro-batches, PP, micro-batch x DP x PP
  // What the plan's trainer (ParallelPlan::trainer.preset) cannot run; the
  // first value is the preset's index in trainer_presets().
  trainer_unknown,               // -
  trainer_no_pipeline,           // the preset
  trainer_no_sp,                 // the preset
  trainer_no_selective,          // the preset
  trainer_no_interleaved,        // the preset (field: schedule or virtual_stages)
  trainer_no_flash,              // the preset
  trainer_no_grad_accum_fusion,  // the preset
  trainer_no_cp,                 // the preset
  trainer_no_cp_a2a,             // the preset
  trainer_no_ep,                 // the preset (field: ep or etp)
  trainer_no_zero_stage,         // the preset, the stage, the preset's stages as a bit mask
  trainer_even_stages,           // the preset
  trainer_even_chunks,           // the preset
  trainer_no_fp8,                // the preset
  trainer_no_layout,             // the preset
  trainer_no_kernel,             // the preset, the kernel (AttentionKernel)
  gpu_no_kernel,                 // the kernel (AttentionKernel): the GPU profile has no rates for it
  kernel_needs_flash,            // the kernel: a fused kernel with flash attention off
  trainer_no_recompute_modules,  // the preset
  recompute_modules_need_selective,  // -
  recompute_module_refused,      // the module (RecomputeModule) Megatron-Core refuses
  trainer_no_dispatcher,         // the preset
  trainer_no_cuda_graphs,        // the preset
  trainer_no_tp_comm_overlap,    // the preset
  trainer_no_overlap_param_gather,  // the preset
  tp_overlap_needs_sp,           // TP, SP (0 / 1)
  param_overlap_needs_dist_opt,  // the ZeRO stage
  param_overlap_needs_grad_overlap,  // -
  trainer_no_param_gather_in_step,   // the preset
  param_gather_in_step_needs,        // what it lacks: 0 --overlap-param-gather, 1 virtual stages
  trainer_no_ddp_bucket_size,        // the preset
  trainer_no_ep_overlap,         // the preset
  ep_overlap_refused,            // why (EpOverlapRefusal), the model's MTP layers
  cuda_graph_module_refused,     // why (CudaGraphRefusal)
  trainer_no_offload,            // the preset
  offload_layers_range,          // N, the model's layers (Megatron-Core: N < layers)
  offload_needs_one_stage,       // PP (Megatron-Core: no pipeline parallelism with CPU offloading)
  offload_with_recompute,        // - (Megatron-Core: no activation recomputation with it)
  offload_with_layer_graphs,     // - (Megatron-Core: per-layer CUDA graphs refused with it)
  offload_no_host_link,          // - (the cluster card has no host_link)
  offload_modules_with_layers,   // - (Megatron-Core: not with cpu_offloading)
  offload_proj_without_core,     // - (Megatron-Core: attn_proj only with core_attn)
  offload_in_recomputed_moe,     // the module (OffloadModule) inside a recomputed MoE MLP
  offload_modules_graphs,        // why (OffloadGraphRefusal)
  trainer_no_recompute_layers,   // the preset (a recompute method or layer count other than uniform 1)
  recompute_layers_need_full,    // - (a method or layer count without full recomputation)
  trainer_no_dp_grad_bytes,      // the preset, the plan's bytes per gradient
  trainer_no_fsdp_grad_bytes,    // the preset, the plan's Megatron-FSDP bytes per gradient
  trainer_no_precision_aware,    // the preset
  trainer_no_fp8_attention,      // the preset
  moe_static_refused,            // why (MoeStaticRefusal), the busiest rank's rows, the budget's rows
  trainer_no_muon,               // the preset
  muon_refused,                  // why (MuonRefusal), the ZeRO stage
};

struct PlanRejection {
  PlanCheck kind = PlanCheck::not_positive;
  PlanField field = PlanField::world_size;
  std::array<std::int64_t, 5> values{};
  friend auto operator<=>(const PlanRejection&, const PlanRejection&) = default;
};

// The first problem of the plan for the model on the cluster, or none.
// Checks, in order: positive sizes, ZeRO stage range, sequence length, what
// the plan's trainer can run (check_trainer), TP
// divides heads / kv heads / FFN, CP's chunks and heads, the experts,
// latent attention, the precision the GPU can run, the stage split, interleaving, SP, TP x CP x PP x DP
// against the GPUs, batch divisibility. Allocation-free.
std::optional<PlanRejection> check_plan(const ParallelPlan& plan, const ModelSpec& model, const Cluster& cluster);

// What of the plan `trainer` cannot run, or none: the one statement of the
// presets' limits (trainers/*.json can_run), which a plan file and the plan
// of the flags both meet through check_plan. Allocation-free.
std::optional<PlanRejection> check_trainer(const ParallelPlan& plan, const TrainerPreset& trainer);

// What is wrong, in the plan's own words (no flag, no key, no fix): "TP 3
// does not divide the 64 attention heads of Llama 3 70B".
std::string describe(const PlanRejection& rejection, const ModelSpec& model, const Cluster& cluster);

}  // namespace cuboid
