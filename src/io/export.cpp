#include "cuboid/io/export.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "export_common.hpp"

namespace cuboid {

namespace exporters {

void refuse(const PlanFile& pf, const std::string& field, const std::string& problem, const std::string& fix) {
  throw InputError(pf.source, field, problem, fix);
}

bool default_rank_order(const ParallelPlan& p) { return p.order == RankOrder{}; }

int position(const RankOrder& order, Dim d) {
  for (int i = 0; i < 3; ++i)
    if (order.inner_to_outer[static_cast<std::size_t>(i)] == d) return i;
  return 3;
}

void refuse_mla_mtp(const PlanFile& pf, std::string_view trainer) {
  if (pf.model.mla.enabled())
    refuse(pf, "model.mla",
           fmt::format("{} cannot build multi-head latent attention from its pinned options (Megatron-LM's "
                       "--multi-latent-attention and MLA flags can)",
                       trainer),
           "export with --to megatron");
  if (pf.model.mtp_layers > 0)
    refuse(pf, "model.mtp_layers",
           fmt::format("{} cannot build the model's {} multi-token-prediction layer{} from its pinned options "
                       "(Megatron-LM's --mtp-num-layers can)",
                       trainer, pf.model.mtp_layers, pf.model.mtp_layers == 1 ? "" : "s"),
           "export with --to megatron, or drop mtp_layers from the card");
}

void refuse_offload(const PlanFile& pf, std::string_view trainer, std::string_view why) {
  if (pf.plan.offload_modules != 0)
    refuse(pf, "parallel.offload_modules",
           fmt::format("{} has no setting for Megatron-Core's fine-grained activation offloading "
                       "(offload_modules: hooks in Megatron-Core's own attention and expert modules, "
                       "fine_grained_activation_offload.py at d98e8a64)",
                       trainer),
           "export with --to megatron or --to megatron-bridge, or plan without --offload-modules");
  if (pf.plan.offload_layers == 0) return;
  refuse(pf, "parallel.offload_activations",
         fmt::format("{} has no setting for Megatron-Core's CPU activation offloading ({})", trainer, why),
         "export with --to megatron or --to megatron-bridge, or plan without --offload-activations");
}

void refuse_precision_aware_optimizer(const PlanFile& pf, std::string_view trainer, std::string_view why) {
  const ParallelPlan& p = pf.plan;
  if (!p.precision_aware_optimizer && p.adam_moment_bytes == 4) return;
  refuse(pf, p.precision_aware_optimizer ? "parallel.precision_aware_optimizer" : "parallel.adam_moment_bytes",
         fmt::format("{} has no setting for Megatron-Core's precision-aware optimizer ({})", trainer, why),
         "export with --to megatron or --to megatron-bridge, or plan without --precision-aware-optimizer and "
         "--adam-moments");
}

void refuse_muon(const PlanFile& pf, std::string_view trainer, std::string_view why) {
  if (pf.plan.optimizer != OptimizerKind::muon) return;
  refuse(pf, "parallel.optimizer", fmt::format("{} has no setting for Megatron-Core's Muon optimizer ({})", trainer, why),
         "export with --to megatron or --to megatron-bridge, or plan with --optimizer adam");
}

void refuse_fp8_attention(const PlanFile& pf, std::string_view trainer, std::string_view why) {
  if (!pf.plan.fp8_attention) return;
  refuse(pf, "parallel.fp8_attention", fmt::format("{} has no setting for FP8 attention ({})", trainer, why),
         "export with --to megatron-bridge, or plan without --fp8-attention");
}

void refuse_ddp_bucket_size(const PlanFile& pf, std::string_view trainer, std::string_view why) {
  if (pf.plan.trainer.ddp_bucket_params <= 0) return;
  refuse(pf, "parallel.trainer.ddp_bucket_size",
         fmt::format("{} has no setting for Megatron-Core's DDP bucket size ({}), and the plan was priced with "
                     "buckets of {} parameters",
                     trainer, why, pf.plan.trainer.ddp_bucket_params),
         "export with --to megatron or --to megatron-bridge, or plan without --ddp-bucket-size");
}

void refuse_recompute_layers(const PlanFile& pf, std::string_view why) {
  const ParallelPlan& p = pf.plan;
  if (!p.recompute_layers_set()) return;
  refuse(pf, p.recompute_method != RecomputeMethod::uniform ? "parallel.recompute_method" : "parallel.recompute_num_layers",
         std::string(why),
         "plan without --recompute-method and --recompute-num-layers, or export with --to megatron, --to "
         "megatron-bridge or --to nemo");
}

void refuse_pipeline_layout(const PlanFile& pf, std::string_view trainer) {
  const ParallelPlan& p = pf.plan;
  if (!has_pipeline_layout(p)) return;
  refuse(pf,
         p.pipeline_layout.empty() ? (p.embedding_in_split ? "parallel.embedding_in_pipeline_split"
                                                           : "parallel.loss_in_pipeline_split")
                                   : "parallel.pipeline_layout",
         fmt::format("{} has no setting for Megatron-Core's pipeline layout (the embedding and the loss counted as "
                     "layers, --pipeline-model-parallel-layout)",
                     trainer),
         "export with --to megatron, or plan without the layout");
}

void refuse_megatron_overlaps(const PlanFile& pf, std::string_view trainer, bool has_cuda_graphs) {
  const TrainerSettings& t = pf.plan.trainer;
  if (t.cuda_graphs.on() && !has_cuda_graphs)
    refuse(pf, "parallel.trainer.cuda_graphs",
           fmt::format("{} has no setting for Megatron-Core's CUDA graphs ({}), and the plan was priced with its "
                       "captured kernels launched without the host",
                       trainer, t.cuda_graphs.str()),
           "export with --to megatron or megatron-bridge, or plan with --cuda-graphs none");
  if (t.tp_comm_overlap)
    refuse(pf, "parallel.trainer.tp_comm_overlap",
           fmt::format("{} has no setting for Transformer Engine's userbuffers TP overlap, and the plan was priced "
                       "with the SP collectives under their GEMMs",
                       trainer),
           "export with --to megatron, megatron-bridge or nemo, or plan with --tp-comm-overlap off");
  if (t.overlap_param_gather && (pf.plan.zero_stage == 1 || pf.plan.zero_stage == 2))
    refuse(pf, "parallel.trainer.overlap_param_gather",
           fmt::format("{} has no setting for Megatron-Core's distributed optimizer gathering the parameters in "
                       "the next forward, and the plan was priced with that gather overlapped",
                       trainer),
           "export with --to megatron, megatron-bridge or nemo, or plan with --overlap-param-gather off");
  refuse_ddp_bucket_size(pf, trainer, "it has no Megatron-Core DDP");
}

McoreQuantization mcore_quantization(Precision p) {
  switch (p) {
    case Precision::fp8_delayed: return {false, "hybrid", "delayed", 1024, "max"};
    case Precision::fp8_current: return {false, "hybrid", "tensorwise", 0, ""};
    case Precision::fp8_blockwise: return {false, "hybrid", "blockwise", 0, ""};
    case Precision::mxfp8: return {false, "e4m3", "mxfp8", 0, ""};
    case Precision::nvfp4: return {true, "e2m1", "nvfp4", 0, ""};
    case Precision::bf16: break;
  }
  throw std::logic_error("mcore_quantization: a bf16 plan has no quantization settings");
}

void refuse_precision(const PlanFile& pf, const std::string& why, const std::string& fix) {
  refuse(pf, "parallel.precision",
         fmt::format("the plan is priced with {} GEMMs, and {}", to_string(pf.plan.precision), why), fix);
}

std::string header(const PlanFile& pf, std::string_view comment, std::string_view target) {
  const ParallelPlan& p = pf.plan;
  // CP and EP only where the plan has them (a plain plan's header reads as before).
  const std::string cp = p.cp > 1 ? fmt::format(" x CP {}", p.cp) : "";
  const std::string ep = p.ep > 1 ? fmt::format(" (experts: EP {} x ETP {})", p.ep, p.expert_tp()) : "";
  return fmt::format(
      "{0} {1} configuration for the cuboid plan in {2} (schema cuboid.plan/1):\n"
      "{0}   {3} on {4}: {5} nodes x {6} {7}; TP {8}{14} x PP {9} x DP {10}{15}, micro-batch {11}, global batch {12} x "
      "{13} tokens\n",
      comment, target, pf.source, pf.model.name, pf.cluster_name, pf.nodes, pf.gpus_per_node, pf.gpu_name, p.tp, p.pp,
      p.dp, p.micro_batch, p.global_batch, p.seq_length, cp, ep);
}

std::int64_t layers_per_virtual_stage(const PlanFile& pf) {
  return pf.model.num_layers / (static_cast<std::int64_t>(pf.plan.pp) * pf.plan.virtual_stages);
}

std::string_view position_embedding_type(const PlanFile& pf, std::string_view trainer) {
  if (pf.model.alibi)
    refuse(pf, "model.alibi",
           fmt::format("{} builds its models on Megatron-Core, which has no ALiBi positions (position_embedding_type "
                       "learned_absolute, rope, yarn, mrope, relative or none: Megatron-LM d98e8a64 "
                       "megatron/training/arguments.py)",
                       trainer),
           "train an ALiBi model such as BLOOM with BigScience's Megatron-DeepSpeed (--position-embedding-type alibi); "
           "--to deepspeed writes its DeepSpeed configuration");
  return pf.model.learned_position_embeddings ? "learned_absolute" : "rope";
}

std::int64_t integral_rope_theta(const PlanFile& pf) {
  const double theta = pf.model.rope_theta;
  if (theta != std::floor(theta))
    refuse(pf, "model.rope_theta", fmt::format("the rotary base {} is not an integer; the trainers take an int", theta),
           "round rope_theta in the model card");
  return static_cast<std::int64_t>(theta);
}

std::string moe_layer_pattern(const ModelSpec& m) {
  if (!m.moe.enabled() || m.moe.moe_layer_count() == m.num_layers) return "";
  std::string out;
  const std::vector<bool>& layers = m.moe.moe_layers;
  for (std::size_t i = 0; i < layers.size();) {
    std::size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) ++j;
    out += fmt::format("{}[{}]*{}", out.empty() ? "" : "+", layers[i] ? 1 : 0, j - i);
    i = j;
  }
  return out;
}

bool megatron_tp_pp_dp(const PlanFile& pf, std::string_view trainer, std::string_view option) {
  // Megatron's rank order is tp-cp-ep-dp-pp; the tp-pp-dp mapping swaps DP and PP
  // (tp-cp-ep-pp-dp). Core's rank map places CP and the experts as both do
  // (RankOrder), so the plan's groups are the ones Megatron builds.
  const ParallelPlan& p = pf.plan;
  const bool tp_pp_dp = p.order.str() == "tp-pp-dp";
  if (!default_rank_order(p) && !tp_pp_dp)
    refuse(pf, "parallel.rank_order",
           fmt::format("{} orders ranks tp-dp-pp (default) or tp-pp-dp ({}), not {}", trainer, option, p.order.str()),
           "plan with --rank-order tp-dp-pp or tp-pp-dp");
  // megatron/core/parallel_state.py@d98e8a64 initialize_model_parallel: with
  // PP > 1 an order that does not end with pp needs the experts' data-parallel
  // size (world / (ETP x EP x PP)) to equal the layers' (world / (TP x CP x PP)).
  if (tp_pp_dp && p.pp > 1 && pf.model.moe.enabled() && p.expert_tp() * p.ep != p.tp * p.cp)
    refuse(pf, "parallel.rank_order",
           fmt::format("{} with {} and PP {} asserts at start-up that the experts' data-parallel size (world / "
                       "(ETP {} x EP {} x PP)) equals the layers' (world / (TP {} x CP {} x PP)) "
                       "(megatron/core/parallel_state.py initialize_model_parallel)",
                       trainer, option, p.pp, p.expert_tp(), p.ep, p.tp, p.cp),
           "plan with --rank-order tp-dp-pp, or with ETP x EP = TP x CP");
  return tp_pp_dp;
}

void refuse_zero1_all_reduce(const PlanFile& pf, std::string_view trainer) {
  const ParallelPlan& p = pf.plan;
  // megatron/core/distributed/param_and_grad_buffer.py:710@d98e8a64 (704@cd4afffa):
  // with the distributed optimizer each bucket is reduce-scattered.
  if (p.zero_stage == 1 && p.dp_cp() > 1 && p.trainer.zero1_grad_all_reduce)
    refuse(pf, "trainer.zero1_grad_all_reduce",
           fmt::format("{} runs ZeRO-1 as Megatron-Core's distributed optimizer, which reduce-scatters the gradients "
                       "(megatron/core/distributed/param_and_grad_buffer.py), and the plan was priced with them "
                       "all-reduced in full (trainer {})",
                       trainer, p.trainer.preset),
           "plan --for this target (it prices Megatron-Core's reduction), or export with --to deepspeed");
}

std::string_view megatron_fsdp_strategy(int zero_stage) {
  // ZeRO-2 / ZeRO-3 are Megatron FSDP's optim_grads / optim_grads_params.
  return zero_stage == 3 ? "optim_grads_params" : "optim_grads";
}

std::vector<McoreSetting> moe_layer_settings(const ModelSpec& m) {
  using Kind = McoreSetting::Kind;
  const MoeSpec& e = m.moe;
  // Megatron-LM arguments.py core_transformer_config_from_args: --num-experts
  // sets num_moe_experts; every other flag is its field's name with dashes.
  std::vector<McoreSetting> out = {
      {"--num-experts", "num_moe_experts", Kind::number, fmt::format("{}", e.num_experts)},
      {"--moe-router-topk", "moe_router_topk", Kind::number, fmt::format("{}", e.experts_per_token)},
      {"--moe-ffn-hidden-size", "moe_ffn_hidden_size", Kind::number, fmt::format("{}", e.expert_ffn_hidden_size)},
  };
  if (std::string pattern = moe_layer_pattern(m); !pattern.empty())
    out.push_back({"--moe-layer-freq", "moe_layer_freq", Kind::list, std::move(pattern)});
  if (e.shared_expert_ffn_hidden_size > 0)
    out.push_back({"--moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size", Kind::number,
                   fmt::format("{}", e.shared_expert_ffn_hidden_size)});
  if (e.shared_expert_gate) out.push_back({"--moe-shared-expert-gate", "moe_shared_expert_gate", Kind::on, ""});
  if (e.capacity_factor > 0)
    out.push_back({"--moe-expert-capacity-factor", "moe_expert_capacity_factor", Kind::number,
                   fmt::format("{}", e.capacity_factor)});
  if (e.router_groups > 0) {
    out.push_back(
        {"--moe-router-num-groups", "moe_router_num_groups", Kind::number, fmt::format("{}", e.router_groups)});
    out.push_back(
        {"--moe-router-group-topk", "moe_router_group_topk", Kind::number, fmt::format("{}", e.router_group_topk)});
  }
  return out;
}

std::vector<McoreSetting> moe_kernel_settings(const ParallelPlan& plan) {
  // Megatron-Core's MoE layer as cuboid prices it: grouped expert GEMMs and
  // the plan's dispatcher; flex with its backend and SMs where not
  // Megatron-Core's defaults (deepep, each backend's SMs:
  // transformer_config.py moe_flex_dispatcher_backend, _num_sms at d98e8a64).
  std::vector<McoreSetting> out = {{"--moe-grouped-gemm", "moe_grouped_gemm", McoreSetting::Kind::on, ""},
                                   {"--moe-token-dispatcher-type", "moe_token_dispatcher_type",
                                    McoreSetting::Kind::word, std::string(to_string(plan.moe_dispatcher))}};
  if (plan.moe_dispatcher == MoeDispatcher::flex && plan.moe_flex.backend != FlexBackend::deepep)
    out.push_back({"--moe-flex-dispatcher-backend", "moe_flex_dispatcher_backend", McoreSetting::Kind::word,
                   std::string(to_string(plan.moe_flex.backend))});
  if (plan.moe_dispatcher == MoeDispatcher::flex && plan.moe_flex.sms > 0)
    out.push_back({"--moe-flex-dispatcher-num-sms", "moe_flex_dispatcher_num_sms", McoreSetting::Kind::number,
                   fmt::format("{}", plan.moe_flex.sms)});
  // HybridEP's static budget, with the Transformer Engine op fuser it needs
  // (transformer_config.py:1875-1883 at d98e8a64: the op fuser or grouped
  // tensors; the paged stash runs in the op fuser's expert path only,
  // experts.py:766-828), and the paged stash with its buffer factor where
  // not Megatron-Core's 1.10 (transformer_config.py:1364-1374).
  if (plan.moe_dispatcher == MoeDispatcher::flex && plan.moe_flex.rank_capacity_factor > 0) {
    out.push_back({"--moe-expert-rank-capacity-factor", "moe_expert_rank_capacity_factor", McoreSetting::Kind::number,
                   fmt::format("{}", plan.moe_flex.rank_capacity_factor)});
    out.push_back({"--use-transformer-engine-op-fuser", "use_transformer_engine_op_fuser", McoreSetting::Kind::on, ""});
    if (plan.moe_flex.paged_stash) {
      out.push_back({"--moe-paged-stash", "moe_paged_stash", McoreSetting::Kind::on, ""});
      if (plan.moe_flex.stash_buffer_factor != FlexSetting{}.stash_buffer_factor)
        out.push_back({"--moe-paged-stash-buffer-size-factor-cuda", "moe_paged_stash_buffer_size_factor_cuda",
                       McoreSetting::Kind::number, fmt::format("{}", plan.moe_flex.stash_buffer_factor)});
    }
  }
  // The EP overlap: the combined 1F1B schedule, with the delayed weight
  // gradients where priced with them (model_parallel_config.py lines 343 and
  // 348 at d98e8a64; cd4afffa, Megatron-Bridge v0.6.0's, has both too).
  if (plan.moe_ep_overlap) {
    out.push_back({"--overlap-moe-expert-parallel-comm", "overlap_moe_expert_parallel_comm", McoreSetting::Kind::on, ""});
    if (plan.moe_delay_wgrad)
      out.push_back({"--delay-wgrad-compute", "delay_wgrad_compute", McoreSetting::Kind::on, ""});
  }
  return out;
}

std::string launch_lines(const PlanFile& pf, std::string_view script_and_args, std::string_view comment,
                         SlurmLines slurm) {
  const bool run = slurm == SlurmLines::run;
  const std::string_view word = host_word(pf);
  return fmt::format(
      "{3} torchrun on each of the {0} {7}s (NODE_RANK 0..{1}, MASTER_ADDR = {7} 0):\n"
      "{3}   torchrun --nnodes {0} --nproc_per_node {2} --node_rank \"$NODE_RANK\" --master_addr \"$MASTER_ADDR\" "
      "--master_port 6000 {4}\n"
      "{3} Slurm: one torchrun per {7}, rendezvous on the first {7}{5}\n"
      "{6}MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
      "{6}srun --nodes {0} --ntasks-per-node 1 torchrun --nnodes {0} --nproc_per_node {2} --rdzv_backend c10d "
      "--rdzv_endpoint \"$MASTER_ADDR:6000\" --rdzv_id \"$SLURM_JOB_ID\" {4}\n",
      pf.hosts(), pf.hosts() - 1, pf.host_gpus(), comment, script_and_args, run ? "." : ":",
      run ? std::string() : fmt::format("{}   ", comment), word);
}

std::string_view host_word(const PlanFile& pf) { return pf.gpus_per_host > 0 ? "host" : "node"; }

}  // namespace exporters

