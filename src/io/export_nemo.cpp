// NeMo 1.x (Megatron GPT on the mcore path) at NVIDIA/NeMo 8cfedd72: keys from
// examples/nlp/language_modeling/conf/megatron_gpt_config.yaml and the cfg.get()
// calls of nemo/collections/nlp/models/language_modeling/megatron_base_model.py and
// megatron_gpt_model.py, and the TransformerConfig fields build_transformer_config
// takes from the model config (MoE, cp_comm_type)
// (tests/data/trainer_options/nemo-8cfedd72.json). NeMo 2's LLM training moved to
// Megatron-Bridge (--to megatron-bridge).
#include <fmt/format.h>

#include "export_common.hpp"

namespace cuboid::exporters {

namespace {

const char* yes_no(bool b) { return b ? "true" : "false"; }

// What NeMo 1.x cannot run as planned: each refusal names the NeMo source
// that rules it out.
// True for the tp-pp-dp rank order (model.use_tp_pp_dp_mapping).
bool refuse_unsupported(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  // nlp_overrides.py init_model_parallel: order 'tp-cp-ep-pp-dp' with
  // use_tp_pp_dp_mapping, else 'tp-cp-ep-dp-pp', with Megatron's assertions.
  const bool tp_pp_dp = megatron_tp_pp_dp(pf, "NeMo 1.x", "model.use_tp_pp_dp_mapping");
  refuse_zero1_all_reduce(pf, "NeMo 1.x (mcore_distributed_optim)");
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule", "NeMo (Megatron core schedules) has no GPipe schedule",
           "plan with --schedule 1f1b or --schedule interleaved");
  refuse_mla_mtp(pf, "cuboid's NeMo 1.x export");
  refuse_pipeline_layout(pf, "cuboid's NeMo 1.x export");
  // megatron_gpt_model.py@8cfedd72 build_transformer_config passes
  // enable_cuda_graph only: Megatron-Core's per-layer graphs of whole layers.
  if (const CudaGraphs& g = p.trainer.cuda_graphs; g.on() && !(g.impl == CudaGraphImpl::local && g.modules == 0))
    refuse(pf, "parallel.trainer.cuda_graphs",
           "NeMo 1.x has enable_cuda_graph only (Megatron-Core's per-layer graphs of whole layers), not " + g.str(),
           "plan with --cuda-graphs local, or export with --to megatron or --to megatron-bridge");
  // megatron_base_model.py build_transformer_config@8cfedd72 (line 603)
  // passes any TransformerConfig field the YAML names, but NeMo 1.x pins no
  // Megatron-Core that has the field: its options (megatron_gpt_config.yaml)
  // have none.
  if (p.moe_ep_overlap)
    refuse(pf, "parallel.moe_ep_overlap",
           "NeMo 1.x's megatron_gpt_config.yaml@8cfedd72 has no overlap_moe_expert_parallel_comm key, and the "
           "Megatron-Core it runs is not pinned to one that has the combined 1F1B schedule",
           "plan with --moe-ep-overlap off, or export with --to megatron or --to megatron-bridge");
  if (p.moe_dispatcher == MoeDispatcher::flex && p.moe_flex != FlexSetting{})
    refuse(pf, p.moe_flex.backend != FlexBackend::deepep ? "parallel.moe_flex_backend" : "parallel.moe_flex_sms",
           "NeMo 1.x's megatron_gpt_config.yaml@8cfedd72 has no moe_flex_dispatcher_backend or "
           "moe_flex_dispatcher_num_sms key",
           "plan without --moe-flex-backend and --moe-flex-sms, or export with --to megatron or --to megatron-bridge");
  refuse_offload(pf, "cuboid's NeMo 1.x export", "its pinned option list has no cpu_offloading keys");
  refuse_precision_aware_optimizer(pf, "cuboid's NeMo 1.x export",
                                   "its pinned option list has no use_precision_aware_optimizer or exp_avg_dtype keys");
  refuse_muon(pf, "cuboid's NeMo 1.x export", "its pinned option list has no Megatron-Core emerging optimizer");
  refuse_fp8_attention(pf, "cuboid's NeMo 1.x export", "its pinned option list has no fp8_dot_product_attention key");
  refuse_ddp_bucket_size(pf, "cuboid's NeMo 1.x export", "its pinned option list has no optim.ddp_bucket_size key");
  // megatron_gpt_config.yaml@8cfedd72 has FP8 keys for delayed scaling only
  // (fp8, fp8_e4m3 / fp8_hybrid, fp8_margin, fp8_amax_history_len,
  // fp8_amax_compute_algo, fp8_params); no key selects another recipe.
  if (p.precision != Precision::bf16 && p.precision != Precision::fp8_delayed)
    refuse_precision(pf,
                     "NeMo 1.x's megatron_gpt_config.yaml has FP8 keys for delayed scaling only (fp8, fp8_hybrid, "
                     "fp8_amax_history_len); none selects current, blockwise, MXFP8 or NVFP4 scaling",
                     "plan with --precision fp8-delayed, or export with --to megatron or --to megatron-bridge");
  // nlp_overrides.py init_model_parallel passes no expert tensor-parallel size
  // to parallel_state.initialize_model_parallel, which then takes ETP = TP.
  if (m.moe.enabled() && p.expert_tp() != p.tp)
    refuse(pf, "parallel.etp",
           fmt::format("NeMo 1.x sets up Megatron's parallel state without an expert tensor-parallel size "
                       "(nlp_overrides.py init_model_parallel), so its experts run at ETP = TP = {}, not the "
                       "plan's ETP {}",
                       p.tp, p.expert_tp()),
           fmt::format("plan with --etp {}, or export with --to megatron-bridge (NeMo 2's trainer) or --to megatron",
                       p.tp));
  if (p.virtual_stages > 1)
    refuse(pf, "parallel.virtual_stages",
           "NeMo 1.x's mcore GPT asserts virtual_pipeline_model_parallel_size is None (\"Virtual pipeline model "
           "parallel size is no longer supported for nemo 1.0\", megatron_gpt_model.py mcore_model_customize)",
           "plan with --schedule 1f1b, or export with --to megatron-bridge");
  if (has_uneven_stages(p))
    refuse(pf, "parallel.first_stage_layers",
           "megatron_gpt_config.yaml has no keys for uneven first / last pipeline stages",
           "plan without uneven stages, or export with --to megatron");
  if (p.dp_cp() > 1 && p.zero_stage >= 2)  // Megatron shards over DP x CP
    refuse(pf, "parallel.zero_stage",
           fmt::format("NeMo 1.x's ZeRO-{} is model.fsdp, PyTorch FSDP (nlp_overrides.py NLPFSDPStrategy: "
                       "BackwardPrefetch.BACKWARD_PRE, no forward prefetch, no gradient-accumulation fusion), not the "
                       "Megatron FSDP gather schedule the plan was priced with",
                       p.zero_stage),
           "plan with --zero 0 or 1, or export with --to megatron-bridge or --to megatron (Megatron FSDP)");
  // megatron_base_model.py __init__ drops gradient_accumulation_fusion without
  // megatron_amp_O2 (set by training_keys) or with DP > 1, PP = 1 and no distributed optimizer.
  if (p.grad_accum_fusion && p.dp > 1 && p.pp == 1 && p.zero_stage == 0)
    refuse(pf, "parallel.grad_accum_fusion",
           "NeMo 1.x turns gradient_accumulation_fusion off without pipeline parallelism unless the optimizer is "
           "distributed (\"gradient accumulation fusion can only be used with distributed_fused_adam\")",
           "plan with --zero 1, or with --grad-accum-fusion off");
  // megatron_gpt_model.py training_step: without a distributed optimizer
  // (megatron_amp_O2) the gradients are all-reduced after the backward, not
  // overlapped, with pipeline parallelism or with sequence parallelism.
  if (p.dp > 1 && p.zero_stage == 0 && (p.pp > 1 || p.sequence_parallel) && p.trainer.dp_overlap)
    refuse(pf, "trainer.dp_overlap",
           fmt::format("NeMo 1.x without a distributed optimizer all-reduces the gradients after the backward with "
                       "{} (megatron_gpt_model.py training_step: allreduce_main_grads \"when using pipeline "
                       "parallelism\" or sequence_parallel), and the plan was priced with the reduction overlapped",
                       p.pp > 1 ? "pipeline parallelism" : "sequence parallelism"),
           "plan with --zero 1 (mcore_distributed_optim overlaps it)");
  return tp_pp_dp;
}

// The file's comments, the launch lines, the trainer keys and the parallel
// sizes.
std::string parallel_keys(const PlanFile& pf, bool tp_pp_dp) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  std::string out = header(pf, "#", "NeMo 1.x");
  out += "# Keys: NVIDIA/NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml@8cfedd72 and the\n"
         "# cfg.get() keys of megatron_gpt_model.py (NeMo 1.x YAML; NeMo 2's LLM training is Megatron-Bridge:\n"
         "# --to megatron-bridge). Save as examples/nlp/language_modeling/conf/cuboid_plan.yaml; the defaults\n"
         "# list below takes every other key from megatron_gpt_config.yaml.\n"
         "# Add: model.data.data_prefix, model.tokenizer.*, model.optim learning rate and schedule, and\n"
         "# exp_manager.checkpoint_callback_params / exp_manager.exp_dir for checkpoints.\n";
  out += launch_lines(pf, "examples/nlp/language_modeling/megatron_gpt_pretraining.py --config-name=cuboid_plan");
  out += "defaults:\n  - megatron_gpt_config\n  - _self_\n";
  out += "trainer:\n";
  out += fmt::format("  num_nodes: {}\n", pf.hosts());
  out += fmt::format("  devices: {}\n", pf.host_gpus());
  out += "  precision: bf16\n";
  out += "model:\n";
  out += "  mcore_gpt: true\n";
  out += fmt::format("  micro_batch_size: {}\n", p.micro_batch);
  out += fmt::format("  global_batch_size: {}\n", p.global_batch);
  out += fmt::format("  tensor_model_parallel_size: {}\n", p.tp);
  out += fmt::format("  pipeline_model_parallel_size: {}\n", p.pp);
  out += "  virtual_pipeline_model_parallel_size: null\n";
  if (tp_pp_dp) out += "  use_tp_pp_dp_mapping: true\n";
  if (p.cp > 1) {
    // megatron_base_model.py: context_parallel_size sets up the CP groups; the
    // batch is cut into the 2 x CP chunks (megatron_gpt_model.py
    // get_batch_on_this_context_parallel_rank); cp_comm_type reaches
    // TransformerConfig like every config field present in cfg.
    out += fmt::format("  context_parallel_size: {}\n", p.cp);
    out += fmt::format("  cp_comm_type: {}\n", to_string(p.cp_comm));
  }
  if (m.moe.enabled()) out += fmt::format("  expert_model_parallel_size: {}\n", p.ep);
  out += fmt::format("  sequence_parallel: {}\n", yes_no(p.sequence_parallel));
  return out;
}

