#include "cuboid/core/plan_check.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cuboid/core/workload.hpp"

namespace cuboid {

namespace {

using F = PlanField;
using K = PlanCheck;
using Found = std::optional<PlanRejection>;

Found reject(PlanCheck kind, PlanField field, std::int64_t a = 0, std::int64_t b = 0, std::int64_t c = 0,
             std::int64_t d = 0, std::int64_t e = 0) {
  return PlanRejection{kind, field, {a, b, c, d, e}};
}

Found check_sizes(const ParallelPlan& p, const ModelSpec& m) {
  const std::pair<std::int64_t, PlanField> sizes[] = {{p.tp, F::tp},
                                                      {p.pp, F::pp},
                                                      {p.dp, F::dp},
                                                      {p.cp, F::cp},
                                                      {p.micro_batch, F::micro_batch},
                                                      {p.global_batch, F::global_batch},
                                                      {p.seq_length, F::seq_length},
                                                      {p.virtual_stages, F::virtual_stages}};
  for (const auto& [v, field] : sizes)
    if (v <= 0) return reject(K::not_positive, field, v);
  // Megatron-Core's uniform method steps by N (recompute.py: a loop that
  // never ends at 0), its block method recomputes nothing at 0.
  if (p.recompute_num_layers <= 0) return reject(K::not_positive, F::recompute_num_layers, p.recompute_num_layers);
  // 0: the trainer's rule.
  if (p.trainer.ddp_bucket_params < 0) return reject(K::not_positive, F::ddp_bucket_size, p.trainer.ddp_bucket_params);
  if (p.zero_stage < 0 || p.zero_stage > 3) return reject(K::zero_stage_range, F::zero_stage, p.zero_stage);
  if (p.seq_length > m.max_position_embeddings)
    return reject(K::seq_over_max, F::seq_length, p.seq_length, m.max_position_embeddings);
  return std::nullopt;
}

// The presets' limits, in the order their can_run fields are listed.
Found check_trainer_limits(const ParallelPlan& p, const TrainerPreset& t, std::int64_t preset) {
  if (p.pp > 1 && !t.pipeline) return reject(K::trainer_no_pipeline, F::pp, preset);
  if (p.sequence_parallel && !t.sequence_parallel) return reject(K::trainer_no_sp, F::sequence_parallel, preset);
  if (p.recompute == Recompute::selective && !t.selective_recompute)
    return reject(K::trainer_no_selective, F::recompute, preset);
  if (!t.interleaved && (p.schedule == Schedule::interleaved || p.virtual_stages > 1))
    return reject(K::trainer_no_interleaved, p.schedule == Schedule::interleaved ? F::schedule : F::virtual_stages,
                  preset);
  if (p.flash_attention && !t.flash_attention) return reject(K::trainer_no_flash, F::flash_attention, preset);
  if (p.grad_accum_fusion && !t.grad_accum_fusion)
    return reject(K::trainer_no_grad_accum_fusion, F::grad_accum_fusion, preset);
  if (p.cp > 1 && !t.context_parallel) return reject(K::trainer_no_cp, F::cp, preset);
  if (p.cp > 1 && p.cp_comm == CpComm::a2a && !t.context_parallel_a2a)
    return reject(K::trainer_no_cp_a2a, F::cp_comm, preset);
  if (p.precision != Precision::bf16 && !t.fp8) return reject(K::trainer_no_fp8, F::precision, preset);
  // Without expert parallelism the experts split as the attention does: EP 1, ETP = TP.
  if ((p.ep > 1 || (p.etp > 0 && p.etp != p.tp)) && !t.expert_parallel)
    return reject(K::trainer_no_ep, p.ep > 1 ? F::ep : F::etp, preset);
  if (std::find(t.moe_dispatchers.begin(), t.moe_dispatchers.end(), p.moe_dispatcher) == t.moe_dispatchers.end())
    return reject(K::trainer_no_dispatcher, F::moe_dispatcher, preset);
  if (p.moe_ep_overlap && !t.moe_ep_overlap) return reject(K::trainer_no_ep_overlap, F::moe_ep_overlap, preset);
  std::int64_t stages = 0;
  for (int z : t.zero_stages) stages |= std::int64_t{1} << z;
  if (p.zero_stage >= 0 && p.zero_stage <= 3 && ((stages >> p.zero_stage) & 1) == 0)
    return reject(K::trainer_no_zero_stage, F::zero_stage, preset, p.zero_stage, stages);
  if (has_uneven_stages(p)) {
    if (!t.uneven_stages) return reject(K::trainer_even_stages, F::uneven_stages, preset);
    if (chunks_per_stage(p) > 1 && !t.uneven_interleaved) return reject(K::trainer_even_chunks, F::uneven_stages, preset);
  }
  if (has_pipeline_layout(p) && !t.pipeline_layout) return reject(K::trainer_no_layout, F::pipeline_layout, preset);
  const auto& kernels = t.attention_kernels;
  if (p.flash_attention && p.attention_kernel != AttentionKernel::auto_ &&
      std::find(kernels.begin(), kernels.end(), p.attention_kernel) == kernels.end())
    return reject(K::trainer_no_kernel, F::attention_kernel, preset, static_cast<std::int64_t>(p.attention_kernel));
  if (p.recompute_modules != 0 && !t.recompute_modules)
    return reject(K::trainer_no_recompute_modules, F::recompute_modules, preset);
  if (p.recompute_layers_set() && !t.recompute_layers)
    return reject(K::trainer_no_recompute_layers,
                  p.recompute_method != RecomputeMethod::uniform ? F::recompute_method : F::recompute_num_layers, preset);
  if (p.trainer.cuda_graphs.on() && !t.cuda_graphs) return reject(K::trainer_no_cuda_graphs, F::cuda_graphs, preset);
  if (p.trainer.tp_comm_overlap && !t.tp_comm_overlap)
    return reject(K::trainer_no_tp_comm_overlap, F::tp_comm_overlap, preset);
  if (p.trainer.overlap_param_gather_with_optimizer_step && !t.overlap_param_gather_with_optimizer_step)
    return reject(K::trainer_no_param_gather_in_step, F::overlap_param_gather_with_optimizer_step, preset);
  if (p.trainer.overlap_param_gather && !t.overlap_param_gather)
    return reject(K::trainer_no_overlap_param_gather, F::overlap_param_gather, preset);
  if (p.trainer.ddp_bucket_params != 0 && !t.ddp_bucket_size)
    return reject(K::trainer_no_ddp_bucket_size, F::ddp_bucket_size, preset);
  if (p.offload_layers != 0 && !t.activation_offloading)
    return reject(K::trainer_no_offload, F::offload_layers, preset);
  if (!t.runs_dp_grad_bytes(p.trainer.dp_grad_bytes))
    return reject(K::trainer_no_dp_grad_bytes, F::dp_grad_bytes, preset, p.trainer.dp_grad_bytes);
  if (!t.runs_fsdp_grad_bytes(p.trainer.fsdp_grad_bytes))
    return reject(K::trainer_no_fsdp_grad_bytes, F::fsdp_grad_bytes, preset, p.trainer.fsdp_grad_bytes);
  if (p.optimizer == OptimizerKind::muon && !t.muon) return reject(K::trainer_no_muon, F::optimizer, preset);
  if (p.precision_aware_optimizer && !t.precision_aware_optimizer)
    return reject(K::trainer_no_precision_aware, F::precision_aware_optimizer, preset);
  if (p.fp8_attention && !t.fp8_attention) return reject(K::trainer_no_fp8_attention, F::fp8_attention, preset);
  if (p.offload_modules != 0 && !t.activation_offloading)
    return reject(K::trainer_no_offload, F::offload_modules, preset);
  return std::nullopt;
}

// Megatron-LM d98e8a64 megatron/training/arguments.py:1441-1442: TP
// communication overlap only with sequence parallelism (which :1433-1439
// turns off at TP 1); :1024-1028: --overlap-param-gather only with the
// distributed optimizer (or Megatron-FSDP) and --overlap-grad-reduce;
// :1066-1072: --overlap-param-gather-with-optimizer-step only with the
// distributed optimizer, --overlap-param-gather and an interleaved schedule.
Found check_overlaps(const ParallelPlan& p) {
  if (p.trainer.tp_comm_overlap && (p.tp < 2 || !p.sequence_parallel))
    return reject(K::tp_overlap_needs_sp, F::tp_comm_overlap, p.tp, p.sequence_parallel ? 1 : 0);
  if (p.trainer.overlap_param_gather && p.zero_stage == 0)
    return reject(K::param_overlap_needs_dist_opt, F::overlap_param_gather, p.zero_stage);
  if (p.trainer.overlap_param_gather && !p.trainer.dp_overlap)
    return reject(K::param_overlap_needs_grad_overlap, F::overlap_param_gather);
  if (p.trainer.overlap_param_gather_with_optimizer_step && !p.trainer.overlap_param_gather)
    return reject(K::param_gather_in_step_needs, F::overlap_param_gather_with_optimizer_step, 0);
  if (p.trainer.overlap_param_gather_with_optimizer_step && p.virtual_stages < 2)
    return reject(K::param_gather_in_step_needs, F::overlap_param_gather_with_optimizer_step, 1);
  return std::nullopt;
}

// Megatron-Core's checks of cpu_offloading (transformer_config.py
// __post_init__ at d98e8a64: fewer layers than the model's, no pipeline
// parallelism, no recomputation), then that the card says what the copies
// cross.
Found check_offload(const ParallelPlan& p, const ModelSpec& m, const Cluster& c) {
  if (p.offload_layers == 0) return std::nullopt;
  if (p.offload_layers < 0 || p.offload_layers >= m.num_layers)
    return reject(K::offload_layers_range, F::offload_layers, p.offload_layers, m.num_layers);
  if (p.pp > 1) return reject(K::offload_needs_one_stage, F::offload_layers, p.pp);
  if (p.recompute != Recompute::none) return reject(K::offload_with_recompute, F::offload_layers);
  // transformer_config.py:2800-2801@d98e8a64: "CUDA graphs not supported with
  // CPU offloading" unless the graph is the full iteration.
  if (p.trainer.cuda_graphs.on() && p.trainer.cuda_graphs.impl != CudaGraphImpl::full_iteration)
    return reject(K::offload_with_layer_graphs, F::offload_layers);
  if (!c.host_link.present()) return reject(K::offload_no_host_link, F::offload_layers);
  return std::nullopt;
}

// Megatron-Core's checks of fine-grained activation offloading
// (transformer_config.py __post_init__ at d98e8a64: not with cpu_offloading
// :2127-2130; attn_proj only with core_attn :2148-2153; nothing inside a
// recomputed MoE MLP :2165-2175; with CUDA graphs :2929-2962), then that the
// card says what the copies cross. Modules that touch no layer of the model
// (expert_fc1 on a dense model; a norm fused into the next linear layer)
// offload nothing, as in Megatron-Core.
Found check_offload_modules(const ParallelPlan& p, const Cluster& c) {
  if (p.offload_modules == 0) return std::nullopt;
  using M = OffloadModule;
  if (p.offload_layers > 0) return reject(K::offload_modules_with_layers, F::offload_modules);
  if (p.offloads(M::attn_proj) && !p.offloads(M::core_attn)) return reject(K::offload_proj_without_core, F::offload_modules);
  if (p.recomputes(RecomputeModule::moe))
    for (const M module : {M::expert_fc1, M::moe_act})
      if (p.offloads(module))
        return reject(K::offload_in_recomputed_moe, F::offload_modules, static_cast<std::int64_t>(module));
  const CudaGraphs& g = p.trainer.cuda_graphs;
  if (g.impl == CudaGraphImpl::local || g.impl == CudaGraphImpl::transformer_engine) {
    using R = OffloadGraphRefusal;
    const auto refuse = [](R why) {
      return reject(K::offload_modules_graphs, F::offload_modules, static_cast<std::int64_t>(why));
    };
    if (g.impl == CudaGraphImpl::local) {
      const auto moe_only = static_cast<std::uint8_t>(M::expert_fc1) | static_cast<std::uint8_t>(M::moe_act);
      if ((p.offload_modules & ~moe_only) != 0) return refuse(R::local_attention);
      if (g.modules == 0) return refuse(R::local_whole_layer);
      if ((g.modules & static_cast<std::uint8_t>(CudaGraphModule::moe)) != 0) return refuse(R::local_moe);
    }
    if ((g.modules & static_cast<std::uint8_t>(CudaGraphModule::moe)) != 0) return refuse(R::moe_captured);
  }
  if (!c.host_link.present()) return reject(K::offload_no_host_link, F::offload_modules);
  return std::nullopt;
}

// Megatron-Core's checks of --recompute-modules (transformer_config.py
// __post_init__ at d98e8a64, lines 1964-2012: moe_act only with grouped
// expert GEMMs, mla_up_proj only with latent attention, neither moe_act nor
// layernorm with delayed FP8 scaling). Every module is priced (memory.cpp,
// workload.cpp); one that touches no layer of the model (layernorm on a
// dense layer of standard attention, whose norms are fused into Transformer
// Engine's linear layers; moe and shared_experts without them; mlp on MoE
// layers) recomputes nothing, as in Megatron-Core.
Found check_recompute_modules(const ParallelPlan& p, const ModelSpec& m) {
  // transformer_config.py:1908-1932 and arguments.py:1425-1428 at d98e8a64:
  // a method and a layer count with full granularity only (cuboid's none has
  // no granularity: nothing for them to say).
  if (p.recompute_layers_set() && p.recompute != Recompute::full)
    return reject(K::recompute_layers_need_full,
                  p.recompute_method != RecomputeMethod::uniform ? F::recompute_method : F::recompute_num_layers);
  if (p.recompute_modules == 0) return std::nullopt;
  if (p.recompute != Recompute::selective) return reject(K::recompute_modules_need_selective, F::recompute_modules);
  using M = RecomputeModule;
  auto refuse = [](M module) {
    return reject(K::recompute_module_refused, F::recompute_modules, static_cast<std::int64_t>(module));
  };
  if (p.recomputes(M::moe_act) && !m.moe.enabled()) return refuse(M::moe_act);
  if (p.recomputes(M::mla_up_proj) && !m.mla.enabled()) return refuse(M::mla_up_proj);
  if (p.precision == Precision::fp8_delayed)
    for (const M module : {M::moe_act, M::layernorm})
      if (p.recomputes(module)) return refuse(module);
  return std::nullopt;
}

// Megatron-Core's checks of the per-layer graphs' modules against the model
// and the plan (transformer_config.py __post_init__ at d98e8a64, lines
// 2824-2869 and 3063-3071; the list's own rules are CudaGraphs::parse's).
Found check_cuda_graph_modules(const ParallelPlan& p, const ModelSpec& m) {
  const CudaGraphs& g = p.trainer.cuda_graphs;
  using R = CudaGraphRefusal;
  const auto refuse = [](R why) {
    return reject(K::cuda_graph_module_refused, F::cuda_graphs, static_cast<std::int64_t>(why));
  };
  const auto has = [&](CudaGraphModule x) { return g.names(x); };
  // Recomputation under graphs (2854-2899): full recomputation with the
  // full-iteration graph only; a graphed recomputation draws no random
  // numbers, so no dropout in a recomputed module a graph captures (the
  // full-iteration graph and a whole-layer one capture every module).
  if (g.on()) {
    if (p.recompute == Recompute::full && g.impl != CudaGraphImpl::full_iteration) return refuse(R::full_recompute);
    const bool whole = g.impl == CudaGraphImpl::full_iteration || g.modules == 0;
    const auto graphed = [&](CudaGraphModule x, RecomputeModule r) { return (whole || has(x)) && p.recomputes(r); };
    if (m.attention_dropout != 0 && graphed(CudaGraphModule::attn, RecomputeModule::core_attn))
      return refuse(R::graphed_attn_dropout);
    if (m.hidden_dropout != 0 && (graphed(CudaGraphModule::mlp, RecomputeModule::mlp) ||
                                  graphed(CudaGraphModule::moe, RecomputeModule::moe)))
      return refuse(R::graphed_hidden_dropout);
  }
  if (g.impl != CudaGraphImpl::local && g.impl != CudaGraphImpl::transformer_engine) return std::nullopt;
  if (!m.moe.enabled()) {
    if (has(CudaGraphModule::moe) || has(CudaGraphModule::moe_router)) return refuse(R::moe_needs_moe);
  } else {
    if (!m.has_dense_and_moe_layers() && has(CudaGraphModule::mlp)) return refuse(R::mlp_needs_dense);
    if (has(CudaGraphModule::moe)) return refuse(R::moe_needs_drop_pad);
    if (p.moe_dispatcher == MoeDispatcher::alltoall && m.moe.capacity_factor > 0 &&
        has(CudaGraphModule::moe_preprocess))
      return refuse(R::preprocess_host_sync);
  }
  const bool te = g.impl == CudaGraphImpl::transformer_engine;
  if (te && p.recompute == Recompute::selective && p.recomputes(RecomputeModule::moe) &&
      has(CudaGraphModule::moe_router))
    return refuse(R::router_with_moe_recompute);
  if (te && p.moe_ep_overlap && (has(CudaGraphModule::moe) || has(CudaGraphModule::mlp))) return refuse(R::ep_overlap);
  return std::nullopt;
}

// Megatron-Core's requirements of --overlap-moe-expert-parallel-comm
// (transformer_config.py __post_init__ at d98e8a64, the lines describe
// names): with PP > 1 the interleaved schedule, whose steady state it combines.
Found check_ep_overlap(const ParallelPlan& p, const ModelSpec& m) {
  if (!p.moe_ep_overlap) return std::nullopt;
  using R = EpOverlapRefusal;
  const auto refuse = [&](R why) {
    return reject(K::ep_overlap_refused, F::moe_ep_overlap, static_cast<std::int64_t>(why), m.mtp_layers);
  };
  if (!m.moe.enabled()) return refuse(R::needs_moe);
  if (p.ep <= 1) return refuse(R::needs_ep);
  if (p.moe_dispatcher == MoeDispatcher::allgather) return refuse(R::dispatcher);
  if (p.recompute == Recompute::full) return refuse(R::full_recompute);
  if (p.recomputes(RecomputeModule::moe)) return refuse(R::moe_recompute);
  if (m.mtp_layers > 1) return refuse(R::mtp_layers);
  if (p.pp > 1 && p.schedule != Schedule::interleaved) return refuse(R::needs_interleaved);
  return std::nullopt;
}

// HybridEP's static receive budget and the paged stash: Megatron-Core's
// checks (transformer_config.py __post_init__ at d98e8a64), then that the
// busiest EP rank's token copies fit the budget. Above it HybridEP drops
// them and Megatron-Core's PagedStashRunner reruns every such step dropless
// without the stash (paged_stash.py, training.py:4439-4440): a second
// forward and backward that cuboid refuses rather than prices.
Found check_moe_static(const ParallelPlan& p, const ModelSpec& m) {
  const FlexSetting& f = p.moe_flex;
  if (f.rank_capacity_factor <= 0 && !f.paged_stash) return std::nullopt;
  using R = MoeStaticRefusal;
  const PlanField field = f.rank_capacity_factor > 0 ? F::moe_rank_capacity_factor : F::moe_paged_stash;
  const auto refuse = [&](R why, PlanField at, std::int64_t rows = 0, std::int64_t budget = 0) {
    return reject(K::moe_static_refused, at, static_cast<std::int64_t>(why), rows, budget);
  };
  if (!m.moe.enabled()) return refuse(R::needs_moe, field);
  if (f.paged_stash && f.rank_capacity_factor <= 0) return refuse(R::stash_needs_factor, F::moe_paged_stash);
  if (p.moe_dispatcher != MoeDispatcher::flex || f.backend != FlexBackend::hybridep)
    return refuse(R::needs_hybridep, F::moe_rank_capacity_factor);
  if (f.paged_stash && p.offload_layers > 0) return refuse(R::stash_with_offload, F::moe_paged_stash);
  constexpr auto expert_offload =
      static_cast<std::uint8_t>(static_cast<unsigned>(OffloadModule::expert_fc1) | static_cast<unsigned>(OffloadModule::moe_act));
  if (f.paged_stash && (p.offload_modules & expert_offload) != 0)
    return refuse(R::stash_with_moe_offload, F::moe_paged_stash);
  const double rows = expert_tokens(m, p), budget = rank_budget_rows(m, p);
  if (rows > budget)
    return refuse(R::over_budget, F::moe_rank_capacity_factor, static_cast<std::int64_t>(std::ceil(rows)),
                  static_cast<std::int64_t>(budget));
  return std::nullopt;
}

Found check_tp(const ParallelPlan& p, const ModelSpec& m) {
  if (m.num_attention_heads % p.tp != 0) return reject(K::tp_heads, F::tp, p.tp, m.num_attention_heads);
  if (m.num_kv_heads % p.tp != 0) return reject(K::tp_kv_heads, F::tp, p.tp, m.num_kv_heads);
  if (m.ffn_hidden_size % p.tp != 0) return reject(K::tp_ffn, F::tp, p.tp, m.ffn_hidden_size);
  return std::nullopt;
}

// Megatron-LM runs context parallelism in Transformer Engine's fused
// attention only, and splits each sequence into 2 x CP chunks (arguments.py:
// seq_length % (2 x context_parallel_size) == 0).
Found check_cp(const ParallelPlan& p, const ModelSpec& m) {
  // The exchange is CP's: asked for without it, it would be ignored.
  if (p.cp <= 1) return p.cp_comm == CpComm::a2a ? reject(K::cp_comm_needs_cp, F::cp_comm) : std::nullopt;
  if (!p.flash_attention) return reject(K::cp_needs_flash, F::cp);
  if (p.seq_length % (2LL * p.cp) != 0) return reject(K::cp_chunks, F::cp, p.seq_length, 2LL * p.cp);
  if (p.sequence_parallel && (p.seq_length / p.cp) % p.tp != 0)
    return reject(K::cp_sp_tokens, F::cp, p.seq_length / p.cp, p.tp);
  // The all-to-all gives each rank heads / (TP x CP) query and key/value
  // heads of the whole sequence.
  if (p.cp_comm == CpComm::a2a && ((m.num_attention_heads / p.tp) % p.cp != 0 || (m.num_kv_heads / p.tp) % p.cp != 0))
    return reject(K::cp_a2a_heads, F::cp_comm, p.cp, m.num_attention_heads / p.tp, m.num_kv_heads / p.tp);
  return std::nullopt;
}

// ZeRO-3 by whole blocks (Megatron-FSDP's and FSDP2's units): what cuboid
// prices for MoE and latent-attention layers. DeepSpeed's per-tensor units,
// host waits, list-form collectives and reduce buckets cut a layer by its
// dense weights (layer_weights) only.
bool zero3_by_blocks(const TrainerSettings& ts) {
  return ts.zero3_unit == Zero3Unit::block && !ts.zero3_sync && !ts.zero3_list_collectives &&
         ts.zero3_reduce_bucket_params <= 0;
}

// The experts' dimensions, as Megatron-Core constrains them (arguments.py,
// moe_layer.py, parallel_state.py at d98e8a64), and the ETP cuboid models.
Found check_experts(const ParallelPlan& p, const ModelSpec& m) {
  if (p.ep <= 0) return reject(K::not_positive, F::ep, p.ep);
  if (p.etp < 0) return reject(K::not_positive, F::etp, p.etp);
  if (!m.moe.enabled()) {
    // A dense plan names no ETP (complete_plan leaves it 0): one given would be ignored.
    if (p.ep > 1 || p.etp > 0) return reject(K::ep_needs_moe, p.ep > 1 ? F::ep : F::etp);
    // A dense plan moves no tokens to experts: a dispatcher given would be ignored.
    if (p.moe_dispatcher != MoeDispatcher::alltoall) return reject(K::dispatcher_needs_moe, F::moe_dispatcher);
    return std::nullopt;
  }
  if (m.moe.num_experts % p.ep != 0) return reject(K::ep_experts, F::ep, p.ep, m.moe.num_experts);
  if (p.expert_tp() != 1 && p.expert_tp() != p.tp) return reject(K::etp_not_1_or_tp, F::etp, p.expert_tp(), p.tp);
  if (m.moe.expert_ffn_hidden_size % p.expert_tp() != 0)
    return reject(K::etp_ffn, F::etp, p.expert_tp(), m.moe.expert_ffn_hidden_size);
  if (m.moe.shared_expert_ffn_hidden_size % p.tp != 0)
    return reject(K::tp_shared_ffn, F::tp, p.tp, m.moe.shared_expert_ffn_hidden_size);
  const std::int64_t dense = static_cast<std::int64_t>(p.tp) * p.cp * p.dp;
  const std::int64_t folded = static_cast<std::int64_t>(p.expert_tp()) * p.ep;
  if (dense % folded != 0) return reject(K::ep_fold, F::ep, folded, dense);
  // ZeRO-3 of an MoE model is priced as Megatron-FSDP runs it (and FSDP2,
  // whose experts are an FSDP module of their own in each block): whole
  // blocks, the routed experts a bucket of their own over expert-DP
  // (step.cpp).
  if (p.zero_stage >= 3 && !zero3_by_blocks(p.trainer)) return reject(K::moe_zero3, F::zero_stage);
  if (p.tp > 1 && !p.sequence_parallel) return reject(K::moe_needs_sp, F::sequence_parallel);
  return std::nullopt;
}

Found check_latent_attention(const ParallelPlan& p, const ModelSpec& m) {
  if (!m.mla.enabled()) return std::nullopt;
  if (p.cp > 1) return reject(K::mla_cp, F::cp);
  if (p.zero_stage >= 3 && !zero3_by_blocks(p.trainer)) return reject(K::mla_zero3, F::zero_stage);
  return std::nullopt;
}

// What the GPU's tensor cores run (Transformer Engine d0067d0d
// transformer_engine/pytorch/quantization.py check_*_support: FP8 from
// compute capability 8.9, MXFP8 and NVFP4 from 10.0), read from the
// profile's rates and microscaling_formats.
Found check_precision(const ParallelPlan& p, const GpuProfile& gpu) {
  if (p.fp8_param_gather && p.precision == Precision::bf16)
    return reject(K::param_gather_needs_fp8, F::fp8_param_gather);
  // Megatron-LM d98e8a64 optimizer_config.py __post_init__: the moments'
  // dtype "can only be fp32 when not using precision-aware optimizer".
  if (p.adam_moment_bytes != 4 && !p.precision_aware_optimizer)
    return reject(K::moments_need_precision_aware, F::adam_moment_bytes, p.adam_moment_bytes);
  if (p.optimizer == OptimizerKind::muon) {
    using M = MuonRefusal;
    const auto muon = [&](M why, PlanField field) {
      return reject(K::muon_refused, field, static_cast<std::int64_t>(why), p.zero_stage);
    };
    if (p.zero_stage >= 2) return muon(M::zero_stage, F::zero_stage);
    if (p.precision_aware_optimizer) return muon(M::precision_aware, F::precision_aware_optimizer);
    if (p.trainer.overlap_param_gather_with_optimizer_step)
      return muon(M::param_gather_in_step, F::overlap_param_gather_with_optimizer_step);
  }
  if (p.precision == Precision::bf16) return std::nullopt;
  if (p.precision == Precision::nvfp4) {
    if (gpu.peak_fp4_flops <= 0) return reject(K::precision_no_fp4, F::precision);
  } else if (gpu.peak_fp8_flops <= 0) {
    return reject(K::precision_no_fp8, F::precision);
  }
  if ((p.precision == Precision::mxfp8 || p.precision == Precision::nvfp4) && !gpu.microscaling_formats)
    return reject(K::precision_no_microscaling, F::precision);
  // ZeRO-3 is Megatron-FSDP, which runs FP8 (Megatron-LM d98e8a64
  // megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:
  // FP8 parameter groups, their shards and transposes). Megatron-LM
  // d98e8a64 megatron/training/arguments.py: --fp8-param-gather only with
  // the distributed optimizer, torch FSDP2 or Megatron-FSDP.
  if (p.fp8_param_gather && p.zero_stage == 0)
    return reject(K::param_gather_needs_dist_opt, F::fp8_param_gather, p.zero_stage);
  return std::nullopt;
}

// FP8 attention (--fp8-attention, Megatron-Core's --fp8-dot-product-attention):
// Megatron-Core passes fp8_dpa to the delayed, current-scaling, MXFP8 and
// NVFP4 recipes, not to the blockwise one (Megatron-LM d98e8a64 fp8_utils.py
// get_fp8_recipe, fp4_utils.py get_fp4_recipe); Transformer Engine d0067d0d
// runs it per-tensor under delayed and current scaling and in MXFP8 under
// MXFP8, and under NVFP4 only with NVTE_DPA_FP8_RECIPE naming another recipe
// (dot_product_attention.py init_fp8_metadata), which cuboid does not model.
// Its FP8 backend is cuDNN's fused attention (backends.py FusedAttention:
// FusedAttnBackend["FP8"]). Under context parallelism it runs
// context_parallel.py's FP8 path (FP8 K/V chunks on the ring, amax
// reductions over CP), not modelled.
Found check_fp8_attention(const ParallelPlan& p, const GpuProfile& gpu) {
  if (!p.fp8_attention) return std::nullopt;
  const std::optional<Fp8AttentionFormat> format = p.fp8_attention_format();
  if (!format) return reject(K::fp8_attention_recipe, F::fp8_attention, static_cast<std::int64_t>(p.precision));
  const AttentionKernel runs = p.attention_kernel == AttentionKernel::auto_ ? gpu.attention_kernel : p.attention_kernel;
  if (!p.flash_attention || runs != AttentionKernel::cudnn)
    return reject(K::fp8_attention_cudnn, F::fp8_attention,
                  static_cast<std::int64_t>(p.flash_attention ? runs : AttentionKernel::unfused));
  if (p.cp > 1) return reject(K::fp8_attention_cp, F::fp8_attention, p.cp);
  if (fp8_attention_rates_of(gpu, *format) == nullptr)
    return reject(K::fp8_attention_rates, F::fp8_attention, static_cast<std::int64_t>(*format));
  return std::nullopt;
}

// Megatron-Core builds every stage's layers as `v` equal chunks
// (transformer_config.py __post_init__: the first / last stage's layers
// divisible by the virtual pipeline size; transformer_block.py
// get_num_layers_to_build: every stage's).
Found check_uneven_split(const ParallelPlan& p, const ModelSpec& m) {
  if (p.pp < 2) return reject(K::uneven_needs_pp, F::uneven_stages);
  const int fixed_stages = (p.first_stage_layers > 0 ? 1 : 0) + (p.last_stage_layers > 0 ? 1 : 0);
  const std::int64_t rest = m.num_layers - p.first_stage_layers - p.last_stage_layers;
  const int middle = p.pp - fixed_stages;
  if (rest < middle || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0))
    return reject(K::uneven_rest, F::uneven_stages, p.first_stage_layers, p.last_stage_layers, rest, m.num_layers,
                  middle);
  if (const int v = p.virtual_stages; v > 1) {
    const std::int64_t layers[] = {p.first_stage_layers, p.last_stage_layers, middle > 0 ? rest / middle : 0};
    for (int which = 0; which < 3; ++which)
      if (layers[which] % v != 0) return reject(K::uneven_chunks, F::uneven_stages, which, layers[which], v);
  }
  return std::nullopt;
}

// Megatron-Core's checks of the pipeline layout and of the embedding and the
// loss counted as layers (transformer_config.py __post_init__ at d98e8a64:
// neither with first / last stage layers, the layout with neither;
// validate_layer_layout; num_layers + counted divisible by PP, and a stage's
// share by the virtual pipeline size).
Found check_layout(const ParallelPlan& p, const ModelSpec& m) {
  if (has_uneven_stages(p)) return reject(K::layout_with_uneven, F::pipeline_layout);
  const int v = chunks_per_stage(p);
  if (p.pipeline_layout.empty()) {
    const std::int64_t counted = split_layers(p, m.num_layers);
    if (counted % (static_cast<std::int64_t>(p.pp) * v) != 0)
      return reject(K::counted_split, v > 1 ? F::virtual_stages : F::pp, m.num_layers, counted, p.pp, v);
    return std::nullopt;
  }
  if (p.embedding_in_split || p.loss_in_split) return reject(K::layout_with_counted, F::pipeline_layout);
  const auto stages = static_cast<std::int64_t>(p.pipeline_layout.decoders.size());
  if (stages != static_cast<std::int64_t>(p.pp) * v) return reject(K::layout_stages, F::pipeline_layout, stages, p.pp, v);
  std::int64_t decoders = 0;
  for (int n : p.pipeline_layout.decoders) decoders += n;
  if (decoders != m.num_layers) return reject(K::layout_layers, F::pipeline_layout, decoders, m.num_layers);
  if (p.pipeline_layout.mtp != m.mtp_layers) return reject(K::layout_mtp, F::pipeline_layout, p.pipeline_layout.mtp, m.mtp_layers);
  return std::nullopt;
}

Found check_stages(const ParallelPlan& p, const ModelSpec& m) {
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0) return reject(K::stage_layers_negative, F::uneven_stages);
  if (has_pipeline_layout(p)) return check_layout(p, m);
  if (has_uneven_stages(p)) return check_uneven_split(p, m);
  const std::int64_t chunks = static_cast<std::int64_t>(p.pp) * p.virtual_stages;
  if (m.num_layers % chunks != 0)
    return reject(K::layers_split, p.virtual_stages > 1 ? F::virtual_stages : F::pp, p.pp, p.virtual_stages, chunks,
                  m.num_layers);
  return std::nullopt;
}

