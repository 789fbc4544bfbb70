// Per-GPU memory: weights + optimizer states and activations per pipeline
// stage, in the spirit of Megatron-LM's theoretical memory report
// (megatron/training/theoretical_memory_usage.py) and Korthikanti et al. 2022
// ("Reducing Activation Recomputation in Large Transformer Models", Table 2).
//
// Megatron's report covers one configuration only: selective recompute with
// sequence parallelism, the first pipeline stage, and s*b*h*(18 + 4f/h) bytes
// per layer (34*s*b*h for GPT, i.e. Table 2's "selective + SP" row
// 34*s*b*h/t). The model here generalises it to every recompute mode, SP on or
// off, flash attention, GQA, gated MLPs, schedules and stages, and reduces to
// Megatron's numbers in that configuration (tests/test_memory.cpp checks it).
// For GQA and gated MLPs the per-layer count here is
// s*b*h*(10 + 4q/h + 4kv/h) + 6*s*b*f, where Megatron keeps 18 + 4f/h.
// With context parallelism s is a rank's s / cp tokens (every activation
// above is per token; Megatron's report has no CP term), and ZeRO shards
// over DP x CP (Megatron's distributed optimizer uses the data-parallel group
// with context parallelism).
#include "cuboid/cost/memory.hpp"

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/ep_overlap.hpp"
#include "cuboid/core/precision.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/offload.hpp"
#include "cuboid/cost/optimizer_step.hpp"

#include <algorithm>
#include <cmath>

namespace cuboid {

double core_input_copy_bytes(const ParallelPlan& plan) {
  const std::optional<Fp8AttentionFormat> f = plan.fp8_attention_format();
  if (!f || !plan.flash_attention || plan.checkpoints(RecomputeModule::core_attn)) return 0;
  return (*f == Fp8AttentionFormat::mxfp8 ? 2.0 : 1.0) * quantized_element_bytes(plan.precision);
}

double core_saved_input_bytes(const ParallelPlan& plan) {
  const double copy = core_input_copy_bytes(plan);
  return copy > 0 ? copy : kBf16Bytes;
}

double core_saved_output_bytes(const ParallelPlan& plan) {
  return core_input_copy_bytes(plan) > 0 && projection_saves_quantized_copy(plan) ? kFp8Bytes : kBf16Bytes;
}

namespace {

double layers_per_stage(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  // Even or uneven split (first/last stage layers); check_plan checks it.
  return layers_on_stage(plan, m.num_layers, stage);
}

double final_norm_parameters(const ModelSpec& m) {
  // LayerNorm: weight + bias; RMSNorm: weight only.
  const double h = static_cast<double>(m.hidden_size);
  return m.normalization == Normalization::layernorm ? 2 * h : h;
}

bool interleaved(const ParallelPlan& plan) {
  return plan.schedule != Schedule::gpipe && plan.virtual_stages > 1;
}

// Bytes of the first stage's embedding activations for one micro-batch:
// the int64 token ids (8 bytes per token) and the embedding dropout mask
// (1 byte per element), as Megatron counts them; no mask at a hidden dropout
// of 0 (torch's dropout returns its input at p = 0 without drawing one:
// aten/src/ATen/native/Dropout.cpp, _dropout_impl). With sequence parallelism
// Megatron divides both by t (the ids are in fact replicated, but they are
// 8*s*b bytes: negligible), and so do we to stay comparable.
double embedding_activation_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  const double s = static_cast<double>(plan.seq_per_rank());
  const double b = plan.micro_batch;
  const double h = static_cast<double>(m.hidden_size);
  const double mask = m.hidden_dropout > 0 ? s * b * h : 0.0;
  const double bytes = 8 * s * b + mask;
  return plan.sequence_parallel ? bytes / plan.tp : bytes;
}

// Bytes of the last stage's output layer for one micro-batch: Megatron's
// "inputs to output layer and CE loss" term s*b*h*4*(1 + V/h) = 4*s*b*h (the
// LM head input, Megatron's constant) + 4*s*b*V (the fp32 logits the
// cross-entropy keeps). Megatron adds it only when pp == 1 because its report
// is the first stage; here it always sits on the last stage and is held for
// one micro-batch (the loss is computed and its backward starts at once).
// The logits are split by TP along the vocabulary; the LM head input only
// with sequence parallelism.
double output_layer_activation_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  const double s = static_cast<double>(plan.seq_per_rank());
  const double b = plan.micro_batch;
  const double h = static_cast<double>(m.hidden_size);
  const double v = static_cast<double>(padded_vocab_size(m.vocab_size, plan.tp));
  const double input = 4 * s * b * h;
  const double logits = 4 * s * b * v / plan.tp;
  return (plan.sequence_parallel ? input / plan.tp : input) + logits;
}

