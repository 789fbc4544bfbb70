// torchtitan, two versions:
//  * v0.2.2: --section.key overrides of a TOML job config; fields from pytorch/torchtitan
//    torchtitan/config/job_config.py@v0.2.2 (tests/data/trainer_options/torchtitan-v0.2.2.json);
//  * main at b5bcd76c: refused, its language models' attention being FlexAttention with
//    per-document masks (torchtitan_main below).
// Schedule names are torch.distributed.pipelining's (get_schedule_class).
//
// What v0.2.2 does at start-up beyond the overrides, and what the export does
// about it (docs/plan-files-and-exports.md, torchtitan):
//  * the rotate method is read by validation only (components/validate.py:213
//    passes it to set_rotate_method); training keeps PyTorch's default, the
//    all-gather of K and V: a CP export launches torchtitan.train after
//    set_rotate_method("alltoall"), the p2p ring cuboid priced;
//  * the base TOML's [compile], async TP and converters stay unless
//    overridden (llama3_405b.toml turns on all three): every export turns
//    compile and async TP off and names its converter;
//  * booleans are tyro flags: --section.key sets, --section.no_key clears
//    (docs/debugging.md@v0.2.2: "--key=False will not work");
//  * FSDP under the pipeline keeps unsharded fp32 gradients until the last
//    backward (priced by TrainerSettings::pp_fsdp_no_sync), and FSDP without
//    the pipeline regathers the parameters every micro-batch (ZeRO-2 refused).
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "export_common.hpp"