// The attention kernel: fused only with flash attention on, the GPU's rates
// for it (a profile with an attention_kernels table prices only the kernels
// it lists), and auto's kernel (the GPU's default) one the trainer calls.
Found check_attention_kernel(const ParallelPlan& p, const GpuProfile& gpu, const TrainerPreset& t, std::int64_t preset) {
  const auto k = static_cast<std::int64_t>(p.attention_kernel);
  if (p.attention_kernel == AttentionKernel::unfused ||
      (!p.flash_attention && p.attention_kernel != AttentionKernel::auto_))
    return reject(K::kernel_needs_flash, F::attention_kernel, k);
  if (!p.flash_attention) return std::nullopt;
  const AttentionKernel runs = p.attention_kernel == AttentionKernel::auto_ ? gpu.attention_kernel : p.attention_kernel;
  if (runs == AttentionKernel::auto_) return std::nullopt;  // a card without a named kernel: its flash rates
  if (!gpu.attention_rates.empty() && !gpu.attention_rates.count(runs))
    return reject(K::gpu_no_kernel, F::attention_kernel, static_cast<std::int64_t>(runs));
  const auto& kernels = t.attention_kernels;
  if (std::find(kernels.begin(), kernels.end(), runs) == kernels.end())
    return reject(K::trainer_no_kernel, F::attention_kernel, preset, static_cast<std::int64_t>(runs));
  return std::nullopt;
}

