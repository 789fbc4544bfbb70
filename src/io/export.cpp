#include "cuboid/io/export.hpp"

#include <cstdint>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuboid/core/error.hpp"

namespace cuboid {

namespace {

[[noreturn]] void refuse(const PlanFile& pf, const std::string& field, const std::string& problem,
                         const std::string& fix) {
  throw InputError(pf.source, field, problem, fix);
}

bool default_rank_order(const ParallelPlan& p) { return p.order == RankOrder{}; }

// Index of `d` in the rank order, 0 = innermost.
int position(const RankOrder& order, Dim d) {
  for (int i = 0; i < 3; ++i)
    if (order.inner_to_outer[static_cast<std::size_t>(i)] == d) return i;
  return 3;
}

std::string header(const PlanFile& pf, std::string_view comment, std::string_view target) {
  const ParallelPlan& p = pf.plan;
  return fmt::format(
      "{0} {1} configuration for the cuboid plan in {2} (schema cuboid.plan/1):\n"
      "{0}   {3} on {4}: {5} nodes x {6} {7}; TP {8} x PP {9} x DP {10}, micro-batch {11}, global batch {12} x {13} "
      "tokens\n",
      comment, target, pf.source, pf.model.name, pf.cluster_name, pf.nodes, pf.gpus_per_node, pf.gpu_name, p.tp, p.pp,
      p.dp, p.micro_batch, p.global_batch, p.seq_length);
}

// ---------------------------------------------------------------------------
// Megatron-LM. Flag names from NVIDIA/Megatron-LM megatron/training/arguments.py
// (_add_distributed_args, _add_training_args, _add_network_size_args,
// _add_mixed_precision_args).

std::string export_megatron(const PlanFile& pf) {
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
  const bool fsdp = p.zero_stage >= 2 && p.dp > 1;

  std::string out = "#!/bin/bash\n" + header(pf, "#", "Megatron-LM");
  out += "# Flags: NVIDIA/Megatron-LM megatron/training/arguments.py. Add data, tokenizer, optimizer,\n"
         "# learning-rate and checkpoint flags before running.\n";
  out += "MEGATRON_ARGS=(\n";
  auto arg = [&](const std::string& a) { out += "    " + a + "\n"; };
  arg("# parallelism");
  arg(fmt::format("--tensor-model-parallel-size {}", p.tp));
  arg(fmt::format("--pipeline-model-parallel-size {}", p.pp));
  if (p.virtual_stages > 1)  // there is no VPP-size flag in older releases: layers per virtual stage it is
    arg(fmt::format("--num-layers-per-virtual-pipeline-stage {}",
                    m.num_layers / (static_cast<std::int64_t>(p.pp) * p.virtual_stages)));
  if (p.first_stage_layers > 0) arg(fmt::format("--decoder-first-pipeline-num-layers {}", p.first_stage_layers));
  if (p.last_stage_layers > 0) arg(fmt::format("--decoder-last-pipeline-num-layers {}", p.last_stage_layers));
  if (p.sequence_parallel) arg("--sequence-parallel");
  if (tp_pp_dp) arg("--use-tp-pp-dp-mapping");
  if (p.zero_stage >= 1) arg("--use-distributed-optimizer");
  if (fsdp) {
    // ZeRO-2 / ZeRO-3 are Megatron FSDP's optim_grads / optim_grads_params; it
    // only supports the fsdp_dtensor checkpoint format.
    arg("--use-megatron-fsdp");
    arg(fmt::format("--data-parallel-sharding-strategy {}", p.zero_stage == 3 ? "optim_grads_params" : "optim_grads"));
    arg("--ckpt-format fsdp_dtensor");
  }
  if (p.dp > 1) arg("--overlap-grad-reduce");
  if (p.dp > 1 && p.zero_stage >= 1) arg("--overlap-param-gather");
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
  if (m.head_dim * m.num_attention_heads != m.hidden_size) arg(fmt::format("--kv-channels {}", m.head_dim));
  if (m.num_kv_heads != m.num_attention_heads) {
    arg("--group-query-attention");
    arg(fmt::format("--num-query-groups {}", m.num_kv_heads));
  }
  arg(fmt::format("--seq-length {}", p.seq_length));
  arg(fmt::format("--max-position-embeddings {}", m.max_position_embeddings));
  arg(fmt::format("--position-embedding-type {}", m.learned_position_embeddings ? "learned_absolute" : "rope"));
  arg(fmt::format("--normalization {}", m.normalization == Normalization::rmsnorm ? "RMSNorm" : "LayerNorm"));
  if (m.activation == Activation::swiglu) arg("--swiglu");
  if (!m.linear_bias) arg("--disable-bias-linear");
  if (!m.tied_embeddings) arg("--untie-embeddings-and-output-weights");
  arg("--make-vocab-size-divisible-by 128");
  arg("# precision and kernels");
  arg("--bf16");
  arg(fmt::format("--attention-backend {}", p.flash_attention ? "flash" : "unfused"));
  // Fusion is Megatron-LM's default; a plan priced without it says so.
  if (!p.grad_accum_fusion) arg("--no-gradient-accumulation-fusion");
  out += ")\n\n";

  if (fsdp)
    out += "# Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1.\nunset CUDA_DEVICE_MAX_CONNECTIONS\n\n";
  else if (p.tp > 1)
    out += "# TP > 1: Megatron-LM wants CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).\n"
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
  return out;
}

// ---------------------------------------------------------------------------
// DeepSpeed. Keys from microsoft/DeepSpeed docs/_pages/config-json.md and
// deepspeed/runtime/config.py (get_pipeline_config: stages, partition,
// seed_layers, activation_checkpoint_interval).

std::string export_deepspeed(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  if (p.tp > 1)
    refuse(pf, "parallel.tp",
           "DeepSpeed's config has no tensor-parallel size: Megatron-style TP (and sequence parallelism) comes from "
           "the model code, e.g. Megatron-DeepSpeed's --tensor-model-parallel-size",
           "export with --to megatron, or plan with --tp 1");
  if (p.pp > 1 && p.schedule == Schedule::interleaved)
    refuse(pf, "parallel.schedule",
           "DeepSpeed's pipeline engine has no interleaved (virtual-stage) schedule; it runs one 1F1B schedule "
           "(TrainSchedule)",
           "plan with --schedule 1f1b, or export with --to megatron");
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule", "DeepSpeed's pipeline engine has no GPipe schedule; it runs 1F1B (TrainSchedule)",
           "plan with --schedule 1f1b");
  if (p.pp > 1 && p.zero_stage >= 2)
    refuse(pf, "parallel.zero_stage",
           fmt::format("DeepSpeed's pipeline engine rejects ZeRO-{} (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                       "parallelism\", deepspeed/runtime/pipe/engine.py)",
                       p.zero_stage),
           "plan with --zero 0 or 1, or with --pp 1");
  if (has_uneven_stages(p))
    refuse(pf, "parallel.first_stage_layers",
           "DeepSpeed's PipelineModule splits layers by its own partition method (uniform, parameters, type:...), "
           "not by fixed first / last stage sizes",
           "plan without uneven stages");
  if (p.pp > 1 && p.dp > 1 && position(p.order, Dim::pp) < position(p.order, Dim::dp))
    refuse(pf, "parallel.rank_order",
           "DeepSpeed's PipeDataParallelTopology (axes pipe, data) puts data-parallel ranks inside pipelines, not "
           "rank order " + p.order.str(),
           "plan with --rank-order tp-dp-pp");
  if (p.recompute == Recompute::selective)
    refuse(pf, "parallel.recompute",
           "DeepSpeed has no selective (attention-core) recomputation; its activation checkpointing recomputes whole "
           "layers",
           "plan with --recompute none or full");
  if (p.recompute == Recompute::full && p.pp == 1)
    refuse(pf, "parallel.recompute",
           "without pipeline parallelism DeepSpeed's config cannot switch recomputation on (the model code calls "
           "deepspeed.checkpointing.checkpoint)",
           "plan with --recompute none, or with --pp > 1 where pipeline.activation_checkpoint_interval expresses it");