namespace {

struct Entry {
  ExportTarget target;
  ExportResult (*run)(const PlanFile&);
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"megatron", "Megatron-LM", "main at d98e8a64 (2026)", "sh", "pretrain_gpt.py arguments and torchrun / srun lines"},
       exporters::megatron},
      {{"megatron-bridge", "Megatron-Bridge", "v0.6.0", "py",
        "a Python ConfigContainer script (NeMo 2's successor for LLM training)"},
       exporters::megatron_bridge},
      {{"deepspeed", "DeepSpeed", "v0.16.4", "json",
        "ds_config.json; the PipelineModule arguments and the launch line on stderr"},
       exporters::deepspeed},
      {{"torchtitan", "torchtitan", "v0.2.2", "txt", "--job.config_file overrides and the same TOML tables"},
       exporters::torchtitan_v02},
      {{"torchtitan-main", "torchtitan", "main at b5bcd76c (2026)", "py",
        "none: refuses every plan (FlexAttention with per-document masks, not the causal attention priced)"},
       exporters::torchtitan_main},
      {{"nemo", "NeMo", "1.x YAML (NeMo 8cfedd72)", "yaml", "a megatron_gpt_config.yaml overlay (Hydra)"},
       exporters::nemo1},
  };
  return kEntries;
}

}  // namespace

