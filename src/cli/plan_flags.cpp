#include "plan_flags.hpp"

#include "cuboid/core/pipeline_layout.hpp"
#include "plan_words.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <type_traits>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/report/report.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"

namespace cuboid::cli {

void add_plan_flags(CLI::App* cmd, PlanFlags& f, bool search, bool with_plan_file) {
  cmd->add_option("--model", f.model_path, "model card (models/*.json) or a HuggingFace config.json");
  cmd->add_option("--cluster", f.cluster_path,
                  with_plan_file ? "cluster card (topologies/*.json); with --plan: default the card the plan names"
                                 : "cluster card (topologies/*.json)");
  if (with_plan_file)
    cmd->add_option("--plan", f.plan_path, "a plan file written by `cuboid plan --out` (instead of --model and the dimensions)");
  cmd->add_option("--nodes", f.nodes, "use N nodes of the cluster card (default: the card's node count)");
  cmd->add_option("--gpus-per-node", f.gpus_per_node,
                  "use G of each node's GPUs, with their share of its NICs (default: all; e.g. 64 for 16 of a GB200 "
                  "NVL72 rack's 18 trays)");
  cmd->add_option("--global-batch", f.global_batch, "sequences per iteration (default: ~4M tokens, at most 16 sequences per GPU, divisible by every DP size)");
  cmd->add_option("--seq-length", f.seq_length, "tokens per sequence (default: the model card's seq_length)");
  const char* fix = search ? "fix it (default: searched)" : "set it";
  cmd->add_option("--tp", f.tp, fmt::format("tensor-parallel size; {}", fix));
  cmd->add_option("--pp", f.pp, fmt::format("pipeline-parallel size; {}", fix));
  cmd->add_option("--dp", f.dp, fmt::format("data-parallel size; {} (default: GPUs / (TP x CP x PP))", fix));
  cmd->add_option("--cp", f.cp,
                  search ? "context-parallel size: each sequence split over CP ranks (Megatron's "
                           "--context-parallel-size); fix it (default: searched where the trainer has it)"
                         : "context-parallel size: each sequence split over CP ranks (default 1)");
  cmd->add_option("--cp-comm-type", f.cp_comm,
                  "how CP exchanges keys and values: p2p (a ring under the attention, Megatron's default) or a2a "
                  "(all-to-all of Q, K, V and the output)");
  cmd->add_option("--ep", f.ep,
                  search ? "expert-parallel size of a mixture-of-experts model: each MoE layer's experts split over "
                           "EP ranks (Megatron's --expert-model-parallel-size); fix it (default: searched where the "
                           "trainer has it)"
                         : "expert-parallel size of a mixture-of-experts model (default 1)");
  cmd->add_option("--moe-dispatcher", f.moe_dispatcher,
                  std::string("how an MoE layer's tokens reach their experts (Megatron-Core's "
                              "--moe-token-dispatcher-type): alltoall, allgather or flex (DeepEP across nodes, "
                              "HybridEP inside an NVLink domain); default: ") +
                      (search ? "each the trainer has, searched where EP > 1" : "the trainer's first"));
  cmd->add_option("--moe-flex-backend", f.moe_flex_backend,
                  "the flex dispatcher's kernels (Megatron-Core's --moe-flex-dispatcher-backend): deepep (default) or "
                  "hybridep (NVIDIA's, its first level the whole NVLink domain: an NVL72 rack)");
  cmd->add_option("--moe-flex-sms", f.moe_flex_sms,
                  "SMs the flex dispatcher's kernels take (Megatron-Core's --moe-flex-dispatcher-num-sms; default: "
                  "DeepEP 20, HybridEP 24 inside one NVLink domain, 8 across)");
  cmd->add_option("--moe-rank-capacity-factor", f.moe_rank_capacity_factor,
                  "HybridEP's static receive budget per EP rank: its tokens x top-k x this factor, the expert "
                  "activations that size, no host sync (Megatron-Core's --moe-expert-rank-capacity-factor; needs "
                  "--moe-dispatcher flex --moe-flex-backend hybridep; default: none, dropless)");
  cmd->add_option("--moe-paged-stash", f.moe_paged_stash,
                  "copy the experts' saved activations at their real size into one paged buffer instead of keeping "
                  "the budget's padded tensors (Megatron-Core's --moe-paged-stash; needs "
                  "--moe-rank-capacity-factor): on|off (default off)");
  cmd->add_option("--moe-paged-stash-buffer-factor", f.moe_paged_stash_buffer_factor,
                  "the paged stash's GPU buffer over the in-flight tokens: positive, of the average (budget / factor); "
                  "negative, of the real ones (Megatron-Core's --moe-paged-stash-buffer-size-factor-cuda; default "
                  "1.1)");
  cmd->add_option("--moe-ep-overlap", f.moe_ep_overlap,
                  "overlap each EP all-to-all with another micro-batch's compute in Megatron-Core's combined 1F1B "
                  "schedule (--overlap-moe-expert-parallel-comm --delay-wgrad-compute; EP > 1, alltoall or flex, PP "
                  "1 or interleaved): on|off (default: the trainer's, off for megatron-core)");
  cmd->add_option("--moe-delay-wgrad", f.moe_delay_wgrad,
                  "with --moe-ep-overlap on: each module's weight gradient delayed to a node of its own, the "
                  "dispatch's gradient under the experts' (Megatron-Core --delay-wgrad-compute): on|off (default on)");
  cmd->add_option("--etp", f.etp,
                  "expert tensor-parallel size: each expert's FFN split over ETP ranks, 1 or TP (Megatron's "
                  "--expert-tensor-parallel-size; default TP" +
                      std::string(search ? ", searched with 1" : "") + ")");
  cmd->add_option("--micro-batch", f.micro_batch, fmt::format("sequences per micro-batch; {}", fix));
  cmd->add_option("--vpp", f.vpp, fmt::format("virtual pipeline stages per GPU (interleaved 1F1B); {}", fix));
  cmd->add_option("--zero", f.zero, fmt::format("ZeRO stage 0-3 (1 = Megatron's distributed optimizer); {}", fix));
  cmd->add_option("--recompute", f.recompute, "activation recomputation: none|selective|full");
  cmd->add_option("--recompute-modules", f.recompute_modules,
                  "with selective recomputation, the modules it re-runs, comma-separated: core_attn, mlp, layernorm, "
                  "moe_act, moe, shared_experts, mla_up_proj (Megatron-Core's --recompute-modules; default core_attn; "
                  "implies --recompute selective)");
  cmd->add_option("--recompute-method", f.recompute_method,
                  "with full recomputation, which layers of each model chunk: uniform (all, in checkpoint groups of "
                  "--recompute-num-layers) or block (the first --recompute-num-layers, the rest stored); "
                  "Megatron-Core's --recompute-method; default uniform; implies --recompute full");
  cmd->add_option("--recompute-num-layers", f.recompute_num_layers,
                  "with full recomputation, the layers per checkpoint group (uniform) or recomputed per model chunk "
                  "(block); Megatron-Core's --recompute-num-layers; default 1; implies --recompute full");
  cmd->add_option("--sequence-parallel", f.sequence_parallel, "sequence parallelism with TP: on|off");
  cmd->add_option("--schedule", f.schedule, "pipeline schedule: gpipe|1f1b|interleaved");
  cmd->add_option("--flash-attention", f.flash_attention, "fused attention core: on|off (default: on where the device has it, see the GPU profile's flash_attention)");
  cmd->add_option("--attention-kernel", f.attention_kernel,
                  "the attention core's kernel: auto|unfused|flash1|flash2|flash3|cudnn (default auto: the trainer "
                  "preset's, else the GPU profile's attention_kernel; unfused = --flash-attention off)");
  cmd->add_option("--trainer", f.trainer,
                  "the trainer and version the plan runs in, which sets what it can run and how (overlap, fusion, "
                  "gradient dtype): " + trainer_names() + " (default megatron-core; docs/cli.md#trainers)");
  cmd->add_option("--grad-accum-fusion", f.grad_accum_fusion,
                  "Megatron's gradient-accumulation fusion: on = wgrad GEMMs accumulate into the fp32 main_grad "
                  "(Megatron-LM's default since 2022); off = a separate main_grad.add_ per parameter and micro-batch "
                  "(Megatron-LM before March 2022, DeepSpeed, FSDP): on|off (default: the trainer's)");
  cmd->add_option("--precision", f.precision,
                  "format of the linear layers' GEMMs, as Transformer Engine's recipes run them (attention, "
                  "embedding and LM head stay bf16): " + precision_names() + " (default bf16" +
                      std::string(search ? ", not searched" : "") + "; docs/cost-model.md#fp8)");
  cmd->add_flag("--fp8-param-gather", f.fp8_param_gather,
                "keep the FP8 layers' weights in FP8 only and all-gather them in FP8 (Megatron-Core's "
                "--fp8-param-gather; needs an FP8 --precision and the distributed optimizer, --zero 1 or 2, or "
                "Megatron-FSDP, --zero 3)");
  cmd->add_flag("--fp8-attention", f.fp8_attention,
                "run the attention core in cuDNN's FP8 kernels (Megatron-Core's --fp8-dot-product-attention): "
                "per-tensor with --precision fp8-delayed or fp8-current, MXFP8 with mxfp8; cuDNN's fused attention, "
                "CP 1, on a GPU whose profile has cuDNN's measured FP8 rates (docs/cost-model.md#fp8-attention)");
  cmd->add_flag("--precision-aware-optimizer", f.precision_aware_optimizer,
                "let Transformer Engine's FusedAdam hold the optimizer's states (Megatron-Core's "
                "--use-precision-aware-optimizer): on a bf16 plan the master weights are kept as 16-bit "
                "remainders of the bf16 weights and the gradients read where the buffer keeps them "
                "(megatron-core only; docs/cost-model.md#the-precision-aware-optimizer)");
  cmd->add_option("--adam-moments", f.adam_moments,
                  "the dtype of Adam's two moments: fp32 (default) or bf16 (Megatron-Core's --exp-avg-dtype and "
                  "--exp-avg-sq-dtype; bf16 needs --precision-aware-optimizer); not searched");
  cmd->add_option("--optimizer", f.optimizer,
                  "the optimizer: adam (default) or muon (Megatron-Core's Muon: Newton-Schulz orthogonalisation of "
                  "each 2-D weight, Adam on the embedding, the LM head and 1-D parameters; with --zero 1 its layer-wise "
                  "distributed optimizer, Megatron-Bridge's dist_muon; megatron-core only); not searched");
  cmd->add_option("--offload-activations", f.offload_activations,
                  "offload the activations of the first N decoder layers to host memory and reload them for the "
                  "backward (Megatron-Core's --cpu-offloading-num-layers; PP 1, implies --recompute none; the "
                  "cluster card's host_link prices the copies; default: none)");
  cmd->add_option("--offload-modules", f.offload_modules,
                  "offload the saved tensors of these modules to host memory after their forward and reload them "
                  "for their backward, comma-separated: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, "
                  "expert_fc1, moe_act (Megatron-Core's --fine-grained-activation-offloading --offload-modules; "
                  "the cluster card's host_link prices the copies; docs/cost-model.md#fine-grained-activation-"
                  "offloading; default: none)");
  cmd->add_option("--dp-overlap", f.dp_overlap,
                  "overlap the DP gradient reduction with the last backward (Megatron --overlap-grad-reduce, torch "
                  "DDP, FSDP): on|off (default: the trainer's)");
  cmd->add_option("--grad-reduce-dtype", f.grad_reduce_dtype,
                  "the dtype the DP gradients are kept and reduced in: fp32 or bf16 (Megatron's --grad-reduce-in-bf16, "
                  "Megatron-Bridge's grad_reduce_in_fp32 = False; megatron-core only); default: the trainer's, fp32 "
                  "for megatron-core's DDP; not searched");
  cmd->add_option("--fsdp-grad-dtype", f.fsdp_grad_dtype,
                  "the dtype Megatron-FSDP (ZeRO 2 / 3 in megatron-core) keeps and reduce-scatters the gradients in: "
                  "bf16 (its default, --megatron-fsdp-main-grads-dtype auto: the parameters' dtype) or fp32; "
                  "--grad-reduce-dtype does not reach it; not searched");
  cmd->add_option("--cuda-graphs", f.cuda_graphs,
                  "Megatron-Core's CUDA graphs, whose captured kernels pay no host launch: none | full_iteration (one "
                  "graph of the forward-backward, --cuda-graph-impl full_iteration) | local | transformer_engine "
                  "(per-layer graphs), the last two optionally :MODULES, a comma-separated list of attn, mlp, moe, "
                  "moe_router, moe_preprocess, mamba (--cuda-graph-modules) "
                  "(default: the trainer's; docs/cost-model.md#cuda-graphs)");
  cmd->add_option("--tp-comm-overlap", f.tp_comm_overlap,
                  "overlap the SP all-gathers and reduce-scatters with the linear layers' GEMMs as Transformer "
                  "Engine's userbuffers do (Megatron-Core --tp-comm-overlap; needs TP > 1 and sequence parallelism): "
                  "on|off (default: the trainer's)");
  cmd->add_option("--overlap-param-gather", f.overlap_param_gather,
                  "all-gather the distributed optimizer's parameters bucket by bucket in the next forward instead of "
                  "after the step (Megatron-Core --overlap-param-gather; --zero 1 or 2): on|off (default: the "
                  "trainer's)");
  cmd->add_option("--overlap-param-gather-with-optimizer-step", f.overlap_param_gather_with_optimizer_step,
                  "issue the first model chunk's parameter all-gather inside the optimizer step, under the other "
                  "chunks' steps (Megatron-Core --overlap-param-gather-with-optimizer-step; needs "
                  "--overlap-param-gather on and --vpp 2 or more): on|off (default: the trainer's)");
  cmd->add_option("--align-param-gather", f.align_param_gather,
                  "with --overlap-param-gather and virtual stages, issue each chunk's gather ahead of it as the "
                  "interleaved schedule does, at once on every stage (Megatron-Core align_param_gather; "
                  "Megatron-LM's --no-align-param-gather turns it off): on|off (default: the trainer's)");
  cmd->add_option("--ddp-bucket-size", f.ddp_bucket_size,
                  "the DDP gradient bucket of the first pipeline stage's first model chunk, in parameters, whose "
                  "reductions and gathers overlap the backward and forward bucket by bucket (Megatron-Core "
                  "--ddp-bucket-size; Megatron-Bridge's CommOverlapConfig sets 134217728 with DP > 1) (default: "
                  "max(40M, 1M x DP x CP))");
  cmd->add_option("--rank-order", f.rank_order,
                  search ? "rank order, innermost first, e.g. tp-dp-pp or tp-pp-dp (Megatron-Core's tp-cp-ep-dp-pp, "
                           "tp-cp-ep-pp-dp); default: searched"
                         : "rank order, innermost first (default tp-dp-pp, Megatron-Core's tp-cp-ep-dp-pp)");
  cmd->add_flag("--uneven-stages", f.uneven_stages,
                "allow a PP that does not divide the layers: first and last stages get fewer layers");
  cmd->add_option("--first-stage-layers", f.first_stage_layers, "layers on the first pipeline stage (uneven split)");
  cmd->add_option("--last-stage-layers", f.last_stage_layers, "layers on the last pipeline stage (uneven split)");
  cmd->add_flag("--account-for-embedding-in-pipeline-split", f.embedding_in_split,
                "Megatron-Core's: the embedding counts as a layer when the layers split over PP x virtual stages (its "
                "virtual stage builds one decoder layer fewer)");
  cmd->add_flag("--account-for-loss-in-pipeline-split", f.loss_in_split,
                "Megatron-Core's: the loss counts as a layer when the layers split over PP x virtual stages (its "
                "virtual stage builds one decoder layer fewer)");
  cmd->add_option("--pipeline-model-parallel-layout,--pipeline-layout", f.pipeline_layout,
                  "Megatron-Core's layout of the layers over PP x virtual stages, e.g. \"Et*2|(t*3|)*30,t*2L\" (E "
                  "embedding, t decoder layer, m MTP module, L loss, | between virtual stages); needs --pp and sets "
                  "the virtual stages");
  cmd->add_option("--gpu-spread", f.gpu_spread,
                  "relative sigma of per-GPU compute speed; the job runs at its slowest GPU's pace "
                  "(default: the GPU profile's speed_spread; 0: every GPU alike)");
  cmd->add_option("--moe-imbalance", f.moe_imbalance,
                  "mixture of experts: the busiest EP rank's routed tokens over the mean, >= 1 (1: balanced, as "
                  "Megatron-Core's --moe-router-force-load-balancing runs); default: the card's router_load_imbalance, "
                  "else the measured load of the router's balancing (docs/cost-model.md#routing-imbalance)");
  cmd->add_flag("--json", f.json, "print one JSON document on stdout");
  cmd->add_flag("-v,--verbose", f.verbose, "log what is loaded and searched on stderr");
}

bool parse_on_off(const std::string& v, const std::string& flag) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  throw InputError("command line", flag, "expected on or off, got \"" + v + "\"", "use " + flag + " on or " + flag + " off");
}