std::string recompute_keys(const ParallelPlan& p) {
  switch (p.recompute) {
    case Recompute::none:
      return "  activations_checkpoint_granularity: null\n"
             "  activations_checkpoint_method: null\n"
             "  activations_checkpoint_num_layers: null\n";
    case Recompute::selective:
      return "  activations_checkpoint_granularity: selective\n"
             "  activations_checkpoint_method: null\n"
             "  activations_checkpoint_num_layers: null\n";
    case Recompute::full:
      return fmt::format("  activations_checkpoint_granularity: full\n"
                         "  activations_checkpoint_method: {}\n"
                         "  activations_checkpoint_num_layers: {}\n",
                         to_string(p.recompute_method), p.recompute_num_layers);
  }
  return "";
}

// The model's shape.
std::string model_keys(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const ModelSpec& m = pf.model;
  std::string out;
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
  out += fmt::format("  position_embedding_type: {}\n",
                     position_embedding_type(pf, "NeMo 1.x's mcore path (the one this export writes)"));
  if (!m.learned_position_embeddings) {
    out += fmt::format("  rotary_base: {}\n", integral_rope_theta(pf));
    if (m.rope_scaling_factor > 0) {
      out += "  scale_positional_embedding: true\n";
      out += fmt::format("  scale_factor: {}\n", m.rope_scaling_factor);
    }
  }
  out += fmt::format("  share_embeddings_and_output_weights: {}\n", yes_no(m.tied_embeddings));
  // megatron_gpt_config.yaml's dropouts are 0.1.
  if (m.hidden_dropout != 0.1) out += fmt::format("  hidden_dropout: {}\n", m.hidden_dropout);
  if (m.attention_dropout != 0.1) out += fmt::format("  attention_dropout: {}\n", m.attention_dropout);
  return out;
}