const std::vector<ExportTarget>& export_target_list() {
  static const std::vector<ExportTarget> kList = [] {
    std::vector<ExportTarget> out;
    for (const Entry& e : entries()) out.push_back(e.target);
    return out;
  }();
  return kList;
}

const std::vector<std::string>& export_targets() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> out;
    for (const Entry& e : entries()) out.emplace_back(e.target.name);
    return out;
  }();
  return kNames;
}

ExportResult export_plan(const PlanFile& pf, std::string_view target) {
  for (const Entry& e : entries()) {
    if (e.target.name != target) continue;
    // YaRN changes no cost, but a trainer must build the same model: the
    // Megatron-LM export writes it for multi-latent attention (the only
    // target that builds MLA); others refuse MLA themselves.
    if (pf.model.rope_yarn && !pf.model.mla.enabled())
      exporters::refuse(pf, "model.rope_scaling_type",
             "the model uses YaRN rope scaling on standard attention, which no export writes yet (Megatron-LM's "
             "--position-embedding-type yarn and its --yarn-* flags are not among the pinned options)",
             "drop rope_scaling_type and rope_scaling_factor from the card to export without the scaling");
    return e.run(pf);
  }
  std::string names;
  const auto& all = export_targets();
  for (std::size_t i = 0; i < all.size(); ++i)
    names += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i];
  throw InputError("command line", "--to", "unknown export target \"" + std::string(target) + "\"", "use " + names);
}

}  // namespace cuboid