// What an MoE layer's MLP keeps for its backward on one GPU, beyond its
// input (counted with the layer's), as Megatron-Core d98e8a64 saves it: the
// router's fp32 scores, the expert GEMMs' input (the busiest rank's token
// copies after the ETP all-gather), FC1's output (the activation's input)
// and the activation's output (FC2's input), and the shared experts'
// intermediates. The probabilities multiply the activation's output
// (moe/experts.py TEGroupedMLP.forward, bias_act_func with permuted_probs),
// so their gradient reads FC1's output, and the dispatchers' unpermute runs
// without probabilities (token_dispatcher.py): the experts' output is not
// kept. Recomputed modules drop what they rebuild: moe the whole MLP (its
// checkpoint keeps the input only: moe_layer.py:701-716), moe_act the
// activation's output (experts.py:1019-1030, CheckpointWithoutOutput),
// shared_experts the shared experts' intermediates (moe_layer.py:517-529).
// Bytes per row of the experts' saved tensors (their input, FC1's output and
// the activation's output, less what moe_act recomputes): all of them are
// what the paged stash pages (Transformer Engine's fused grouped MLP marks
// them, mark_grouped_tensor: ops/fused/grouped_mlp.py:1749@d0067d0d).
// The GEMMs' inputs are saved as Transformer Engine saves them
// (expert_gemm_input_bytes), FC1's output in bf16.
double expert_bytes_per_row(const ModelSpec& m, const ParallelPlan& plan) {
  const double h = static_cast<double>(m.hidden_size);
  const double fe = static_cast<double>(m.moe.expert_ffn_hidden_size / plan.expert_tp());
  const double fc1_output = (m.gated_mlp() ? 2 : 1) * kBf16Bytes;  // the activation's input
  const double act_output = expert_gemm_input_bytes(plan, ExpertGemm::fc2);
  const double routed_width = fc1_output + (plan.recomputes(RecomputeModule::moe_act) ? 0.0 : act_output);
  return h * expert_gemm_input_bytes(plan, ExpertGemm::fc1) + fe * routed_width;
}

// The rows are the busiest rank's token copies; with a rank capacity factor
// the static budget's (every expert tensor is that tall), and with the paged
// stash its pages' share (saved_expert_rows).
double moe_mlp_activation_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  if (plan.checkpoints(RecomputeModule::moe)) return 0;
  const double tokens = static_cast<double>(plan.seq_per_rank()) * plan.micro_batch /
                        (plan.sequence_parallel ? plan.tp : 1);
  const double fs = static_cast<double>(m.moe.shared_expert_ffn_hidden_size);
  const double per_width = m.gated_mlp() ? 6 : 4;
  const double full_tokens = static_cast<double>(plan.seq_per_rank()) * plan.micro_batch;
  const double shared = plan.checkpoints(RecomputeModule::shared_experts) ? 0.0 : per_width * full_tokens * fs / plan.tp;
  return tokens * static_cast<double>(m.moe.num_experts) * 4 +
         saved_expert_rows(m, plan) * expert_bytes_per_row(m, plan) + shared;
}

// Latent attention's saved activations on one GPU, as Megatron-Core's
// MLASelfAttention with Transformer Engine keeps them (d98e8a64,
// multi_latent_attention.py; DeepSeek-V3's layer spec with q and kv norms:
// gpt_layer_specs.py, linear_q_up_proj / linear_kv_up_proj are
// TELayerNormColumnParallelLinear). Replicated across TP unless SP (the
// down projections run on every TP rank's tokens): each latent's norm input
// (bf16) and output (the up projection's saved input, quantized under
// FP8), q_lora and kv_lora wide. Split by TP: the attention core's query
// and key (heads x (qk + rope)), value (heads x v) and the output
// projection's input (heads x v); the core takes Q, K, V unpadded in the
// bshd layout (the value is padded to the query's width only for packed
// THD sequences, _prepare_mla_core_attention_value). --recompute-modules
// mla_up_proj checkpoints the up projections and the rotary embedding
// (CheckpointWithoutOutput, multi_latent_attention.py:983-988) and discards
// Q, K, V after the core (:904-907): the norm outputs and Q, K, V go; the
// checkpoint keeps the latents, already counted.
struct MlaActivations {
  double replicated = 0;  // per micro-batch, before any division by TP
  double split = 0;       // per micro-batch, to divide by TP
};

MlaActivations mla_activations(const ModelSpec& m, const ParallelPlan& plan) {
  MlaActivations out;
  if (!m.mla.enabled()) return out;
  const double sb = static_cast<double>(plan.seq_per_rank()) * plan.micro_batch;
  const double n = static_cast<double>(m.num_attention_heads);
  const double qk = static_cast<double>(m.mla.qk_head_dim + m.mla.qk_rope_head_dim);
  const double v = static_cast<double>(m.mla.v_head_dim);
  const double latents = static_cast<double>(m.mla.q_lora_rank + m.mla.kv_lora_rank);
  const bool up_recomputed = plan.recomputes(RecomputeModule::mla_up_proj);
  const double norm_output = up_recomputed ? 0.0 : quantized_element_bytes(plan.precision);
  out.replicated = (kBf16Bytes + norm_output) * sb * latents;
  // Q, K, V: bf16 unless the core keeps FP8 copies of its own, which
  // mla_up_proj's discard of the bf16 tensors leaves in place.
  const double copy = core_input_copy_bytes(plan);
  const double qkv_bytes = copy > 0 ? copy : up_recomputed ? 0.0 : kBf16Bytes;
  out.split = sb * (qkv_bytes * n * (qk + qk + v) + kBf16Bytes * n * v);
  return out;
}

}  // namespace

