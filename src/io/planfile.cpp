#include "cuboid/io/planfile.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <map>
#include <string_view>
#include <unistd.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/core/pipeline_layout.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid_config.hpp"

namespace cuboid {

namespace {

const std::string kRegenerate = "regenerate it with this cuboid (cuboid plan ... --out FILE)";


// Optional: plan files written before these settings were priced with
// FSDP2's ZeRO-3, the defaults.
void read_zero3(JsonReader& t, TrainerSettings& s) {
  if (!t.has("zero3")) return;
  JsonReader z = t.object("zero3");
  s.zero3_unit = parse_zero3_unit(z.choice("unit", {"block", "tensor"}), z.source(), "parallel.trainer.zero3.unit");
  auto count = [&](std::string_view key) { return z.count<std::int64_t>(key, 0); };
  s.zero3_persist_params = count("persist_params");
  s.zero3_prefetch_units = z.count<int>("prefetch_units", 0, 1'000'000);
  s.zero3_prefetch_params = count("prefetch_params");
  s.zero3_reuse_params = count("reuse_params");
  s.zero3_reduce_bucket_params = count("reduce_bucket_params");
  s.zero3_reduce_per_tensor = z.boolean("reduce_per_tensor");
  s.zero3_sync = z.boolean("sync");
  s.zero3_list_collectives = z.boolean("list_collectives");
  s.zero3_fetch_norm = z.boolean("fetch_norm");
  z.reject_unknown();
}

nlohmann::json parallel_to_json(const ParallelPlan& p) {
  nlohmann::json j = plan_layout_json(p);
  j["cp"] = p.cp;
  j["num_micro_batches"] = p.num_micro_batches();
  j["first_stage_layers"] = p.first_stage_layers;
  j["last_stage_layers"] = p.last_stage_layers;
  // Written when set only: other plans' files stay as they were.
  if (p.embedding_in_split) j["embedding_in_pipeline_split"] = true;
  if (p.loss_in_split) j["loss_in_pipeline_split"] = true;
  if (!p.pipeline_layout.empty()) j["pipeline_layout"] = pipeline_layout_string(p.pipeline_layout);
  j["flash_attention"] = p.flash_attention;
  // Written when named: auto (the GPU's default kernel) leaves files as they were.
  if (p.attention_kernel != AttentionKernel::auto_) j["attention_kernel"] = std::string(to_string(p.attention_kernel));
  j["grad_accum_fusion"] = p.grad_accum_fusion;
  j["world_size"] = p.world_size();
  j["trainer"] = {{"preset", p.trainer.preset},
                  {"dp_overlap", p.trainer.dp_overlap},
                  {"dp_grad_bytes", p.trainer.dp_grad_bytes},
                  {"zero1_grad_all_reduce", p.trainer.zero1_grad_all_reduce},
                  {"tp_backward_overlap", p.trainer.tp_backward_overlap},
                  {"grad_accum_bytes", p.trainer.grad_accum_bytes},
                  {"zero3", zero3_to_json(p.trainer)}};
  // Written where they differ from the preset's: other plans' files stay as they were.
  if (const TrainerPreset* preset = find_trainer(p.trainer.preset)) {
    const TrainerSettings& d = preset->settings;
    if (p.trainer.cuda_graphs != d.cuda_graphs) j["trainer"]["cuda_graphs"] = p.trainer.cuda_graphs.str();
    if (p.trainer.tp_comm_overlap != d.tp_comm_overlap) j["trainer"]["tp_comm_overlap"] = p.trainer.tp_comm_overlap;
    if (p.trainer.overlap_param_gather != d.overlap_param_gather)
      j["trainer"]["overlap_param_gather"] = p.trainer.overlap_param_gather;
    if (p.trainer.overlap_param_gather_with_optimizer_step != d.overlap_param_gather_with_optimizer_step)
      j["trainer"]["overlap_param_gather_with_optimizer_step"] = p.trainer.overlap_param_gather_with_optimizer_step;
    if (p.trainer.align_param_gather != d.align_param_gather)
      j["trainer"]["align_param_gather"] = p.trainer.align_param_gather;
    if (p.trainer.fsdp_grad_bytes != d.fsdp_grad_bytes) j["trainer"]["fsdp_grad_bytes"] = p.trainer.fsdp_grad_bytes;
  }
  // Written when set: absent is the trainer's rule.
  if (p.trainer.ddp_bucket_params > 0) j["trainer"]["ddp_bucket_size"] = p.trainer.ddp_bucket_params;
  // Written when on (torchtitan's pipeline with FSDP): other plans' files stay as they were.
  if (p.trainer.pp_fsdp_no_sync) j["trainer"]["pp_fsdp_no_sync"] = true;
  // Written with CP only: a file without it reads as the default ring.
  if (p.cp > 1) j["cp_comm"] = std::string(to_string(p.cp_comm));
  // Written for expert parallelism only (EP > 1 or an ETP of its own).
  if (p.ep > 1 || p.etp > 0) {
    j["ep"] = p.ep;
    j["etp"] = p.expert_tp();
  }
  // Written with EP > 1 only, where the dispatcher moves tokens between
  // ranks: a file without it reads as alltoall.
  if (p.ep > 1) j["moe_dispatcher"] = std::string(to_string(p.moe_dispatcher));
  // The flex dispatcher's backend and SMs, written where not the defaults
  // (DeepEP, its backend's SMs).
  if (p.moe_dispatcher == MoeDispatcher::flex && p.moe_flex.backend != FlexBackend::deepep)
    j["moe_flex_backend"] = std::string(to_string(p.moe_flex.backend));
  if (p.moe_dispatcher == MoeDispatcher::flex && p.moe_flex.sms > 0) j["moe_flex_sms"] = p.moe_flex.sms;
  // HybridEP's static budget and the paged stash, written where set (a file
  // without them reads as dropless, no stash, the buffer factor 1.10).
  if (p.moe_flex.rank_capacity_factor > 0) j["moe_rank_capacity_factor"] = p.moe_flex.rank_capacity_factor;
  if (p.moe_flex.paged_stash) j["moe_paged_stash"] = true;
  if (p.moe_flex.paged_stash && p.moe_flex.stash_buffer_factor != FlexSetting{}.stash_buffer_factor)
    j["moe_paged_stash_buffer_factor"] = p.moe_flex.stash_buffer_factor;
  // Written when on: a file without it reads as off, Megatron-Core's default.
  if (p.moe_ep_overlap) j["moe_ep_overlap"] = true;
  // Written when off with the overlap: absent reads as on.
  if (p.moe_ep_overlap && !p.moe_delay_wgrad) j["moe_delay_wgrad"] = false;
  return j;
}

nlohmann::json rank_mapping_to_json(const ParallelPlan& p, int gpus_per_node) {
  RankMapping map(p, gpus_per_node);
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < map.world_size(); ++r) {
    const RankCoord c = map.coord(r);
    out.push_back({{"rank", c.rank}, {"node", c.node}, {"gpu", c.gpu}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}});
    if (p.cp > 1) out.back()["cp"] = c.cp;
  }
  return out;
}