Found check_schedule(const ParallelPlan& p) {
  if (p.schedule == Schedule::interleaved && p.virtual_stages < 2) return reject(K::interleaved_needs_v, F::schedule);
  if (p.schedule != Schedule::interleaved && p.virtual_stages > 1)
    return reject(K::v_needs_interleaved, F::virtual_stages, p.virtual_stages);
  if (p.virtual_stages > 1 && p.pp < 2) return reject(K::v_needs_pp, F::virtual_stages);
  if (p.sequence_parallel && p.tp == 1) return reject(K::sp_needs_tp, F::sequence_parallel);
  return std::nullopt;
}

Found check_world(const ParallelPlan& p, const Cluster& c) {
  const std::int64_t gpus = c.total_gpus();
  // In floating point: the factors are positive ints, so the product cannot
  // overflow (world_size() can, for a DP of 2147483647), and it is exact
  // whenever it is at most the GPU count.
  const double world = static_cast<double>(p.tp) * p.pp * p.dp * p.cp;
  if (world > static_cast<double>(gpus)) return reject(K::world_over_gpus, F::world_size, p.tp, p.pp, p.dp, p.cp, gpus);
  if (p.world_size() != gpus) return reject(K::world_not_gpus, F::world_size, p.world_size(), gpus, p.cp);
  return std::nullopt;
}