// Under FP8 and FP4 Transformer Engine's grouped linear layers, the module
// and the op alike, quantize their input and keep only the columnwise copy
// the weight gradient reads (module/grouped_linear.py:905-914,
// ops/basic/grouped_linear.py:1290-1293 at d0067d0d; since TE 4c9626e7, April
// 2025). With a rank capacity factor the experts run the fused grouped MLP
// (HybridEP's factor needs the op fuser or grouped tensors:
// transformer_config.py:1874-1882@d98e8a64; cuboid's exports write
// --use-transformer-engine-op-fuser), which fuses MXFP8 and NVFP4 only
// (fuse_grouped_mlp_ops, ops/fused/grouped_mlp.py:842) and keeps the
// columnwise MXFP8 copy alone but both NVFP4 copies (:1765-1771). FC1 keeps
// the original bf16 input when expert_fc1 is offloaded outside MXFP8 and
// NVFP4 (experts.py:278-284, set_save_original_input); FC2's under moe_act
// recomputation is the checkpoint's discarded output (not counted).
double expert_gemm_input_bytes(const ParallelPlan& plan, ExpertGemm gemm) {
  const Precision p = plan.precision;
  if (p == Precision::bf16) return kBf16Bytes;
  const bool block_scaled = p == Precision::mxfp8 || p == Precision::nvfp4;
  if (block_scaled && plan.moe_flex.rank_capacity_factor > 0)
    return (p == Precision::nvfp4 ? 2.0 : 1.0) * quantized_element_bytes(p);
  if (gemm == ExpertGemm::fc1 && !block_scaled && plan.offloads(OffloadModule::expert_fc1)) return kBf16Bytes;
  return quantized_element_bytes(p);
}

// linear_proj's saved input is the attention core's output. Under FP8
// recipes other than delayed scaling and under FP4, Megatron-Core has
// linear_proj keep that bf16 tensor itself (set_save_original_input,
// attention.py:428-444 at d98e8a64, Transformer Engine 2.6 / 2.7 and later),
// which a fused core saves anyway: one bf16 copy. Under delayed scaling it
// saves the quantized copy, beside the bf16 output a fused core (not
// recomputed) keeps.
bool projection_saves_quantized_copy(const ParallelPlan& plan) { return plan.precision == Precision::fp8_delayed; }

double projection_input_bytes(const ParallelPlan& plan) {
  if (!projection_saves_quantized_copy(plan)) return kBf16Bytes;
  const bool core_keeps_output = plan.flash_attention && !plan.checkpoints(RecomputeModule::core_attn);
  return quantized_element_bytes(plan.precision) + (core_keeps_output ? core_saved_output_bytes(plan) : 0.0);
}

double pp_fsdp_no_sync_bytes(const ParallelPlan& plan, const StageParameters& params) {
  if (!plan.trainer.pp_fsdp_no_sync || plan.pp <= 1 || plan.zero_stage < 2) return 0;
  // Under torch.distributed.pipelining every backward but the step's last
  // runs with FSDP's gradient sync and resharding after backward off
  // (pytorch/pytorch 0138610331 torch/distributed/pipelining/stage.py
  // backward_maybe_with_nosync: set_requires_gradient_sync(False),
  // set_reshard_after_backward(False); _post_backward turns both back on and
  // reduces). FSDP2 then accumulates each parameter's gradient unsharded in
  // the reduce dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
  // to_accumulated_grad_if_needed), fp32 (torchtitan's
  // mixed_precision_reduce), and keeps
  // the gathered bf16 parameters; the sharded gradients do not exist yet
  // (torchtitan's train_step zeroes them to None first: train.py@v0.2.2
  // train_step, optimizers.zero_grad()). At the end of a backward pass the
  // rank holds, for a group sharded over d ranks: 4 bytes of unsharded
  // gradient per parameter instead of the 4 / d priced, and with ZeRO-3 the
  // 2-byte gathered copy beside its shard (ZeRO-2 prices it whole already).
  // Where d = 1 nothing is sharded and nothing changes.
  auto extra = [&](double parameters, int d) {
    if (d <= 1) return 0.0;
    return parameters * (kFp32Bytes - kFp32Bytes / d + (plan.zero_stage >= 3 ? kBf16Bytes : 0.0));
  };
  return extra(params.dense, plan.dp_cp()) + extra(params.expert, plan.expert_dp());
}

double zero3_gathered_bytes(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  if (plan.zero_stage < 3 || pp_fsdp_no_sync_bytes(plan, stage_parameters(m, plan, stage)) > 0) return 0;
  const int layers = layers_on_stage(plan, m.num_layers, stage);
  if (layers <= 0) return 0;
  const StageParameters layer = layer_parameter_split(m, plan, moe_layers_on_stage(m, plan, stage) > 0);
  // What a rank gathers of a block: the parts sharded over more than one rank.
  const double unit = (plan.dp_cp() > 1 ? layer.dense : 0.0) + (plan.expert_dp() > 1 ? layer.expert : 0.0);
  if (!(unit > 0)) return 0;
  const TrainerSettings& s = plan.trainer;
  double ahead = s.zero3_prefetch_units;
  if (s.zero3_prefetch_params > 0) {
    const double by_params = std::ceil(static_cast<double>(s.zero3_prefetch_params) / unit);
    ahead = s.zero3_prefetch_units > 0 ? std::min(ahead, by_params) : by_params;
  }
  ahead = std::min(ahead, static_cast<double>(layers - 1));
  return unit * (kBf16Bytes * (1.0 + ahead) + plan.grad_element_bytes());
}