nlohmann::json prediction_to_json(const Estimate& e) {
  const MemoryReport& m = e.memory;
  const Breakdown& b = e.breakdown;
  auto bytes = [](double v) { return static_cast<std::int64_t>(v); };
  nlohmann::json out{
      {"score", e.simulated ? "simulated" : "analytical"},
      {"iteration_time_s", e.iteration_time_s},
      {"tokens_per_s", e.tokens_per_s},
      {"model_flops_per_iteration", e.model_flops},
      {"hardware_flops_per_iteration", e.hardware_flops},
      {"model_tflops_per_gpu", e.model_tflops_per_gpu},
      {"hardware_tflops_per_gpu", e.hardware_tflops_per_gpu},
      {"mfu", e.mfu},
      {"hfu", e.hfu},
      {"memory",
       {{"parameters_on_gpu", bytes(m.parameters)},
        {"weights_and_optimizer_bytes", bytes(m.weight_and_optimizer_bytes)},
        {"activation_bytes", bytes(m.activation_bytes)},
        {"reserve_bytes", bytes(m.reserve_bytes)},
        {"total_bytes", bytes(m.total_bytes)},
        {"capacity_bytes", bytes(m.capacity_bytes)},
        {"headroom_bytes", bytes(m.headroom_bytes())},
        {"peak_stage", m.peak_stage},
        {"fits", m.fits()}}},
      {"breakdown",
       {{"compute_s", b.compute_s},
        {"tp_comm_s", b.tp_comm_s},
        {"pp_comm_s", b.pp_comm_s},
        {"dp_comm_s", b.dp_comm_s},
        {"bubble_s", b.bubble_s},
        {"optimizer_s", b.optimizer_s}}},
  };
  // Only with CP: other plans' files stay as they were.
  if (e.plan.cp > 1) out["breakdown"]["cp_comm_s"] = b.cp_comm_s;
  if (e.plan.ep > 1) out["breakdown"]["ep_comm_s"] = b.ep_comm_s;
  if (e.plan.offloads_activations()) out["breakdown"]["offload_s"] = b.offload_s;
  if (e.interval) out["interval"] = interval_to_json(*e.interval);
  if (!e.other_orders.empty()) {
    out["other_rank_orders"] = nlohmann::json::array();
    for (const Estimate::OtherOrder& o : e.other_orders)
      out["other_rank_orders"].push_back({{"rank_order", o.order.str()},
                                          {"iteration_time_s", o.iteration_time_s},
                                          {"score", o.simulated ? "simulated" : "analytical"}});
  }
  return out;
}

// The JSON key of a plan setting ("parallel" where the file has no key of its own).
std::string plan_key(PlanField field) {
  switch (field) {
    case PlanField::tp: return "parallel.tp";
    case PlanField::pp: return "parallel.pp";
    case PlanField::dp: return "parallel.dp";
    case PlanField::cp: return "parallel.cp";
    case PlanField::cp_comm: return "parallel.cp_comm";
    case PlanField::ep: return "parallel.ep";
    case PlanField::etp: return "parallel.etp";
    case PlanField::micro_batch: return "parallel.micro_batch";
    case PlanField::global_batch: return "parallel.global_batch";
    case PlanField::seq_length: return "parallel.seq_length";
    case PlanField::virtual_stages: return "parallel.virtual_stages";
    case PlanField::zero_stage: return "parallel.zero_stage";
    case PlanField::schedule: return "parallel.schedule";
    case PlanField::sequence_parallel: return "parallel.sequence_parallel";
    case PlanField::world_size: return "parallel.world_size";
    case PlanField::flash_attention: return "parallel.flash_attention";
    case PlanField::recompute: return "parallel.recompute";
    case PlanField::grad_accum_fusion: return "parallel.grad_accum_fusion";
    case PlanField::trainer: return "parallel.trainer.preset";
    case PlanField::precision: return "parallel.precision";
    case PlanField::fp8_param_gather: return "parallel.fp8_param_gather";
    case PlanField::attention_kernel: return "parallel.attention_kernel";
    case PlanField::recompute_modules: return "parallel.recompute_modules";
    case PlanField::uneven_stages: return "parallel";
    case PlanField::pipeline_layout: return "parallel.pipeline_layout";
    case PlanField::moe_dispatcher: return "parallel.moe_dispatcher";
    case PlanField::cuda_graphs: return "parallel.trainer.cuda_graphs";
    case PlanField::tp_comm_overlap: return "parallel.trainer.tp_comm_overlap";
    case PlanField::overlap_param_gather: return "parallel.trainer.overlap_param_gather";
    case PlanField::overlap_param_gather_with_optimizer_step:
      return "parallel.trainer.overlap_param_gather_with_optimizer_step";
    case PlanField::ddp_bucket_size: return "parallel.trainer.ddp_bucket_size";
    case PlanField::optimizer: return "parallel.optimizer";
    case PlanField::moe_ep_overlap: return "parallel.moe_ep_overlap";
    case PlanField::offload_layers: return "parallel.offload_activations";
    case PlanField::offload_modules: return "parallel.offload_modules";
    case PlanField::recompute_method: return "parallel.recompute_method";
    case PlanField::recompute_num_layers: return "parallel.recompute_num_layers";
    case PlanField::dp_grad_bytes: return "parallel.trainer.dp_grad_bytes";
    case PlanField::fsdp_grad_bytes: return "parallel.trainer.fsdp_grad_bytes";
    case PlanField::moe_rank_capacity_factor: return "parallel.moe_rank_capacity_factor";
    case PlanField::moe_paged_stash: return "parallel.moe_paged_stash";
    case PlanField::precision_aware_optimizer: return "parallel.precision_aware_optimizer";
    case PlanField::adam_moment_bytes: return "parallel.adam_moment_bytes";
    case PlanField::fp8_attention: return "parallel.fp8_attention";
  }
  return "parallel";
}

