// Megatron-Bridge v0.6.0 (NVIDIA-NeMo/Megatron-Bridge 51885cf1), where NeMo 2's
// LLM training moved: a Python script that builds the ConfigContainer from
// recipes/common.py _pretrain_common(), a GPTModelProvider and the plan's
// fields, then calls pretrain(). Fields: training/config.py, models/gpt_provider.py
// and, through them, NVIDIA/Megatron-LM cd4afffa (the 3rdparty/Megatron-LM commit
// v0.6.0 pins) megatron/core/model_parallel_config.py, transformer/transformer_config.py,
// distributed/distributed_data_parallel_config.py, training/config/*.py
// (tests/data/trainer_options/megatron-bridge-v0.6.0.json).
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "export_common.hpp"

namespace cuboid::exporters {

namespace {

const char* py(bool b) { return b ? "True" : "False"; }

// A float literal: 0.0, 0.05 (fmt's shortest form, with a decimal point).
std::string python_float(double x) {
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

struct Layout {
  bool tp_pp_dp;  // ranks ordered tp-pp-dp (dist.use_tp_pp_dp_mapping)
  bool fsdp;      // ZeRO-2 / ZeRO-3 as Megatron FSDP
};

// Refuses what Megatron-Bridge cannot run.
Layout check_plan(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  refuse_mla_mtp(pf, "The Megatron-Bridge script (a GPTModelProvider)");
  refuse_pipeline_layout(pf, "The Megatron-Bridge script (a GPTModelProvider)");
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule",
           "Megatron-Bridge runs Megatron-Core's schedules (1F1B and interleaved 1F1B), no GPipe",
           "plan with --schedule 1f1b or --schedule interleaved");
  refuse_zero1_all_reduce(pf, "Megatron-Bridge");
  const Layout l = {megatron_tp_pp_dp(pf, "Megatron-Bridge", "dist.use_tp_pp_dp_mapping"),
                    p.zero_stage >= 2 && p.dp_cp() > 1};
  if (l.fsdp && l.tp_pp_dp)
    refuse(pf, "parallel.rank_order",
           "Megatron-Bridge asserts \"use_tp_pp_dp_mapping is not supported with Megatron FSDP\" (training/config.py)",
           "plan with --rank-order tp-dp-pp");
  if (p.trainer.overlap_param_gather_with_optimizer_step && p.dp_cp() > 1 && !l.fsdp &&
      p.precision == Precision::mxfp8 && p.fp8_param_gather)
    refuse(pf, "parallel.trainer.overlap_param_gather_with_optimizer_step",
           "Megatron-Bridge asserts MXFP8's parameter all-gather reuses the gradient buffer (training/config.py:1351"
           "@v0.6.0), which Megatron-Core refuses with the gather under the optimizer step "
           "(optimizer/optimizer_config.py:424@cd4afffa)",
           "plan with --overlap-param-gather-with-optimizer-step off or without --fp8-param-gather, or export with "
           "--to megatron");
  return l;
}

// The mixed-precision recipe of src/megatron/bridge/training/mixed_precision.py@v0.6.0
// that runs the plan's quantized GEMMs: its format and scaling are the ones
// Megatron-LM's export writes (mcore_quantization).
const char* bridge_recipe(Precision p) {
  switch (p) {
    case Precision::fp8_delayed: return "bf16_with_fp8_delayed_scaling_mixed";
    case Precision::fp8_current: return "bf16_with_fp8_current_scaling_mixed";
    case Precision::fp8_blockwise: return "bf16_with_fp8_subchannel_scaling_mixed";
    case Precision::mxfp8: return "bf16_with_mxfp8_mixed";
    case Precision::nvfp4: return "bf16_with_nvfp4_mixed";
    case Precision::bf16: break;
  }
  return "bf16_mixed";
}

// The comment lines and imports before the function.
std::string preamble(const PlanFile& pf, const Layout& l) {
  std::string out = "#!/usr/bin/env python3\n" + header(pf, "#", "Megatron-Bridge v0.6.0");
  out += "# Fields: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py, models/gpt_provider.py,\n"
         "# recipes/common.py@v0.6.0 and the Megatron-Core configs they extend (NVIDIA/Megatron-LM@cd4afffa).\n"
         "# Add: the dataset (cfg.dataset.blend, or mock data), the tokenizer (cfg.tokenizer), train_iters,\n"
         "# the optimizer's learning rate and schedule (cfg.optimizer, cfg.scheduler) and checkpoint\n"
         "# directories (cfg.checkpoint.save / load).\n";
  out += launch_lines(pf, "cuboid_plan.py");
  if (pf.plan.tp > 1 && !l.fsdp)
    out += "# TP > 1: also export CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).\n";
  if (l.fsdp) out += "# Megatron FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset.\n";
  if (l.fsdp || pf.plan.adam_moment_bytes != 4) out += "import torch\n";
  out += "import torch.nn.functional as F\n"
         "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
         "from megatron.bridge.recipes.common import _pretrain_common\n"
         "from megatron.bridge.training.gpt_step import forward_step\n";
  if (pf.plan.precision != Precision::bf16 || pf.plan.trainer.dp_grad_bytes != 4)
    out += fmt::format("from megatron.bridge.training.mixed_precision import {}\n", bridge_recipe(pf.plan.precision));
  out += "from megatron.bridge.training.pretrain import pretrain\n"
         "from megatron.core.transformer.enums import AttnBackend\n\n\n";
  return out;
}

// GPTModelProvider's parallelism and recomputation fields.
Fields parallel_fields(const ParallelPlan& p, const ModelSpec& m) {
  Fields f;
  f.emplace_back("tensor_model_parallel_size", std::to_string(p.tp));
  f.emplace_back("pipeline_model_parallel_size", std::to_string(p.pp));
  f.emplace_back("virtual_pipeline_model_parallel_size",
                 p.virtual_stages > 1 ? std::to_string(p.virtual_stages) : "None");
  // The interleaved schedule's p2p overlapped and unbatched, as Megatron-LM
  // runs it by default (--no-overlap-p2p-communication is store_false) and as
  // Bridge's CommOverlapConfig would set it (comm_overlap.py, vp_size > 1);
  // the recipe leaves comm_overlap None, and ModelParallelConfig's defaults
  // (batched, not overlapped) are what arguments.py refuses with PP 2.
  if (p.pp > 1 && p.virtual_stages > 1) {
    f.emplace_back("overlap_p2p_comm", "True");
    f.emplace_back("batch_p2p_comm", "False");
  }
  if (p.first_stage_layers > 0)
    f.emplace_back("num_layers_in_first_pipeline_stage", std::to_string(p.first_stage_layers));
  if (p.last_stage_layers > 0) f.emplace_back("num_layers_in_last_pipeline_stage", std::to_string(p.last_stage_layers));
  f.emplace_back("context_parallel_size", std::to_string(p.cp));
  if (p.cp > 1) f.emplace_back("cp_comm_type", fmt::format("\"{}\"", to_string(p.cp_comm)));
  if (m.moe.enabled()) {
    f.emplace_back("expert_model_parallel_size", std::to_string(p.ep));
    f.emplace_back("expert_tensor_parallel_size", std::to_string(p.expert_tp()));
  }
  f.emplace_back("sequence_parallel", py(p.sequence_parallel));
  switch (p.recompute) {
    case Recompute::none:
      f.emplace_back("recompute_granularity", "None");
      break;
    case Recompute::selective:
      f.emplace_back("recompute_granularity", "\"selective\"");
      if (p.recompute_modules != 0) {
        std::string modules = recompute_modules_string(p.recompute_modules);
        for (std::size_t i = modules.find(','); i != std::string::npos; i = modules.find(',', i + 4))
          modules.replace(i, 1, "\", \"");
        f.emplace_back("recompute_modules", "[\"" + modules + "\"]");
      }
      break;
    case Recompute::full:
      f.emplace_back("recompute_granularity", "\"full\"");
      f.emplace_back("recompute_method", fmt::format("\"{}\"", to_string(p.recompute_method)));
      f.emplace_back("recompute_num_layers", std::to_string(p.recompute_num_layers));
      break;
  }
  // As the performance scripts set it (scripts/performance/utils/overrides.py at v0.6.0).
  if (p.offload_layers > 0) {
    f.emplace_back("cpu_offloading", "True");
    f.emplace_back("cpu_offloading_num_layers", std::to_string(p.offload_layers));
  }
  // As the DeepSeek-V3 performance recipes set them (perf_recipes/deepseek/common.py:115-116 at 067f987d; their
  // launch sets NVTE_CPU_OFFLOAD_V1=1, gb300/deepseek_v3.py:262).
  if (p.offload_modules != 0) {
    std::string modules = offload_modules_string(p.offload_modules);
    for (std::size_t i = modules.find(','); i != std::string::npos; i = modules.find(',', i + 4))
      modules.replace(i, 1, "\", \"");
    f.emplace_back("fine_grained_activation_offloading", "True");
    f.emplace_back("offload_modules", "[\"" + modules + "\"]");
  }
  return f;
}

// GPTModelProvider's fields for the model's shape, positions and blocks.
Fields shape_fields(const PlanFile& pf) {
  const ModelSpec& m = pf.model;
  Fields f = {{"num_layers", std::to_string(m.num_layers)},
              {"hidden_size", std::to_string(m.hidden_size)},
              {"ffn_hidden_size", std::to_string(m.ffn_hidden_size)},
              {"num_attention_heads", std::to_string(m.num_attention_heads)},
              {"num_query_groups", std::to_string(m.num_kv_heads)},
              {"kv_channels", std::to_string(m.head_dim)},
              {"seq_length", std::to_string(pf.plan.seq_length)},
              {"position_embedding_type", fmt::format("\"{}\"", position_embedding_type(pf, "Megatron-Bridge"))}};
  if (!m.learned_position_embeddings) {
    f.emplace_back("rotary_base", std::to_string(integral_rope_theta(pf)));
    f.emplace_back("rope_scaling", py(m.rope_scaling_factor > 0));
    if (m.rope_scaling_factor > 0) f.emplace_back("rope_scaling_factor", fmt::format("{:.1f}", m.rope_scaling_factor));
  }
  f.emplace_back("normalization", m.normalization == Normalization::rmsnorm ? "\"RMSNorm\"" : "\"LayerNorm\"");
  f.emplace_back("gated_linear_unit", py(m.activation == Activation::swiglu));
  f.emplace_back("activation_func", m.activation == Activation::swiglu ? "F.silu" : "F.gelu");
  f.emplace_back("add_bias_linear", py(m.linear_bias));
  f.emplace_back("share_embeddings_and_output_weights", py(m.tied_embeddings));
  // TransformerConfig's dropouts default to 0.1.
  if (m.hidden_dropout != 0.1) f.emplace_back("hidden_dropout", python_float(m.hidden_dropout));
  if (m.attention_dropout != 0.1) f.emplace_back("attention_dropout", python_float(m.attention_dropout));
  return f;
}

std::string python_value(const McoreSetting& s) {
  switch (s.kind) {
    case McoreSetting::Kind::on: return "True";
    case McoreSetting::Kind::word: return fmt::format("\"{}\"", s.value);
    default: return s.value;
  }
}

Fields moe_fields(const ModelSpec& m, const ParallelPlan& plan) {
  if (!m.moe.enabled()) return {};
  Fields f;
  for (const auto& settings : {moe_layer_settings(m), moe_kernel_settings(plan)})
    for (const McoreSetting& s : settings) f.emplace_back(s.field, python_value(s));
  return f;
}

// The vocabulary padding and the kernels.
Fields kernel_fields(const ParallelPlan& p) {
  return {{"make_vocab_size_divisible_by", "128"},
          // auto: Transformer Engine's choice (cuDNN's fused attention on
          // Hopper and Blackwell), which a plan with the GPU's default kernel priced.
          {"attention_backend", !p.flash_attention                          ? "AttnBackend.unfused"
                                : p.attention_kernel == AttentionKernel::cudnn ? "AttnBackend.fused"
                                : p.attention_kernel == AttentionKernel::auto_ ? "AttnBackend.auto"
                                                                               : "AttnBackend.flash"},
          {"gradient_accumulation_fusion", py(p.grad_accum_fusion)}};
}

// TP communication overlap and CUDA graphs, where the plan has them: the
// model's fields (Megatron-LM cd4afffa ModelParallelConfig.tp_comm_overlap,
// TransformerConfig.cuda_graph_impl / cuda_graph_modules); Transformer
// Engine's RNG tracker with graphs, as the performance scripts set it
// (scripts/performance/utils/overrides.py _set_cuda_graph_overrides; config.py
// validate copies it to rng.te_rng_tracker).
Fields overlap_fields(const ParallelPlan& p) {
  Fields f;
  if (p.trainer.tp_comm_overlap) f.emplace_back("tp_comm_overlap", "True");
  if (const CudaGraphs& g = p.trainer.cuda_graphs; g.on()) {
    f.emplace_back("cuda_graph_impl", fmt::format("\"{}\"", to_string(g.impl)));
    if (g.modules != 0) {
      std::string modules;
      for (CudaGraphModule m : {CudaGraphModule::attn, CudaGraphModule::mlp, CudaGraphModule::moe,
                                CudaGraphModule::moe_router, CudaGraphModule::moe_preprocess, CudaGraphModule::mamba})
        if ((g.modules & static_cast<std::uint8_t>(m)) != 0)
          modules += fmt::format("{}\"{}\"", modules.empty() ? "" : ", ", to_string(m));
      f.emplace_back("cuda_graph_modules", "[" + modules + "]");
    }
    f.emplace_back("use_te_rng_tracker", "True");
  }
  return f;
}

// The cfg.<field> = value lines after the model.
std::string config_lines(const ParallelPlan& p, const Layout& l) {
  std::string out;
  auto set = [&](const std::string& field, const std::string& value) {
    out += "    cfg." + field + " = " + value + "\n";
  };
  // Every recipe sets grad_reduce_in_fp32 = True, and MixedPrecisionConfig.setup
  // copies it over the DDP config's (update_config_with_precision_overrides):
  // a plan priced with bf16 gradient reduction sets it on the recipe's config.
  const bool bf16_grads = p.trainer.dp_grad_bytes != 4;
  if (p.precision == Precision::bf16 && !bf16_grads) {
    set("mixed_precision", "\"bf16_mixed\"");
  } else if (p.precision == Precision::bf16) {
    set("mixed_precision", "bf16_mixed()");
  } else {
    // The recipe's MixedPrecisionConfig, with what the plan prices set on it:
    // the recipes turn the parameter all-gather in FP8 / FP4 on (all but
    // subchannel scaling) and current scaling keeps the first and last layers
    // in bf16, which cuboid does not price (every layer quantized).
    const bool fp4 = p.precision == Precision::nvfp4;
    set("mixed_precision", std::string(bridge_recipe(p.precision)) + "()");
    set("mixed_precision.first_last_layers_bf16", "False");
    set(fp4 ? "mixed_precision.fp4_param_gather" : "mixed_precision.fp8_param_gather", py(p.fp8_param_gather));
    // config.py validate: MXFP8's parameter all-gather without FSDP asserts the
    // gradient buffer's reuse; without the all-gather it has nothing to reuse.
    if (p.precision == Precision::mxfp8)
      set("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag", py(p.fp8_param_gather));
    // The attention core in FP8 as priced (Megatron-Core's fp8_dpa); the
    // recipes leave it False.
    if (p.fp8_attention) set("mixed_precision.fp8_dot_product_attention", "True");
  }
  if (bf16_grads) set("mixed_precision.grad_reduce_in_fp32", "False");
  set("dist.use_tp_pp_dp_mapping", py(l.tp_pp_dp));
  // Both, or validation syncs the pair back to the recipe optimizer's True
  // (training/config.py _validate_and_sync_distributed_optimizer_settings):
  // a ZeRO-0 plan would run as ZeRO-1.
  // Muon shards its states in its own layer-wise optimizer ("dist_muon",
  // optimizer/__init__.py:744-754@cd4afffa), both flags off as the Kimi-K2
  // recipes set them (recipes/kimi/kimi_k2.py _apply_kimi_k2_optimizer).
  const bool muon = p.optimizer == OptimizerKind::muon;
  set("ddp.use_distributed_optimizer", py(p.zero_stage >= 1 && !muon));
  set("optimizer.use_distributed_optimizer", py(p.zero_stage >= 1 && !muon));
  if (muon) {
    set("optimizer.optimizer", p.zero_stage >= 1 ? "\"dist_muon\"" : "\"muon\"");
    set("optimizer.muon_nesterov", "True");
  }
  // The optimizer's states as priced (Megatron-Core's OptimizerConfig:
  // Transformer Engine's FusedAdam, Adam's moments' dtypes).
  if (p.precision_aware_optimizer) set("optimizer.use_precision_aware_optimizer", "True");
  if (p.adam_moment_bytes != 4) {
    set("optimizer.exp_avg_dtype", "torch.bfloat16");
    set("optimizer.exp_avg_sq_dtype", "torch.bfloat16");
  }
  set("ddp.use_megatron_fsdp", py(l.fsdp));
  set("ddp.data_parallel_sharding_strategy",
      l.fsdp ? fmt::format("\"{}\"", megatron_fsdp_strategy(p.zero_stage)) : "\"no_shard\"");
  // Megatron FSDP's gradients as priced (grad_reduce_in_fp32 does not reach it).
  if (l.fsdp)
    set("ddp.megatron_fsdp_main_grads_dtype", p.grad_element_bytes() == 4 ? "torch.float32" : "torch.bfloat16");
  // Megatron shards and reduces over DP x CP.
  set("ddp.overlap_grad_reduce", py(p.dp_cp() > 1 && p.trainer.dp_overlap));
  // Priced: ZeRO 1-2's parameter all-gather after the optimizer step, or in
  // the next forward (--overlap-param-gather); ZeRO-3's gathers prefetched
  // under compute (Megatron FSDP needs the flag for that).
  set("ddp.overlap_param_gather", py(p.dp_cp() > 1 && (p.zero_stage == 3 || p.trainer.overlap_param_gather)));
  // The first chunk's gather under the optimizer step (the recipe leaves
  // comm_overlap None, which would otherwise reset it).
  if (p.dp_cp() > 1 && p.trainer.overlap_param_gather_with_optimizer_step)
    set("optimizer.overlap_param_gather_with_optimizer_step", "True");
  // The chunks' gathers issued ahead by the interleaved schedule (the DDP
  // config's default is off; Bridge's CommOverlapConfig would set it).
  if (p.aligns_param_gather()) set("ddp.align_param_gather", "True");
  set("ddp.grad_reduce_in_fp32", py(p.trainer.dp_grad_bytes == 4));
  // The first chunk's bucket as priced (the recipe leaves comm_overlap None,
  // whose optimizer overlap would set 128M parameters with DP > 1).
  if (p.trainer.ddp_bucket_params > 0) set("ddp.bucket_size", std::to_string(p.trainer.ddp_bucket_params));
  if (l.fsdp) set("checkpoint.ckpt_format", "\"fsdp_dtensor\"");
  set("train.micro_batch_size", std::to_string(p.micro_batch));
  set("train.global_batch_size", std::to_string(p.global_batch));
  set("dataset.seq_length", std::to_string(p.seq_length));
  // config.py validate (1364-1368) asserts it with the full-iteration graph.
  if (p.trainer.cuda_graphs.impl == CudaGraphImpl::full_iteration)
    set("rerun_state_machine.check_for_nan_in_loss", "False");
  return out;
}

}  // namespace

ExportResult megatron_bridge(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  const Layout l = check_plan(pf);
  std::string out = preamble(pf, l);
  // The model fields go to the constructor: TransformerConfig.__post_init__
  // derives kv_channels and checks divisibility from them.
  Fields model = parallel_fields(p, m);
  for (const Fields& more : {shape_fields(pf), moe_fields(m, p), kernel_fields(p), overlap_fields(p)})
    model.insert(model.end(), more.begin(), more.end());

  out += "def cuboid_plan():\n";
  out += "    cfg = _pretrain_common()\n";
  out += fmt::format("    # {}: vocabulary {} from the tokenizer, padded by Megatron\n", m.name, m.vocab_size);
  out += "    cfg.model = GPTModelProvider(\n";
  for (const auto& [k, v] : model) out += "        " + k + "=" + v + ",\n";
  out += "    )\n";
  out += config_lines(p, l);
  out += "    return cfg\n\n\n";
  out += "if __name__ == \"__main__\":\n    pretrain(cuboid_plan(), forward_step)\n";
  return {out, ""};
}

}  // namespace cuboid::exporters
