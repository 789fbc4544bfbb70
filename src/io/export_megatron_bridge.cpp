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

ExportResult megatron_bridge(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  refuse_mla_mtp(pf, "The Megatron-Bridge script (a GPTModelProvider)");
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule",
           "Megatron-Bridge runs Megatron-Core's schedules (1F1B and interleaved 1F1B), no GPipe",
           "plan with --schedule 1f1b or --schedule interleaved");
  const bool tp_pp_dp = p.order.str() == "tp-pp-dp";
  if (!default_rank_order(p) && !tp_pp_dp)
    refuse(pf, "parallel.rank_order",
           "Megatron-Bridge orders ranks tp-dp-pp (default) or tp-pp-dp (dist.use_tp_pp_dp_mapping), not " +
               p.order.str(),
           "plan with --rank-order tp-dp-pp or tp-pp-dp");
  const bool fsdp = p.zero_stage >= 2 && p.dp > 1;
  if (fsdp && tp_pp_dp)
    refuse(pf, "parallel.rank_order",
           "Megatron-Bridge asserts \"use_tp_pp_dp_mapping is not supported with Megatron FSDP\" (training/config.py)",
           "plan with --rank-order tp-dp-pp");

  auto py = [](bool b) { return b ? "True" : "False"; };
  std::string out = "#!/usr/bin/env python3\n" + header(pf, "#", "Megatron-Bridge v0.6.0");
  out += "# Fields: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py, models/gpt_provider.py,\n"
         "# recipes/common.py@v0.6.0 and the Megatron-Core configs they extend (NVIDIA/Megatron-LM@cd4afffa).\n"
         "# Add: the dataset (cfg.dataset.blend, or mock data), the tokenizer (cfg.tokenizer), train_iters,\n"
         "# the optimizer's learning rate and schedule (cfg.optimizer, cfg.scheduler) and checkpoint\n"
         "# directories (cfg.checkpoint.save / load).\n";
  out += launch_lines(pf, "cuboid_plan.py");
  if (p.tp > 1 && !fsdp) out += "# TP > 1: also export CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).\n";
  if (fsdp) out += "# Megatron FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset.\n";
  out += "import torch.nn.functional as F\n"
         "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
         "from megatron.bridge.recipes.common import _pretrain_common\n"
         "from megatron.bridge.training.gpt_step import forward_step\n"
         "from megatron.bridge.training.pretrain import pretrain\n"
         "from megatron.core.transformer.enums import AttnBackend\n\n\n";
  // The model fields go to the constructor: TransformerConfig.__post_init__
  // derives kv_channels and checks divisibility from them.
  std::vector<std::pair<std::string, std::string>> model;
  auto mset = [&](const std::string& field, const std::string& value) { model.emplace_back(field, value); };
  mset("tensor_model_parallel_size", std::to_string(p.tp));
  mset("pipeline_model_parallel_size", std::to_string(p.pp));
  mset("virtual_pipeline_model_parallel_size", p.virtual_stages > 1 ? std::to_string(p.virtual_stages) : "None");
  if (p.first_stage_layers > 0) mset("num_layers_in_first_pipeline_stage", std::to_string(p.first_stage_layers));
  if (p.last_stage_layers > 0) mset("num_layers_in_last_pipeline_stage", std::to_string(p.last_stage_layers));
  mset("context_parallel_size", std::to_string(p.cp));
  if (p.cp > 1) mset("cp_comm_type", fmt::format("\"{}\"", to_string(p.cp_comm)));
  if (m.moe.enabled()) {
    mset("expert_model_parallel_size", std::to_string(p.ep));
    mset("expert_tensor_parallel_size", std::to_string(p.expert_tp()));
  }
  mset("sequence_parallel", py(p.sequence_parallel));
  switch (p.recompute) {
    case Recompute::none:
      mset("recompute_granularity", "None");
      break;
    case Recompute::selective:
      mset("recompute_granularity", "\"selective\"");
      break;
    case Recompute::full:
      mset("recompute_granularity", "\"full\"");
      mset("recompute_method", "\"uniform\"");
      mset("recompute_num_layers", "1");
      break;
  }
  mset("num_layers", std::to_string(m.num_layers));
  mset("hidden_size", std::to_string(m.hidden_size));
  mset("ffn_hidden_size", std::to_string(m.ffn_hidden_size));
  mset("num_attention_heads", std::to_string(m.num_attention_heads));
  mset("num_query_groups", std::to_string(m.num_kv_heads));
  mset("kv_channels", std::to_string(m.head_dim));
  mset("seq_length", std::to_string(p.seq_length));
  mset("position_embedding_type", fmt::format("\"{}\"", position_embedding_type(pf, "Megatron-Bridge")));
  if (!m.learned_position_embeddings) {
    mset("rotary_base", std::to_string(integral_rope_theta(pf)));
    mset("rope_scaling", py(m.rope_scaling_factor > 0));
    if (m.rope_scaling_factor > 0) mset("rope_scaling_factor", fmt::format("{:.1f}", m.rope_scaling_factor));
  }
  mset("normalization", m.normalization == Normalization::rmsnorm ? "\"RMSNorm\"" : "\"LayerNorm\"");
  mset("gated_linear_unit", py(m.activation == Activation::swiglu));
  mset("activation_func", m.activation == Activation::swiglu ? "F.silu" : "F.gelu");
  mset("add_bias_linear", py(m.linear_bias));
  mset("share_embeddings_and_output_weights", py(m.tied_embeddings));
  if (m.moe.enabled()) {
    // Megatron-Core's MoE layer as cuboid prices it: the alltoall dispatcher
    // and grouped expert GEMMs.
    mset("num_moe_experts", std::to_string(m.moe.num_experts));
    mset("moe_router_topk", std::to_string(m.moe.experts_per_token));
    mset("moe_ffn_hidden_size", std::to_string(m.moe.expert_ffn_hidden_size));
    if (const std::string pattern = moe_layer_pattern(m); !pattern.empty()) mset("moe_layer_freq", pattern);
    if (m.moe.shared_expert_ffn_hidden_size > 0)
      mset("moe_shared_expert_intermediate_size", std::to_string(m.moe.shared_expert_ffn_hidden_size));
    if (m.moe.shared_expert_gate) mset("moe_shared_expert_gate", "True");
    if (m.moe.capacity_factor > 0) mset("moe_expert_capacity_factor", fmt::format("{}", m.moe.capacity_factor));
    if (m.moe.router_groups > 0) {
      mset("moe_router_num_groups", std::to_string(m.moe.router_groups));
      mset("moe_router_group_topk", std::to_string(m.moe.router_group_topk));
    }
    mset("moe_grouped_gemm", "True");
    mset("moe_token_dispatcher_type", "\"alltoall\"");
  }
  mset("make_vocab_size_divisible_by", "128");
  mset("attention_backend", p.flash_attention ? "AttnBackend.flash" : "AttnBackend.unfused");
  mset("gradient_accumulation_fusion", py(p.grad_accum_fusion));

  out += "def cuboid_plan():\n";
  out += "    cfg = _pretrain_common()\n";
  out += fmt::format("    # {}: vocabulary {} from the tokenizer, padded by Megatron\n", m.name, m.vocab_size);
  out += "    cfg.model = GPTModelProvider(\n";
  for (const auto& [k, v] : model) out += "        " + k + "=" + v + ",\n";
  out += "    )\n";
  auto set = [&](const std::string& field, const std::string& value) { out += "    cfg." + field + " = " + value + "\n"; };
  set("mixed_precision", "\"bf16_mixed\"");
  set("dist.use_tp_pp_dp_mapping", py(tp_pp_dp));
  set("ddp.use_distributed_optimizer", py(p.zero_stage >= 1));
  set("ddp.use_megatron_fsdp", py(fsdp));
  set("ddp.data_parallel_sharding_strategy",
      fsdp ? (p.zero_stage == 3 ? "\"optim_grads_params\"" : "\"optim_grads\"") : "\"no_shard\"");
  set("ddp.overlap_grad_reduce", py(p.dp > 1 && p.trainer.dp_overlap));
  // Priced: ZeRO 1-2's parameter all-gather after the optimizer step (exposed),
  // ZeRO-3's gathers prefetched under compute (Megatron FSDP needs the flag for that).
  set("ddp.overlap_param_gather", py(p.dp > 1 && p.zero_stage == 3));
  set("ddp.grad_reduce_in_fp32", py(p.trainer.dp_grad_bytes == 4));
  if (fsdp) set("checkpoint.ckpt_format", "\"fsdp_dtensor\"");
  set("train.micro_batch_size", std::to_string(p.micro_batch));
  set("train.global_batch_size", std::to_string(p.global_batch));
  set("dataset.seq_length", std::to_string(p.seq_length));
  out += "    return cfg\n\n\n";
  out += "if __name__ == \"__main__\":\n    pretrain(cuboid_plan(), forward_step)\n";
  return {out, ""};
}

}  // namespace cuboid::exporters