namespace {

// Whether the EP overlap's combined steps run on this stage (full
// recomputation is refused with it: transformer_config.py:3020@d98e8a64).
bool ep_overlap_pairs_layers(const ParallelPlan& plan, int stage) {
  return plan.moe_ep_overlap &&
         ep_overlap_steps(plan.pp, stage, plan.num_micro_batches(), plan.pp > 1 ? plan.virtual_stages : 1) > 0;
}

struct StageMemory {
  double parameters = 0;
  double weight_and_optimizer_bytes = 0;
  double activation_bytes = 0;
  double host_bytes = 0;  // fine-grained offloading's pinned host memory
};

// Fine-grained activation offloading on a stage (offload.hpp): each
// micro-batch in flight has its offloaded modules' tensors in host memory
// for every layer but each chunk's last; one layer's more are on the GPU
// while they are copied (the reload one layer ahead of the backward, or a
// copy to host not done). The GPU's saving and the host's bytes.
struct StageOffload {
  double freed = 0;
  double host = 0;
};

StageOffload stage_fine_offload(const ModelSpec& m, const ParallelPlan& plan, int stage, double in_flight) {
  StageOffload out;
  if (plan.offload_modules == 0) return out;
  const double layers = layers_on_stage(plan, m.num_layers, stage);
  const double moe_layers = moe_layers_on_stage(m, plan, stage);
  if (layers <= 0) return out;
  const ModuleOffload dense = layer_module_offload(m, plan, false);
  const ModuleOffload moe = layer_module_offload(m, plan, true);
  // The kept layer of each chunk: an MoE layer's where the stage has any.
  const ModuleOffload kept = moe_layers > 0 ? moe : dense;
  const double chunks = std::min<double>(chunks_per_stage(plan), layers);
  const double freed = dense.freed * (layers - moe_layers) + moe.freed * moe_layers - kept.freed * chunks;
  const double copied = dense.copied * (layers - moe_layers) + moe.copied * moe_layers - kept.copied * chunks;
  out.freed = std::max(0.0, freed * in_flight - kept.freed);
  out.host = std::max(0.0, copied * in_flight);
  return out;
}

StageMemory stage_memory(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  StageMemory mem;
  const StageParameters params = stage_parameters(m, plan, stage);
  mem.parameters = params.total();
  const double grad_bytes = plan.grad_element_bytes();
  const double states = plan.optimizer_state_bytes();
  mem.weight_and_optimizer_bytes =
      params.dense * bytes_per_parameter(plan.zero_stage, plan.dp_cp(), grad_bytes, states) +
      params.expert * bytes_per_parameter(plan.zero_stage, plan.expert_dp(), grad_bytes, states);
  if (plan.optimizer == OptimizerKind::muon) {
    // Muon keeps one fp32 momentum where Adam keeps two moments (the
    // momentum_buffer of orthogonalized_optimizer.py), on the same share.
    const StageParameters muon = muon_elements(m, plan, stage);
    const double d = plan.zero_stage >= 1 ? plan.dp_cp() : 1, ed = plan.zero_stage >= 1 ? plan.expert_dp() : 1;
    mem.weight_and_optimizer_bytes -= plan.adam_moment_bytes * (muon.dense / d + muon.expert / ed);
  }
  // FP8 / FP4 plans: Transformer Engine keeps each quantized weight's
  // rowwise and columnwise copies from the first micro-batch's cast to the
  // step's end (linear.py quantize_weight with update_workspace on
  // is_first_microbatch), beside the bf16 weight.
  // With --fp8-param-gather the rowwise copy is the parameter itself: no
  // bf16 weight (Megatron-Core's fp8_param, TE's fp8_model_init).
  if (plan.precision != Precision::bf16 && plan.zero_stage >= 3) {
    // Megatron-FSDP (its bf16 gradients: grad_element_bytes); with
    // --fp8-param-gather the quantized weights' shards are FP8, rowwise
    // (and, MXFP8, columnwise: param_and_grad_buffer.py's transpose buffer)
    // instead of bf16, the columnwise copy made for each gathered layer only
    // (as the gathered units, not counted); without it Transformer Engine
    // caches every layer's two copies, as above, whole on every rank.
    // The routed experts' shards are over expert-DP (their own buckets).
    const double d = plan.dp_cp(), ed = plan.expert_dp();
    const StageParameters quantized = quantized_stage_weights(m, plan, stage);
    const double e = quantized_element_bytes(plan.precision);
    const double shard = (plan.precision == Precision::mxfp8 ? 2 * e : e) - kBf16Bytes;
    if (plan.fp8_param_gather) {
      mem.weight_and_optimizer_bytes += quantized.dense * shard / d;
      if (quantized.expert > 0) mem.weight_and_optimizer_bytes += quantized.expert * shard / ed;
    } else {
      mem.weight_and_optimizer_bytes += quantized.total() * 2.0 * e;
    }
  } else if (plan.precision != Precision::bf16) {
    mem.weight_and_optimizer_bytes +=
        quantized_weights_on_stage(m, plan, stage) *
        (2.0 * quantized_element_bytes(plan.precision) - (plan.fp8_param_gather ? kBf16Bytes : 0.0));
  }

  mem.weight_and_optimizer_bytes += pp_fsdp_no_sync_bytes(plan, params);
  mem.weight_and_optimizer_bytes += zero3_gathered_bytes(m, plan, stage);

  const double in_flight = in_flight_micro_batches(plan, stage);
  const double moe_layers = moe_layers_on_stage(m, plan, stage);
  // Each layer as the plan prices it (with full recomputation: each
  // checkpoint group's input), and a partial one's stored layers whole.
  const StageRecompute rc = stage_recompute(m, plan, stage);
  ParallelPlan stored = plan;
  stored.recompute = Recompute::none;
  const bool full = plan.recompute == Recompute::full;
  const std::array<double, 2> whole = {full ? layer_activation_bytes(m, stored, false) : 0.0,
                                       full && moe_layers > 0 ? layer_activation_bytes(m, stored, true) : 0.0};
  double act = (layer_activation_bytes(m, plan, false) * rc.kept[0] + layer_activation_bytes(m, plan, true) * rc.kept[1] +
                (whole[0] * rc.stored[0] + whole[1] * rc.stored[1])) *
               in_flight;
  // CPU offloading (PP 1, one micro-batch in flight): Transformer Engine
  // frees offloaded layer i's tensors before the forward of layer L - K + i
  // and reloads it L - 1 - K layers ahead of its backward, so at every
  // instant K layers' activations are in host memory (offload.hpp).
  act -= offloaded_host_bytes(m, plan);
  const StageOffload fine = stage_fine_offload(m, plan, stage, in_flight);
  act -= fine.freed;
  mem.host_bytes = fine.host;
  // The checkpoint group being recomputed in backward holds its layers'
  // full activations once: the largest of the stage's.
  double group = 0;
  for (const std::array<double, 2>& g : rc.groups) group = std::max(group, whole[0] * g[0] + whole[1] * g[1]);
  act += group;
  // An MoE layer's all-to-all buffers while it dispatches: its token copies
  // sent and the busiest rank's received.
  if (moe_layers > 0 && plan.ep > 1) act += moe_dispatch_buffer_bytes(m, plan);
  // The EP overlap's combined step runs the next micro-batch's (chunk's)
  // forward layer i beside the backward of the held one's last remaining
  // layer, and frees that layer after the pair (model_chunk_schedule_plan.py
  // run(): get_layer(i) with pop_layer(), then b_layer.release_state(), at
  // d98e8a64; combined_1f1b.py: PP 1 pairs micro-batch i + 1's forward with
  // micro-batch i's backward): one layer more than the schedule holds
  // without it, the largest on the stage.
  if (ep_overlap_pairs_layers(plan, stage)) act += layer_activation_bytes(m, plan, moe_layers > 0);
  // The paged stash: beside the pages, one MoE layer's expert tensors at the
  // budget's padded size, those of the layer in its forward until its copy
  // is waited for at the next layer's start (paged_stash.py:301-311,
  // 504-514@d98e8a64) or, in backward, those reloaded into a fresh
  // padded tensor for the layer in its backward (:516-549).
  if (moe_layers > 0) act += paged_stash_padded_layer_bytes(m, plan);
  if (stage == 0) act += embedding_activation_bytes(m, plan) * in_flight;
  if (stage == plan.pp - 1) act += output_layer_activation_bytes(m, plan);
  // Multi-token prediction on the last stage: each module's layer, lookup
  // and loss, held like a layer's.
  if (stage == plan.pp - 1 && m.mtp_layers > 0) {
    const bool moe = m.moe.enabled() && m.moe.moe_layers.back();
    act += static_cast<double>(m.mtp_layers) *
           ((layer_activation_bytes(m, plan, moe) + embedding_activation_bytes(m, plan)) * in_flight +
            output_layer_activation_bytes(m, plan));
  }
  mem.activation_bytes = act;
  // The step's fp32 gradient copy, where it outgrows the activations it
  // follows (the peak is the larger of the two).
  mem.weight_and_optimizer_bytes += std::max(0.0, step_grad_copy_bytes(plan, params) - act);
  return mem;
}

}  // namespace