// The fix of check_plan's refusal of a plan file: what its trainer refuses
// names the settings it runs; anything else the file's maker got wrong.
std::string key_fix(const PlanRejection& r, const ParallelPlan& p) {
  const std::string regenerate = "regenerate it with cuboid plan --trainer " + p.trainer.preset + " ... --out FILE";
  const std::string other_trainer = "name a parallel.trainer.preset that has it, or " + regenerate;
  switch (r.kind) {
    case PlanCheck::trainer_no_zero_stage: {
      std::string stages;
      for (int z = 0; z < 4; ++z)
        if ((r.values[2] >> z) & 1) stages += (stages.empty() ? "" : " or ") + std::to_string(z);
      return "use zero_stage " + stages + ", or name a parallel.trainer.preset that runs ZeRO " +
             std::to_string(r.values[1]) + ", or " + regenerate;
    }
    case PlanCheck::trainer_no_sp: return "set sequence_parallel false, or " + other_trainer;
    case PlanCheck::trainer_no_selective: return "set recompute full or none, or " + other_trainer;
    case PlanCheck::trainer_no_interleaved:
      return "set schedule 1f1b and virtual_stages 1, or " + other_trainer;
    case PlanCheck::trainer_no_flash: return "set flash_attention false, or " + other_trainer;
    case PlanCheck::trainer_no_grad_accum_fusion: return "set grad_accum_fusion false, or " + other_trainer;
    case PlanCheck::trainer_no_cp_a2a: return "set cp_comm p2p, or " + other_trainer;
    case PlanCheck::trainer_no_dispatcher: return "set moe_dispatcher alltoall, or " + other_trainer;
    case PlanCheck::dispatcher_needs_moe: return "drop moe_dispatcher; or " + kRegenerate;
    case PlanCheck::trainer_no_ep_overlap: return "set moe_ep_overlap false, or " + other_trainer;
    case PlanCheck::ep_overlap_refused: return "set moe_ep_overlap false; or " + kRegenerate;
    case PlanCheck::moe_static_refused:
      return "drop moe_rank_capacity_factor and moe_paged_stash, or give a factor and backend they fit; or " +
             kRegenerate;
    case PlanCheck::cuda_graph_module_refused: return "name other modules in trainer.cuda_graphs; or " + kRegenerate;
    case PlanCheck::trainer_no_pipeline:
    case PlanCheck::trainer_no_cp:
    case PlanCheck::trainer_no_ep:
    case PlanCheck::trainer_even_stages:
    case PlanCheck::trainer_even_chunks:
    case PlanCheck::trainer_no_fp8: return other_trainer;
    case PlanCheck::trainer_no_layout: return other_trainer;
    case PlanCheck::trainer_no_kernel: return "set attention_kernel to a kernel the trainer calls, or " + other_trainer;
    case PlanCheck::gpu_no_kernel:
      return "drop attention_kernel (auto), or use the plan with a cluster card whose GPU has rates for it (--cluster)";
    case PlanCheck::kernel_needs_flash: return "drop attention_kernel, or set flash_attention true";
    case PlanCheck::trainer_no_recompute_modules: return "drop recompute_modules, or " + other_trainer;
    case PlanCheck::recompute_modules_need_selective: return "set recompute selective, or drop recompute_modules";
    case PlanCheck::recompute_module_refused: return "drop that module from recompute_modules; or " + kRegenerate;
    case PlanCheck::trainer_no_recompute_layers:
      return "drop recompute_method and recompute_num_layers, or " + other_trainer;
    case PlanCheck::recompute_layers_need_full: return "set recompute full, or drop recompute_method and recompute_num_layers";
    case PlanCheck::trainer_no_offload:
      if (r.field == PlanField::offload_modules) return "drop offload_modules, or " + other_trainer;
      return "drop offload_activations, or " + other_trainer;
    case PlanCheck::offload_layers_range:
      return "give offload_activations 1 to " + std::to_string(r.values[1] - 1) + ", or drop it";
    case PlanCheck::offload_needs_one_stage: return "set pp 1, or drop offload_activations; or " + kRegenerate;
    case PlanCheck::offload_with_recompute: return "set recompute none, or drop offload_activations";
    case PlanCheck::offload_no_host_link:
      if (r.field == PlanField::offload_modules)
        return "drop offload_modules, or use the plan with a cluster card that has host_link (--cluster)";
      return "drop offload_activations, or use the plan with a cluster card that has host_link (--cluster)";
    case PlanCheck::offload_modules_with_layers: return "drop offload_activations or offload_modules";
    case PlanCheck::offload_proj_without_core: return "add core_attn to offload_modules, or drop attn_proj";
    case PlanCheck::offload_in_recomputed_moe: return "drop that module from offload_modules, or moe from recompute_modules";
    case PlanCheck::offload_modules_graphs: return "drop offload_modules; or " + kRegenerate;
    case PlanCheck::cp_comm_needs_cp: return "drop cp_comm, or set cp to 2 or more; or " + kRegenerate;
    case PlanCheck::precision_no_fp8:
    case PlanCheck::precision_no_fp4:
    case PlanCheck::precision_no_microscaling:
      return "drop precision (bf16), or use the plan with a cluster card whose GPU runs it (--cluster)";
    case PlanCheck::param_gather_needs_fp8: return "drop fp8_param_gather, or give an FP8 precision; or " + kRegenerate;
    case PlanCheck::param_gather_needs_dist_opt: return "drop fp8_param_gather, or set zero_stage 1 or 3; or " + kRegenerate;
    case PlanCheck::moments_need_precision_aware:
      return "add \"precision_aware_optimizer\": true, or drop adam_moment_bytes; or " + kRegenerate;
    case PlanCheck::trainer_no_cuda_graphs: return "set trainer.cuda_graphs none, or " + other_trainer;
    case PlanCheck::trainer_no_tp_comm_overlap: return "set trainer.tp_comm_overlap false, or " + other_trainer;
    case PlanCheck::trainer_no_overlap_param_gather: return "set trainer.overlap_param_gather false, or " + other_trainer;
    case PlanCheck::trainer_no_param_gather_in_step:
      return "set trainer.overlap_param_gather_with_optimizer_step false, or " + other_trainer;
    case PlanCheck::trainer_no_ddp_bucket_size: return "drop trainer.ddp_bucket_size, or " + other_trainer;
    case PlanCheck::trainer_no_dp_grad_bytes:
      return "set trainer.dp_grad_bytes to the preset's (" +
             std::to_string(find_trainer(p.trainer.preset)->settings.dp_grad_bytes) + "), or " + other_trainer;
    case PlanCheck::trainer_no_fsdp_grad_bytes: return "drop trainer.fsdp_grad_bytes, or " + other_trainer;
    case PlanCheck::trainer_no_precision_aware:
      return "drop precision_aware_optimizer and adam_moment_bytes, or " + other_trainer;
    case PlanCheck::trainer_no_fp8_attention: return "drop fp8_attention, or " + other_trainer;
    case PlanCheck::trainer_no_muon: return "drop optimizer (Adam), or " + other_trainer;
    case PlanCheck::muon_refused: return "drop optimizer (Adam), or drop the setting it names; or " + kRegenerate;
    case PlanCheck::fp8_attention_recipe:
      return "drop fp8_attention, or give precision fp8-current, fp8-delayed or mxfp8; or " + kRegenerate;
    case PlanCheck::fp8_attention_cudnn:
      return "drop fp8_attention, or set flash_attention true with attention_kernel cudnn; or " + kRegenerate;
    case PlanCheck::fp8_attention_cp: return "drop fp8_attention, or set cp 1; or " + kRegenerate;
    case PlanCheck::fp8_attention_rates:
      return "drop fp8_attention, or use the plan with a cluster card whose GPU profile has those rates (--cluster)";
    case PlanCheck::tp_overlap_needs_sp:
      return "set trainer.tp_comm_overlap false, or tp 2 or more with sequence_parallel true; or " + kRegenerate;
    case PlanCheck::param_overlap_needs_dist_opt:
      return "set trainer.overlap_param_gather false, or zero_stage 1 or 2; or " + kRegenerate;
    case PlanCheck::param_overlap_needs_grad_overlap:
      return "set trainer.overlap_param_gather false, or trainer.dp_overlap true; or " + kRegenerate;
    case PlanCheck::param_gather_in_step_needs:
      return std::string("set trainer.overlap_param_gather_with_optimizer_step false, or ") +
             (p.trainer.overlap_param_gather ? "virtual_stages 2 or more" : "trainer.overlap_param_gather true") +
             "; or " + kRegenerate;
    default: return kRegenerate;
  }
}