  if (p.grad_accum_fusion)
    refuse(pf, "parallel.grad_accum_fusion",
           "DeepSpeed's engine adds each micro-batch's gradients to its accumulation buffers in a separate pass, "
           "not inside the weight-gradient GEMMs, and the plan was priced with Megatron's fused accumulation",
           "plan with --grad-accum-fusion off (plan --for deepspeed does)");

  nlohmann::ordered_json j;
  j["train_batch_size"] = p.global_batch;
  j["train_micro_batch_size_per_gpu"] = p.micro_batch;
  // train_batch_size = micro batch x gradient accumulation x data-parallel ranks.
  j["gradient_accumulation_steps"] = p.num_micro_batches();
  // DeepSpeed v0.5.4's ZeRO optimizers are fp16 only ("Creating fp16 ZeRO
  // stage {} optimizer", deepspeed/runtime/engine.py); the plan's 16-bit
  // gradients (dp_grad_bytes 2) are that run.
  if (p.trainer.dp_grad_bytes == 2) j["fp16"] = {{"enabled", true}};
  else j["bf16"] = {{"enabled", true}};
  j["zero_optimization"] = {{"stage", p.zero_stage}};
  if (p.zero_stage == 3 && p.trainer.zero3_unit == Zero3Unit::tensor) {
    // The ZeRO-3 settings the plan was priced with (deepspeed/runtime/zero/constants.py keys).
    j["zero_optimization"]["stage3_param_persistence_threshold"] = p.trainer.zero3_persist_params;
    j["zero_optimization"]["stage3_prefetch_bucket_size"] = p.trainer.zero3_prefetch_params;
    j["zero_optimization"]["stage3_max_reuse_distance"] = p.trainer.zero3_reuse_params;
    j["zero_optimization"]["reduce_bucket_size"] = p.trainer.zero3_reduce_bucket_params;
  }
  if (p.pp > 1) {
    nlohmann::ordered_json pipe;
    pipe["stages"] = p.pp;
    pipe["partition"] = "uniform";  // equal numbers of layers per stage, as the plan assumes
    pipe["activation_checkpoint_interval"] = p.recompute == Recompute::full ? 1 : 0;
    j["pipeline"] = pipe;
  }
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------
// torchtitan. Fields from pytorch/torchtitan torchtitan/config/job_config.py
// (Parallelism, Training, ActivationCheckpoint); schedule names are those of
// torch.distributed.pipelining (get_schedule_class): "1F1B", "Interleaved1F1B",
// "GPipe".

std::string export_torchtitan(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  if (!default_rank_order(p))
    refuse(pf, "parallel.rank_order",
           "torchtitan's device mesh is fixed as [pp, dp_replicate, dp_shard, cp, tp] (TP innermost, PP outermost = "
           "rank order tp-dp-pp), not " + p.order.str(),
           "plan with --rank-order tp-dp-pp");
  if (p.tp > 1 && !p.sequence_parallel)
    refuse(pf, "parallel.sequence_parallel",
           "torchtitan's tensor parallelism always shards norms along the sequence (sequence parallelism)",
           "plan with --sequence-parallel on");
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
  if (p.dp > 1 && p.zero_stage == 1)
    refuse(pf, "parallel.zero_stage",
           "ZeRO-1 (sharded optimizer states, replicated weights and gradients) has no torchtitan equivalent: FSDP2 "
           "shards weights, gradients and optimizer states together",
           "plan with --zero 3 (FSDP), --zero 2 (FSDP without resharding after forward) or --zero 0 (DDP)");
  if (p.dp > 1 && p.zero_stage == 0 && (p.tp > 1 || p.pp > 1))
    refuse(pf, "parallel.zero_stage",
           "torchtitan replicates with DDP (data_parallel_replicate_degree) only without tensor or pipeline "
           "parallelism (\"DDP has not supported > 1D parallelism\")",
           "plan with --zero 3 (FSDP), or export with --to megatron");

  if (p.grad_accum_fusion)
    refuse(pf, "parallel.grad_accum_fusion",
           "torchtitan (FSDP2 or DDP) adds each micro-batch's gradients in a separate pass (autograd's "
           "AccumulateGrad, FSDP's sharded add), not inside the weight-gradient GEMMs, and the plan was priced with "
           "Megatron's fused accumulation",
           "plan with --grad-accum-fusion off (plan --for torchtitan does)");

  // ZeRO-3 = FSDP resharding after forward; ZeRO-2 = FSDP keeping the
  // gathered weights until backward (torch fully_shard reshard_after_forward=False).
  const bool shard = p.dp > 1 && p.zero_stage >= 2;
  const int replicate_degree = p.dp > 1 && p.zero_stage == 0 ? p.dp : 1;
  const int shard_degree = shard ? p.dp : 1;
  std::vector<std::pair<std::string, std::string>> par, train, ac;  // key, TOML value
  auto q = [](std::string_view s) { return fmt::format("\"{}\"", s); };
  par.emplace_back("data_parallel_replicate_degree", std::to_string(replicate_degree));
  par.emplace_back("data_parallel_shard_degree", std::to_string(shard_degree));
  if (shard) par.emplace_back("fsdp_reshard_after_forward", q(p.zero_stage == 3 ? "always" : "never"));
  par.emplace_back("tensor_parallel_degree", std::to_string(p.tp));
  par.emplace_back("pipeline_parallel_degree", std::to_string(p.pp));
  if (p.pp > 1) {
    const char* schedule = p.schedule == Schedule::interleaved ? "Interleaved1F1B"
                           : p.schedule == Schedule::gpipe     ? "GPipe"
                                                               : "1F1B";
    par.emplace_back("pipeline_parallel_schedule", q(schedule));
    // Pin the split: layers per (virtual) stage, no layer taken off the first
    // and last stages for the embedding and the output.
    par.emplace_back("pipeline_parallel_layers_per_stage",
                     std::to_string(m.num_layers / (static_cast<std::int64_t>(p.pp) * p.virtual_stages)));
    par.emplace_back("pipeline_parallel_first_stage_less_layers", "0");
    par.emplace_back("pipeline_parallel_last_stage_less_layers", "0");
    par.emplace_back("pipeline_parallel_microbatch_size", std::to_string(p.micro_batch));
  }
  par.emplace_back("context_parallel_degree", std::to_string(p.cp));
  // local_batch_size is per data-parallel rank: with PP it holds all of the
  // rank's micro-batches; without, gradient accumulation fills the global batch.
  train.emplace_back("local_batch_size",
                     std::to_string(p.pp > 1 ? p.global_batch / p.dp : static_cast<std::int64_t>(p.micro_batch)));
  train.emplace_back("global_batch_size", std::to_string(p.global_batch));
  train.emplace_back("seq_len", std::to_string(p.seq_length));
  const char* mode = p.recompute == Recompute::full ? "full" : "none";
  ac.emplace_back("mode", q(mode));

  std::string out = header(pf, "#", "torchtitan");
  out += "# Fields: pytorch/torchtitan torchtitan/config/job_config.py (Parallelism, Training, ActivationCheckpoint).\n";
  out += fmt::format("# Set --model.name / --model.flavor to a {} shape ({} layers, hidden {}).\n", m.name, m.num_layers,
                     m.hidden_size);
  if (p.recompute == Recompute::selective)
    out += "# cuboid's selective recomputation (attention core only) equals none with flash attention, which\n"
           "# recomputes the attention core in backward by itself: activation_checkpoint.mode = \"none\".\n";
  out += "\n# Command-line overrides:\n";
  std::vector<std::string> flags;
  auto add_flags = [&](const char* section, const auto& kv) {
    for (const auto& [k, v] : kv) {
      std::string value = v;
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      flags.push_back(fmt::format("--{}.{}={}", section, k, value));
    }
  };
  add_flags("parallelism", par);
  add_flags("training", train);
  add_flags("activation_checkpoint", ac);
  for (std::size_t i = 0; i < flags.size(); ++i) out += flags[i] + (i + 1 < flags.size() ? " \\\n" : "\n");
  out += "\n# The same as a TOML job config (train_configs/*.toml):\n";
  auto table = [&](const char* section, const auto& kv) {
    out += fmt::format("[{}]\n", section);
    for (const auto& [k, v] : kv) out += fmt::format("{} = {}\n", k, v);
  };
  table("parallelism", par);
  out += "\n";
  table("training", train);
  out += "\n";
  table("activation_checkpoint", ac);
  return out;
}

// ---------------------------------------------------------------------------
// NeMo 1.x (Megatron GPT). Keys from NVIDIA/NeMo
// examples/nlp/language_modeling/conf/megatron_gpt_config.yaml.

std::string export_nemo(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  if (!default_rank_order(p))
    refuse(pf, "parallel.rank_order", "NeMo's Megatron GPT orders ranks tp-dp-pp; it has no key for " + p.order.str(),
           "plan with --rank-order tp-dp-pp");
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule", "NeMo (Megatron core schedules) has no GPipe schedule",
           "plan with --schedule 1f1b or --schedule interleaved");
  if (has_uneven_stages(p))
    refuse(pf, "parallel.first_stage_layers",
           "megatron_gpt_config.yaml has no keys for uneven first / last pipeline stages",
           "plan without uneven stages, or export with --to megatron");
  if (p.dp > 1 && p.zero_stage >= 2)
    refuse(pf, "parallel.zero_stage",
           fmt::format("NeMo's Megatron GPT shards optimizer states (ZeRO-1, optim.name distributed_fused_adam) but "
                       "has no ZeRO-{} setting",
                       p.zero_stage),
           "plan with --zero 0 or 1, or export with --to megatron (Megatron FSDP)");