double step_grad_copy_bytes(const ParallelPlan& plan, const StageParameters& params) {
  // ZeRO-3 of FSDP2 and DeepSpeed: no copy; Megatron-FSDP's
  // update_main_grads (d98e8a64 param_and_grad_buffer.py) casts each
  // gradient shard to the fp32 main weights' dtype, dropped at zero_grad;
  // none where FusedAdam reads the buffer (ParallelPlan::optimizer_casts_gradients).
  if (!plan.optimizer_casts_gradients()) return 0;
  // Megatron-LM d98e8a64: the distributed optimizer's
  // _copy_model_grads_to_main_grads gives each fp32 master shard
  // `shard_model_grad.float()` (distrib_optimizer.py), the unsharded one
  // `model_param.main_grad.float()` (optimizer.py), a copy of a 16-bit
  // buffer (of an fp32 one the same tensor); zero_grad(set_to_none=True) at
  // the start of the next train_step frees it (training.py train_step).
  auto copy = [&](double parameters, int d) {
    return parameters * kFp32Bytes / (plan.zero_stage >= 1 ? static_cast<double>(std::max(1, d)) : 1.0);
  };
  return copy(params.dense, plan.dp_cp()) + copy(params.expert, plan.expert_dp());
}

double bytes_per_parameter(int zero_stage, int dp, double grad_bytes, double optimizer_bytes) {
  // bf16 weight 2 + gradient (fp32 main_grad 4, or 2) + the optimizer's
  // states (fp32 master weight 4 + Adam m 4 + v 4).
  constexpr double weight = kBf16Bytes;
  const double grad = grad_bytes, optimizer = optimizer_bytes;
  const double d = dp;
  switch (zero_stage) {
    case 0: return weight + grad + optimizer;
    case 1: return weight + grad + optimizer / d;  // master + moments sharded (Megatron's distributed optimizer)
    case 2: return weight + (grad + optimizer) / d;  // + gradients sharded
    default: return (weight + grad + optimizer) / d;  // + weights sharded (ZeRO-3)
  }
}