void check_outputs(std::initializer_list<std::pair<const char*, const std::optional<std::string>*>> flags) {
  std::vector<OutputPath> given;
  for (const auto& [flag, path] : flags)
    if (*path) given.push_back({flag, **path});
  check_output_paths(given);
}

void refuse_flags_without_effect(const PlanFlags& f, std::string_view command) {
  struct Unused {
    std::string_view command;
    bool given;
    const char* flag;
    const char* why;
    const char* fix;
  };
  const Unused unused[] = {
      {"mesh", f.json, "--json", "mesh prints the mesh as a table only; --json would be ignored",
       "drop --json (cuboid simulate --json prints a plan as JSON)"},
      {"mesh", f.gpu_spread.has_value(), "--gpu-spread",
       "mesh draws where the ranks are and prices nothing; the GPUs' speed spread would be ignored",
       "drop --gpu-spread, or give it to cuboid simulate"},
      {"mesh", f.moe_imbalance.has_value(), "--moe-imbalance",
       "mesh draws where the ranks are and prices nothing; the routing's imbalance would be ignored",
       "drop --moe-imbalance, or give it to cuboid plan or simulate"},
      {"plan", f.explain && f.json, "--explain",
       "the --json document has no --explain rows; --explain would be ignored",
       "drop --json to print the rows, or --report FILE to see them in the report"},
  };
  for (const Unused& u : unused)
    if (u.command == command && u.given) throw InputError("command line", u.flag, u.why, u.fix);
}