Found check_batch(const ParallelPlan& p) {
  const std::int64_t per_step = static_cast<std::int64_t>(p.micro_batch) * p.dp;
  if (p.global_batch % per_step != 0) return reject(K::batch_split, F::global_batch, p.global_batch, per_step);
  if (p.schedule == Schedule::interleaved && p.num_micro_batches() % p.pp != 0)
    return reject(K::interleaved_batches, F::global_batch, p.num_micro_batches(), p.pp, per_step * p.pp);
  return std::nullopt;
}

std::string n(std::int64_t v) { return std::to_string(v); }

std::string trainer_words(std::int64_t preset, const std::string& what) {
  const auto presets = trainer_presets();
  if (preset < 0 || preset >= static_cast<std::int64_t>(presets.size())) return "the plan's trainer " + what;
  const TrainerPreset& t = presets[static_cast<std::size_t>(preset)];
  return t.name + " " + what + " (" + t.description + ")";
}

// The trainers' limits in words, "" for other kinds.
std::string describe_trainer(const PlanRejection& r) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::trainer_unknown: return "unknown trainer preset";
    case K::trainer_no_pipeline: return trainer_words(v[0], "has no pipeline parallelism here");
    case K::trainer_no_sp: return trainer_words(v[0], "has no sequence parallelism");
    case K::trainer_no_selective: return trainer_words(v[0], "recomputes whole layers only (no selective recomputation)");
    case K::trainer_no_interleaved: return trainer_words(v[0], "has no interleaved schedule");
    case K::trainer_no_flash: return trainer_words(v[0], "runs the unfused attention core");
    case K::trainer_no_grad_accum_fusion: return trainer_words(v[0], "has no gradient-accumulation fusion");
    case K::trainer_no_cp: return trainer_words(v[0], "has no context parallelism here");
    case K::trainer_no_cp_a2a:
      return trainer_words(v[0], "exchanges K/V around the ring only (no all-to-all of attention heads)");
    case K::trainer_no_ep: return trainer_words(v[0], "has no expert parallelism here");
    case K::trainer_no_dispatcher: return trainer_words(v[0], "has no such MoE token dispatcher here");
    case K::trainer_no_ep_overlap:
      return trainer_words(v[0], "has no EP all-to-all overlap (Megatron-Core's --overlap-moe-expert-parallel-comm)");
    case K::trainer_no_zero_stage: return trainer_words(v[0], "cannot run ZeRO stage " + n(v[1]));
    case K::trainer_even_stages: return trainer_words(v[0], "gives every pipeline stage the same number of layers");
    case K::trainer_even_chunks: return trainer_words(v[0], "has no uneven stages with the interleaved schedule");
    case K::trainer_no_fp8: return trainer_words(v[0], "runs no FP8 / FP4 linear layers here (no Transformer Engine recipe)");
    case K::trainer_no_kernel:
      return trainer_words(v[0], "cannot call the " + std::string(to_string(static_cast<AttentionKernel>(v[1]))) +
                                     " attention kernel");
    case K::trainer_no_recompute_modules:
      return trainer_words(v[0], "recomputes the attention core only (no --recompute-modules)");
    case K::recompute_modules_need_selective: return "recompute modules are those of a selective recomputation";
    case K::trainer_no_recompute_layers:
      return trainer_words(v[0], "recomputes every layer or none (no --recompute-method / --recompute-num-layers)");
    case K::recompute_layers_need_full:
      return "a recompute method and layer count are those of a full recomputation (Megatron-Core refuses them with "
             "selective granularity, arguments.py:1425-1428 and transformer_config.py:1926-1932 at d98e8a64, and "
             "ignores them without recomputation)";
    case K::trainer_no_offload: return trainer_words(v[0], "keeps every activation on the GPU (no CPU offloading)");
    case K::offload_layers_range:
      return "Megatron-Core offloads fewer layers than the model's " + n(v[1]) + ", at least 1; " + n(v[0]) + " given";
    case K::offload_needs_one_stage:
      return "Megatron-Core offloads activations to the CPU only without pipeline parallelism (PP " + n(v[0]) + ")";
    case K::offload_with_recompute:
      return "Megatron-Core offloads activations to the CPU only without activation recomputation";
    case K::offload_modules_with_layers:
      return "Megatron-Core refuses fine-grained activation offloading with CPU offloading "
             "(transformer_config.py:2127-2130 at d98e8a64)";
    case K::offload_proj_without_core:
      return "Megatron-Core offloads attn_proj only with core_attn: attn_proj's input is core_attn's output, which "
             "core_attn's backward needs (transformer_config.py:2148-2153 at d98e8a64)";
    case K::offload_in_recomputed_moe:
      return "Megatron-Core cannot offload " + std::string(to_string(static_cast<OffloadModule>(v[0]))) +
             " while recomputing the whole MoE MLP (--recompute-modules moe; transformer_config.py:2165-2175 at "
             "d98e8a64)";
    case K::offload_modules_graphs:
      switch (static_cast<OffloadGraphRefusal>(v[0])) {
        case OffloadGraphRefusal::local_attention:
          return "Megatron-Core's local CUDA graphs offload only expert_fc1 and moe_act (transformer_config.py:2931-2938 "
                 "at d98e8a64)";
        case OffloadGraphRefusal::local_whole_layer:
          return "Megatron-Core refuses fine-grained activation offloading with local CUDA graphs of the whole layer "
                 "(transformer_config.py:2940-2943 at d98e8a64)";
        case OffloadGraphRefusal::local_moe:
          return "Megatron-Core offloads under local CUDA graphs only when the MoE MLP is not captured "
                 "(transformer_config.py:2944-2959 at d98e8a64)";
        case OffloadGraphRefusal::moe_captured:
          return "Megatron-Core refuses fine-grained activation offloading with a CUDA graph of the MoE MLP "
                 "(\"Token-drop MoE is temporarily not supported with activation offloading\", "
                 "transformer_config.py:2960-2962 at d98e8a64)";
      }
      return "";
    case K::offload_with_layer_graphs:
      return "Megatron-Core refuses per-layer CUDA graphs with CPU offloading (\"CUDA graphs not supported with CPU "
             "offloading\"); only the full-iteration graph runs with it";
    case K::recompute_module_refused: {
      const std::string name(to_string(static_cast<RecomputeModule>(v[0])));
      if (name == "mla_up_proj") return "Megatron-Core recomputes mla_up_proj only with latent attention";
      if (name == "moe_act")
        return "Megatron-Core recomputes moe_act only with grouped expert GEMMs (an MoE model) and without delayed "
               "FP8 scaling";
      return "Megatron-Core does not recompute " + name + " with delayed FP8 scaling";
    }
    case K::trainer_no_layout:
      return trainer_words(v[0], "has no pipeline layout (the embedding and the loss counted as layers, or a layout string)");
    case K::trainer_no_cuda_graphs: return trainer_words(v[0], "has no Megatron-Core CUDA graphs");
    case K::trainer_no_tp_comm_overlap:
      return trainer_words(v[0], "has no Transformer Engine userbuffers TP overlap");
    case K::trainer_no_overlap_param_gather:
      return trainer_words(v[0], "has no parameter all-gather overlapped with the forward");
    case K::trainer_no_param_gather_in_step:
      return trainer_words(v[0], "has no parameter all-gather under the optimizer step");
    case K::trainer_no_ddp_bucket_size:
      return trainer_words(v[0], "has no DDP bucket size to set (Megatron-Core's --ddp-bucket-size)");
    case K::trainer_no_dp_grad_bytes:
      return trainer_words(v[0], std::string("does not reduce gradients in ") + (v[1] == 2 ? "16 bits" : "fp32"));
    case K::trainer_no_precision_aware:
      return trainer_words(v[0], "has no precision-aware optimizer (Transformer Engine's FusedAdam holding the "
                                 "optimizer's states)");
    case K::trainer_no_fp8_attention:
      return trainer_words(v[0], "has no FP8 attention core (Transformer Engine's fp8_dpa)");
    case K::trainer_no_muon: return trainer_words(v[0], "has no Muon optimizer (Megatron-Core's emerging optimizers)");
    case K::muon_refused:
      switch (static_cast<MuonRefusal>(v[0])) {
        case MuonRefusal::zero_stage:
          return "Megatron-Core runs Muon with ZeRO 0 or its layer-wise distributed optimizer (ZeRO 1), not ZeRO " +
                 n(v[1]) + " (arguments.py asserts no Megatron-FSDP or FSDP2 with an emerging optimizer)";
        case MuonRefusal::precision_aware:
          return "Muon keeps fp32 master weights and momentum of its own; the precision-aware optimizer is Transformer "
                 "Engine's FusedAdam";
        case MuonRefusal::param_gather_in_step:
          return "Megatron-Core's layer-wise Muon has no parameter all-gather under the optimizer step "
                 "(optimizer/__init__.py asserts against overlap_param_gather_with_optimizer_step)";
      }
      return "";
    case K::trainer_no_fsdp_grad_bytes:
      return trainer_words(v[0], std::string("has no Megatron-FSDP to keep gradients in ") +
                                     (v[1] == 2 ? "bf16" : "fp32") + " (its ZeRO 2 / 3 gradients follow the DP reduction's dtype)");
    case K::tp_overlap_needs_sp:
      return "TP communication overlap needs sequence parallelism and TP > 1 (here TP " + n(v[0]) + ", SP " +
             (v[1] != 0 ? "on" : "off") +
             "; Megatron-LM d98e8a64 megatron/training/arguments.py:1442 asserts sequence_parallel, which :1433-1439 "
             "turns off at TP 1)";
    case K::param_overlap_needs_dist_opt:
      return "the overlapped parameter all-gather is the distributed optimizer's (ZeRO 1, 2; Megatron-FSDP's ZeRO 3), "
             "not ZeRO " + n(v[0]) + " (Megatron-LM d98e8a64 megatron/training/arguments.py:1025)";
    case K::param_overlap_needs_grad_overlap:
      return "the overlapped parameter all-gather needs the overlapped gradient reduction (Megatron-LM d98e8a64 "
             "megatron/training/arguments.py:1028 asserts overlap_grad_reduce)";
    case K::param_gather_in_step_needs:
      return std::string("the parameter all-gather under the optimizer step needs ") +
             (v[0] == 0 ? "the overlapped parameter all-gather (Megatron-LM d98e8a64 megatron/training/arguments.py:1070)"
                        : "virtual stages (Megatron-LM d98e8a64 megatron/training/arguments.py:1072: an interleaved schedule)");
    default: return "";
  }
}

