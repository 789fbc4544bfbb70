#include "plan_words.hpp"

#include "cuboid/core/trainer.hpp"

namespace cuboid::cli {

namespace {

using K = PlanCheck;
using R = Rejection::Kind;

const std::string kOtherTrainer = "drop it, or choose a --trainer that has it";

std::string zero_stages(std::int64_t mask) {
  std::string stages;
  for (int z = 0; z < 4; ++z)
    if ((mask >> z) & 1) stages += (stages.empty() ? "" : ", ") + std::to_string(z);
  return stages;
}

std::string known_trainers_fix() { return "use one of " + trainer_names() + " (cuboid plan --help)"; }

// The fixes of check_plan's refusals that flag_fix leaves to it, or "" for the others.
std::string plain_fix(const PlanRejection& r) {
  switch (r.kind) {
    case K::not_positive: return "give a value >= 1";
    case K::zero_stage_range: return "use 0, 1, 2 or 3";
    case K::tp_heads: return "choose a TP that divides the number of heads";
    case K::tp_kv_heads: return "choose a TP that divides the number of key/value heads";
    case K::tp_ffn: return "choose a TP that divides the FFN size";
    case K::cp_needs_flash: return "turn flash attention on, or use CP 1";
    case K::cp_chunks: return "choose a CP for which 2 x CP divides the sequence length";
    case K::cp_sp_tokens: return "choose CP and TP so that TP divides sequence length / CP";
    case K::cp_comm_needs_cp: return "use --cp 2 (or more), or drop --cp-comm-type";
    case K::cp_a2a_heads: return "use the p2p ring, or a CP that divides the key/value heads per TP rank";
    case K::ep_needs_moe: return r.field == PlanField::etp ? "drop --etp" : "drop EP / ETP (use EP 1)";
    case K::ep_experts: return "choose an EP that divides the number of experts";
    case K::etp_not_1_or_tp: return "use ETP 1 or ETP = TP";
    case K::etp_ffn: return "choose an ETP that divides the experts' FFN size";
    case K::tp_shared_ffn: return "choose a TP that divides the shared experts' FFN size";
    case K::ep_fold: return "choose EP and ETP whose product divides TP x CP x DP";
    case K::moe_zero3:
    case K::mla_zero3: return "use ZeRO 0-2, or --trainer megatron-core (Megatron-FSDP) for ZeRO 3";
    case K::moe_needs_sp: return "turn sequence parallelism on";
    case K::mla_cp: return "use CP 1 for a latent-attention model";
    case K::precision_no_fp8:
    case K::precision_no_fp4: return "use --precision bf16, or a cluster card whose GPU has those tensor cores";
    case K::precision_no_microscaling:
      return "use --precision fp8-current (or fp8-delayed, fp8-blockwise) on this GPU, or a Blackwell cluster card";
    case K::param_gather_needs_fp8: return "add --precision fp8-delayed (or another FP8 recipe), or drop --fp8-param-gather";
    case K::param_gather_needs_dist_opt: return "use --zero 1 (Megatron's distributed optimizer) or 3 (Megatron-FSDP), or drop --fp8-param-gather";
    case K::moments_need_precision_aware: return "add --precision-aware-optimizer, or drop --adam-moments";
    case K::fp8_attention_recipe: return "use --precision fp8-current, fp8-delayed or mxfp8, or drop --fp8-attention";
    case K::fp8_attention_cudnn:
      return "use --flash-attention on with --attention-kernel cudnn (auto on Hopper and Blackwell), or drop --fp8-attention";
    case K::fp8_attention_cp: return "use --cp 1, or drop --fp8-attention";
    case K::fp8_attention_rates: return "drop --fp8-attention (bf16 attention), or a cluster card whose GPU profile has those rates";
    case K::stage_layers_negative: return "give positive layer counts";
    case K::uneven_rest:
      return "choose first/last stage layers so that the remaining layers divide by the middle stages";
    case K::uneven_chunks:
      return "choose first/last stage layers and virtual stages so that every stage's layers divide by the virtual "
             "stages";
    case K::batch_split: return "choose a global batch that is a multiple of " + std::to_string(r.values[1]);
    case K::trainer_unknown: return known_trainers_fix();
    case K::trainer_no_pipeline: return "use --pp 1, or " + kOtherTrainer;
    case K::trainer_no_sp: return "use --sequence-parallel off, or " + kOtherTrainer;
    case K::trainer_no_selective: return "use --recompute full or none";
    case K::trainer_no_interleaved: return "use --schedule 1f1b (or gpipe) without --vpp";
    case K::trainer_no_flash: return "use --flash-attention off, or " + kOtherTrainer;
    case K::trainer_no_grad_accum_fusion: return "use --grad-accum-fusion off, or " + kOtherTrainer;
    case K::trainer_no_cp:
      return r.field == PlanField::cp_comm ? "drop --cp-comm-type, or choose a --trainer that has CP"
                                           : "use --cp 1, or " + kOtherTrainer;
    case K::trainer_no_cp_a2a: return "use --cp-comm-type p2p, or " + kOtherTrainer;
    case K::trainer_no_ep: return "use --ep 1 without --etp, or " + kOtherTrainer;
    case K::trainer_no_dispatcher: return "use --moe-dispatcher alltoall, or --trainer megatron-core";
    case K::dispatcher_needs_moe: return "drop --moe-dispatcher";
    case K::trainer_no_ep_overlap: return "use --moe-ep-overlap off, or --trainer megatron-core";
    case K::ep_overlap_refused: return "use --moe-ep-overlap off";
    case K::moe_static_refused:
      switch (static_cast<MoeStaticRefusal>(r.values[0])) {
        case MoeStaticRefusal::needs_moe: return "drop --moe-rank-capacity-factor and --moe-paged-stash";
        case MoeStaticRefusal::needs_hybridep:
          return "add --moe-dispatcher flex --moe-flex-backend hybridep, or drop --moe-rank-capacity-factor";
        case MoeStaticRefusal::stash_needs_factor: return "add --moe-rank-capacity-factor (e.g. 1.5), or drop --moe-paged-stash";
        case MoeStaticRefusal::stash_with_offload: return "drop --offload-activations, or use --moe-paged-stash off";
        case MoeStaticRefusal::stash_with_moe_offload:
          return "drop expert_fc1 and moe_act from --offload-modules, or use --moe-paged-stash off";
        case MoeStaticRefusal::over_budget:
          return "give a --moe-rank-capacity-factor of at least the busiest rank's load (--moe-imbalance), or drop it";
      }
      return "";
    case K::cuda_graph_module_refused:
      switch (static_cast<CudaGraphRefusal>(r.values[0])) {
        case CudaGraphRefusal::full_recompute: return "use --cuda-graphs full_iteration, or --recompute selective or none";
        case CudaGraphRefusal::graphed_attn_dropout:
        case CudaGraphRefusal::graphed_hidden_dropout:
          return "name modules in --cuda-graphs that leave the recomputed ones out, or choose other --recompute-modules";
        default:
          return "name other modules in --cuda-graphs (e.g. transformer_engine:attn,moe_router,moe_preprocess)";
      }
    case K::trainer_no_zero_stage: return "use --zero " + zero_stages(r.values[2]);
    case K::trainer_even_stages: return "choose a PP that divides the layers";
    case K::trainer_no_fp8: return "use --precision bf16, or --trainer megatron-core";
    case K::trainer_no_kernel: return "use --attention-kernel with a kernel the trainer calls, or " + kOtherTrainer;
    case K::gpu_no_kernel: return "use --attention-kernel auto or a kernel the GPU profile has rates for";
    case K::kernel_needs_flash: return "drop --flash-attention off, or use --attention-kernel unfused";
    case K::trainer_no_recompute_modules: return "drop --recompute-modules, or use --trainer megatron-core";
    case K::recompute_modules_need_selective: return "use --recompute selective, or drop --recompute-modules";
    case K::recompute_module_refused: return "drop that module from --recompute-modules";
    case K::trainer_no_recompute_layers:
      return "drop --recompute-method and --recompute-num-layers, or use --trainer megatron-core";
    case K::recompute_layers_need_full:
      return "use --recompute full, or drop --recompute-method and --recompute-num-layers";
    case K::trainer_no_offload:
      if (r.field == PlanField::offload_modules) return "drop --offload-modules, or use --trainer megatron-core";
      return "drop --offload-activations, or use --trainer megatron-core";
    case K::offload_layers_range:
      return "give --offload-activations 1 to " + std::to_string(r.values[1] - 1) + ", or drop it";
    case K::offload_needs_one_stage: return "use --pp 1, or drop --offload-activations";
    case K::offload_with_recompute: return "use --recompute none, or drop --offload-activations";
    case K::offload_with_layer_graphs: return "use --cuda-graphs full_iteration or none, or drop --offload-activations";
    case K::offload_no_host_link:
      if (r.field == PlanField::offload_modules) return "add host_link to the cluster card, or drop --offload-modules";
      return "add host_link to the cluster card, or drop --offload-activations";
    case K::offload_modules_with_layers: return "drop --offload-activations or --offload-modules";
    case K::offload_proj_without_core: return "add core_attn to --offload-modules, or drop attn_proj";
    case K::offload_in_recomputed_moe: return "drop that module from --offload-modules, or moe from --recompute-modules";
    case K::offload_modules_graphs: return "use --cuda-graphs transformer_engine (without moe) or none, or drop --offload-modules";
    case K::trainer_even_chunks:
      return "drop --vpp (1F1B with uneven stages), or choose a PP x virtual stages that divides the layers";
    case K::interleaved_batches:
      return "choose a global batch that is a multiple of micro-batch x DP x PP = " + std::to_string(r.values[2]);
    case K::trainer_no_layout:
      return "drop --account-for-*-in-pipeline-split and --pipeline-model-parallel-layout, or use --trainer "
             "megatron-core";
    case K::layout_with_uneven: return "drop --first-stage-layers and --last-stage-layers";
    case K::layout_with_counted: return "drop --account-for-*-in-pipeline-split: the layout places E and L";
    case K::counted_split:
      return "choose PP x virtual stages that divides " + std::to_string(r.values[1]) + ", or drop the counted layers";
    case K::layout_stages: return "give PP x virtual stages entries in the layout, | between them";
    case K::layout_layers: return "give the layout " + std::to_string(r.values[1]) + " decoder layers t";
    case K::layout_mtp: return "give the layout " + std::to_string(r.values[1]) + " MTP modules m, in its last virtual stage";
    case K::trainer_no_cuda_graphs: return "use --cuda-graphs none, or --trainer megatron-core";
    case K::trainer_no_tp_comm_overlap: return "use --tp-comm-overlap off, or --trainer megatron-core";
    case K::trainer_no_overlap_param_gather: return "use --overlap-param-gather off, or --trainer megatron-core";
    case K::trainer_no_param_gather_in_step:
      return "use --overlap-param-gather-with-optimizer-step off, or --trainer megatron-core";
    case K::trainer_no_ddp_bucket_size: return "drop --ddp-bucket-size (the trainer's own buckets), or use --trainer megatron-core";
    case K::trainer_no_dp_grad_bytes:
      return "drop --grad-reduce-dtype (the trainer's own dtype), or use --trainer megatron-core";
    case K::trainer_no_fsdp_grad_bytes:
      return "drop --fsdp-grad-dtype (--grad-reduce-dtype sets this trainer's), or use --trainer megatron-core";
    case K::trainer_no_precision_aware:
      return "drop --precision-aware-optimizer and --adam-moments, or use --trainer megatron-core";
    case K::trainer_no_fp8_attention: return "drop --fp8-attention, or use --trainer megatron-core";
    case K::trainer_no_muon: return "use --optimizer adam, or --trainer megatron-core";
    case K::muon_refused:
      switch (static_cast<MuonRefusal>(r.values[0])) {
        case MuonRefusal::zero_stage: return "use --zero 0 or 1 with --optimizer muon, or --optimizer adam";
        case MuonRefusal::precision_aware: return "drop --precision-aware-optimizer, or use --optimizer adam";
        case MuonRefusal::param_gather_in_step:
          return "use --overlap-param-gather-with-optimizer-step off, or --optimizer adam";
      }
      return "";
    case K::tp_overlap_needs_sp: return "use --tp 2 (or more) with --sequence-parallel on, or --tp-comm-overlap off";
    case K::param_overlap_needs_dist_opt: return "use --zero 1 or 2, or --overlap-param-gather off";
    case K::param_overlap_needs_grad_overlap: return "use --dp-overlap on, or --overlap-param-gather off";
    case K::param_gather_in_step_needs:
      return r.values[0] == 0 ? "use --overlap-param-gather on, or --overlap-param-gather-with-optimizer-step off"
                              : "use --vpp 2 (or more), or --overlap-param-gather-with-optimizer-step off";
    default: return "";
  }
}

// The flag and the fix of a refusal of the options (not Kind::plan).
std::pair<std::string, std::string> option_words(const Rejection& r) {
  switch (r.kind) {
    case R::unknown_trainer: return {"--trainer", known_trainers_fix()};
    case R::fixed_not_dividing_gpus: {
      const char* size = r.field == PlanField::tp   ? "TP"
                         : r.field == PlanField::pp ? "PP"
                         : r.field == PlanField::dp ? "DP"
                                                    : "CP";
      return {std::string(flag_of(r.field)), "choose a " + std::string(size) + " that divides the GPU count"};
    }
    case R::no_uneven_split:
      return {"--uneven-stages", "give --first-stage-layers and --last-stage-layers, or choose another PP" +
                                     std::string(r.values[2] > 1 ? " or --vpp" : "")};
    default: return {std::string(flag_of(r.plan.field)), flag_fix(r.plan)};
  }
}

}  // namespace

std::string_view flag_of(PlanField field) {
  switch (field) {
    case PlanField::tp: return "--tp";
    case PlanField::pp: return "--pp";
    case PlanField::dp: return "--dp";
    case PlanField::cp: return "--cp";
    case PlanField::cp_comm: return "--cp-comm-type";
    case PlanField::ep: return "--ep";
    case PlanField::etp: return "--etp";
    case PlanField::micro_batch: return "--micro-batch";
    case PlanField::global_batch: return "--global-batch";
    case PlanField::seq_length: return "--seq-length";
    case PlanField::virtual_stages: return "--vpp";
    case PlanField::zero_stage: return "--zero";
    case PlanField::schedule: return "--schedule";
    case PlanField::sequence_parallel: return "--sequence-parallel";
    case PlanField::flash_attention: return "--flash-attention";
    case PlanField::uneven_stages: return "--uneven-stages";
    case PlanField::world_size: return "--tp/--pp/--dp";
    case PlanField::recompute: return "--recompute";
    case PlanField::grad_accum_fusion: return "--grad-accum-fusion";
    case PlanField::trainer: return "--trainer";
    case PlanField::precision: return "--precision";
    case PlanField::fp8_param_gather: return "--fp8-param-gather";
    case PlanField::attention_kernel: return "--attention-kernel";
    case PlanField::recompute_modules: return "--recompute-modules";
    case PlanField::pipeline_layout: return "--pipeline-model-parallel-layout";
    case PlanField::moe_dispatcher: return "--moe-dispatcher";
    case PlanField::cuda_graphs: return "--cuda-graphs";
    case PlanField::tp_comm_overlap: return "--tp-comm-overlap";
    case PlanField::overlap_param_gather: return "--overlap-param-gather";
    case PlanField::moe_ep_overlap: return "--moe-ep-overlap";
    case PlanField::offload_layers: return "--offload-activations";
    case PlanField::offload_modules: return "--offload-modules";
    case PlanField::recompute_method: return "--recompute-method";
    case PlanField::recompute_num_layers: return "--recompute-num-layers";
    case PlanField::dp_grad_bytes: return "--grad-reduce-dtype";
    case PlanField::fsdp_grad_bytes: return "--fsdp-grad-dtype";
    case PlanField::moe_rank_capacity_factor: return "--moe-rank-capacity-factor";
    case PlanField::moe_paged_stash: return "--moe-paged-stash";
    case PlanField::precision_aware_optimizer: return "--precision-aware-optimizer";
    case PlanField::adam_moment_bytes: return "--adam-moments";
    case PlanField::fp8_attention: return "--fp8-attention";
    case PlanField::overlap_param_gather_with_optimizer_step: return "--overlap-param-gather-with-optimizer-step";
    case PlanField::ddp_bucket_size: return "--ddp-bucket-size";
    case PlanField::optimizer: return "--optimizer";
  }
  return "--tp/--pp/--dp";
}

std::string flag_fix(const PlanRejection& r) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::seq_over_max: return "use --seq-length <= " + std::to_string(v[1]);
    case K::uneven_needs_pp: return "use --pp >= 2 or an even split";
    case K::layers_split:
      return v[1] > 1 ? "choose PP x virtual stages that divides the number of layers"
                      : "choose PP x virtual stages that divides the number of layers, or add --uneven-stages";
    case K::interleaved_needs_v: return "add --vpp 2 (or more), or use --schedule 1f1b";
    case K::v_needs_interleaved: return "add --schedule interleaved, or drop --vpp";
    case K::v_needs_pp: return "drop --vpp or use --pp >= 2";
    case K::sp_needs_tp: return "use --sequence-parallel off with TP 1";
    case K::world_over_gpus: return "use fewer GPUs or more nodes (--nodes N)";
    case K::world_not_gpus:
      return std::string("make ") + (v[2] > 1 ? "TP x CP x PP x DP" : "TP x PP x DP") +
             " equal the GPU count, or set --nodes so the cluster has exactly that many GPUs";
    default: return plain_fix(r);
  }
}

InputError worded(const PlanRejected& refused) {
  const auto [flag, fix] = option_words(refused.rejection());
  return InputError(refused.source(), flag, refused.problem(), fix);
}

std::map<std::string, std::int64_t> skip_reasons(const SearchResult& result, const ModelSpec& model,
                                                 const Cluster& cluster, const PlannerOptions& options,
                                                 const std::optional<std::string>& for_target) {
  std::map<std::string, std::int64_t> lines;
  for (const auto& [why, count] : result.skips) {
    std::string line;
    switch (why.kind) {
      case R::plan:
        line = "invalid for " + std::string(flag_of(why.field)) + ": " + describe(why.plan, model, cluster);
        break;
      case R::pp_not_dividing_layers: line = describe(why, model, cluster, options) + " (allow --uneven-stages)"; break;
      case R::not_accepted:
        line = for_target.value_or("") + " cannot express it (--for " + for_target.value_or("") + ")";
        break;
      default: line = describe(why, model, cluster, options);
    }
    lines[line] += count;
  }
  return lines;
}

}  // namespace cuboid::cli