// A sub-reader whose errors name the field under `prefix`.
template <typename F>
auto with_prefix(const std::string& prefix, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    throw InputError(e.source(), e.field().empty() ? prefix : prefix + "." + e.field(), e.problem(), e.fix());
  }
}

// A plan's degrees, batch and stage sizes: far beyond any run, far inside int.
int read_int(JsonReader& r, std::string_view key, std::int64_t min_value) {
  return r.count<int>(key, min_value, 1'000'000'000);
}

ParallelPlan read_parallel(JsonReader& r, const std::string& source) {
  ParallelPlan p;
  p.tp = read_int(r, "tp", 1);
  p.pp = read_int(r, "pp", 1);
  p.dp = read_int(r, "dp", 1);
  p.cp = read_int(r, "cp", 1);
  if (const auto comm = r.optional_string("cp_comm"))
    p.cp_comm = parse_cp_comm(*comm, source, "parallel.cp_comm");
  if (r.has("ep")) p.ep = read_int(r, "ep", 1);
  if (r.has("etp")) p.etp = read_int(r, "etp", 1);
  if (const auto d = r.optional_string("moe_dispatcher"))
    p.moe_dispatcher = parse_moe_dispatcher(*d, source, "parallel.moe_dispatcher");
  if (const auto b = r.optional_string("moe_flex_backend"))
    p.moe_flex.backend = parse_flex_backend(*b, source, "parallel.moe_flex_backend");
  if (r.has("moe_flex_sms")) p.moe_flex.sms = read_int(r, "moe_flex_sms", 1);
  if ((r.has("moe_flex_backend") || r.has("moe_flex_sms")) && p.moe_dispatcher != MoeDispatcher::flex)
    throw InputError(source, r.has("moe_flex_backend") ? "parallel.moe_flex_backend" : "parallel.moe_flex_sms",
                     "set with moe_dispatcher " + std::string(to_string(p.moe_dispatcher)),
                     "set moe_dispatcher flex, or drop it");
  if (const auto f = r.optional_positive_number("moe_rank_capacity_factor")) p.moe_flex.rank_capacity_factor = *f;
  p.moe_flex.paged_stash = r.optional_boolean("moe_paged_stash").value_or(false);
  if (const auto f = r.optional_number("moe_paged_stash_buffer_factor")) {
    if (*f == 0)
      throw InputError(source, "parallel.moe_paged_stash_buffer_factor", "0 allocates no stash on the GPU",
                       "give a factor such as 1.1 (of the average tokens) or -1.0 (of the real ones), or drop it");
    p.moe_flex.stash_buffer_factor = *f;
  }
  p.moe_ep_overlap = r.optional_boolean("moe_ep_overlap").value_or(false);
  p.moe_delay_wgrad = r.optional_boolean("moe_delay_wgrad").value_or(true);
  p.micro_batch = read_int(r, "micro_batch", 1);
  // Sequences: the limit of --global-batch, so batch products stay inside 64 bits.
  constexpr std::int64_t kMaxSequences = std::int64_t{1} << 30;
  // Tokens: the limit of a model's sizes (validate_model).
  constexpr std::int64_t kMaxTokens = std::int64_t{1} << 24;
  p.global_batch = r.count<std::int64_t>("global_batch", 1, kMaxSequences);
  p.seq_length = r.count<std::int64_t>("seq_length", 1, kMaxTokens);
  const auto micro_batches = r.count<std::int64_t>("num_micro_batches", 1, kMaxSequences);
  p.virtual_stages = read_int(r, "virtual_stages", 1);
  p.first_stage_layers = read_int(r, "first_stage_layers", 0);
  p.last_stage_layers = read_int(r, "last_stage_layers", 0);
  // Optional: absent in plans without them (and in files written before them).
  p.embedding_in_split = r.optional_boolean("embedding_in_pipeline_split").value_or(false);
  p.loss_in_split = r.optional_boolean("loss_in_pipeline_split").value_or(false);
  if (const auto layout = r.optional_string("pipeline_layout"))
    p.pipeline_layout = parse_pipeline_layout(*layout, source, "parallel.pipeline_layout");
  p.zero_stage = read_int(r, "zero_stage", 0);
  p.recompute = parse_recompute(r.choice("recompute", {"none", "selective", "full"}), source, "parallel.recompute");
  // Optional: written only when given (plan_layout_json).
  if (const auto modules = r.optional_string("recompute_modules"))
    p.recompute_modules = parse_recompute_modules(*modules, source, "parallel.recompute_modules");
  // Optional: written only when not uniform 1 (plan_layout_json).
  if (const auto method = r.optional_string("recompute_method"))
    p.recompute_method = parse_recompute_method(*method, source, "parallel.recompute_method");
  if (r.has("recompute_num_layers")) p.recompute_num_layers = read_int(r, "recompute_num_layers", 1);
  // Optional: written only when some layers are offloaded.
  if (r.has("offload_activations")) p.offload_layers = read_int(r, "offload_activations", 1);
  if (const auto modules = r.optional_string("offload_modules"))
    p.offload_modules = parse_offload_modules(*modules, source, "parallel.offload_modules");
  p.sequence_parallel = r.boolean("sequence_parallel");
  p.schedule = parse_schedule(r.choice("schedule", {"gpipe", "1f1b", "interleaved"}), source, "parallel.schedule");
  p.flash_attention = r.boolean("flash_attention");
  // Optional: absent, the GPU's default fused kernel (auto).
  if (const auto kernel = r.optional_string("attention_kernel"))
    p.attention_kernel = parse_attention_kernel(*kernel, source, "parallel.attention_kernel");
  // Optional: plan files written before the field existed were priced with
  // the fused accumulation, the default.
  p.grad_accum_fusion = r.optional_boolean("grad_accum_fusion").value_or(true);
  // Optional: written only when not bf16 (plan_layout_json).
  if (const auto precision = r.optional_string("precision"))
    p.precision = parse_precision(*precision, source, "parallel.precision");
  p.fp8_param_gather = r.optional_boolean("fp8_param_gather").value_or(false);
  // Optional: written only when on (plan_layout_json).
  p.fp8_attention = r.optional_boolean("fp8_attention").value_or(false);
  // Optional: written only when on (plan_layout_json), and the moments when not fp32.
  p.precision_aware_optimizer = r.optional_boolean("precision_aware_optimizer").value_or(false);
  if (r.has("adam_moment_bytes")) {
    p.adam_moment_bytes = read_int(r, "adam_moment_bytes", 1);
    if (p.adam_moment_bytes != 2 && p.adam_moment_bytes != 4)
      r.fail("adam_moment_bytes", "must be 2 (bf16) or 4 (fp32), got " + std::to_string(p.adam_moment_bytes),
             kRegenerate);
  }
  // Optional: written only when not Adam (plan_layout_json).
  if (const auto optimizer = r.optional_string("optimizer")) {
    if (*optimizer == "muon") p.optimizer = OptimizerKind::muon;
    else if (*optimizer != "adam") r.fail("optimizer", "expected \"adam\" or \"muon\", got \"" + *optimizer + "\"", kRegenerate);
  }
  p.order = RankOrder::parse(r.string("rank_order"), source, "parallel.rank_order");
  const std::int64_t world = r.positive_integer("world_size");
  // Optional: plan files written before trainer presets were priced as
  // Megatron-Core runs them, the default.
  if (r.has("trainer")) {
    JsonReader t = r.object("trainer");
    p.trainer.preset = t.string("preset");
    if (!find_trainer(p.trainer.preset))
      t.fail("preset", "unknown trainer " + quote_value(p.trainer.preset), "use one of " + trainer_names());
    p.trainer.dp_overlap = t.boolean("dp_overlap");
    p.trainer.dp_grad_bytes = t.count<int>("dp_grad_bytes");
    if (p.trainer.dp_grad_bytes != 2 && p.trainer.dp_grad_bytes != 4)
      t.fail("dp_grad_bytes", "must be 2 (16-bit gradients) or 4 (fp32), got " + std::to_string(p.trainer.dp_grad_bytes),
             kRegenerate);
    p.trainer.zero1_grad_all_reduce = t.boolean("zero1_grad_all_reduce");
    p.trainer.tp_backward_overlap = t.boolean("tp_backward_overlap");
    // Absent in plan files written before it existed: the preset's value.
    p.trainer.grad_accum_bytes =
        t.has("grad_accum_bytes") ? t.count<int>("grad_accum_bytes")
                                  : find_trainer(p.trainer.preset)->settings.grad_accum_bytes;
    if (p.trainer.grad_accum_bytes != 6 && p.trainer.grad_accum_bytes != 10 && p.trainer.grad_accum_bytes != 18)
      t.fail("grad_accum_bytes",
             "must be 6 (16-bit .grad accumulated by autograd), 10 (Megatron's main_grad hook) or 18 (DeepSpeed's "
             "BF16Optimizer), got " +
                 std::to_string(p.trainer.grad_accum_bytes),
             kRegenerate);
    // Absent: priced without (files written before it, and every other preset's).
    p.trainer.pp_fsdp_no_sync = t.has("pp_fsdp_no_sync") && t.boolean("pp_fsdp_no_sync");
    read_zero3(t, p.trainer);
    // Absent: the preset's (written only where they differ from it).
    const TrainerSettings& preset = find_trainer(p.trainer.preset)->settings;
    p.trainer.cuda_graphs = preset.cuda_graphs;
    if (const auto graphs = t.optional_string("cuda_graphs"))
      p.trainer.cuda_graphs = CudaGraphs::parse(*graphs, source, "parallel.trainer.cuda_graphs");
    p.trainer.tp_comm_overlap = t.optional_boolean("tp_comm_overlap").value_or(preset.tp_comm_overlap);
    p.trainer.overlap_param_gather = t.optional_boolean("overlap_param_gather").value_or(preset.overlap_param_gather);
    p.trainer.overlap_param_gather_with_optimizer_step = t.optional_boolean("overlap_param_gather_with_optimizer_step")
                                                             .value_or(preset.overlap_param_gather_with_optimizer_step);
    p.trainer.align_param_gather = t.optional_boolean("align_param_gather").value_or(preset.align_param_gather);
    p.trainer.ddp_bucket_params = t.optional_count<std::int64_t>("ddp_bucket_size").value_or(0);
    p.trainer.fsdp_grad_bytes = preset.fsdp_grad_bytes;
    if (t.has("fsdp_grad_bytes")) {
      p.trainer.fsdp_grad_bytes = t.count<int>("fsdp_grad_bytes", 0, 4);
      if (p.trainer.fsdp_grad_bytes != 0 && p.trainer.fsdp_grad_bytes != 2 && p.trainer.fsdp_grad_bytes != 4)
        t.fail("fsdp_grad_bytes",
               "must be 2 (bf16), 4 (fp32) or 0 (the DP reduction's dtype), got " +
                   std::to_string(p.trainer.fsdp_grad_bytes),
               kRegenerate);
    }
    t.reject_unknown();
  } else {
    // Priced as Megatron-Core runs them: its Megatron-FSDP's gradient dtype.
    p.trainer.fsdp_grad_bytes = find_trainer(p.trainer.preset)->settings.fsdp_grad_bytes;
  }
  r.reject_unknown();
  // Multiplied step by step in 64 bits, so a hand-edited size cannot overflow world_size().
  std::int64_t product = 1;
  for (const int v : {p.tp, p.pp, p.dp, p.cp}) {
    product *= v;
    if (product > (std::int64_t{1} << 18))
      r.fail("world_size", "TP x PP x DP x CP is above cuboid's limit of 262144 GPUs", kRegenerate);
  }
  if (world != p.world_size())
    r.fail("world_size", "is " + std::to_string(world) + " but TP x PP x DP x CP = " + std::to_string(p.world_size()),
           kRegenerate);
  if (static_cast<std::int64_t>(p.micro_batch) * p.dp * micro_batches != p.global_batch)
    r.fail("num_micro_batches",
           "is " + std::to_string(micro_batches) + " but global_batch / (micro_batch x dp) = " +
               std::to_string(p.global_batch) + " / " + std::to_string(static_cast<std::int64_t>(p.micro_batch) * p.dp),
           kRegenerate);
  return p;
}

void check_rank_mapping(const nlohmann::json& j, const ParallelPlan& p, int gpus_per_node, const std::string& source) {
  if (!j.is_array()) throw InputError(source, "rank_mapping", "expected an array of ranks", kRegenerate);
  if (j.size() != static_cast<std::size_t>(p.world_size()))
    throw InputError(source, "rank_mapping",
                     "has " + std::to_string(j.size()) + " entries but the plan has " + std::to_string(p.world_size()) +
                         " ranks",
                     kRegenerate);
  RankMapping map(p, gpus_per_node);
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string path = "rank_mapping[" + std::to_string(i) + "]";
    if (!j[i].is_object()) throw InputError(source, path, "expected an object", kRegenerate);
    JsonReader r(j[i], source, path);
    const RankCoord want = map.coord(static_cast<int>(i));
    const std::pair<const char*, int> fields[] = {{"rank", want.rank}, {"node", want.node}, {"gpu", want.gpu},
                                                  {"tp", want.tp},     {"pp", want.pp},     {"dp", want.dp},
                                                  {"cp", want.cp}};
    for (const auto& [key, expected] : fields) {
      if (std::string_view(key) == "cp" && p.cp == 1 && !r.has(key)) continue;  // written with CP only
      const std::int64_t got = r.integer(key);
      if (got != expected)
        r.fail(key,
               "is " + std::to_string(got) + " but rank order " + p.order.str() + " with " +
                   std::to_string(gpus_per_node) + " GPUs per node puts rank " + std::to_string(i) + " at " + key + " " +
                   std::to_string(expected),
               "the file was edited by hand; " + kRegenerate);
    }
    r.reject_unknown();
  }
}