// The words of the kinds about sizes, TP and CP; "" for the others.
std::string describe_sizes(const PlanRejection& r, const ModelSpec& m) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::not_positive: return "must be positive, got " + n(v[0]);
    case K::zero_stage_range: return "ZeRO stage must be 0, 1, 2 or 3, got " + n(v[0]);
    case K::seq_over_max:
      return "sequence length " + n(v[0]) + " exceeds the model's max_position_embeddings " + n(v[1]) + " (" + m.name +
             ")";
    case K::tp_heads: return "TP " + n(v[0]) + " does not divide the " + n(v[1]) + " attention heads of " + m.name;
    case K::tp_kv_heads:
      return "TP " + n(v[0]) + " does not divide the " + n(v[1]) + " key/value heads of " + m.name +
             " (Megatron-LM requires num_query_groups % TP == 0)";
    case K::tp_ffn: return "TP " + n(v[0]) + " does not divide ffn_hidden_size " + n(v[1]);
    case K::cp_needs_flash: return "context parallelism needs fused (flash) attention (Transformer Engine's)";
    case K::cp_chunks: return "sequence length " + n(v[0]) + " does not split into 2 x CP = " + n(v[1]) + " chunks";
    case K::cp_sp_tokens:
      return "the " + n(v[0]) + " tokens of a CP rank do not split over TP " + n(v[1]) + " for sequence parallelism";
    case K::cp_comm_needs_cp:
      return "the a2a exchange is context parallelism's; with CP 1 there is nothing to exchange and it has no effect";
    case K::cp_a2a_heads:
      return "the a2a exchange needs CP " + n(v[0]) + " to divide the heads per TP rank (" + n(v[1]) + " query, " +
             n(v[2]) + " key/value)";
    default: return "";
  }
}