namespace {

// Megatron-Core's pipeline layout flags, with its refusals of their
// combinations (transformer_config.py __post_init__ and arguments.py at
// d98e8a64): the layout alone, the embedding / loss counted without first /
// last stage layers; the layout's virtual stages over --pp, as --vpp if given.
void pipeline_layout_options(const PlanFlags& f, PlannerOptions& o) {
  const std::string cl = "command line";
  const bool counted = f.embedding_in_split || f.loss_in_split;
  const char* counted_flag =
      f.embedding_in_split ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split";
  const bool uneven = f.uneven_stages || f.first_stage_layers || f.last_stage_layers;
  if (counted && uneven)
    throw InputError(cl, counted_flag,
                     "cannot be combined with --uneven-stages, --first-stage-layers or --last-stage-layers "
                     "(Megatron-Core refuses first / last stage layers with the embedding or the loss counted)",
                     "drop one of them");
  o.embedding_in_split = f.embedding_in_split;
  o.loss_in_split = f.loss_in_split;
  if (!f.pipeline_layout) return;
  const char* flag = "--pipeline-model-parallel-layout";
  if (counted || uneven)
    throw InputError(cl, flag,
                     "cannot be combined with --account-for-*-in-pipeline-split, --uneven-stages, "
                     "--first-stage-layers or --last-stage-layers (the layout places every layer itself)",
                     "give the layout alone");
  if (!f.pp) throw InputError(cl, flag, "a layout needs --pp to read its virtual stages", "add --pp");
  o.pipeline_layout = parse_pipeline_layout(*f.pipeline_layout, cl, flag);
  const auto stages = static_cast<std::int64_t>(o.pipeline_layout.decoders.size());
  if (stages % *f.pp != 0)
    throw InputError(cl, flag,
                     "the layout's " + std::to_string(stages) + " virtual stages do not split over PP " +
                         std::to_string(*f.pp),
                     "give PP x virtual stages entries, | between them");
  const int v = static_cast<int>(stages / *f.pp);
  if (f.vpp && *f.vpp != v)
    throw InputError(cl, "--vpp",
                     "--vpp " + std::to_string(*f.vpp) + " conflicts with the layout's " + std::to_string(v) +
                         " virtual stages per PP rank",
                     "drop --vpp: the layout sets it");
  o.virtual_stages = v;
}

}  // namespace