namespace {

// One layer's parameters on a GPU of an MoE model, split as the optimizer
// shards them: attention, shared experts and dense MLP over TP, the norms,
// router and shared-expert gate whole, the routed experts over ETP x EP
// (Megatron's theoretical_memory_usage.py).
StageParameters layer_split(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double norms = 2 * d(m.layer_norm_parameters());
  if (!moe_layer) return {(d(m.attention_parameters()) + d(m.dense_mlp_parameters())) / plan.tp + norms, 0.0};
  const double routed = d(m.moe.num_experts * m.expert_parameters());
  const double router = d(m.moe.num_experts * m.hidden_size);
  const double gate = m.moe.shared_expert_gate ? d(m.hidden_size) : 0.0;
  const double shared = d(m.moe_mlp_parameters()) - routed - router - gate;
  return {(d(m.attention_parameters()) + shared) / plan.tp + norms + router + gate,
          routed / (plan.expert_tp() * plan.ep)};
}

}  // namespace

StageParameters mtp_parameters(const ModelSpec& m, const ParallelPlan& plan) {
  StageParameters p;
  if (m.mtp_layers <= 0) return p;
  const bool moe = m.moe.enabled() && m.moe.moe_layers.back();
  const double h = static_cast<double>(m.hidden_size);
  const StageParameters layer =
      m.moe.enabled() ? layer_split(m, plan, moe) : StageParameters{layer_parameters_on_gpu(m, plan, false), 0.0};
  const double own = 2 * h * h / plan.tp + 3 * static_cast<double>(m.layer_norm_parameters());
  p.dense = static_cast<double>(m.mtp_layers) * (layer.dense + own);
  p.expert = static_cast<double>(m.mtp_layers) * layer.expert;
  // Its embedding lookup needs the word embedding on the last stage too.
  if (plan.pp > 1) p.dense += static_cast<double>(padded_vocab_size(m.vocab_size, plan.tp)) * h / plan.tp;
  return p;
}

double parameters_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  if (m.moe.enabled()) return stage_parameters(m, plan, stage).total();
  const double mtp = stage == plan.pp - 1 ? mtp_parameters(m, plan).total() : 0.0;
  const double h = static_cast<double>(m.hidden_size);
  const double embedding = static_cast<double>(padded_vocab_size(m.vocab_size, plan.tp)) * h;
  double params = static_cast<double>(m.parameters_per_layer()) * layers_per_stage(m, plan, stage);
  if (stage == 0) {
    params += embedding;
    if (m.learned_position_embeddings) {
      params += static_cast<double>(m.max_position_embeddings) * h;
    }
  }
  if (stage == plan.pp - 1) {
    params += final_norm_parameters(m);
    // A tied LM head still needs its own copy when it lives on another stage
    // than the embedding (Megatron all-reduces the two copies' gradients).
    if (plan.pp > 1 || !m.tied_embeddings) params += embedding;
  }
  // Megatron's counting: everything divided by tp (norm weights are in fact
  // replicated, a negligible difference).
  return params / plan.tp + mtp;
}

// A layer's quantized weights: the routed experts' and the others.
StageParameters quantized_layer_weights(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  StageParameters w;
  if (plan.precision == Precision::bf16) return w;
  for (const Op& op : transformer_layer_ops(m, plan, moe_layer).forward) {
    if (op.kind != OpKind::gemm || op.precision == Precision::bf16) continue;
    const double elements = static_cast<double>(op.k) * static_cast<double>(op.n) * static_cast<double>(op.batch);
    (op.grouped ? w.expert : w.dense) += elements;
  }
  return w;
}

namespace {

void add_scaled(StageParameters& into, const StageParameters& w, double times) {
  into.dense += times * w.dense;
  into.expert += times * w.expert;
}

}  // namespace

StageParameters quantized_stage_weights(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  StageParameters w;
  if (plan.precision == Precision::bf16) return w;
  const int moe = moe_layers_on_stage(m, plan, stage);
  const int dense = layers_on_stage(plan, m.num_layers, stage) - moe;
  if (dense > 0) add_scaled(w, quantized_layer_weights(m, plan, false), dense);
  if (moe > 0) add_scaled(w, quantized_layer_weights(m, plan, true), moe);
  if (stage == plan.pp - 1 && m.mtp_layers > 0)
    add_scaled(w, quantized_layer_weights(m, plan, m.moe.enabled() && m.moe.moe_layers.back()),
               static_cast<double>(m.mtp_layers));
  return w;
}

double quantized_weights_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  return quantized_stage_weights(m, plan, stage).total();
}

int moe_layers_on_stage(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  if (!m.moe.enabled()) return 0;
  const int chunks = chunks_per_stage(plan);
  int n = 0;
  for (int c = 0; c < chunks; ++c) {
    const int first = first_layer_of_chunk(plan, m.num_layers, stage, c);
    const int per_chunk = layers_in_chunk(plan, m.num_layers, stage, c);
    for (int l = first; l < first + per_chunk; ++l) n += m.moe.moe_layers[static_cast<std::size_t>(l)] ? 1 : 0;
  }
  return n;
}

StageRecompute stage_recompute(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  StageRecompute r;
  const bool full = plan.recompute == Recompute::full;
  for (int c = 0; c < chunks_per_stage(plan); ++c) {
    const int first = first_layer_of_chunk(plan, m.num_layers, stage, c);
    const int layers = layers_in_chunk(plan, m.num_layers, stage, c);
    const auto kind = [&](int i) {
      return m.moe.enabled() && m.moe.moe_layers[static_cast<std::size_t>(first + i)] ? std::size_t{1} : std::size_t{0};
    };
    for (int i = 0; i < layers; ++i) {
      if (recomputes_layer(plan, i)) r.recomputed[kind(i)] += 1;
      else if (full) r.stored[kind(i)] += 1;
      if (!full) r.kept[kind(i)] += 1;
    }
    for (const std::array<int, 2>& g : recompute_groups(plan, layers)) {
      r.kept[kind(g[0])] += 1;
      std::array<double, 2> n{};
      for (int i = g[0]; i < g[1]; ++i) n[kind(i)] += 1;
      r.groups.push_back(n);
    }
  }
  return r;
}