// Megatron-Core's assertions quoted with their lines in transformer_config.py at d98e8a64.
std::string describe_ep_overlap(EpOverlapRefusal why, std::int64_t mtp, const ModelSpec& m) {
  const std::string what = "the EP all-to-all overlap (--overlap-moe-expert-parallel-comm) ";
  const std::string at = " (Megatron-Core asserts it: megatron/core/transformer/transformer_config.py:";
  switch (why) {
    case EpOverlapRefusal::needs_moe: return what + "needs a mixture-of-experts model; " + m.name + " has no experts";
    case EpOverlapRefusal::needs_ep: return what + "needs expert parallelism, EP > 1" + at + "3013@d98e8a64)";
    case EpOverlapRefusal::dispatcher:
      return what + "runs with the alltoall or flex token dispatcher, not allgather" + at + "3016@d98e8a64)";
    case EpOverlapRefusal::full_recompute:
      return what + "cannot run with full recomputation" + at + "3021@d98e8a64)";
    case EpOverlapRefusal::moe_recompute:
      return what + "cannot run with the MoE layer recomputed (--recompute-modules moe)" + at + "3030@d98e8a64)";
    case EpOverlapRefusal::mtp_layers:
      return what + "supports at most one MTP layer; " + m.name + " has " + n(mtp) + at + "3042@d98e8a64)";
    case EpOverlapRefusal::needs_interleaved:
      return what + "with PP > 1 needs the interleaved schedule (virtual stages)" + at + "3007@d98e8a64)";
  }
  return "";
}