PlannerOptions planner_options(const PlanFlags& f) {
  const std::string cl = "command line";
  auto positive = [&](const auto& v, const char* flag) {
    if (v && *v <= 0) throw InputError(cl, flag, "must be positive, got " + std::to_string(*v), "give a value >= 1");
  };
  positive(f.nodes, "--nodes");
  positive(f.gpus_per_node, "--gpus-per-node");
  positive(f.global_batch, "--global-batch");
  positive(f.seq_length, "--seq-length");
  positive(f.tp, "--tp");
  positive(f.pp, "--pp");
  positive(f.dp, "--dp");
  positive(f.cp, "--cp");
  positive(f.ep, "--ep");
  positive(f.etp, "--etp");
  positive(f.micro_batch, "--micro-batch");
  positive(f.vpp, "--vpp");
  // CLI11 saturates an out-of-range integer at INT64_MAX; a bound here keeps
  // tokens per iteration (batch x sequence) far from overflowing.
  constexpr std::int64_t kMaxGlobalBatch = std::int64_t{1} << 30;
  if (f.global_batch && *f.global_batch > kMaxGlobalBatch)
    throw InputError(cl, "--global-batch", "global batch " + std::to_string(*f.global_batch) + " is above cuboid's limit of " + std::to_string(kMaxGlobalBatch) + " sequences",
                     "give a global batch of at most " + std::to_string(kMaxGlobalBatch));
  constexpr std::int64_t kMaxSeqLength = std::int64_t{1} << 24;
  if (f.seq_length && *f.seq_length > kMaxSeqLength)
    throw InputError(cl, "--seq-length", "sequence length " + std::to_string(*f.seq_length) + " is above cuboid's limit of " + std::to_string(kMaxSeqLength) + " tokens",
                     "give a sequence length of at most " + std::to_string(kMaxSeqLength));
  if (f.zero && (*f.zero < 0 || *f.zero > 3))
    throw InputError(cl, "--zero", "ZeRO stage must be 0, 1, 2 or 3, got " + std::to_string(*f.zero), "use 0, 1, 2 or 3");
  PlannerOptions o;
  o.tp = f.tp;
  o.pp = f.pp;
  o.dp = f.dp;
  o.cp = f.cp;
  if (f.cp_comm) o.cp_comm = parse_cp_comm(*f.cp_comm, cl, "--cp-comm-type");
  o.ep = f.ep;
  o.etp = f.etp;
  if (f.moe_dispatcher) o.moe_dispatcher = parse_moe_dispatcher(*f.moe_dispatcher, cl, "--moe-dispatcher");
  if (f.moe_ep_overlap) o.moe_ep_overlap = parse_on_off(*f.moe_ep_overlap, "--moe-ep-overlap");
  if (f.moe_delay_wgrad) o.moe_delay_wgrad = parse_on_off(*f.moe_delay_wgrad, "--moe-delay-wgrad");
  if (f.moe_flex_backend) o.moe_flex_backend = parse_flex_backend(*f.moe_flex_backend, cl, "--moe-flex-backend");
  if (f.moe_flex_sms) {
    if (*f.moe_flex_sms < 1)
      throw InputError(cl, "--moe-flex-sms", fmt::format("{} SMs", *f.moe_flex_sms), "give at least 1");
    o.moe_flex_sms = f.moe_flex_sms;
  }
  if (f.moe_rank_capacity_factor) {
    if (!(*f.moe_rank_capacity_factor > 0))
      throw InputError(cl, "--moe-rank-capacity-factor", fmt::format("factor {}", *f.moe_rank_capacity_factor),
                       "give a factor > 0 (e.g. 1.5), or drop it for dropless routing");
    // transformer_config.py:1868-1874@d98e8a64: hybridep (or ncclep, not modelled) only.
    if (o.moe_flex_backend != FlexBackend::hybridep)
      throw InputError(cl, "--moe-rank-capacity-factor",
                       "Megatron-Core takes a rank capacity factor with the flex dispatcher's hybridep backend only "
                       "(transformer_config.py:1868-1874@d98e8a64)",
                       "add --moe-dispatcher flex --moe-flex-backend hybridep, or drop it");
    o.moe_rank_capacity_factor = f.moe_rank_capacity_factor;
  }
  if (f.moe_paged_stash) o.moe_paged_stash = parse_on_off(*f.moe_paged_stash, "--moe-paged-stash");
  if (f.moe_paged_stash_buffer_factor) {
    if (*f.moe_paged_stash_buffer_factor == 0)
      throw InputError(cl, "--moe-paged-stash-buffer-factor", "0 allocates no stash on the GPU",
                       "give a factor such as 1.1 (of the average tokens) or -1.0 (of the real ones), or drop it");
    if (!o.moe_paged_stash.value_or(false))
      throw InputError(cl, "--moe-paged-stash-buffer-factor", "set without --moe-paged-stash on",
                       "add --moe-paged-stash on, or drop it");
    o.moe_paged_stash_buffer_factor = f.moe_paged_stash_buffer_factor;
  }
  if ((f.moe_flex_backend || f.moe_flex_sms) && o.moe_dispatcher && *o.moe_dispatcher != MoeDispatcher::flex)
    throw InputError(cl, f.moe_flex_backend ? "--moe-flex-backend" : "--moe-flex-sms",
                     "set with --moe-dispatcher " + std::string(to_string(*o.moe_dispatcher)),
                     "use --moe-dispatcher flex, or drop it");
  o.micro_batch = f.micro_batch;
  o.virtual_stages = f.vpp;
  o.zero_stage = f.zero;
  o.global_batch = f.global_batch;
  o.seq_length = f.seq_length;
  if (f.recompute) o.recompute = parse_recompute(*f.recompute, cl, "--recompute");
  if (f.recompute_modules) {
    if (o.recompute && *o.recompute != Recompute::selective)
      throw InputError(cl, "--recompute-modules", "the modules are those of a selective recomputation",
                       "drop --recompute, or give --recompute selective");
    o.recompute = Recompute::selective;
    o.recompute_modules = parse_recompute_modules(*f.recompute_modules, cl, "--recompute-modules");
  }
  if (f.recompute_method || f.recompute_num_layers) {
    const char* flag = f.recompute_method ? "--recompute-method" : "--recompute-num-layers";
    if (o.recompute && *o.recompute != Recompute::full)
      throw InputError(cl, flag, "a recompute method and layer count are those of a full recomputation",
                       "drop --recompute, or give --recompute full");
    o.recompute = Recompute::full;
    if (f.recompute_method) o.recompute_method = parse_recompute_method(*f.recompute_method, cl, "--recompute-method");
    if (f.recompute_num_layers) {
      if (*f.recompute_num_layers < 1)
        throw InputError(cl, "--recompute-num-layers", "must be 1 or more, got " + std::to_string(*f.recompute_num_layers),
                         "give the layers per checkpoint group (uniform) or recomputed per model chunk (block)");
      o.recompute_num_layers = *f.recompute_num_layers;
    }
  }
  if (f.offload_activations) {
    if (*f.offload_activations < 0)
      throw InputError(cl, "--offload-activations", "must be 0 or more, got " + std::to_string(*f.offload_activations),
                       "give the number of decoder layers to offload, or 0 for none");
    if (*f.offload_activations > 0) {
      if (o.recompute && *o.recompute != Recompute::none)
        throw InputError(cl, "--offload-activations", "Megatron-Core offloads activations only without recomputation",
                         "drop --recompute, or give --recompute none");
      o.recompute = Recompute::none;
    }
    o.offload_layers = *f.offload_activations;
  }
  if (f.offload_modules) o.offload_modules = parse_offload_modules(*f.offload_modules, cl, "--offload-modules");
  if (f.schedule) o.schedule = parse_schedule(*f.schedule, cl, "--schedule");
  if (f.sequence_parallel) o.sequence_parallel = parse_on_off(*f.sequence_parallel, "--sequence-parallel");
  if (f.flash_attention) o.flash_attention = parse_on_off(*f.flash_attention, "--flash-attention");
  if (f.attention_kernel) {
    o.attention_kernel = parse_attention_kernel(*f.attention_kernel, cl, "--attention-kernel");
    const bool fused = *o.attention_kernel != AttentionKernel::unfused;
    if (o.flash_attention && *o.attention_kernel != AttentionKernel::auto_ && *o.flash_attention != fused)
      throw InputError(cl, "--attention-kernel",
                       std::string(fused ? "a fused kernel" : "unfused") + " with --flash-attention " +
                           (fused ? "off" : "on"),
                       "give one of the two flags");
  }
  if (f.grad_accum_fusion) o.grad_accum_fusion = parse_on_off(*f.grad_accum_fusion, "--grad-accum-fusion");
  if (f.dp_overlap) o.dp_overlap = parse_on_off(*f.dp_overlap, "--dp-overlap");
  if (f.grad_reduce_dtype) {
    if (*f.grad_reduce_dtype != "fp32" && *f.grad_reduce_dtype != "bf16")
      throw InputError(cl, "--grad-reduce-dtype", "expected fp32 or bf16, got \"" + *f.grad_reduce_dtype + "\"",
                       "use --grad-reduce-dtype fp32 or --grad-reduce-dtype bf16");
    o.dp_grad_bytes = *f.grad_reduce_dtype == "fp32" ? 4 : 2;
  }
  if (f.fsdp_grad_dtype) {
    if (*f.fsdp_grad_dtype != "fp32" && *f.fsdp_grad_dtype != "bf16")
      throw InputError(cl, "--fsdp-grad-dtype", "expected fp32 or bf16, got \"" + *f.fsdp_grad_dtype + "\"",
                       "use --fsdp-grad-dtype fp32 or --fsdp-grad-dtype bf16");
    o.fsdp_grad_bytes = *f.fsdp_grad_dtype == "fp32" ? 4 : 2;
  }
  if (f.cuda_graphs) o.cuda_graphs = CudaGraphs::parse(*f.cuda_graphs, cl, "--cuda-graphs");
  if (f.tp_comm_overlap) o.tp_comm_overlap = parse_on_off(*f.tp_comm_overlap, "--tp-comm-overlap");
  if (f.overlap_param_gather) o.overlap_param_gather = parse_on_off(*f.overlap_param_gather, "--overlap-param-gather");
  if (f.overlap_param_gather_with_optimizer_step)
    o.overlap_param_gather_with_optimizer_step =
        parse_on_off(*f.overlap_param_gather_with_optimizer_step, "--overlap-param-gather-with-optimizer-step");
  if (f.align_param_gather) o.align_param_gather = parse_on_off(*f.align_param_gather, "--align-param-gather");
  positive(f.ddp_bucket_size, "--ddp-bucket-size");
  o.ddp_bucket_params = f.ddp_bucket_size;
  if (f.precision) o.precision = parse_precision(*f.precision, cl, "--precision");
  if (f.fp8_param_gather) o.fp8_param_gather = true;
  if (f.precision_aware_optimizer) o.precision_aware_optimizer = true;
  if (f.fp8_attention) o.fp8_attention = true;
  if (f.adam_moments) {
    if (*f.adam_moments != "fp32" && *f.adam_moments != "bf16")
      throw InputError(cl, "--adam-moments", "expected fp32 or bf16, got \"" + *f.adam_moments + "\"",
                       "use --adam-moments fp32 or --adam-moments bf16");
    o.adam_moment_bytes = *f.adam_moments == "fp32" ? 4 : 2;
  }
  if (f.optimizer) {
    if (*f.optimizer != "adam" && *f.optimizer != "muon")
      throw InputError(cl, "--optimizer", "expected adam or muon, got \"" + *f.optimizer + "\"",
                       "use --optimizer adam or --optimizer muon");
    o.optimizer = *f.optimizer == "muon" ? OptimizerKind::muon : OptimizerKind::adam;
  }
  o.trainer = f.trainer;
  if (f.rank_order) o.order = RankOrder::parse(*f.rank_order, cl, "--rank-order");
  positive(f.first_stage_layers, "--first-stage-layers");
  positive(f.last_stage_layers, "--last-stage-layers");
  o.first_stage_layers = f.first_stage_layers;
  o.last_stage_layers = f.last_stage_layers;
  o.uneven_stages = f.uneven_stages || f.first_stage_layers || f.last_stage_layers;
  pipeline_layout_options(f, o);
  o.threads = f.threads;
  o.simulate_top = f.simulate_top;
  if (o.schedule && *o.schedule != Schedule::interleaved && o.virtual_stages && *o.virtual_stages > 1)
    throw InputError(cl, "--vpp", "virtual stages need the interleaved schedule", "add --schedule interleaved, or drop --vpp");
  return o;
}

