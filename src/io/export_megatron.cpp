// Megatron-LM. Flag names and types: NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64
// (_add_distributed_args, _add_training_args, _add_network_size_args,
// _add_mixed_precision_args); tests/data/trainer_options/megatron-d98e8a64.json holds them.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/pipeline_layout.hpp"
#include "export_common.hpp"

namespace cuboid::exporters {

namespace {

using Args = std::vector<std::string>;  // MEGATRON_ARGS entries: a flag with its value, or a comment

// Refuses what Megatron-LM cannot run; true for the tp-pp-dp rank order.
bool check_plan(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule",
           "Megatron-LM has no GPipe schedule (its pipeline schedules are 1F1B and interleaved 1F1B)",
           "plan with --schedule 1f1b or --schedule interleaved");
  // arguments.py:1024-1029@d98e8a64: --overlap-param-gather, which ZeRO-3's
  // prefetched gathers need, asserts --overlap-grad-reduce.
  if (p.zero_stage == 3 && p.dp_cp() > 1 && !p.trainer.dp_overlap)
    refuse(pf, "trainer.dp_overlap",
           "Megatron FSDP prefetches ZeRO-3's parameter gathers only with --overlap-param-gather, which Megatron-LM "
           "asserts comes with --overlap-grad-reduce (megatron/training/arguments.py validate_args), and the plan was "
           "priced with the reduction after the backward",
           "plan with --dp-overlap on, or export with --to megatron-bridge");
  refuse_zero1_all_reduce(pf, "Megatron-LM");
  refuse_fp8_attention(pf, "Megatron-LM d98e8a64's command line",
                       "megatron/training/arguments.py _add_network_size_args excludes TransformerConfig's "
                       "fp8_dot_product_attention: \"no CLI argument exists\" for it");
  return megatron_tp_pp_dp(pf, "Megatron-LM", "--use-tp-pp-dp-mapping");
}

Args parallelism_args(const PlanFile& pf, bool tp_pp_dp, bool fsdp) {
  const ParallelPlan& p = pf.plan;
  Args a = {"# parallelism", fmt::format("--tensor-model-parallel-size {}", p.tp),
            fmt::format("--pipeline-model-parallel-size {}", p.pp)};
  // There is no VPP-size flag in older releases: layers per virtual stage it
  // is, except with uneven stages, which arguments.py allows only with
  // --num-virtual-stages-per-pipeline-rank.
  // A layout names its virtual stages itself (arguments.py allows one of the
  // three); the embedding and the loss counted as layers take the VPP size.
  if (!p.pipeline_layout.empty())
    a.push_back(fmt::format("--pipeline-model-parallel-layout \"{}\"", pipeline_layout_string(p.pipeline_layout)));
  else if (p.virtual_stages > 1 && (has_uneven_stages(p) || has_pipeline_layout(p)))
    a.push_back(fmt::format("--num-virtual-stages-per-pipeline-rank {}", p.virtual_stages));
  else if (p.virtual_stages > 1)
    a.push_back(fmt::format("--num-layers-per-virtual-pipeline-stage {}", layers_per_virtual_stage(pf)));
  if (p.first_stage_layers > 0)
    a.push_back(fmt::format("--decoder-first-pipeline-num-layers {}", p.first_stage_layers));
  if (p.last_stage_layers > 0) a.push_back(fmt::format("--decoder-last-pipeline-num-layers {}", p.last_stage_layers));
  if (p.embedding_in_split) a.push_back("--account-for-embedding-in-pipeline-split");
  if (p.loss_in_split) a.push_back("--account-for-loss-in-pipeline-split");
  if (p.sequence_parallel) a.push_back("--sequence-parallel");
  if (p.cp > 1) {
    a.push_back(fmt::format("--context-parallel-size {}", p.cp));
    a.push_back(fmt::format("--cp-comm-type {}", to_string(p.cp_comm)));
  }
  if (tp_pp_dp) a.push_back("--use-tp-pp-dp-mapping");
  if (p.zero_stage >= 1) a.push_back("--use-distributed-optimizer");
  if (fsdp) {
    // Megatron FSDP only supports the fsdp_dtensor checkpoint format.
    a.push_back("--use-megatron-fsdp");
    a.push_back(fmt::format("--data-parallel-sharding-strategy {}", megatron_fsdp_strategy(p.zero_stage)));
    a.push_back("--ckpt-format fsdp_dtensor");
    // The gradients' dtype as priced; --grad-reduce-in-bf16 does not reach
    // Megatron FSDP (its own default, auto, is the parameters' bf16).
    a.push_back(fmt::format("--megatron-fsdp-main-grads-dtype {}", p.grad_element_bytes() == 4 ? "fp32" : "bf16"));
  }
  // DP x CP: Megatron reduces the gradients over both.
  if (p.dp_cp() > 1 && p.trainer.dp_overlap) a.push_back("--overlap-grad-reduce");
  // The distributed optimizer's parameter all-gather (ZeRO 1 and 2) as
  // priced: after the optimizer step, or in the next forward with
  // --overlap-param-gather; ZeRO-3's gathers are prefetched under compute,
  // which Megatron FSDP does only with this flag.
  if (p.dp_cp() > 1 && (p.zero_stage == 3 || p.trainer.overlap_param_gather)) a.push_back("--overlap-param-gather");
  // Megatron-LM aligns the chunks' gathers by default; a plan priced without.
  if (p.dp_cp() > 1 && p.zero_stage < 3 && p.trainer.overlap_param_gather && !p.trainer.align_param_gather)
    a.push_back("--no-align-param-gather");
  // The first chunk's gather under the optimizer step, as priced; Megatron-LM
  // asserts it is not run with a distributed checkpoint (arguments.py:1073:
  // use_dist_ckpt is ckpt_format != torch).
  if (p.dp_cp() > 1 && p.trainer.overlap_param_gather_with_optimizer_step) {
    a.push_back("--overlap-param-gather-with-optimizer-step");
    a.push_back("--ckpt-format torch");
  }
  // The first chunk's bucket as priced (training.py resolve_ddp_bucket_size).
  if (p.trainer.ddp_bucket_params > 0) a.push_back(fmt::format("--ddp-bucket-size {}", p.trainer.ddp_bucket_params));
  if (p.dp_cp() > 1 && p.trainer.dp_grad_bytes == 2) a.push_back("--grad-reduce-in-bf16");
  // The optimizer's states as priced: Transformer Engine's FusedAdam and
  // Adam's moments' dtypes (arguments.py _add_experimental_args).
  if (p.precision_aware_optimizer) a.push_back("--use-precision-aware-optimizer");
  if (p.adam_moment_bytes != 4) {
    a.push_back("--exp-avg-dtype bf16");
    a.push_back("--exp-avg-sq-dtype bf16");
  }
  // Muon as priced: with --use-distributed-optimizer the layer-wise
  // distributed optimizer (arguments.py:1725-1737@d98e8a64), Nesterov
  // momentum as Megatron-Bridge's recipes run it (optimizer_step.hpp).
  if (p.optimizer == OptimizerKind::muon) {
    a.push_back("--optimizer muon");
    a.push_back("--muon-nesterov");
  }
  // Transformer Engine's userbuffers with its default methods (initialize_ub
  // without --tp-comm-overlap-cfg), as priced.
  if (p.trainer.tp_comm_overlap) a.push_back("--tp-comm-overlap");
  if (const CudaGraphs& g = p.trainer.cuda_graphs; g.on()) {
    a.push_back(fmt::format("--cuda-graph-impl {}", to_string(g.impl)));
    if (g.modules != 0) {
      std::string modules;
      for (CudaGraphModule m : {CudaGraphModule::attn, CudaGraphModule::mlp, CudaGraphModule::moe,
                                CudaGraphModule::moe_router, CudaGraphModule::moe_preprocess, CudaGraphModule::mamba})
        if ((g.modules & static_cast<std::uint8_t>(m)) != 0) modules += (modules.empty() ? "" : " ") + std::string(to_string(m));
      a.push_back("--cuda-graph-modules " + modules);
    }
    // arguments.py:1235-1237 asserts it with the full-iteration graph.
    if (g.impl == CudaGraphImpl::full_iteration) a.push_back("--no-check-for-nan-in-loss-and-grad");
  }
  return a;
}

Args batch_args(const ParallelPlan& p) {
  Args a = {"# batch", fmt::format("--micro-batch-size {}", p.micro_batch),
            fmt::format("--global-batch-size {}", p.global_batch)};
  if (p.recompute != Recompute::none) a.push_back("# activation recomputation");
  if (p.recompute == Recompute::selective) a.push_back("--recompute-granularity selective");
  // TransformerConfig.recompute_modules (a list: nargs "+", argument_utils.py at d98e8a64); none: core_attn.
  if (p.recompute == Recompute::selective && p.recompute_modules != 0) {
    std::string modules = recompute_modules_string(p.recompute_modules);
    std::replace(modules.begin(), modules.end(), ',', ' ');
    a.push_back("--recompute-modules " + modules);
  }
  if (p.recompute == Recompute::full)
    a.insert(a.end(), {"--recompute-granularity full", fmt::format("--recompute-method {}", to_string(p.recompute_method)),
                       fmt::format("--recompute-num-layers {}", p.recompute_num_layers)});
  // arguments.py sets cpu_offloading itself when the count is above 0 (d98e8a64).
  if (p.offload_layers > 0)
    a.insert(a.end(), {"# activation offloading to host memory",
                       fmt::format("--cpu-offloading-num-layers {}", p.offload_layers)});
  // TransformerConfig.fine_grained_activation_offloading and offload_modules
  // (a list: nargs "+"); arguments.py:1935-1939 at d98e8a64 asks for
  // NVTE_CPU_OFFLOAD_V1=1 with Transformer Engine 2.10 or later.
  if (p.offload_modules != 0) {
    std::string modules = offload_modules_string(p.offload_modules);
    std::replace(modules.begin(), modules.end(), ',', ' ');
    a.insert(a.end(), {"# fine-grained activation offloading to host memory (with NVTE_CPU_OFFLOAD_V1=1 set)",
                       "--fine-grained-activation-offloading", "--offload-modules " + modules});
  }
  return a;
}

// The attention flags after --num-attention-heads: MLA or the head width.
Args attention_args(const ModelSpec& m) {
  Args a;
  if (m.mla.enabled()) {
    // Megatron-Core's MLASelfAttention (MLATransformerConfig). It takes YaRN by
    // default (--rope-type): written as the card has it, YaRN with its factor
    // and attention scale terms (the config fields of the same names, from
    // args: training/argument_utils.py _default_config_from_args at
    // d98e8a64), as Megatron-LM's own DeepSeek-V3 and Kimi-K2 scripts do.
    a.push_back("--multi-latent-attention");
    if (m.mla.q_lora_rank > 0) a.push_back(fmt::format("--q-lora-rank {}", m.mla.q_lora_rank));
    a.push_back(fmt::format("--kv-lora-rank {}", m.mla.kv_lora_rank));
    a.push_back(fmt::format("--qk-head-dim {}", m.mla.qk_head_dim));
    a.push_back(fmt::format("--qk-pos-emb-head-dim {}", m.mla.qk_rope_head_dim));
    a.push_back(fmt::format("--v-head-dim {}", m.mla.v_head_dim));
    if (m.rope_yarn) {
      a.push_back("--rope-type yarn");
      a.push_back(fmt::format("--rotary-scaling-factor {}", m.rope_scaling_factor));
      a.push_back(fmt::format("--mscale {}", m.rope_mscale));
      a.push_back(fmt::format("--mscale-all-dim {}", m.rope_mscale_all_dim));
    } else {
      a.push_back("--rope-type rope");
    }
  } else if (m.head_dim * m.num_attention_heads != m.hidden_size) {
    a.push_back(fmt::format("--kv-channels {}", m.head_dim));
  }
  if (m.mtp_layers > 0) a.push_back(fmt::format("--mtp-num-layers {}", m.mtp_layers));
  if (m.num_kv_heads != m.num_attention_heads) {
    a.push_back("--group-query-attention");
    a.push_back(fmt::format("--num-query-groups {}", m.num_kv_heads));
  }
  return a;
}

Args model_args(const PlanFile& pf) {
  const ModelSpec& m = pf.model;
  Args a = {fmt::format("# model shape ({}; vocabulary {} from the tokenizer, padded by Megatron)", m.name,
                        m.vocab_size),
            fmt::format("--num-layers {}", m.num_layers), fmt::format("--hidden-size {}", m.hidden_size),
            fmt::format("--ffn-hidden-size {}", m.ffn_hidden_size),
            fmt::format("--num-attention-heads {}", m.num_attention_heads)};
  for (std::string& flag : attention_args(m)) a.push_back(std::move(flag));
  a.push_back(fmt::format("--seq-length {}", pf.plan.seq_length));
  a.push_back(fmt::format("--max-position-embeddings {}", m.max_position_embeddings));
  a.push_back(fmt::format("--position-embedding-type {}", position_embedding_type(pf, "Megatron-LM")));
  if (!m.learned_position_embeddings) {
    a.push_back(fmt::format("--rotary-base {}", integral_rope_theta(pf)));
    if (m.rope_scaling_factor > 0 && !m.rope_yarn) {
      // Llama 3.1's scaling (low / high frequency factors 1 / 4, original 8192 positions).
      a.push_back("--use-rope-scaling");
      a.push_back(fmt::format("--rope-scaling-factor {}", m.rope_scaling_factor));
    }
  }
  a.push_back(fmt::format("--normalization {}", m.normalization == Normalization::rmsnorm ? "RMSNorm" : "LayerNorm"));
  if (m.activation == Activation::swiglu) a.push_back("--swiglu");
  if (!m.linear_bias) a.push_back("--disable-bias-linear");
  if (!m.tied_embeddings) a.push_back("--untie-embeddings-and-output-weights");
  a.push_back("--make-vocab-size-divisible-by 128");
  // Megatron's defaults are 0.1 (TransformerConfig hidden_dropout /
  // attention_dropout); a model trained without dropout says so.
  if (m.hidden_dropout != 0.1) a.push_back(fmt::format("--hidden-dropout {}", m.hidden_dropout));
  if (m.attention_dropout != 0.1) a.push_back(fmt::format("--attention-dropout {}", m.attention_dropout));
  return a;
}

std::string flag(const McoreSetting& s) {
  switch (s.kind) {
    case McoreSetting::Kind::on: return std::string(s.flag);
    case McoreSetting::Kind::list: return fmt::format("{} \"{}\"", s.flag, s.value);
    default: return fmt::format("{} {}", s.flag, s.value);
  }
}

Args moe_args(const PlanFile& pf) {
  if (!pf.model.moe.enabled()) return {};
  Args a = {"# mixture of experts"};
  for (const McoreSetting& s : moe_layer_settings(pf.model)) a.push_back(flag(s));
  a.push_back(fmt::format("--expert-model-parallel-size {}", pf.plan.ep));
  a.push_back(fmt::format("--expert-tensor-parallel-size {}", pf.plan.expert_tp()));
  for (const McoreSetting& s : moe_kernel_settings(pf.plan)) a.push_back(flag(s));
  return a;
}

Args precision_args(const ParallelPlan& p) {
  // A fused core is Transformer Engine's choice (transformer_config.py
  // attention_backend = AttnBackend.auto: cuDNN's fused attention or
  // FlashAttention, whichever TE finds); "flash" would pin Dao's package and
  // fail where it is not installed.
  Args a = {"# precision and kernels", "--bf16",
            fmt::format("--attention-backend {}", !p.flash_attention                          ? "unfused"
                                                  : p.attention_kernel == AttentionKernel::cudnn ? "fused"
                                                  : p.attention_kernel == AttentionKernel::auto_ ? "auto"
                                                                                                 : "flash")};
  // Fusion is Megatron-LM's default; a plan priced without it says so.
  if (!p.grad_accum_fusion) a.push_back("--no-gradient-accumulation-fusion");
  if (p.precision == Precision::bf16) return a;
  // The linear layers' GEMMs through Transformer Engine (TransformerConfig fp8 /
  // fp8_recipe / fp4 / fp4_recipe, argparse names --fp8-format and --fp4-format;
  // --fp8-param-gather and --fp4-param-gather from _add_transformer_engine_args).
  // first_last_layers_bf16 stays at its default, off: every layer quantized, as priced.
  const McoreQuantization q = mcore_quantization(p.precision);
  a.push_back(fmt::format("# {} GEMMs in the linear layers (Transformer Engine)", to_string(p.precision)));
  const std::string_view kind = q.fp4 ? "fp4" : "fp8";
  a.push_back(fmt::format("--{}-format {}", kind, q.format));
  a.push_back(fmt::format("--{}-recipe {}", kind, q.recipe));
  if (q.amax_history_len > 0) {
    a.push_back(fmt::format("--fp8-amax-history-len {}", q.amax_history_len));
    a.push_back(fmt::format("--fp8-amax-compute-algo {}", q.amax_compute_algo));
  }
  if (p.fp8_param_gather) a.push_back(fmt::format("--{}-param-gather", kind));
  return a;
}

std::string cuda_connections(const ParallelPlan& p, bool fsdp) {
  if (fsdp) return "# Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1.\nunset CUDA_DEVICE_MAX_CONNECTIONS\n\n";
  if (p.tp > 1 || p.cp > 1)
    return std::string(p.cp > 1 ? "# TP or CP > 1" : "# TP > 1") +
           ": Megatron-LM wants CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).\n"
           "export CUDA_DEVICE_MAX_CONNECTIONS=1\n\n";
  return "";
}

}  // namespace

ExportResult megatron(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const bool tp_pp_dp = check_plan(pf);
  const bool fsdp = p.zero_stage >= 2 && p.dp_cp() > 1;

  std::string out = "#!/bin/bash\n" + header(pf, "#", "Megatron-LM");
  out += "# Flags: NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64 (main, 2026). Add data, tokenizer,\n"
         "# optimizer, learning-rate and checkpoint flags before running.\n";
  out += "MEGATRON_ARGS=(\n";
  for (const Args& section : {parallelism_args(pf, tp_pp_dp, fsdp), batch_args(p), model_args(pf), moe_args(pf),
                              precision_args(p)})
    for (const std::string& a : section) out += "    " + a + "\n";
  out += ")\n\n";
  out += cuda_connections(p, fsdp);
  out += launch_lines(pf, "pretrain_gpt.py \"${MEGATRON_ARGS[@]}\"", "#", SlurmLines::run);
  return {out, ""};
}

}  // namespace cuboid::exporters