std::string describe_moe_static(MoeStaticRefusal why, std::int64_t rows, std::int64_t budget, const ModelSpec& m) {
  const std::string at = " (Megatron-Core asserts it: megatron/core/transformer/transformer_config.py:";
  switch (why) {
    case MoeStaticRefusal::needs_moe:
      return "a rank capacity factor or paged stash needs a mixture-of-experts model; " + m.name + " has no experts";
    case MoeStaticRefusal::needs_hybridep:
      return "moe_expert_rank_capacity_factor requires the flex token dispatcher with the hybridep backend" + at +
             "1868-1874@d98e8a64; its ncclep backend is not modelled)";
    case MoeStaticRefusal::stash_needs_factor:
      return "moe_paged_stash requires moe_expert_rank_capacity_factor to be set" + at + "2213-2217@d98e8a64)";
    case MoeStaticRefusal::stash_with_offload:
      return "moe_paged_stash cannot be enabled with cpu_offloading" + at + "2211-2212@d98e8a64)";
    case MoeStaticRefusal::stash_with_moe_offload:
      return "with moe_paged_stash, offload_modules must not include expert_fc1 or moe_act (the paged stash covers "
             "those activations)" + at + "2218-2226@d98e8a64)";
    case MoeStaticRefusal::over_budget:
      return "the busiest EP rank receives " + n(rows) + " token copies per MoE layer, above its static budget of " +
             n(budget) + ": HybridEP drops the excess and Megatron-Core reruns every step dropless without the "
             "paged stash (megatron/core/transformer/moe/paged_stash.py PagedStashRunner@d98e8a64), a second "
             "forward and backward cuboid does not price";
  }
  return "";
}

std::string describe_cuda_graph_modules(CudaGraphRefusal why) {
  const std::string at = " (Megatron-Core asserts it: megatron/core/transformer/transformer_config.py:";
  switch (why) {
    case CudaGraphRefusal::moe_needs_moe: return "moe cuda graph is only supported for MoE" + at + "2829@d98e8a64)";
    case CudaGraphRefusal::mlp_needs_dense:
      return "mlp cuda graph is only supported for dense layers, but not found in the model" + at + "2835@d98e8a64)";
    case CudaGraphRefusal::moe_needs_drop_pad:
      return "moe cuda graph is only supported with drop-padding MoE" + at +
             "2844@d98e8a64), and cuboid does not model --moe-pad-expert-input-to-capacity";
    case CudaGraphRefusal::preprocess_host_sync:
      return "moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
             "preprocess step (the alltoall dispatcher with a capacity factor)" +
             at + "2851@d98e8a64)";
    case CudaGraphRefusal::router_with_moe_recompute:
      return "moe recompute is not supported with moe_router CUDA graph with --cuda-graph-impl transformer_engine" +
             at + "2868@d98e8a64)";
    case CudaGraphRefusal::ep_overlap:
      return "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm" + at +
             "3069@d98e8a64)";
    case CudaGraphRefusal::full_recompute:
      return "full recompute is only supported with full iteration CUDA graph" + at + "2858@d98e8a64)";
    case CudaGraphRefusal::graphed_attn_dropout:
      return "attention dropout is not supported with graphed attention recomputation (the model's attention "
             "dropout is not 0, and the graph captures the recomputed core)" +
             at + "2883@d98e8a64)";
    case CudaGraphRefusal::graphed_hidden_dropout:
      return "hidden dropout is not supported with graphed MLP/MoE recomputation (the model's hidden dropout is "
             "not 0, and the graph captures the recomputed MLP)" +
             at + "2899@d98e8a64)";
  }
  return "";
}

std::string describe_experts(const PlanRejection& r, const ModelSpec& m) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::ep_needs_moe: return "expert parallelism needs a mixture-of-experts model; " + m.name + " has no experts";
    case K::dispatcher_needs_moe:
      return "a token dispatcher needs a mixture-of-experts model; " + m.name + " has no experts";
    case K::ep_experts: return "EP " + n(v[0]) + " does not divide the " + n(v[1]) + " experts of " + m.name;
    case K::etp_not_1_or_tp:
      return "ETP " + n(v[0]) + " is neither 1 nor TP " + n(v[1]) +
             " (cuboid prices the experts' TP on the attention's TP group, or none)";
    case K::etp_ffn: return "ETP " + n(v[0]) + " does not divide the experts' FFN size " + n(v[1]);
    case K::tp_shared_ffn: return "TP " + n(v[0]) + " does not divide the shared experts' FFN size " + n(v[1]);
    case K::ep_fold:
      return "ETP x EP = " + n(v[0]) + " does not divide the TP x CP x DP = " + n(v[1]) +
             " ranks of a pipeline stage, which the experts regroup";
    case K::moe_zero3:
      return "ZeRO-3 of a mixture-of-experts model is modelled for trainers that gather whole blocks (Megatron-FSDP, "
             "FSDP2) only, not by weight tensor, host waits, list-form collectives or reduce buckets (DeepSpeed)";
    case K::moe_needs_sp:
      return "a mixture-of-experts layer with TP > 1 needs sequence parallelism (Megatron-Core refuses to train "
             "without it)";
    case K::mla_cp: return "context parallelism with latent attention is not modelled";
    case K::mla_zero3:
      return "ZeRO-3 of a latent-attention model is modelled for trainers that gather whole blocks (Megatron-FSDP, "
             "FSDP2) only, not by weight tensor, host waits, list-form collectives or reduce buckets (DeepSpeed)";
    case K::ep_overlap_refused: return describe_ep_overlap(static_cast<EpOverlapRefusal>(v[0]), v[1], m);
    case K::cuda_graph_module_refused: return describe_cuda_graph_modules(static_cast<CudaGraphRefusal>(v[0]));
    case K::moe_static_refused: return describe_moe_static(static_cast<MoeStaticRefusal>(v[0]), v[1], v[2], m);
    default: return "";
  }
}

// "it has rates for flash2 and flash1" / "it has none".
std::string kernels_with_rates(const GpuProfile& gpu) {
  std::string out;
  for (const auto& entry : gpu.attention_rates)
    out += (out.empty() ? "" : ", ") + std::string(to_string(entry.first));
  return out.empty() ? "it has none" : "it has rates for " + out;
}