namespace cuboid::exporters {

namespace {

// torchtitan's Llama 3 flavours (torchtitan/models/llama3/__init__.py@v0.2.2:
// dim, layers, heads, KV heads, the FFN that ffn_dim_multiplier and
// multiple_of give, vocabulary 128256, rope_theta 500000, Llama 3.1 scaling).
struct Flavor {
  const char* name;  // --model.flavor
  std::int64_t dim, layers, heads, kv_heads, ffn;
};
constexpr std::array<Flavor, 3> kFlavors = {{
    {"8B", 4096, 32, 32, 8, 14336},
    {"70B", 8192, 80, 64, 8, 28672},
    {"405B", 16384, 126, 128, 8, 53248},
}};

// Rotary positions, RMSNorm, SwiGLU, no biases, an untied output layer: the
// blocks torchtitan's llama3 and qwen3 models share.
bool llama_style(const ModelSpec& m) {
  return !m.learned_position_embeddings && m.normalization == Normalization::rmsnorm &&
         m.activation == Activation::swiglu && !m.linear_bias && !m.tied_embeddings;
}

const Flavor& flavor(const PlanFile& pf) {
  const ModelSpec& m = pf.model;
  if (!llama_style(m))
    refuse(pf, "model",
           m.name + " is not a Llama-style model (torchtitan's llama3 has rotary positions, RMSNorm, SwiGLU, no biases "
                    "and an untied output layer), and torchtitan has no model of its shape",
           "export with --to megatron or --to megatron-bridge");
  for (const Flavor& f : kFlavors)
    if (f.dim == m.hidden_size && f.layers == m.num_layers && f.heads == m.num_attention_heads &&
        f.kv_heads == m.num_kv_heads && f.ffn == m.ffn_hidden_size && m.vocab_size == 128256)
      return f;
  refuse(pf, "model",
         fmt::format("torchtitan's llama3 flavours are 8B, 70B and 405B; none has the shape of {} ({} layers, hidden "
                     "{}, {} heads, {} KV heads, FFN {}, vocabulary {})",
                     m.name, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size,
                     m.vocab_size),
         "register a flavour of that shape in torchtitan/models/llama3/__init__.py, or export with --to megatron");
}

// torchtitan v0.2.2's Qwen3 MoE flavours (torchtitan/models/qwen3/__init__.py:
// RMSNorm, SwiGLU experts, no biases, untied output, every layer an MoE layer,
// no shared expert, top-k softmax routing, dropless).
struct MoeFlavor {
  const char* name;
  std::int64_t dim, layers, heads, kv_heads, head_dim, experts, top_k, expert_ffn, vocab;
  double rope_theta;
};
constexpr std::array<MoeFlavor, 2> kQwen3Moe = {{
    {"30B-A3B", 2048, 48, 32, 4, 128, 128, 8, 768, 151936, 1e6},
    {"235B-A22B", 4096, 94, 64, 4, 128, 128, 8, 1536, 151936, 5e6},
}};

const MoeFlavor& moe_flavor(const PlanFile& pf) {
  const ModelSpec& m = pf.model;
  const MoeSpec& e = m.moe;
  if (!llama_style(m) || e.moe_layer_count() != m.num_layers || e.shared_expert_ffn_hidden_size > 0 ||
      e.capacity_factor > 0 || e.router_groups > 0)
    refuse(pf, "model.moe",
           m.name + " is not a Qwen3-style MoE model (torchtitan v0.2.2's MoE train spec here is qwen3: RMSNorm, "
                    "SwiGLU experts in every layer, no shared expert, dropless, no biases, an untied output layer)",
           "export with --to megatron or --to megatron-bridge");
  for (const MoeFlavor& f : kQwen3Moe)
    if (f.dim == m.hidden_size && f.layers == m.num_layers && f.heads == m.num_attention_heads &&
        f.kv_heads == m.num_kv_heads && f.head_dim == m.head_dim && f.experts == e.num_experts &&
        f.top_k == e.experts_per_token && f.expert_ffn == e.expert_ffn_hidden_size && f.vocab == m.vocab_size &&
        f.rope_theta == m.rope_theta && m.rope_scaling_factor == 0)
      return f;
  refuse(pf, "model.moe",
         fmt::format("torchtitan v0.2.2's qwen3 MoE flavours are 30B-A3B and 235B-A22B; none has the shape of {} "
                     "({} layers, hidden {}, {} experts of width {}, top-{})",
                     m.name, m.num_layers, m.hidden_size, e.num_experts, e.expert_ffn_hidden_size,
                     e.experts_per_token),
         "register a flavour of that shape in torchtitan/models/qwen3/__init__.py, or export with --to megatron");
}

// What both versions refuse alike.
void check_common(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  if (!default_rank_order(p))
    refuse(pf, "parallel.rank_order",
           "torchtitan's device mesh is fixed as [pp, dp_replicate, dp_shard, cp, tp] (TP innermost, PP outermost = "
           "rank order tp-dp-pp), not " + p.order.str(),
           "plan with --rank-order tp-dp-pp");
  if (p.tp > 1 && !p.sequence_parallel)
    refuse(pf, "parallel.sequence_parallel",
           "torchtitan's tensor parallelism always shards norms along the sequence (sequence parallelism)",
           "plan with --sequence-parallel on");
  refuse_mla_mtp(pf, "cuboid's torchtitan export (its Llama train spec)");
  refuse_pipeline_layout(pf, "cuboid's torchtitan export (its Llama train spec)");
  refuse_megatron_overlaps(pf, "cuboid's torchtitan export (its Llama train spec)");
  if (p.moe_ep_overlap)
    refuse(pf, "parallel.moe_ep_overlap",
           "torchtitan's training loop runs each micro-batch's forward, then its backward; with PP 1 it has no "
           "schedule that runs one micro-batch's forward beside another's backward (Megatron-Core's combined 1F1B, "
           "which the plan's EP overlap prices)",
           "plan with --moe-ep-overlap off, or export with --to megatron or --to megatron-bridge");
  if (p.moe_flex.rank_capacity_factor > 0 || p.moe_flex.paged_stash)
    refuse(pf, p.moe_flex.rank_capacity_factor > 0 ? "parallel.moe_rank_capacity_factor" : "parallel.moe_paged_stash",
           "torchtitan v0.2.2 has no static per-rank receive budget for its experts' tokens and no paged stash of "
           "their activations (Megatron-Core's moe_expert_rank_capacity_factor and moe_paged_stash, with HybridEP)",
           "plan without --moe-rank-capacity-factor and --moe-paged-stash, or export with --to megatron or --to "
           "megatron-bridge");
  refuse_offload(pf, "cuboid's torchtitan export", "torchtitan's activation checkpointing recomputes; it does not offload");
  refuse_precision_aware_optimizer(pf, "cuboid's torchtitan export",
                                   "its optimizer is torch's AdamW over the fp32 sharded parameters");
  refuse_muon(pf, "cuboid's torchtitan export", "its pinned option list has no Muon");
  refuse_fp8_attention(pf, "torchtitan v0.2.2",
                       "its float8 and MXFP8 converters quantize the linear layers; attention runs "
                       "scaled_dot_product_attention in bf16");
  refuse_recompute_layers(pf,
                          "torchtitan's activation_checkpoint.mode \"full\" wraps every transformer block in a "
                          "checkpoint of its own (its selective mode's layer option checkpoints every N-th "
                          "block, not a chunk's first N or groups of N)");
  if (p.cp > 1 && p.zero_stage < 2)
    refuse(pf, "parallel.zero_stage",
           fmt::format("torchtitan shards the weights, gradients and optimizer states over the context-parallel "
                       "ranks with FSDP whenever CP > 1 (ParallelDims.fsdp_enabled), and the plan keeps them {} "
                       "over its {} CP ranks",
                       p.zero_stage == 0 ? "whole" : "whole but the optimizer states", p.cp),
           "plan with --zero 3 (FSDP) or --zero 2 (FSDP without resharding after forward)");
  if (has_uneven_stages(p))
    refuse(pf, "parallel.first_stage_layers",
           "torchtitan's stage split counts the embedding and the output as layers, so cuboid's uneven "
           "transformer-layer split cannot be expressed exactly",
           "plan without uneven stages");
  if (!p.flash_attention)
    refuse(pf, "parallel.flash_attention",
           "torchtitan's attention is scaled_dot_product_attention (flash kernels); an unfused-attention plan "
           "cannot be reproduced",
           "plan with --flash-attention on");
  if (p.dp * p.cp > 1 && p.zero_stage == 1)
    refuse(pf, "parallel.zero_stage",
           "ZeRO-1 (sharded optimizer states, replicated weights and gradients) has no torchtitan equivalent: FSDP2 "
           "shards weights, gradients and optimizer states together",
           "plan with --zero 3 (FSDP), --zero 2 (FSDP without resharding after forward) or --zero 0 (DDP)");
  if (p.grad_accum_fusion)
    refuse(pf, "parallel.grad_accum_fusion",
           "torchtitan (FSDP2 or DDP) adds each micro-batch's gradients in a separate pass (autograd's "
           "AccumulateGrad, FSDP's sharded add), not inside the weight-gradient GEMMs, and the plan was priced with "
           "Megatron's fused accumulation",
           "plan with --grad-accum-fusion off (plan --for torchtitan does)");
  if (p.dp * p.cp > 1 && p.trainer.dp_grad_bytes != 4)
    refuse(pf, "trainer.dp_grad_bytes",
           "torchtitan reduces gradients in float32 (training.mixed_precision_reduce allows only \"float32\"), and "
           "the plan was priced with 16-bit gradients",
           "plan --for torchtitan (it prices torchtitan's reduction)");
  if (p.dp * p.cp > 1 && !p.trainer.dp_overlap)
    refuse(pf, "trainer.dp_overlap",
           "torchtitan's FSDP2 and DDP reduce gradients during the backward, and the plan was priced with the "
           "reduction after it",
           "plan --for torchtitan (it prices torchtitan's reduction)");
  const bool fsdp = p.dp * p.cp > 1 && p.zero_stage >= 2;
  // torch.distributed.pipelining (pytorch/pytorch 0138610331 stage.py
  // backward_maybe_with_nosync) turns FSDP's gradient sync and resharding
  // after backward off until the last backward: unsharded fp32 gradients
  // (and, ZeRO-3, gathered bf16 parameters) for the whole stage.
  if (fsdp && p.pp > 1 && !p.trainer.pp_fsdp_no_sync)
    refuse(pf, "trainer.pp_fsdp_no_sync",
           fmt::format("torchtitan's pipeline turns FSDP's gradient sync off until the last micro-batch "
                       "(torch.distributed.pipelining backward_maybe_with_nosync), so each GPU holds its stage's "
                       "gradients unsharded in fp32{}, and the plan was priced with them sharded over its {} ranks",
                       p.zero_stage >= 3 ? " and its parameters gathered in bf16" : "", p.dp * p.cp),
           "plan --for torchtitan (it prices torchtitan's pipeline memory)");
  // Without the pipeline, train.py@v0.2.2 train_step runs each micro-batch's
  // forward_backward_step with FSDP's defaults: gradients reduce-scattered and
  // the parameters resharded after every backward (reshard_after_backward),
  // so fsdp_reshard_after_forward = "never" all-gathers them again in every
  // micro-batch's forward; cuboid's ZeRO-2 gathers once, after the step.
  if (fsdp && p.zero_stage == 2 && p.pp == 1 && p.num_micro_batches() > 1)
    refuse(pf, "parallel.zero_stage",
           fmt::format("torchtitan reshards FSDP's parameters after every backward, so with ZeRO-2 "
                       "(fsdp_reshard_after_forward \"never\") and {} micro-batches of gradient accumulation it "
                       "all-gathers them again in each micro-batch's forward, and the plan was priced with one "
                       "gather per step",
                       p.num_micro_batches()),
           "plan with --zero 3 (FSDP's gathers in every forward and backward, as priced), or with a micro-batch "
           "that fills the global batch without accumulation");
}

// torchtitan v0.2.2's converters for the plan's quantized GEMMs
// (torchtitan/components/quantization/float8.py and mx.py@v0.2.2, fields
// from config/job_config.py Float8Linear and MXLinear): per-tensor current
// scaling is torchao's tensorwise Float8Linear (recipe_name unset: dynamic
// per-tensor scales, E4M3 forward, E5M2 gradients, FP8 all-gathers under TP),
// MXFP8 the MX converter's mxfp8_cublas recipe. Both keep the output layer in
// bf16 (filter_fqns "output"), as priced; the float8 converter's default
// filter is empty and would quantize it. A plan without quantized GEMMs
// gets no converter key, as before.
struct Quantize {
  std::string converter;  // model.converters
  std::string section;    // the converter's table
  Fields fields;
};
std::optional<Quantize> quantize_v02(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const std::string fix = "plan with --precision fp8-current or mxfp8, or export with --to megatron or --to "
                          "megatron-bridge";
  switch (p.precision) {
    case Precision::bf16: return std::nullopt;
    case Precision::fp8_delayed:
      refuse_precision(pf,
                       "torchtitan v0.2.2's float8 converter scales dynamically (torchao's tensorwise, rowwise and "
                       "rowwise_with_gw_hp recipes); it keeps no amax history (delayed scaling)",
                       fix);
    case Precision::fp8_blockwise:
      refuse_precision(pf,
                       "torchtitan v0.2.2's float8 recipes are tensorwise, rowwise and rowwise_with_gw_hp "
                       "(Float8Linear.recipe_name); none scales 1 x 128 activation and 128 x 128 weight blocks",
                       fix);
    case Precision::nvfp4:
      refuse_precision(pf,
                       "torchtitan v0.2.2's converters are float8 (torchao Float8Linear) and mx (MXFP8 recipes); "
                       "neither trains in NVFP4",
                       "plan with --precision mxfp8, or export with --to megatron or --to megatron-bridge");
    case Precision::fp8_current:
    case Precision::mxfp8: break;
  }
  if (pf.model.moe.enabled())
    refuse_precision(pf,
                     "torchtitan v0.2.2 quantizes the experts' grouped GEMMs only through its prototype grouped_mm "
                     "converters, which assert no pipeline and no context parallelism (float8.py "
                     "Float8GroupedMMConverter); cuboid's export does not write them",
                     "export with --to megatron or --to megatron-bridge");
  if (p.precision == Precision::mxfp8) {
    if (p.fp8_param_gather)
      refuse(pf, "parallel.fp8_param_gather",
             "torchtitan v0.2.2's MX converter all-gathers the weights in bf16 (only the float8 tensorwise "
             "converter has enable_fsdp_float8_all_gather)",
             "plan without --fp8-param-gather, or export with --to megatron or --to megatron-bridge");
    return Quantize{"quantize.linear.mx", "quantize.linear.mx",
                    {{"recipe_name", "\"mxfp8_cublas\""}, {"filter_fqns", "[\"output\"]"}}};
  }
  // FSDP's FP8 all-gather of the weights (torchao enable_fsdp_float8_all_gather,
  // with the scales' amax in one all-reduce after the optimizer step) is what
  // --fp8-param-gather prices; without FSDP the converter ignores it.
  if (p.fp8_param_gather && !(p.dp * p.cp > 1 && p.zero_stage >= 2))
    refuse(pf, "parallel.fp8_param_gather",
           "torchtitan's FP8 weights exist only for FSDP's all-gather (float8.py: enable_fsdp_float8_all_gather "
           "takes effect with data_parallel_shard_degree > 1 only)",
           "plan without --fp8-param-gather, or with --zero 2 and --dp 2 or more");
  const std::string gather = p.fp8_param_gather ? "true" : "false";
  return Quantize{"quantize.linear.float8",
                  "quantize.linear.float8",
                  {{"filter_fqns", "[\"output\"]"},
                   {"enable_fsdp_float8_all_gather", gather},
                   {"precompute_float8_dynamic_scale_for_fsdp", gather}}};
}

// A TOML value as a --section.key=value override: strings unquoted, lists
// comma-separated (config/manager.py@v0.2.2 list_str_rule splits on ",").
std::string flag_value(const std::string& v) {
  std::string value = v;
  if (value.size() >= 2 && value.front() == '[') {
    std::string out;
    for (char c : value.substr(1, value.size() - 2))
      if (c != '"' && c != ' ') out += c;
    return out;
  }
  if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
  return value;
}

const char* schedule_name(const ParallelPlan& p) {
  return p.schedule == Schedule::interleaved ? "Interleaved1F1B" : p.schedule == Schedule::gpipe ? "GPipe" : "1F1B";
}

// The [parallelism] table.
Fields parallelism(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  auto q = [](std::string_view s) { return fmt::format("\"{}\"", s); };
  // ZeRO-3 = FSDP resharding after forward; ZeRO-2 = FSDP keeping the
  // gathered weights until backward (fully_shard reshard_after_forward=False).
  // FSDP's mesh is dp_shard x cp: with CP it shards over the CP ranks too.
  const bool shard = p.dp * p.cp > 1 && p.zero_stage >= 2;
  Fields par;
  par.emplace_back("data_parallel_replicate_degree", std::to_string(p.dp > 1 && p.zero_stage == 0 ? p.dp : 1));
  par.emplace_back("data_parallel_shard_degree", std::to_string(shard ? p.dp : 1));
  if (shard) par.emplace_back("fsdp_reshard_after_forward", q(p.zero_stage == 3 ? "always" : "never"));
  par.emplace_back("tensor_parallel_degree", std::to_string(p.tp));
  par.emplace_back("pipeline_parallel_degree", std::to_string(p.pp));
  if (p.pp > 1) {
    par.emplace_back("pipeline_parallel_schedule", q(schedule_name(p)));
    // Pin the split: layers per (virtual) stage, no layer taken off the first
    // and last stages for the embedding and the output.
    par.emplace_back("pipeline_parallel_layers_per_stage", std::to_string(layers_per_virtual_stage(pf)));
    par.emplace_back("pipeline_parallel_first_stage_less_layers", "0");
    par.emplace_back("pipeline_parallel_last_stage_less_layers", "0");
    par.emplace_back("pipeline_parallel_microbatch_size", std::to_string(p.micro_batch));
  }
  par.emplace_back("context_parallel_degree", std::to_string(p.cp));
  if (pf.model.moe.enabled()) {
    // parallel_dims.py: the experts regroup the FSDP ranks (dp_shard x cp x tp)
    // as efsdp x ep x etp, ETP = TP or 1.
    par.emplace_back("expert_parallel_degree", std::to_string(p.ep));
    par.emplace_back("expert_tensor_parallel_degree", std::to_string(p.expert_tp()));
  }
  if (p.cp > 1) {
    // PyTorch's ring attention (torch/distributed/tensor/experimental/
    // _context_parallel/_attention.py _templated_ring_attention): the
    // "alltoall" rotater passes each rank's K/V one step around the ring per
    // block (and dK/dV in backward), started before the block and waited
    // after it: the p2p ring. "headtail" = Megatron's 2 x CP chunks, chunk r
    // and 2CP-1-r. Training reads the load balancer (train.py@v0.2.2:476) but
    // not the rotate method (validate.py:213 only): the launch line sets it.
    par.emplace_back("context_parallel_rotate_method", q("alltoall"));
    par.emplace_back("context_parallel_load_balancer", q("headtail"));
  }
  // What cuboid prices: no async TP (it needs torch.compile's micro-pipeline
  // TP, tensor_parallel.py@v0.2.2 maybe_enable_async_tp); llama3_405b.toml
  // turns it on.
  par.emplace_back("enable_async_tensor_parallel", "false");
  return par;
}

std::string rope_note(const PlanFile& pf) {
  if (pf.model.rope_scaling_factor > 0) return "";
  return fmt::format("# Its rotary embedding applies Llama 3.1's frequency scaling (factor 8), which {} has not;\n"
                     "# the cost is the same, the numerics are Llama 3.1's.\n",
                     pf.model.name);
}

}  // namespace

ExportResult torchtitan_v02(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const bool moe = pf.model.moe.enabled();
  const MoeFlavor* mf = moe ? &moe_flavor(pf) : nullptr;  // a model torchtitan cannot build is said first
  check_common(pf);
  if (p.cp > 1 && p.cp_comm != CpComm::p2p)
    refuse(pf, "parallel.cp_comm",
           "torchtitan v0.2.2's context parallelism rotates K/V around the ring (context_parallel_rotate_method "
           "alltoall) or all-gathers it; it has no all-to-all of attention heads (the plan's a2a exchange)",
           "plan with --cp-comm-type p2p");
  if (p.dp > 1 && p.zero_stage == 0 && (p.tp > 1 || p.pp > 1))
    refuse(pf, "parallel.zero_stage",
           "torchtitan v0.2.2 replicates with DDP (data_parallel_replicate_degree) only without tensor or pipeline "
           "parallelism (\"DDP has not supported > 1D parallelism\")",
           "plan with --zero 3 (FSDP), or export with --to megatron");
  // torchtitan/distributed/utils.py@v0.2.2 maybe_enable_amp.
  if (p.dp == 1 && p.cp == 1 && (p.tp > 1 || p.pp > 1))
    refuse(pf, "parallel.dp",
           "torchtitan v0.2.2 applies bf16 mixed precision through FSDP only; with TP or PP and no FSDP "
           "(maybe_enable_amp: \"Mixed precision training with TP or PP is only supported when FSDP/HSDP/CP is "
           "enabled\") it trains in training.dtype, float32, and the plan was priced in bf16",
           "plan with --dp 2 or more and --zero 2 or 3 (FSDP), or export with --to megatron");
  if (moe) {
    if (p.expert_tp() != p.tp && p.expert_tp() != 1)
      refuse(pf, "parallel.etp",
             fmt::format("torchtitan v0.2.2 splits the experts over ETP = TP or ETP = 1 ranks (parallel_dims.py: "
                         "\"Currently we only support ETP=TP or ETP=1\"), not ETP {}",
                         p.expert_tp()),
             fmt::format("plan with --etp {} or --etp 1", p.tp));
    if (p.ep == 1 && p.expert_tp() != p.tp)
      refuse(pf, "parallel.etp",
             "without expert parallelism torchtitan v0.2.2 splits the experts over the TP ranks (ETP = TP)",
             fmt::format("plan with --etp {}", p.tp));
    if (p.ep > 1 && p.dp > 1 && p.zero_stage == 0)
      refuse(pf, "parallel.zero_stage",
             "torchtitan's experts regroup the FSDP ranks (dp_shard x cp x tp) as efsdp x ep x etp "
             "(parallel_dims.py); DDP replicas (data_parallel_replicate_degree) cannot hold different experts",
             "plan with --zero 3 (FSDP) or --zero 2 (FSDP without resharding after forward)");
  }
  // The model: a llama3 flavour, or a qwen3 MoE flavour (no MoE TOML ships:
  // qwen3_32b.toml is the base, the overrides set the flavour).
  std::string model_name, flavor_name, toml, model_line;
  if (mf != nullptr) {
    model_name = "qwen3";
    flavor_name = mf->name;
    toml = "qwen3/train_configs/qwen3_32b.toml";
    model_line = fmt::format("# Model: torchtitan's qwen3 MoE flavour {} ({} layers, hidden {}, {} experts, top-{}); the\n"
                             "# base TOML is qwen3_32b.toml (no MoE TOML ships), the overrides set the flavour.\n",
                             mf->name, mf->layers, mf->dim, mf->experts, mf->top_k);
  } else {
    const Flavor& f = flavor(pf);
    model_name = "llama3";
    flavor_name = f.name;
    // llama3_405b.toml@v0.2.2 sets converters = ["float8"], a name no
    // converter registers at v0.2.2 (float8.py registers
    // "quantize.linear.float8"; protocols/model_converter.py looks the names
    // up), and a list override cannot be empty (manager.py list_str_rule: ""
    // splits to [""]): a bf16 plan could not clear it. The 405B flavour starts
    // from llama3_70b.toml (no converters, no compile, no async TP).
    const bool is_405b = f.name == std::string_view("405B");
    toml = fmt::format("llama3/train_configs/llama3_{}.toml", f.name == std::string_view("8B") ? "8b" : "70b");
    model_line = fmt::format("# Model: torchtitan's llama3 flavour {} ({} layers, hidden {}).\n", f.name,
                             pf.model.num_layers, pf.model.hidden_size) +
                 rope_note(pf);
    if (is_405b)
      model_line += "# The base TOML is llama3_70b.toml: llama3_405b.toml names a converter v0.2.2 does not register\n"
                    "# (converters = [\"float8\"]) that no override can clear; its optimizer (lr 8e-5, warmup 600\n"
                    "# steps) is yours to set (--optimizer.lr, --lr_scheduler.warmup_steps).\n";
  }

  const Fields par = parallelism(pf);
  const std::optional<Quantize> quantize = quantize_v02(pf);
  Fields model = {{"name", fmt::format("\"{}\"", model_name)}, {"flavor", fmt::format("\"{}\"", flavor_name)}};
  if (quantize) model.emplace_back("converters", fmt::format("[\"{}\"]", quantize->converter));
  // local_batch_size is per data-parallel rank: with PP it holds all of the
  // rank's micro-batches; without, gradient accumulation fills the global batch.
  const Fields train = {
      {"local_batch_size",
       std::to_string(p.pp > 1 ? p.global_batch / p.dp : static_cast<std::int64_t>(p.micro_batch))},
      {"global_batch_size", std::to_string(p.global_batch)},
      {"seq_len", std::to_string(p.seq_length)}};
  const Fields ac = {{"mode", p.recompute == Recompute::full ? "\"full\"" : "\"none\""}};
  // cuboid prices eager kernels (each cast, norm and activation a kernel of
  // its own); llama3_405b.toml compiles the model and the loss.
  const Fields compile = {{"enable", "false"}};

  std::string out = header(pf, "#", "torchtitan v0.2.2");
  out += "# Fields: pytorch/torchtitan torchtitan/config/job_config.py@v0.2.2 (Model, Parallelism, Training,\n"
         "# ActivationCheckpoint, Compile).\n";
  out += model_line;
  if (p.recompute == Recompute::selective)
    out += "# cuboid's selective recomputation (attention core only) equals none with flash attention, which\n"
           "# recomputes the attention core in backward by itself: activation_checkpoint.mode = \"none\".\n";
  out += "# Add: the dataset (--training.dataset / dataset_path), the tokenizer (--model.hf_assets_path) and\n"
         "# checkpointing (--checkpoint.enable, --checkpoint.folder).\n";
  // Training never sets the rotate method (only validation does), so the
  // launch sets it before torchtitan.train's main, as validation's
  // create_context_parallel_ctx does (distributed/utils.py@v0.2.2:216).
  const std::string program =
      p.cp > 1 ? "--no-python python -c \"from torch.distributed.tensor.experimental._attention import "
                 "set_rotate_method; set_rotate_method('alltoall'); from torchtitan.train import Trainer, main; "
                 "main(Trainer)\""
               : "-m torchtitan.train";
  if (p.cp > 1)
    out += "# Context parallelism: torchtitan v0.2.2's training never applies context_parallel_rotate_method (only\n"
           "# validation does); without the launcher's set_rotate_method('alltoall') PyTorch all-gathers K and V\n"
           "# instead of passing them around the ring that cuboid priced.\n";
  out += fmt::format(
      "# Start (each of the {0} {3}s; the TOML is torchtitan's own, these overrides win):\n"
      "#   torchrun --nnodes {0} --nproc_per_node {1} --rdzv_backend c10d --rdzv_endpoint \"$MASTER_ADDR:29500\" \\\n"
      "#     {4} --job.config_file ./torchtitan/models/{2} <the overrides below>\n",
      pf.hosts(), pf.host_gpus(), toml, host_word(pf), program);
  if (quantize)
    out += fmt::format("# {} GEMMs: torchao through {}; cuboid prices its casts as kernels of their own,\n"
                       "# as they run with [compile] off.\n",
                       to_string(p.precision), quantize->converter);
  out += "\n# Command-line overrides:\n";
  std::vector<std::string> flags;
  // Booleans are tyro flags, --section.key or --section.no_key
  // (docs/debugging.md@v0.2.2: "--enable_memory_snapshot=False will not work").
  auto add_flags = [&](const char* section, const Fields& kv) {
    for (const auto& [k, v] : kv) {
      if (v == "true" || v == "false") flags.push_back(fmt::format("--{}.{}{}", section, v == "true" ? "" : "no_", k));
      else flags.push_back(fmt::format("--{}.{}={}", section, k, flag_value(v)));
    }
  };
  add_flags("model", model);
  add_flags("parallelism", par);
  add_flags("training", train);
  add_flags("activation_checkpoint", ac);
  add_flags("compile", compile);
  if (quantize) add_flags(quantize->section.c_str(), quantize->fields);
  for (std::size_t i = 0; i < flags.size(); ++i) out += flags[i] + (i + 1 < flags.size() ? " \\\n" : "\n");
  out += "\n# The same as TOML tables (train_configs/*.toml):\n";
  auto table = [&](const char* section, const Fields& kv, bool last) {
    out += fmt::format("[{}]\n", section);
    for (const auto& [k, v] : kv) out += fmt::format("{} = {}\n", k, v);
    if (!last) out += "\n";
  };
  table("model", model, false);
  table("parallelism", par, false);
  table("training", train, false);
  table("activation_checkpoint", ac, false);
  table("compile", compile, !quantize);
  if (quantize) table(quantize->section.c_str(), quantize->fields, true);
  return {out, ""};
}

// torchtitan main at b5bcd76c: a language model's attention is FlexAttention
// (or varlen) with block-causal masks over the documents the dataloader packs
// (torchtitan/models/common/config_utils.py get_attention_config: "Language
// models always use block_causal masking (the dataloaders always emit
// per-document positions)"; "sdpa is no longer supported for language
// models"; both packers, components/data/packing.py, emit them). cuboid prices
// causal attention over the whole sequence at the SDPA kernels' measured rates
// and has neither FlexAttention's rates nor the documents' lengths, so no plan
// runs there as priced. (llama3_405b() in models/llama3/config_registry.py
// also turns on Float8LinearConverter, torch.compile and async TP.)
ExportResult torchtitan_main(const PlanFile& pf) {
  refuse(pf, "model",
         "torchtitan main (b5bcd76c) runs a language model's attention as FlexAttention or varlen with "
         "block-causal masks over the packed documents (models/common/config_utils.py get_attention_config: SDPA "
         "is refused for language models), and cuboid prices causal attention over the whole sequence with the SDPA "
         "kernels' rates; it has no FlexAttention rate nor the documents' lengths",
         "export with --to torchtitan (v0.2.2's llama3 flavours run SDPA, causal over the whole sequence), --to "
         "megatron or --to megatron-bridge");
}

}  // namespace cuboid::exporters