Loaded load(const PlanFlags& f) {
  if (f.verbose) spdlog::set_level(spdlog::level::info);
  const std::string cl = "command line";
  if (f.gpu_spread && !(*f.gpu_spread >= 0 && *f.gpu_spread <= kMaxSpeedSpread))
    throw InputError(cl, "--gpu-spread", fmt::format("must be in [0, {}], got {}", kMaxSpeedSpread, *f.gpu_spread),
                     "give a relative sigma such as 0.0115, or 0 to turn the spread off");
  Loaded l;
  if (f.plan_path) {
    // The plan file carries the model and every dimension; flags that would
    // change them are refused rather than silently ignored.
    const bool dims = f.tp || f.pp || f.dp || f.cp || f.cp_comm || f.ep || f.etp || f.moe_dispatcher || f.moe_ep_overlap || f.moe_delay_wgrad || f.moe_flex_backend || f.moe_flex_sms || f.moe_rank_capacity_factor || f.moe_paged_stash || f.moe_paged_stash_buffer_factor || f.micro_batch || f.vpp || f.zero || f.recompute || f.recompute_modules || f.recompute_method || f.recompute_num_layers || f.offload_activations || f.offload_modules || f.sequence_parallel ||
                      f.schedule || f.flash_attention || f.attention_kernel || f.grad_accum_fusion || f.precision || f.fp8_param_gather || f.fp8_attention || f.precision_aware_optimizer || f.adam_moments || f.optimizer || f.trainer || f.dp_overlap || f.grad_reduce_dtype || f.fsdp_grad_dtype || f.rank_order ||
                      f.cuda_graphs || f.tp_comm_overlap || f.overlap_param_gather ||
                      f.overlap_param_gather_with_optimizer_step || f.align_param_gather || f.ddp_bucket_size ||
                      f.global_batch ||
                      f.seq_length ||
                      f.first_stage_layers || f.last_stage_layers || f.uneven_stages || f.embedding_in_split ||
                      f.loss_in_split || f.pipeline_layout;
    if (!f.model_path.empty() || dims)
      throw InputError(cl, "--plan", "a plan file fixes the model and every dimension; --model and dimension flags cannot be combined with it",
                       "drop those flags, or drop --plan and give --model, --cluster and the dimensions");
    PlanFile pf = read_plan_file(*f.plan_path);
    l.model = pf.model;
    std::string cluster_path = f.cluster_path;
    if (cluster_path.empty()) {
      cluster_path = pf.cluster_source_file;
      if (!std::filesystem::exists(cluster_path))
        throw InputError(*f.plan_path, "cluster.source_file",
                         "the cluster card \"" + cluster_path + "\" named by the plan file is not found from here",
                         "pass --cluster with the card of the cluster this plan was made for");
    }
    l.cluster = load_cluster_for_plan(cluster_path, f.nodes.value_or(pf.nodes), f.gpus_per_node, pf.gpus_per_node);
    // The file's plan passed check_plan on the shape it names (read_plan_file);
    // this cluster has that shape.
    check_plan_matches_cluster(pf, l.cluster);
    l.plan = pf.plan;
  } else {
    if (f.model_path.empty()) throw InputError(cl, "--model", "--model is required", "give a model card, e.g. --model models/llama3-70b.json");
    if (f.cluster_path.empty())
      throw InputError(cl, "--cluster", "--cluster is required", "give a cluster card, e.g. --cluster topologies/dgx-a100-4node.json");
    l.model = load_model(f.model_path);
    l.cluster = load_cluster(f.cluster_path, f.nodes, f.gpus_per_node);
  }
  if (f.moe_imbalance) {
    if (!l.model.moe.enabled())
      throw InputError(cl, "--moe-imbalance", "the model " + l.model.name + " has no experts",
                       "drop --moe-imbalance, or give a mixture-of-experts model");
    if (!(*f.moe_imbalance >= 1.0 && *f.moe_imbalance <= 1e3))
      throw InputError(cl, "--moe-imbalance", fmt::format("must be 1 to 1000, got {}", *f.moe_imbalance),
                       "give the busiest EP rank's tokens over the mean, e.g. 1.2, or 1 for a balanced router");
    l.model.moe.router_load_imbalance = *f.moe_imbalance;
  }
  if (f.gpu_spread) {
    l.cluster.gpu.speed_spread = *f.gpu_spread;
    l.cluster.gpu.sources["speed_spread"] = "--gpu-spread";
  }
  spdlog::info("model {}: {} layers, hidden {}, {} heads ({} KV), {:.2f} B parameters", l.model.name, l.model.num_layers,
               l.model.hidden_size, l.model.num_attention_heads, l.model.num_kv_heads, l.model.parameter_count() / 1e9);
  spdlog::info("cluster {}: {} nodes x {} {}", l.cluster.name, l.cluster.nodes, l.cluster.gpus_per_node, l.cluster.gpu.name);
  l.topology = std::make_unique<Topology>(l.cluster);
  return l;
}