std::string describe_precision(const PlanRejection& r, const Cluster& c) {
  const std::string gpu = c.gpu.name;
  switch (r.kind) {
    case K::precision_no_fp8:
      return gpu + " has no FP8 tensor cores (its profile gives no peak_fp8_tflops; Transformer Engine needs compute "
                   "capability 8.9 or more)";
    case K::precision_no_fp4: return gpu + " has no FP4 tensor cores (its profile gives no peak_fp4_tflops)";
    case K::precision_no_microscaling:
      return gpu + " has no block-scaled tensor-core formats (MXFP8, NVFP4: Transformer Engine runs them on compute "
                   "capability 10.0, Blackwell; its profile's microscaling_formats is false)";
    case K::param_gather_needs_fp8: return "the FP8 parameter all-gather needs an FP8 precision";
    case K::moments_need_precision_aware:
      return "Adam's moments in " + std::string(r.values[0] == 2 ? "bf16" : std::to_string(r.values[0]) + "-byte elements") +
             " need the precision-aware optimizer (Megatron-Core keeps them fp32 without it)";
    case K::param_gather_needs_dist_opt:
      return "the FP8 parameter all-gather is the distributed optimizer's or Megatron-FSDP's (ZeRO 1, 2 or 3), not "
             "ZeRO " + std::to_string(r.values[0]);
    case K::gpu_no_kernel:
      return gpu + "'s profile has no published rates for the " +
             std::string(to_string(static_cast<AttentionKernel>(r.values[0]))) + " attention kernel (" +
             kernels_with_rates(c.gpu) + ")";
    case K::kernel_needs_flash:
      return "the " + std::string(to_string(static_cast<AttentionKernel>(r.values[0]))) +
             " attention kernel with flash attention off";
    case K::fp8_attention_recipe:
      return static_cast<Precision>(r.values[0]) == Precision::fp8_blockwise
                 ? "FP8 attention under the blockwise recipe: Megatron-Core gives that recipe no fp8_dpa, so the "
                   "attention core stays bf16"
                 : "FP8 attention needs an FP8 recipe that runs it: delayed or current scaling (per-tensor) or "
                   "MXFP8, not " + std::string(to_string(static_cast<Precision>(r.values[0]))) +
                       " (Transformer Engine runs it under NVFP4 only with NVTE_DPA_FP8_RECIPE set, not modelled)";
    case K::fp8_attention_cudnn:
      return "FP8 attention is cuDNN's fused attention (Transformer Engine's FP8 backend), not the " +
             std::string(to_string(static_cast<AttentionKernel>(r.values[0]))) + " attention core";
    case K::fp8_attention_cp:
      return "FP8 attention under context parallelism (CP " + std::to_string(r.values[0]) +
             ": Transformer Engine's FP8 ring, not modelled)";
    case K::fp8_attention_rates:
      return gpu + "'s profile has no measured rates for cuDNN's " +
             std::string(describe(static_cast<Fp8AttentionFormat>(r.values[0]))) + " attention (attention_kernels.cudnn." +
             std::string(card_key(static_cast<Fp8AttentionFormat>(r.values[0]))) + ")";
    default: return "";
  }
}

std::string describe_stages(const PlanRejection& r, const ModelSpec& m) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::stage_layers_negative: return "stage layer counts must not be negative";
    case K::uneven_needs_pp: return "uneven stages need PP >= 2";
    case K::uneven_rest:
      return "first stage " + n(v[0]) + " + last stage " + n(v[1]) + " layers leave " + n(v[2]) + " of the " + n(v[3]) +
             " layers of " + m.name + ", which do not split evenly over the other " + n(v[4]) + " stages";
    case K::uneven_chunks: {
      static constexpr const char* kWhich[] = {"first stage", "last stage", "each middle stage"};
      return std::string(kWhich[v[0]]) + "'s " + n(v[1]) + " layers do not split into " + n(v[2]) +
             " virtual stages (every stage holds its layers as " + n(v[2]) + " equal chunks)";
    }
    case K::layers_split:
      return "PP " + n(v[0]) + " x virtual stages " + n(v[1]) + " = " + n(v[2]) + " does not divide the " + n(v[3]) +
             " layers of " + m.name + " (Megatron-LM once trained a silently smaller model here)";
    case K::layout_with_uneven:
      return "first / last stage layers cannot be combined with a pipeline layout or with the embedding / loss "
             "counted as layers (Megatron-Core refuses it)";
    case K::layout_with_counted:
      return "a pipeline layout places the embedding and the loss itself; they cannot also be counted as layers "
             "(Megatron-Core refuses it)";
    case K::counted_split:
      return "the " + n(v[0]) + " layers of " + m.name + " with the embedding / loss counted as layers are " + n(v[1]) +
             ", which PP " + n(v[2]) + " x virtual stages " + n(v[3]) + " = " + n(v[2] * v[3]) + " does not divide";
    case K::layout_stages:
      return "the pipeline layout has " + n(v[0]) + " virtual stages, not PP " + n(v[1]) + " x virtual stages " +
             n(v[2]) + " = " + n(v[1] * v[2]);
    case K::layout_layers:
      return "the pipeline layout has " + n(v[0]) + " decoder layers t, but " + m.name + " has " + n(v[1]);
    case K::layout_mtp:
      return "the pipeline layout has " + n(v[0]) + " MTP modules m, but " + m.name + " has " + n(v[1]);
    case K::interleaved_needs_v: return "the interleaved schedule needs virtual stages >= 2";
    case K::v_needs_interleaved: return "virtual stages " + n(v[0]) + " need the interleaved schedule";
    case K::v_needs_pp: return "virtual stages need pipeline parallelism (PP >= 2)";
    case K::sp_needs_tp: return "sequence parallelism needs TP > 1";
    default: return "";
  }
}

std::string describe_world(const PlanRejection& r, const Cluster& c) {
  const auto& v = r.values;
  switch (r.kind) {
    case K::offload_no_host_link:
      return "cluster " + c.name + " states no link between a GPU and host memory for the offloaded activations";
    case K::world_over_gpus: {
      const double world =
          static_cast<double>(v[0]) * static_cast<double>(v[1]) * static_cast<double>(v[2]) * static_cast<double>(v[3]);
      return std::string(v[3] > 1 ? "TP x CP x PP x DP" : "TP x PP x DP") + " = " + fmt::format("{:.0f}", world) +
             " GPUs but cluster " + c.name + " has " + n(v[4]);
    }
    case K::world_not_gpus:
      return std::string(v[2] > 1 ? "TP x CP x PP x DP" : "TP x PP x DP") + " = " + n(v[0]) + " does not use all " +
             n(v[1]) + " GPUs of " + c.name;
    case K::batch_split: return "global batch " + n(v[0]) + " is not divisible by micro-batch x DP = " + n(v[1]);
    case K::interleaved_batches:
      return "the interleaved schedule needs the number of micro-batches (" + n(v[0]) + ") to be a multiple of PP " +
             n(v[1]);
    default: return "";
  }
}

}  // namespace

std::optional<PlanRejection> check_trainer(const ParallelPlan& p, const TrainerPreset& t) {
  const auto presets = trainer_presets();
  const std::int64_t preset =
      &t >= presets.data() && &t < presets.data() + presets.size() ? &t - presets.data() : -1;
  return check_trainer_limits(p, t, preset);
}

std::optional<PlanRejection> check_plan(const ParallelPlan& p, const ModelSpec& m, const Cluster& c) {
  if (Found r = check_sizes(p, m)) return r;
  const TrainerPreset* trainer = find_trainer(p.trainer.preset);
  if (trainer == nullptr) return reject(K::trainer_unknown, F::trainer);
  if (Found r = check_trainer(p, *trainer)) return r;
  if (Found r = check_tp(p, m)) return r;
  if (Found r = check_cp(p, m)) return r;
  if (Found r = check_experts(p, m)) return r;
  if (Found r = check_ep_overlap(p, m)) return r;
  if (Found r = check_moe_static(p, m)) return r;
  if (Found r = check_cuda_graph_modules(p, m)) return r;
  if (Found r = check_latent_attention(p, m)) return r;
  if (Found r = check_recompute_modules(p, m)) return r;
  if (Found r = check_offload(p, m, c)) return r;
  if (Found r = check_offload_modules(p, c)) return r;
  if (Found r = check_precision(p, c.gpu)) return r;
  if (Found r = check_overlaps(p)) return r;
  {
    const auto presets = trainer_presets();
    const std::int64_t preset = trainer - presets.data();
    if (Found r = check_attention_kernel(p, c.gpu, *trainer, preset)) return r;
  }
  if (Found r = check_fp8_attention(p, c.gpu)) return r;
  if (Found r = check_stages(p, m)) return r;
  if (Found r = check_schedule(p)) return r;
  if (Found r = check_world(p, c)) return r;
  return check_batch(p);
}

std::string describe(const PlanRejection& r, const ModelSpec& m, const Cluster& c) {
  for (std::string words : {describe_sizes(r, m), describe_experts(r, m), describe_precision(r, c),
                            describe_stages(r, m), describe_world(r, c), describe_trainer(r)})
    if (!words.empty()) return words;
  return "";
}

}  // namespace cuboid