// prediction.other_rank_orders, fastest first; empty when absent.
std::vector<Estimate::OtherOrder> other_rank_orders(const nlohmann::json& prediction, const std::string& source) {
  std::vector<Estimate::OtherOrder> out;
  if (!prediction.is_object() || !prediction.contains("other_rank_orders")) return out;
  const std::string key = "prediction.other_rank_orders";
  const nlohmann::json& a = prediction.at("other_rank_orders");
  if (!a.is_array()) throw InputError(source, key, "expected an array", kRegenerate);
  for (const nlohmann::json& item : a) {
    if (!item.is_object()) throw InputError(source, key, "expected objects {rank_order, iteration_time_s, score}", kRegenerate);
    JsonReader r(item, source, key);
    Estimate::OtherOrder o;
    o.order = RankOrder::parse(r.string("rank_order"), source, key + ".rank_order");
    o.iteration_time_s = r.positive_number("iteration_time_s");
    o.simulated = r.choice("score", {"analytical", "simulated"}) == "simulated";
    r.reject_unknown();
    out.push_back(o);
  }
  return out;
}

// Returns the other rank orders it lists (prediction_to_json's other_rank_orders).
std::vector<Estimate::OtherOrder> check_prediction(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source, "prediction", "expected an object", kRegenerate);
  JsonReader r(j, source, "prediction");
  r.choice("score", {"analytical", "simulated"});
  r.positive_number("iteration_time_s");
  for (const char* key : {"tokens_per_s", "model_flops_per_iteration", "hardware_flops_per_iteration",
                          "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"})
    r.number(key);
  JsonReader mem = r.object("memory");
  for (const char* key : {"parameters_on_gpu", "weights_and_optimizer_bytes", "activation_bytes", "reserve_bytes",
                          "total_bytes", "capacity_bytes", "headroom_bytes", "peak_stage"})
    mem.integer(key);
  mem.boolean("fits");
  mem.reject_unknown();
  JsonReader b = r.object("breakdown");
  for (const char* key : {"compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s"}) b.number(key);
  if (b.has("cp_comm_s")) b.number("cp_comm_s");
  if (b.has("ep_comm_s")) b.number("ep_comm_s");
  if (b.has("offload_s")) b.number("offload_s");
  b.reject_unknown();
  if (r.has("interval")) {
    JsonReader in = r.object("interval");
    if (in.boolean("known")) {
      in.positive_number("low_s");
      in.positive_number("high_s");
    }
    in.string("basis");
    in.reject_unknown();
  }
  std::vector<Estimate::OtherOrder> others = other_rank_orders(j, source);
  r.reject_unknown({"other_rank_orders"});
  return others;
}

}  // namespace

