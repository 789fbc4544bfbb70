// Megatron-LM. Flag names and types: NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64
// (_add_distributed_args, _add_training_args, _add_network_size_args,
// _add_mixed_precision_args); tests/data/trainer_options/megatron-d98e8a64.json holds them.
#include <fmt/format.h>

#include "export_common.hpp"

namespace cuboid::exporters {

ExportResult megatron(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule",
           "Megatron-LM has no GPipe schedule (its pipeline schedules are 1F1B and interleaved 1F1B)",
           "plan with --schedule 1f1b or --schedule interleaved");
  // Megatron's rank order is tp-cp-ep-dp-pp; --use-tp-pp-dp-mapping swaps DP and PP.
  const bool tp_pp_dp = p.order.str() == "tp-pp-dp";
  if (!default_rank_order(p) && !tp_pp_dp)
    refuse(pf, "parallel.rank_order",
           "Megatron-LM orders ranks tp-dp-pp (default) or tp-pp-dp (--use-tp-pp-dp-mapping), not " + p.order.str(),
           "plan with --rank-order tp-dp-pp or tp-pp-dp");
  const bool fsdp = p.zero_stage >= 2 && p.dp_cp() > 1;

  std::string out = "#!/bin/bash\n" + header(pf, "#", "Megatron-LM");
  out += "# Flags: NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64 (main, 2026). Add data, tokenizer,\n"
         "# optimizer, learning-rate and checkpoint flags before running.\n";
  out += "MEGATRON_ARGS=(\n";
  auto arg = [&](const std::string& a) { out += "    " + a + "\n"; };
  arg("# parallelism");
  arg(fmt::format("--tensor-model-parallel-size {}", p.tp));
  arg(fmt::format("--pipeline-model-parallel-size {}", p.pp));
  // There is no VPP-size flag in older releases: layers per virtual stage it
  // is, except with uneven stages, which arguments.py allows only with
  // --num-virtual-stages-per-pipeline-rank.
  if (p.virtual_stages > 1 && has_uneven_stages(p))
    arg(fmt::format("--num-virtual-stages-per-pipeline-rank {}", p.virtual_stages));
  else if (p.virtual_stages > 1)
    arg(fmt::format("--num-layers-per-virtual-pipeline-stage {}", layers_per_virtual_stage(pf)));
  if (p.first_stage_layers > 0) arg(fmt::format("--decoder-first-pipeline-num-layers {}", p.first_stage_layers));
  if (p.last_stage_layers > 0) arg(fmt::format("--decoder-last-pipeline-num-layers {}", p.last_stage_layers));
  if (p.sequence_parallel) arg("--sequence-parallel");
  if (p.cp > 1) {
    arg(fmt::format("--context-parallel-size {}", p.cp));
    arg(fmt::format("--cp-comm-type {}", to_string(p.cp_comm)));
  }
  if (tp_pp_dp) arg("--use-tp-pp-dp-mapping");
  if (p.zero_stage >= 1) arg("--use-distributed-optimizer");
  if (fsdp) {
    // ZeRO-2 / ZeRO-3 are Megatron FSDP's optim_grads / optim_grads_params; it
    // only supports the fsdp_dtensor checkpoint format.
    arg("--use-megatron-fsdp");
    arg(fmt::format("--data-parallel-sharding-strategy {}", p.zero_stage == 3 ? "optim_grads_params" : "optim_grads"));
    arg("--ckpt-format fsdp_dtensor");
  }
  // DP x CP: Megatron reduces the gradients over both.
  if (p.dp_cp() > 1 && p.trainer.dp_overlap) arg("--overlap-grad-reduce");
  // The plan prices the distributed optimizer's parameter all-gather (ZeRO 1
  // and 2) after the optimizer step, exposed; ZeRO-3's gathers are prefetched
  // under compute, which Megatron FSDP does only with this flag.
  if (p.dp_cp() > 1 && p.zero_stage == 3) arg("--overlap-param-gather");
  if (p.dp_cp() > 1 && p.trainer.dp_grad_bytes == 2) arg("--grad-reduce-in-bf16");
  arg("# batch");
  arg(fmt::format("--micro-batch-size {}", p.micro_batch));
  arg(fmt::format("--global-batch-size {}", p.global_batch));
  if (p.recompute != Recompute::none) arg("# activation recomputation");
  if (p.recompute == Recompute::selective) arg("--recompute-granularity selective");
  if (p.recompute == Recompute::full) {
    arg("--recompute-granularity full");
    arg("--recompute-method uniform");
    arg("--recompute-num-layers 1");
  }
  arg(fmt::format("# model shape ({}; vocabulary {} from the tokenizer, padded by Megatron)", m.name, m.vocab_size));
  arg(fmt::format("--num-layers {}", m.num_layers));
  arg(fmt::format("--hidden-size {}", m.hidden_size));
  arg(fmt::format("--ffn-hidden-size {}", m.ffn_hidden_size));
  arg(fmt::format("--num-attention-heads {}", m.num_attention_heads));
  if (m.mla.enabled()) {
    // Megatron-Core's MLASelfAttention (MLATransformerConfig). It takes YaRN by
    // default (--rope-type); the card's positions are plain rotary (a YaRN card
    // is refused before any export).
    arg("--multi-latent-attention");
    if (m.mla.q_lora_rank > 0) arg(fmt::format("--q-lora-rank {}", m.mla.q_lora_rank));
    arg(fmt::format("--kv-lora-rank {}", m.mla.kv_lora_rank));
    arg(fmt::format("--qk-head-dim {}", m.mla.qk_head_dim));
    arg(fmt::format("--qk-pos-emb-head-dim {}", m.mla.qk_rope_head_dim));
    arg(fmt::format("--v-head-dim {}", m.mla.v_head_dim));
    arg("--rope-type rope");
  } else if (m.head_dim * m.num_attention_heads != m.hidden_size) {
    arg(fmt::format("--kv-channels {}", m.head_dim));
  }
  if (m.mtp_layers > 0) arg(fmt::format("--mtp-num-layers {}", m.mtp_layers));
  if (m.num_kv_heads != m.num_attention_heads) {
    arg("--group-query-attention");
    arg(fmt::format("--num-query-groups {}", m.num_kv_heads));
  }
  arg(fmt::format("--seq-length {}", p.seq_length));
  arg(fmt::format("--max-position-embeddings {}", m.max_position_embeddings));
  arg(fmt::format("--position-embedding-type {}", position_embedding_type(pf, "Megatron-LM")));
  if (!m.learned_position_embeddings) {
    arg(fmt::format("--rotary-base {}", integral_rope_theta(pf)));
    if (m.rope_scaling_factor > 0) {
      arg("--use-rope-scaling");  // Llama 3.1's scaling (low / high frequency factors 1 / 4, original 8192 positions)
      arg(fmt::format("--rope-scaling-factor {}", m.rope_scaling_factor));
    }
  }
  arg(fmt::format("--normalization {}", m.normalization == Normalization::rmsnorm ? "RMSNorm" : "LayerNorm"));
  if (m.activation == Activation::swiglu) arg("--swiglu");
  if (!m.linear_bias) arg("--disable-bias-linear");
  if (!m.tied_embeddings) arg("--untie-embeddings-and-output-weights");
  arg("--make-vocab-size-divisible-by 128");
  if (m.moe.enabled()) {
    // Megatron-Core's MoE layer as cuboid prices it: the alltoall dispatcher
    // and grouped expert GEMMs.
    arg("# mixture of experts");
    arg(fmt::format("--num-experts {}", m.moe.num_experts));
    arg(fmt::format("--moe-router-topk {}", m.moe.experts_per_token));
    arg(fmt::format("--moe-ffn-hidden-size {}", m.moe.expert_ffn_hidden_size));
    if (const std::string pattern = moe_layer_pattern(m); !pattern.empty())
      arg(fmt::format("--moe-layer-freq \"{}\"", pattern));
    if (m.moe.shared_expert_ffn_hidden_size > 0)
      arg(fmt::format("--moe-shared-expert-intermediate-size {}", m.moe.shared_expert_ffn_hidden_size));
    if (m.moe.shared_expert_gate) arg("--moe-shared-expert-gate");
    if (m.moe.capacity_factor > 0) arg(fmt::format("--moe-expert-capacity-factor {}", m.moe.capacity_factor));
    if (m.moe.router_groups > 0) {
      arg(fmt::format("--moe-router-num-groups {}", m.moe.router_groups));
      arg(fmt::format("--moe-router-group-topk {}", m.moe.router_group_topk));
    }
    arg(fmt::format("--expert-model-parallel-size {}", p.ep));
    arg(fmt::format("--expert-tensor-parallel-size {}", p.expert_tp()));
    arg("--moe-grouped-gemm");
    arg("--moe-token-dispatcher-type alltoall");
  }
  arg("# precision and kernels");
  arg("--bf16");
  arg(fmt::format("--attention-backend {}", p.flash_attention ? "flash" : "unfused"));
  // Fusion is Megatron-LM's default; a plan priced without it says so.
  if (!p.grad_accum_fusion) arg("--no-gradient-accumulation-fusion");
  out += ")\n\n";