Cluster load_cluster_for_plan(const std::string& cluster_path, int nodes, std::optional<int> gpus_per_node,
                              int plan_gpus_per_node) {
  Cluster c = load_cluster(cluster_path, nodes, gpus_per_node);
  if (!gpus_per_node && plan_gpus_per_node < c.gpus_per_node) c = load_cluster(cluster_path, nodes, plan_gpus_per_node);
  return c;
}

// --for TARGET: search only plans that the trainer can express, asking the
// exporter itself (one definition of what each target supports).
std::shared_ptr<const TargetRefusals> restrict_to_target(PlannerOptions& o, const Loaded& l,
                                                         const std::string& target) {
  const auto& targets = export_targets();
  if (std::find(targets.begin(), targets.end(), target) == targets.end()) {
    std::string names;
    for (std::size_t i = 0; i < targets.size(); ++i)
      names += (i == 0 ? "" : i + 1 == targets.size() ? " or " : ", ") + targets[i];
    throw InputError("command line", "--for", "unknown export target \"" + target + "\"", "use " + names);
  }
  // The target runs the plan in one of these trainers (the first unless
  // --trainer names another); any other --trainer contradicts --for.
  static const std::map<std::string, std::vector<std::string>> kTrainers = {
      {"megatron", {"megatron-core", "megatron-2022", "megatron-2021"}},
      {"megatron-bridge", {"megatron-core"}},
      {"nemo", {"megatron-core"}},
      {"torchtitan-main", {"torchtitan"}},
      {"deepspeed", {"megatron-deepspeed", "megatron-deepspeed-2022", "megatron-deepspeed-2021", "deepspeed-2021"}},
      {"torchtitan", {"torchtitan"}},
  };
  const std::vector<std::string>& allowed = kTrainers.at(target);
  if (!o.trainer) {
    o.trainer = allowed.front();
  } else if (std::find(allowed.begin(), allowed.end(), *o.trainer) == allowed.end()) {
    std::string names;
    for (const auto& n : allowed) names += (names.empty() ? "" : ", ") + n;
    throw InputError("command line", "--trainer",
                     "--for " + target + " exports to a trainer that runs as " + names + ", not as " + *o.trainer,
                     "drop --trainer (--for " + target + " implies --trainer " + allowed.front() +
                         "), or use --trainer " + names);
  }
  check_trainer_options(l.model, l.cluster, o);
  auto pf = std::make_shared<PlanFile>();
  pf->source = "candidate";
  pf->model = l.model;
  pf->cluster_name = l.cluster.name;
  pf->cluster_source_file = l.cluster.source_file;
  pf->gpu_name = l.cluster.gpu.name;
  pf->nodes = l.cluster.nodes;
  pf->gpus_per_node = l.cluster.gpus_per_node;
  // A model the target cannot build at all (experts, YaRN, ALiBi, a shape
  // torchtitan has no flavour of, torchtitan main's attention) is refused
  // here, not by an empty search.
  try {
    PlanFile probe = *pf;
    probe.plan = plan_from_options(l.model, l.cluster, o);
    (void)export_plan(probe, target);
  } catch (const InputError& e) {
    if (e.field() == "model" || e.field().rfind("model.", 0) == 0)
      throw InputError("command line", "--for", "--for " + target + ": " + e.problem(), e.fix());
  }
  auto refusals = std::make_shared<TargetRefusals>();
  refusals->target = target;
  auto mutex = std::make_shared<std::mutex>();
  o.accept = [pf, target, refusals, mutex](const ParallelPlan& p) {
    PlanFile candidate = *pf;
    candidate.plan = p;
    try {
      (void)export_plan(candidate, target);
      return true;
    } catch (const InputError& e) {
      const std::lock_guard lock(*mutex);
      TargetRefusals::Seen& seen = refusals->by_key[e.field()];
      if (seen.count++ == 0) {
        seen.problem = e.problem();
        seen.fix = e.fix();
      }
      return false;
    }
  };
  return refusals;
}

