#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// Per-GPU memory, reported like Megatron-LM's theoretical memory report
// (megatron/training/theoretical_memory_usage.py) in two parts, weights +
// optimizer and activations, plus a workspace reserve; generalised to ZeRO
// stages, recompute modes, schedules and every pipeline stage.
#include <array>
#include <vector>
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
  // Pinned host memory per GPU for offloaded activations (offload.hpp), not
  // counted in total_bytes; 0 without offloading.
  double host_activation_bytes = 0;

  bool fits() const { return total_bytes <= capacity_bytes; }
  double headroom_bytes() const { return capacity_bytes - total_bytes; }
};


// Bytes per parameter for weights + gradients + optimizer states with mixed
// precision Adam, gradients of `grad_bytes` (grad_element_bytes) and
// optimizer states of `optimizer_bytes` (optimizer_state_bytes: 12, fp32
// master + Adam's moments): with fp32 gradients 18 without sharding (2 bf16
// weight + 4 fp32 grad + 4 fp32 master + 4 + 4 Adam moments), Megatron's
// distributed optimizer / ZeRO-1 6 + 12/dp, ZeRO-2 2 + 16/dp, ZeRO-3 18/dp;
// bf16 gradients 2 bytes less before their sharding.
double bytes_per_parameter(int zero_stage, int dp, double grad_bytes, double optimizer_bytes);

// Parameters on one GPU of pipeline stage `stage` (transformer layers of the
// stage / tp, plus the embedding on the first stage and the LM head on the
// last stage unless tied and pp == 1). Follows Megatron's counting
// (everything divided by tp).
double parameters_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage);

// The same parameters in the two groups that reduce their gradients and
// shard their optimizer states apart: `dense` over DP x CP, the routed
// experts (`expert`) over expert-DP. For an MoE layer Megatron-Core's
// counting (theoretical_memory_usage.py at d98e8a64): attention and shared
// experts / TP, norms, router and shared-expert gate whole on every rank,
// the routed experts / (ETP x EP); the final norm whole. A dense model's
// parameters are all `dense` (parameters_on_stage's counting).
struct StageParameters {
  double dense = 0;
  double expert = 0;
  double total() const { return dense + expert; }
};
StageParameters stage_parameters(const ModelSpec& m, const ParallelPlan& plan, int stage);
// The optimizer's fp32 copy of 16-bit gradients at the step (where
// grad_element_bytes is 2: ZeRO 0-2, and ZeRO-3 under Megatron-FSDP; 0
// otherwise): `main_param.grad = main_grad.float()` (Megatron-FSDP's
// update_main_grads: the shard `.to(param.dtype)`) for every parameter the
// GPU updates, 4 bytes each of its shard (the whole stage at ZeRO 0). It lives from the step to the next
// iteration's zero_grad, before the forward, so it never meets the
// activations.
double step_grad_copy_bytes(const ParallelPlan& plan, const StageParameters& params);
// The multi-token prediction modules' parameters on one GPU of the last
// stage (a layer of the last layer's kind, the 2h -> h projection / TP, three
// norms each; with PP > 1 the word embedding their lookup needs).
StageParameters mtp_parameters(const ModelSpec& m, const ParallelPlan& plan);

// What torchtitan's pipeline with FSDP holds beyond the ZeRO 2 / 3 bytes
// (TrainerSettings::pp_fsdp_no_sync, with PP > 1 and ZeRO 2 or 3): per
// parameter of `params` sharded over d > 1 ranks (DP x CP, or expert-DP for
// the routed experts), 4 - 4/d bytes of fp32 gradient held unsharded until
// the last backward, plus with ZeRO-3 the 2-byte gathered bf16 copy. 0 when
// the setting is off, with PP 1 or ZeRO 0 / 1.
double pp_fsdp_no_sync_bytes(const ParallelPlan& plan, const StageParameters& params);

// ZeRO-3's gathered units on one GPU of `stage` at the backward's peak: a
// unit (a transformer block, as Megatron-FSDP and FSDP2 gather them; the
// largest layer of the stage, its dense part over DP x CP and its routed
// experts over expert-DP) gathered whole in bf16 while it computes, the
// units the trainer prefetches after it (TrainerSettings::zero3_prefetch_*:
// up to prefetch_units of them, or until they hold prefetch_params
// elements, the unit that reaches it included), and the unit's unsharded
// gradients at grad_element_bytes until their reduce-scatter. 0 below
// ZeRO-3, where nothing is sharded, and where pp_fsdp_no_sync_bytes holds
// the stage's whole gathered copy already.
double zero3_gathered_bytes(const ModelSpec& m, const ParallelPlan& plan, int stage);