  if (fsdp)
    out += "# Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1.\nunset CUDA_DEVICE_MAX_CONNECTIONS\n\n";
  else if (p.tp > 1 || p.cp > 1)
    out += std::string(p.cp > 1 ? "# TP or CP > 1" : "# TP > 1") +
           ": Megatron-LM wants CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).\n"
           "export CUDA_DEVICE_MAX_CONNECTIONS=1\n\n";

  out += fmt::format(
      "# torchrun on each of the {0} nodes (NODE_RANK 0..{1}, MASTER_ADDR = node 0):\n"
      "#   torchrun --nnodes {0} --nproc_per_node {2} --node_rank \"$NODE_RANK\" --master_addr \"$MASTER_ADDR\" "
      "--master_port 6000 pretrain_gpt.py \"${{MEGATRON_ARGS[@]}}\"\n"
      "# Slurm: one torchrun per node, rendezvous on the first node.\n"
      "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
      "srun --nodes {0} --ntasks-per-node 1 torchrun --nnodes {0} --nproc_per_node {2} --rdzv_backend c10d "
      "--rdzv_endpoint \"$MASTER_ADDR:6000\" --rdzv_id \"$SLURM_JOB_ID\" pretrain_gpt.py \"${{MEGATRON_ARGS[@]}}\"\n",
      pf.nodes, pf.nodes - 1, pf.gpus_per_node);
  return {out, ""};
}

}  // namespace cuboid::exporters