namespace {

// The setting of a plan-file key as the flag that fixes it, or none when
// the search chooses it.
struct KeyFlag {
  const char* key;
  const char* flag;
  std::optional<std::string> (*value)(const PlannerOptions&);
};

template <typename T>
std::optional<std::string> shown(const std::optional<T>& v) {
  if (!v) return std::nullopt;
  if constexpr (std::is_same_v<T, bool>) return std::string(*v ? "on" : "off");
  else if constexpr (std::is_floating_point_v<T>) return fmt::format("{}", *v);
  else if constexpr (std::is_arithmetic_v<T>) return std::to_string(*v);
  else if constexpr (std::is_same_v<T, RankOrder>) return v->str();
  else return std::string(to_string(*v));
}

constexpr KeyFlag kKeyFlags[] = {
    {"parallel.tp", "--tp", [](const PlannerOptions& o) { return shown(o.tp); }},
    {"parallel.pp", "--pp", [](const PlannerOptions& o) { return shown(o.pp); }},
    {"parallel.dp", "--dp", [](const PlannerOptions& o) { return shown(o.dp); }},
    {"parallel.cp", "--cp", [](const PlannerOptions& o) { return shown(o.cp); }},
    {"parallel.cp_comm", "--cp-comm-type", [](const PlannerOptions& o) { return shown(o.cp_comm); }},
    {"parallel.ep", "--ep", [](const PlannerOptions& o) { return shown(o.ep); }},
    {"parallel.etp", "--etp", [](const PlannerOptions& o) { return shown(o.etp); }},
    {"parallel.moe_dispatcher", "--moe-dispatcher", [](const PlannerOptions& o) { return shown(o.moe_dispatcher); }},
    {"parallel.moe_ep_overlap", "--moe-ep-overlap", [](const PlannerOptions& o) { return shown(o.moe_ep_overlap); }},
    {"parallel.moe_delay_wgrad", "--moe-delay-wgrad", [](const PlannerOptions& o) { return shown(o.moe_delay_wgrad); }},
    {"parallel.moe_flex_backend", "--moe-flex-backend", [](const PlannerOptions& o) { return shown(o.moe_flex_backend); }},
    {"parallel.moe_flex_sms", "--moe-flex-sms", [](const PlannerOptions& o) { return shown(o.moe_flex_sms); }},
    {"parallel.moe_rank_capacity_factor", "--moe-rank-capacity-factor",
     [](const PlannerOptions& o) { return shown(o.moe_rank_capacity_factor); }},
    {"parallel.moe_paged_stash", "--moe-paged-stash", [](const PlannerOptions& o) { return shown(o.moe_paged_stash); }},
    {"parallel.moe_paged_stash_buffer_factor", "--moe-paged-stash-buffer-factor",
     [](const PlannerOptions& o) { return shown(o.moe_paged_stash_buffer_factor); }},
    {"parallel.micro_batch", "--micro-batch", [](const PlannerOptions& o) { return shown(o.micro_batch); }},
    {"parallel.virtual_stages", "--vpp", [](const PlannerOptions& o) { return shown(o.virtual_stages); }},
    {"parallel.zero_stage", "--zero", [](const PlannerOptions& o) { return shown(o.zero_stage); }},
    {"parallel.recompute", "--recompute", [](const PlannerOptions& o) { return shown(o.recompute); }},
    {"parallel.recompute_modules", "--recompute-modules",
     [](const PlannerOptions& o) {
       return o.recompute_modules ? std::optional<std::string>(recompute_modules_string(*o.recompute_modules))
                                  : std::nullopt;
     }},
    {"parallel.recompute_method", "--recompute-method", [](const PlannerOptions& o) { return shown(o.recompute_method); }},
    {"parallel.recompute_num_layers", "--recompute-num-layers",
     [](const PlannerOptions& o) { return shown(o.recompute_num_layers); }},
    {"parallel.offload_activations", "--offload-activations", [](const PlannerOptions& o) { return shown(o.offload_layers); }},
    {"parallel.offload_modules", "--offload-modules",
     [](const PlannerOptions& o) {
       return o.offload_modules ? std::optional<std::string>(offload_modules_string(*o.offload_modules)) : std::nullopt;
     }},
    {"parallel.sequence_parallel", "--sequence-parallel",
     [](const PlannerOptions& o) { return shown(o.sequence_parallel); }},
    {"parallel.schedule", "--schedule", [](const PlannerOptions& o) { return shown(o.schedule); }},
    {"parallel.flash_attention", "--flash-attention", [](const PlannerOptions& o) { return shown(o.flash_attention); }},
    {"parallel.attention_kernel", "--attention-kernel",
     [](const PlannerOptions& o) { return shown(o.attention_kernel); }},
    {"parallel.grad_accum_fusion", "--grad-accum-fusion",
     [](const PlannerOptions& o) { return shown(o.grad_accum_fusion); }},
    {"parallel.precision", "--precision", [](const PlannerOptions& o) { return shown(o.precision); }},
    {"parallel.fp8_param_gather", "--fp8-param-gather",
     [](const PlannerOptions& o) { return shown(o.fp8_param_gather); }},
    {"parallel.fp8_attention", "--fp8-attention", [](const PlannerOptions& o) { return shown(o.fp8_attention); }},
    {"parallel.precision_aware_optimizer", "--precision-aware-optimizer",
     [](const PlannerOptions& o) { return shown(o.precision_aware_optimizer); }},
    {"parallel.adam_moment_bytes", "--adam-moments",
     [](const PlannerOptions& o) {
       return o.adam_moment_bytes ? std::optional<std::string>(*o.adam_moment_bytes == 4 ? "fp32" : "bf16")
                                  : std::nullopt;
     }},
    {"parallel.optimizer", "--optimizer",
     [](const PlannerOptions& o) {
       return o.optimizer ? std::optional<std::string>(std::string(to_string(*o.optimizer))) : std::nullopt;
     }},
    {"parallel.rank_order", "--rank-order", [](const PlannerOptions& o) { return shown(o.order); }},
    {"parallel.first_stage_layers", "--first-stage-layers",
     [](const PlannerOptions& o) { return shown(o.first_stage_layers); }},
    {"parallel.last_stage_layers", "--last-stage-layers",
     [](const PlannerOptions& o) { return shown(o.last_stage_layers); }},
    {"parallel.pipeline_layout", "--pipeline-model-parallel-layout",
     [](const PlannerOptions& o) {
       return o.pipeline_layout.empty() ? std::nullopt : std::optional<std::string>(pipeline_layout_string(o.pipeline_layout));
     }},
    {"parallel.global_batch", "--global-batch", [](const PlannerOptions& o) { return shown(o.global_batch); }},
    {"parallel.seq_length", "--seq-length", [](const PlannerOptions& o) { return shown(o.seq_length); }},
    {"trainer.dp_overlap", "--dp-overlap", [](const PlannerOptions& o) { return shown(o.dp_overlap); }},
    {"trainer.dp_grad_bytes", "--grad-reduce-dtype",
     [](const PlannerOptions& o) {
       return o.dp_grad_bytes ? std::optional<std::string>(*o.dp_grad_bytes == 4 ? "fp32" : "bf16") : std::nullopt;
     }},
    {"trainer.fsdp_grad_bytes", "--fsdp-grad-dtype",
     [](const PlannerOptions& o) {
       return o.fsdp_grad_bytes ? std::optional<std::string>(*o.fsdp_grad_bytes == 4 ? "fp32" : "bf16") : std::nullopt;
     }},
    {"trainer.cuda_graphs", "--cuda-graphs",
     [](const PlannerOptions& o) {
       return o.cuda_graphs ? std::optional<std::string>(o.cuda_graphs->str()) : std::nullopt;
     }},
    {"trainer.tp_comm_overlap", "--tp-comm-overlap", [](const PlannerOptions& o) { return shown(o.tp_comm_overlap); }},
    {"trainer.overlap_param_gather", "--overlap-param-gather",
     [](const PlannerOptions& o) { return shown(o.overlap_param_gather); }},
    {"trainer.overlap_param_gather_with_optimizer_step", "--overlap-param-gather-with-optimizer-step",
     [](const PlannerOptions& o) { return shown(o.overlap_param_gather_with_optimizer_step); }},
    {"trainer.align_param_gather", "--align-param-gather",
     [](const PlannerOptions& o) { return shown(o.align_param_gather); }},
    {"trainer.ddp_bucket_size", "--ddp-bucket-size", [](const PlannerOptions& o) { return shown(o.ddp_bucket_params); }},
};

}  // namespace

void refuse_fixed_flag_for_target(const PlannerOptions& o, const TargetRefusals& refusals) {
  const KeyFlag* worst = nullptr;
  const TargetRefusals::Seen* seen = nullptr;
  for (const KeyFlag& kf : kKeyFlags) {
    const auto it = refusals.by_key.find(kf.key);
    if (it == refusals.by_key.end() || !kf.value(o)) continue;
    if (seen == nullptr || it->second.count > seen->count) {
      worst = &kf;
      seen = &it->second;
    }
  }
  if (worst == nullptr) return;
  const std::string& t = refusals.target;
  const std::string fixed = std::string(worst->flag) + " " + *worst->value(o);
  throw InputError("command line", worst->flag, "--for " + t + " cannot express " + fixed + ": " + seen->problem,
                   "drop " + fixed + ", or plan --for another target (" + t + "'s exporter: " + seen->fix + ")");
}

}  // namespace cuboid::cli