// Megatron-Core's MoE layer as cuboid prices it (the plan's dispatcher,
// grouped expert GEMMs): num_moe_experts, moe_router_topk and
// moe_grouped_gemm are megatron_gpt_model.py's cfg.get() keys, the rest
// TransformerConfig fields that build_transformer_config takes from cfg.
std::string moe_keys(const ModelSpec& m, const ParallelPlan& plan) {
  std::string out;
  const MoeSpec& e = m.moe;
  out += fmt::format("  num_moe_experts: {}\n", e.num_experts);
  out += fmt::format("  moe_router_topk: {}\n", e.experts_per_token);
  out += fmt::format("  moe_ffn_hidden_size: {}\n", e.expert_ffn_hidden_size);
  if (e.moe_layer_count() < m.num_layers) {
    std::string layers;
    for (const bool moe : e.moe_layers) layers += fmt::format("{}{}", layers.empty() ? "" : ", ", moe ? 1 : 0);
    out += "  moe_layer_freq: [" + layers + "]\n";
  }
  if (e.shared_expert_ffn_hidden_size > 0)
    out += fmt::format("  moe_shared_expert_intermediate_size: {}\n", e.shared_expert_ffn_hidden_size);
  if (e.shared_expert_gate) out += "  moe_shared_expert_gate: true\n";
  if (e.capacity_factor > 0) out += fmt::format("  moe_expert_capacity_factor: {}\n", e.capacity_factor);
  if (e.router_groups > 0) {
    out += fmt::format("  moe_router_num_groups: {}\n", e.router_groups);
    out += fmt::format("  moe_router_group_topk: {}\n", e.router_group_topk);
  }
  out += "  moe_grouped_gemm: true\n";
  out += fmt::format("  moe_token_dispatcher_type: {}\n", to_string(plan.moe_dispatcher));
  return out;
}