nlohmann::json plan_to_json(const ModelSpec& model, const Cluster& cluster, const Estimate& e) {
  nlohmann::json j;
  j["schema"] = kPlanSchema;
  j["generator"] = std::string("cuboid ") + CUBOID_VERSION;
  j["model"] = model_to_json(model);
  j["cluster"] = {
      {"name", cluster.name},
      {"source_file", cluster.source_file},
      {"nodes", cluster.nodes},
      {"gpus_per_node", cluster.gpus_per_node},
      {"gpu", cluster.gpu.name},
  };
  if (cluster.gpus_per_host > 0) j["cluster"]["gpus_per_host"] = cluster.gpus_per_host;
  j["parallel"] = parallel_to_json(e.plan);
  j["rank_mapping"] = rank_mapping_to_json(e.plan, cluster.gpus_per_node);
  j["prediction"] = prediction_to_json(e);
  return j;
}

PlanFile plan_file_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source, "", "top level is not a JSON object", kRegenerate);
  // The version first: a newer file's other fields would only confuse.
  auto schema = j.find("schema");
  if (schema == j.end() || !schema->is_string())
    throw InputError(source, "schema", "missing (this is not a cuboid plan file)",
                     "pass a file written by cuboid plan --out, which starts with \"schema\": \"cuboid.plan/1\"");
  if (schema->get<std::string>() != kPlanSchema)
    throw InputError(source, "schema", "plan file schema \"" + schema->get<std::string>() + "\" is not supported",
                     "regenerate it with this cuboid, which writes cuboid.plan/1");

  JsonReader r(j, source);
  r.string("schema");
  r.optional_string("generator");
  PlanFile pf;
  pf.source = source;
  if (!r.is_object("model")) r.fail("model", "expected the inline model card (an object)", kRegenerate);
  pf.model = with_prefix("model", [&] { return model_from_json(r.raw("model"), source); });

  JsonReader c = r.object("cluster");
  pf.cluster_name = c.string("name");
  pf.cluster_source_file = c.string("source_file");
  pf.nodes = c.count<int>("nodes");
  pf.gpus_per_node = c.count<int>("gpus_per_node");
  if (c.has("gpus_per_host")) {
    pf.gpus_per_host = c.count<int>("gpus_per_host", 1, pf.nodes * pf.gpus_per_node);
    if (pf.gpus_per_node % pf.gpus_per_host != 0 && pf.gpus_per_host % pf.gpus_per_node != 0)
      c.fail("gpus_per_host",
             std::to_string(pf.gpus_per_host) + " neither divides gpus_per_node " + std::to_string(pf.gpus_per_node) +
                 " nor is a multiple of it",
             kRegenerate);
  }
  pf.gpu_name = c.string("gpu");
  c.reject_unknown();

  JsonReader par = r.object("parallel");
  pf.plan = read_parallel(par, source);

  // The plan must be valid for its own model on the cluster shape it names.
  Cluster shape;
  shape.name = pf.cluster_name;
  shape.source_file = pf.cluster_source_file;
  shape.nodes = pf.nodes;
  shape.gpus_per_node = pf.gpus_per_node;
  // The file names its GPU, not what the GPU runs: the precision is checked
  // against the card the plan is used with (check_plan_matches_cluster).
  shape.gpu.name = pf.gpu_name;
  shape.gpu.peak_fp8_flops = shape.gpu.peak_fp4_flops = 1;
  shape.gpu.microscaling_formats = true;
  // Nor its host link: offloading is checked against the card too.
  shape.host_link.d2h_GBps = shape.host_link.h2d_GBps = 1;
  // Nor its attention kernels: an FP8 attention core (cuDNN's, in the
  // recipe's format) is checked against the card too.
  if (const std::optional<Fp8AttentionFormat> format = pf.plan.fp8_attention_format()) {
    shape.gpu.attention_kernel = AttentionKernel::cudnn;
    shape.gpu.fp8_attention_rates[*format] = AttentionRates{};
  }
  if (auto problem = check_plan(pf.plan, pf.model, shape))
    throw InputError(source, plan_key(problem->field), describe(*problem, pf.model, shape), key_fix(*problem, pf.plan));

  check_rank_mapping(r.raw("rank_mapping"), pf.plan, pf.gpus_per_node, source);
  pf.prediction = r.raw("prediction");
  pf.other_orders = check_prediction(pf.prediction, source);
  r.reject_unknown();
  return pf;
}