StageParameters layer_parameter_split(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  if (!m.moe.enabled()) return StageParameters{static_cast<double>(m.parameters_per_layer()) / plan.tp, 0.0};
  return layer_split(m, plan, moe_layer);
}

double layer_parameters_on_gpu(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  if (!m.moe.enabled()) return static_cast<double>(m.parameters_per_layer()) / plan.tp;
  return layer_split(m, plan, moe_layer).total();
}

StageParameters stage_parameters(const ModelSpec& m, const ParallelPlan& plan, int stage) {
  if (!m.moe.enabled()) return StageParameters{parameters_on_stage(m, plan, stage), 0.0};
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double h = d(m.hidden_size), t = plan.tp;
  const double embedding = d(padded_vocab_size(m.vocab_size, plan.tp)) * h;
  const double moe_layers = moe_layers_on_stage(m, plan, stage);
  const double dense_layers = layers_on_stage(plan, m.num_layers, stage) - moe_layers;
  const StageParameters dense = layer_split(m, plan, false), moe = layer_split(m, plan, true);
  StageParameters p;
  p.dense = dense_layers * dense.dense + moe_layers * moe.dense;
  p.expert = moe_layers * moe.expert;
  if (stage == 0) {
    p.dense += embedding / t;
    if (m.learned_position_embeddings) p.dense += d(m.max_position_embeddings) * h / t;
  }
  if (stage == plan.pp - 1) {
    p.dense += final_norm_parameters(m);
    if (plan.pp > 1 || !m.tied_embeddings) p.dense += embedding / t;
    const StageParameters mtp = mtp_parameters(m, plan);
    p.dense += mtp.dense;
    p.expert += mtp.expert;
  }
  return p;
}

double activation_bytes_per_layer(const ModelSpec& m, const ParallelPlan& plan) {
  return layer_activation_bytes(m, plan, m.moe.enabled() && m.moe.moe_layer_count() == m.num_layers);
}

double moe_dispatch_buffer_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  if (!m.moe.enabled()) return 0;
  const double tokens = static_cast<double>(plan.seq_per_rank()) * plan.micro_batch /
                        (plan.sequence_parallel ? plan.tp : 1);
  const double h = static_cast<double>(m.hidden_size);
  const double copies = tokens * static_cast<double>(m.moe.experts_per_token);
  // With a rank capacity factor HybridEP's receive buffer is the static
  // budget (hybrid_ep.cu:314@94a9f8f6, torch::empty of num_permuted_tokens rows).
  const double received = plan.moe_flex.rank_capacity_factor > 0 ? rank_budget_rows(m, plan)
                                                                  : expert_tokens(m, plan) / plan.expert_tp();
  return (copies + received) * h * 2;
}

double paged_stash_padded_layer_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  if (!m.moe.enabled() || !plan.moe_flex.paged_stash || plan.moe_flex.rank_capacity_factor <= 0 ||
      plan.checkpoints(RecomputeModule::moe))
    return 0;
  return rank_budget_rows(m, plan) * expert_bytes_per_row(m, plan);
}