// The vocabulary padding, the layer spec, mixed precision, fusions and the
// optimizer.
std::string training_keys(const ParallelPlan& p) {
  std::string out;
  out += "  make_vocab_size_divisible_by: 128\n";
  // The mcore path picks its layer spec by transformer_engine: true = TE's fused
  // (flash) attention, false = the local spec's unfused attention;
  // use_flash_attention acts on the legacy path only.
  out += fmt::format("  transformer_engine: {}\n", yes_no(p.flash_attention));
  // O2: fp32 main parameters and gradients, as priced; fusion needs it.
  out += "  megatron_amp_O2: true\n";
  out += fmt::format("  gradient_accumulation_fusion: {}\n", yes_no(p.grad_accum_fusion));
  if (p.precision == Precision::fp8_delayed) {
    // megatron_gpt_model.py build_transformer_config: fp8_hybrid -> TransformerConfig
    // fp8 "hybrid"; the amax keys reach TransformerConfig by name (the recipe
    // Megatron-LM's export writes); fp8_params keeps the weights in FP8 and
    // all-gathers them so (megatron_gpt_model.py fp8_param_gather).
    const McoreQuantization q = mcore_quantization(p.precision);
    out += "  fp8: true\n";
    out += "  fp8_e4m3: false\n";
    out += "  fp8_hybrid: true\n";
    out += fmt::format("  fp8_amax_history_len: {}\n", q.amax_history_len);
    out += fmt::format("  fp8_amax_compute_algo: {}\n", q.amax_compute_algo);
    out += fmt::format("  fp8_params: {}\n", yes_no(p.fp8_param_gather));
  }
  // Transformer Engine's userbuffers with its defaults (no
  // ub_tp_comm_overlap_cfg); Megatron-Core's per-layer graphs
  // (enable_cuda_graph, which megatron_gpt_model.py asserts with
  // use_te_rng_tracker).
  if (p.trainer.tp_comm_overlap) out += "  ub_tp_comm_overlap: true\n";
  if (p.trainer.cuda_graphs.on()) {
    out += "  enable_cuda_graph: true\n";
    out += "  use_te_rng_tracker: true\n";
  }
  out += "  optim:\n";
  if (p.zero_stage >= 1) {
    // Megatron-Core's distributed optimizer; the parameter all-gather as
    // priced: after the optimizer step, or in the next forward.
    out += "    name: mcore_distributed_optim\n";
    out += fmt::format("    overlap_grad_sync: {}\n", yes_no(p.trainer.dp_overlap));
    out += fmt::format("    overlap_param_sync: {}\n", yes_no(p.trainer.overlap_param_gather));
    out += fmt::format("    grad_sync_dtype: {}\n", p.trainer.dp_grad_bytes == 2 ? "bf16" : "fp32");
  } else {
    out += "    name: fused_adam\n";
  }
  return out;
}

}  // namespace

ExportResult nemo1(const PlanFile& pf) {
  const bool tp_pp_dp = refuse_unsupported(pf);
  std::string out = parallel_keys(pf, tp_pp_dp);
  out += recompute_keys(pf.plan);
  out += model_keys(pf);
  if (pf.model.moe.enabled()) out += moe_keys(pf.model, pf.plan);
  out += training_keys(pf.plan);
  return {out, ""};
}

}  // namespace cuboid::exporters