PlanFile read_plan_file(const std::filesystem::path& path) {
  return plan_file_from_json(read_json_file(path), path.string());
}

void check_plan_matches_cluster(const PlanFile& pf, const Cluster& cluster) {
  const std::string made_for = std::to_string(pf.nodes) + " nodes x " + std::to_string(pf.gpus_per_node) + " " +
                               pf.gpu_name + " (cluster \"" + pf.cluster_name + "\")";
  const std::string here = std::to_string(cluster.nodes) + " nodes x " + std::to_string(cluster.gpus_per_node) + " " +
                           cluster.gpu.name;
  const std::string source = cluster.source_file.empty() ? cluster.name : cluster.source_file;
  if (cluster.gpus_per_node != pf.gpus_per_node)
    throw InputError(source, "gpus_per_node",
                     "plan file " + pf.source + " was made for " + made_for + " but this cluster has " + here,
                     "use a cluster card with " + std::to_string(pf.gpus_per_node) +
                         " GPUs per node, or regenerate the plan for this cluster");
  if (cluster.total_gpus() != pf.plan.world_size() || cluster.nodes != pf.nodes)
    throw InputError(source, "nodes",
                     "plan file " + pf.source + " was made for " + made_for + " (" +
                         std::to_string(pf.plan.world_size()) + " GPUs) but this cluster has " + here + " (" +
                         std::to_string(cluster.total_gpus()) + " GPUs)",
                     "pass --nodes " + std::to_string(pf.nodes) + ", or regenerate the plan for this cluster");
  if (cluster.gpu.name != pf.gpu_name)
    throw InputError(source, "gpu",
                     "plan file " + pf.source + " was made for " + made_for + " but this cluster has " + here,
                     "use the cluster card the plan was made for (" + pf.cluster_source_file +
                         "), or regenerate the plan for this cluster");
  // What only the card says: whether its GPU runs the plan's precision, and its
  // host link for offloaded activations.
  if (auto problem = check_plan(pf.plan, pf.model, cluster))
    throw InputError(pf.source, plan_key(problem->field), describe(*problem, pf.model, cluster),
                     key_fix(*problem, pf.plan));
}

nlohmann::json zero3_to_json(const TrainerSettings& t) {
  return nlohmann::json{
      {"unit", std::string(to_string(t.zero3_unit))},
      {"persist_params", t.zero3_persist_params},
      {"prefetch_units", t.zero3_prefetch_units},
      {"prefetch_params", t.zero3_prefetch_params},
      {"reuse_params", t.zero3_reuse_params},
      {"reduce_bucket_params", t.zero3_reduce_bucket_params},
      {"reduce_per_tensor", t.zero3_reduce_per_tensor},
      {"sync", t.zero3_sync},
      {"list_collectives", t.zero3_list_collectives},
      {"fetch_norm", t.zero3_fetch_norm},
  };
}

nlohmann::json interval_to_json(const PredictionInterval& i) {
  nlohmann::json j{{"known", i.known}, {"basis", i.basis}};
  if (i.known) {
    j["low_s"] = i.low_s;
    j["high_s"] = i.high_s;
  }
  return j;
}

}  // namespace cuboid