// Bytes per element of an expert GEMM's saved input (FC1's: the routed
// tokens; FC2's: the activation's output) under the plan's precision and
// fusion (memory.cpp says from which code).
enum class ExpertGemm { fc1, fc2 };
double expert_gemm_input_bytes(const ParallelPlan& plan, ExpertGemm gemm);
// Bytes per element of the attention core's output held for linear_proj's
// backward, the core's own copy included.
double projection_input_bytes(const ParallelPlan& plan);
// linear_proj saves a quantized copy of its input (delayed FP8 scaling)
// rather than the core's bf16 output itself.
bool projection_saves_quantized_copy(const ParallelPlan& plan);
// Bytes per element of Q, K and V the fused attention core keeps as copies
// of its own: under FP8 attention its quantized copies (Transformer Engine
// d0067d0d backends.py FusedAttnFunc.forward saves q_fp8, k_fp8, v_fp8):
// per-tensor E4M3 rowwise only (1 byte), MXFP8 rowwise and columnwise with
// their scales (utils.py get_attention_quantizers: 2 x (1 + 1/32)). 0: the
// core keeps the bf16 tensors its inputs are (bf16 attention, or a
// checkpointed core, whose checkpoint keeps them).
double core_input_copy_bytes(const ParallelPlan& plan);
// The bytes per element of the Q, K and V the core saves (its FP8 copies',
// else bf16) and of the output it saves (FP8 where an FP8 core runs under
// delayed scaling: cuDNN's out_fp8; else bf16).
double core_saved_input_bytes(const ParallelPlan& plan);
double core_saved_output_bytes(const ParallelPlan& plan);
// One layer's stored activations for one micro-batch on one GPU: a dense
// layer's, or with `moe_layer` an MoE layer's (its MLP's routed token
// copies, expert intermediates and shared experts instead of the dense MLP's).
double layer_activation_bytes(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer);
// An MoE layer's all-to-all buffers while it dispatches (EP > 1): the rank's
// token copies sent and the busiest rank's received, bf16.
double moe_dispatch_buffer_bytes(const ModelSpec& m, const ParallelPlan& plan);
// With the paged stash (FlexSetting::paged_stash), the bytes of one MoE
// layer's expert tensors at the rank capacity budget's padded size that the
// GPU holds beside the pages (0 without it, or with --recompute-modules moe).
double paged_stash_padded_layer_bytes(const ModelSpec& m, const ParallelPlan& plan);

// One transformer layer's parameters on one GPU: parameters_per_layer / TP
// for a dense layer (Megatron's counting), stage_parameters' counting for an
// MoE layer (`moe_layer`), its routed experts / (ETP x EP) included.
double layer_parameters_on_gpu(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer);
// The same layer's parameters split as the optimizer shards them (and
// Megatron-FSDP groups them, ZeRO-3): the routed experts' and the rest. A
// dense model's layer is all `dense`.
StageParameters layer_parameter_split(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer);
// Of them, the linear weights an FP8 / FP4 plan runs quantized (0 for bf16).
StageParameters quantized_layer_weights(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer);

// Elements of the weights stage `stage` runs quantized (an FP8 / FP4 plan's
// linear layers, multi-token prediction included; 0 for bf16): the FP8
// copies memory keeps and the per-step weight cast (step.hpp) writes.
double quantized_weights_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage);
// The same, split as the optimizer shards them: the routed experts' (the
// grouped GEMMs') and the rest.
StageParameters quantized_stage_weights(const ModelSpec& m, const ParallelPlan& plan, int stage);

// The MoE layers among stage `stage`'s layers (its model chunks' layers).
int moe_layers_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage);

// Stage `stage`'s decoder layers as its model chunks' recomputation treats
// them (recomputes_layer, recompute_groups), each count as [dense, MoE]
// (a dense model's layers all dense): `kept`, the layers memory prices as
// the plan prices a layer (every layer without full recomputation; with it,
// each checkpoint group's first, which keeps its input); `stored`, those of
// a full recomputation that store everything (block's layers after the
// first N of a chunk); `recomputed`, those whose forward re-runs before
// their backward; `groups`, each checkpoint group's layers (re-run at once).
struct StageRecompute {
  std::array<double, 2> kept{}, stored{}, recomputed{};
  std::vector<std::array<double, 2>> groups;
};
StageRecompute stage_recompute(const ModelSpec& m, const ParallelPlan& plan, int stage);

// Activation bytes of one transformer layer for one micro-batch on one GPU
// (Korthikanti et al. 2022, Table 2, generalised to GQA and gated MLPs):
//   no recompute, no SP: s*b*h*(10 + P/t) + A/t, P = 24 for GPT; A = 5*a*s^2*b (0 with flash attention)
//   sequence parallel:   s*b*h*(10 + P)/t + A/t
//   selective recompute: the attention-core term A is dropped
//   full recompute:      2*s*b*h (the layer input; / t with SP)
double activation_bytes_per_layer(const ModelSpec& m, const ParallelPlan& plan);

// Micro-batches whose activations stage `stage` holds at its peak under the
// plan's schedule: GPipe: all m; 1F1B: min(m, pp - stage); interleaved:
// pp * (1 + (pp-1)/(pp*v)) on the first stage (Megatron's penalty). The EP
// overlap's combined steps add one layer, not a micro-batch (memory.cpp).
// Activations of a stage =
// per-layer bytes x layers on the stage x this count.
double in_flight_micro_batches(const ParallelPlan& plan, int stage);

MemoryReport memory_per_gpu(const ModelSpec& m, const ParallelPlan& plan, const GpuProfile& gpu);

}  // namespace cuboid