double layer_activation_bytes(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  const double s = static_cast<double>(plan.seq_per_rank());
  const double b = plan.micro_batch;
  const double h = static_cast<double>(m.hidden_size);
  const double t = plan.tp;
  const double sbh = s * b * h;

  if (plan.recompute == Recompute::full) {
    // Only the layer input (bf16) is kept; sharded along the sequence with SP.
    return plan.sequence_parallel ? 2 * sbh / t : 2 * sbh;
  }

  // Replicated across TP ranks unless sequence parallel: the two norm inputs
  // (4sbh), the QKV GEMM input (2sbh), the two dropout masks (2sbh, 1 byte
  // each; none at a hidden dropout of 0, embedding_activation_bytes) and the
  // MLP input (2sbh).
  const double replicated = (m.hidden_dropout > 0 ? 10 : 8) * sbh;
  // Split by TP: Q, K, V (K and V at kv width for GQA), the output
  // projection's input, and the MLP's intermediate activations: fc1 output +
  // GeLU output (2 x 2 bytes x f) or, gated, fc1 output 2f wide + SwiGLU
  // output (2 x 2f + 2 x f bytes). For GPT (q = kv = h, f = 4h): 24*s*b*h.
  const double q = static_cast<double>(m.query_projection_size());
  const double kv = static_cast<double>(m.kv_projection_size());
  const double f = static_cast<double>(m.ffn_hidden_size);
  const MlaActivations mla = mla_activations(m, plan);
  const double attention = m.mla.enabled() ? mla.split : s * b * (core_saved_input_bytes(plan) * (q + 2 * kv) + 2 * q);
  // A recomputed dense MLP (--recompute-modules mlp) keeps only its input,
  // counted above in bf16 (the checkpoint's); FC1's and FC2's saved inputs
  // and the activation's are dropped.
  const bool mlp_recomputed = !moe_layer && plan.checkpoints(RecomputeModule::mlp);
  const double mlp = moe_layer || mlp_recomputed ? 0.0 : (m.gated_mlp() ? 6 : 4) * s * b * f;
  const double split = attention + mlp;
  // Attention scores: softmax output (2), dropout mask (1), dropout output (2)
  // bytes per score, a*s*s*b scores (the softmax output alone at an attention
  // dropout of 0); never stored with flash attention, and recomputed (not
  // stored) with selective recompute.
  const bool scores_stored = !plan.flash_attention && !plan.checkpoints(RecomputeModule::core_attn);
  const double a = static_cast<double>(m.num_attention_heads);
  const double score_bytes = m.attention_dropout > 0 ? 5 : 2;
  const double scores = scores_stored ? score_bytes * a * s * s * b : 0;

  const double moe = moe_layer ? moe_mlp_activation_bytes(m, plan) : 0.0;
  // FP8 / FP4: the linear layers save their input quantized, not in bf16
  // (linear.py: saved_inputmat is the quantized input, columnwise): QKV's
  // and FC1's (the norms' outputs, replicated without SP) and FC2's (the
  // activation's output); the projection's as projection_input_bytes says
  // (more than bf16 under delayed scaling). An MoE layer's expert inputs are
  // in moe_mlp_activation_bytes.
  const double saved = kBf16Bytes - quantized_element_bytes(plan.precision);
  double replicated_saving = saved * sbh * (moe_layer || mlp_recomputed ? 1 : 2);
  const double projection_input = m.mla.enabled() ? a * static_cast<double>(m.mla.v_head_dim) : q;
  const double split_saving = (kBf16Bytes - projection_input_bytes(plan)) * s * b * projection_input +
                              saved * s * b * (moe_layer || mlp_recomputed ? 0.0 : f);
  // --recompute-modules layernorm drops the output of each norm that is a
  // module of its own (transformer_layer.py:470-531 at d98e8a64, output
  // discarded: CheckpointWithoutOutput): the input norm before latent
  // attention's down projections (a Transformer Engine norm in its layer
  // spec; fused into linear_qkv otherwise, an IdentityOp) and the pre-MLP
  // norm of an MoE layer (fused into linear_fc1 on a dense layer), where
  // its graphs allow it (ParallelPlan::recomputes_moe_mlp_norm).
  if (plan.recomputes(RecomputeModule::layernorm)) {
    if (m.mla.enabled()) replicated_saving += (kBf16Bytes - saved) * sbh;
    if (moe_layer && plan.recomputes_moe_mlp_norm()) replicated_saving += kBf16Bytes * sbh;
  }
  if (plan.sequence_parallel)
    return (replicated + mla.replicated - replicated_saving + split - split_saving) / t + scores / t + moe;
  return replicated + mla.replicated - replicated_saving + (split - split_saving) / t + scores / t + moe;
}

double in_flight_micro_batches(const ParallelPlan& plan, int stage) {
  if (plan.pp == 1) return 1;
  const double m = static_cast<double>(plan.num_micro_batches());
  const double pp = plan.pp;
  if (plan.schedule == Schedule::gpipe) return m;
  if (!interleaved(plan)) return std::min(m, pp - stage);
  // Interleaved 1F1B (Megatron): stage r runs 2*(pp - r - 1) + (v - 1)*pp
  // warm-up chunk forwards, then one more before its first backward; a chunk
  // holds 1/v of the stage's layers, so in stage micro-batches the peak is
  //   (2*(pp - r - 1) + (v - 1)*pp + 1) / v = pp + (pp - 1 - 2r) / v.
  // On the first stage this is Megatron's pp * (1 + (pp - 1)/(pp * v)); later
  // stages hold proportionally less. All chunks in flight (m * v) caps it at m.
  // The EP overlap's extra warm-up forward takes the place of that one more
  // forward: its combined steps free the backward's layers as they go
  // (ep_overlap_layer_bytes).
  const double v = plan.virtual_stages;
  return std::min(m, pp + (pp - 1 - 2.0 * stage) / v);
}

MemoryReport memory_per_gpu(const ModelSpec& m, const ParallelPlan& plan, const GpuProfile& gpu) {
  MemoryReport report;
  report.reserve_bytes = static_cast<double>(gpu.memory_reserve_bytes);
  report.capacity_bytes = static_cast<double>(gpu.memory_bytes);
  double peak_total = -1;
  // The middle stages hold the same layers and parameters, and the
  // micro-batches in flight never grow with the stage index (GPipe: m; 1F1B:
  // min(m, pp - s); interleaved: decreasing in s), so the peak is on the first
  // stage, the first middle stage or the last stage: only those are computed.
  const int candidates[] = {0, 1, plan.pp - 1};
  int previous = -1;
  for (int stage : candidates) {
    if (stage <= previous || stage >= plan.pp) continue;
    previous = stage;
    const StageMemory mem = stage_memory(m, plan, stage);
    const double total = mem.weight_and_optimizer_bytes + mem.activation_bytes + report.reserve_bytes;
    if (total > peak_total) {  // first stage wins ties
      peak_total = total;
      report.parameters = mem.parameters;
      report.weight_and_optimizer_bytes = mem.weight_and_optimizer_bytes;
      report.activation_bytes = mem.activation_bytes;
      report.total_bytes = total;
      report.peak_stage = stage;
      report.host_activation_bytes = plan.offload_modules != 0 ? mem.host_bytes : offloaded_host_bytes(m, plan);
    }
  }
  return report;
}

}  // namespace cuboid