  auto yes_no = [](bool b) { return b ? "true" : "false"; };
  std::string out = header(pf, "#", "NeMo");
  out += "# Keys: NVIDIA/NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (NeMo 1.x).\n";
  out += "trainer:\n";
  out += fmt::format("  num_nodes: {}\n", pf.nodes);
  out += fmt::format("  devices: {}\n", pf.gpus_per_node);
  out += "  precision: bf16\n";
  out += "model:\n";
  out += fmt::format("  micro_batch_size: {}\n", p.micro_batch);
  out += fmt::format("  global_batch_size: {}\n", p.global_batch);
  out += fmt::format("  tensor_model_parallel_size: {}\n", p.tp);
  out += fmt::format("  pipeline_model_parallel_size: {}\n", p.pp);
  out += p.virtual_stages > 1 ? fmt::format("  virtual_pipeline_model_parallel_size: {}\n", p.virtual_stages)
                              : std::string("  virtual_pipeline_model_parallel_size: null\n");
  out += fmt::format("  sequence_parallel: {}\n", yes_no(p.sequence_parallel));
  switch (p.recompute) {
    case Recompute::none:
      out += "  activations_checkpoint_granularity: null\n"
             "  activations_checkpoint_method: null\n"
             "  activations_checkpoint_num_layers: null\n";
      break;
    case Recompute::selective:
      out += "  activations_checkpoint_granularity: selective\n"
             "  activations_checkpoint_method: null\n"
             "  activations_checkpoint_num_layers: null\n";
      break;
    case Recompute::full:
      out += "  activations_checkpoint_granularity: full\n"
             "  activations_checkpoint_method: uniform\n"
             "  activations_checkpoint_num_layers: 1\n";
      break;
  }
  out += fmt::format("  encoder_seq_length: {}\n", p.seq_length);
  out += fmt::format("  max_position_embeddings: {}\n", m.max_position_embeddings);
  out += fmt::format("  num_layers: {}\n", m.num_layers);
  out += fmt::format("  hidden_size: {}\n", m.hidden_size);
  out += fmt::format("  ffn_hidden_size: {}\n", m.ffn_hidden_size);
  out += fmt::format("  num_attention_heads: {}\n", m.num_attention_heads);
  out += m.num_kv_heads != m.num_attention_heads ? fmt::format("  num_query_groups: {}\n", m.num_kv_heads)
                                                 : std::string("  num_query_groups: null\n");
  out += m.head_dim * m.num_attention_heads != m.hidden_size ? fmt::format("  kv_channels: {}\n", m.head_dim)
                                                             : std::string("  kv_channels: null\n");
  out += fmt::format("  normalization: {}\n", m.normalization == Normalization::rmsnorm ? "rmsnorm" : "layernorm");
  out += fmt::format("  activation: {}\n", m.activation == Activation::swiglu ? "swiglu" : "gelu");
  out += fmt::format("  bias: {}\n", yes_no(m.linear_bias));
  out += fmt::format("  position_embedding_type: {}\n", m.learned_position_embeddings ? "learned_absolute" : "rope");
  out += fmt::format("  share_embeddings_and_output_weights: {}\n", yes_no(m.tied_embeddings));
  out += "  make_vocab_size_divisible_by: 128\n";
  out += fmt::format("  use_flash_attention: {}\n", yes_no(p.flash_attention));
  out += fmt::format("  gradient_accumulation_fusion: {}\n", yes_no(p.grad_accum_fusion));
  out += "  optim:\n";
  out += fmt::format("    name: {}\n", p.zero_stage >= 1 ? "distributed_fused_adam" : "fused_adam");
  return out;
}

}  // namespace

const std::vector<std::string>& export_targets() {
  static const std::vector<std::string> kTargets = {"megatron", "deepspeed", "torchtitan", "nemo"};
  return kTargets;
}

std::string export_plan(const PlanFile& pf, std::string_view target) {
  if (target == "megatron") return export_megatron(pf);
  if (target == "deepspeed") return export_deepspeed(pf);
  if (target == "torchtitan") return export_torchtitan(pf);
  if (target == "nemo") return export_nemo(pf);
  throw InputError("command line", "--to", "unknown export target \"" + std::string(target) + "\"",
                   "use megatron, deepspeed, torchtitan or nemo");
}

}  // namespace cuboid
