#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// ParallelPlan: one point of the search space (TP x PP x DP, micro-batch,
// virtual stages, ZeRO, recomputation, sequence parallelism, schedule, rank
// order), and the rank <-> (node, gpu) mapping with its process groups.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"

namespace cuboid {

enum class Recompute { none, selective, full };
enum class Schedule { gpipe, one_f_one_b, interleaved };
enum class Dim { tp, dp, pp };
// What ZeRO-3 gathers at once: a transformer block (FSDP2, Megatron-FSDP:
// one unit per layer) or each weight tensor of a layer (DeepSpeed's
// per-module hooks: QKV, proj, FC1, FC2).
enum class Zero3Unit { block, tensor };
// How context parallelism exchanges keys and values (Megatron's
// --cp-comm-type, Transformer Engine's context-parallel attention): p2p: a
// ring of send/recv that passes each rank's K/V chunk on while it computes
// attention with the one it holds; a2a: an all-to-all of Q, K and V that
// gives each rank all tokens of heads / CP heads (DeepSpeed-Ulysses), and
// one of the output back.
enum class CpComm { p2p, a2a };
// How an MoE layer's tokens reach the EP ranks of their experts and come back
// (Megatron-Core's --moe-token-dispatcher-type, megatron/core/transformer/moe/
// token_dispatcher.py at d98e8a64; docs/cost-model.md "Token dispatchers"):
// alltoall: each token copy (top-k per token) sent to its expert's EP rank by
// an NCCL all-to-all (MoEAlltoAllTokenDispatcher); allgather: every rank's
// tokens all-gathered over the ETP x EP ranks and the outputs reduce-scattered
// back (MoEAllGatherTokenDispatcher); flex: DeepEP's (HybridEP's inside one
// NVLink domain) fused dispatch and combine, a token sent once to each rank
// and, across nodes, once to each node, then forwarded over NVLink
// (MoEFlexTokenDispatcher).
enum class MoeDispatcher { alltoall, allgather, flex };
// The flex dispatcher's kernels (Megatron-Core --moe-flex-dispatcher-backend
// and --moe-flex-dispatcher-num-sms, transformer_config.py at d98e8a64;
// docs/cost-model.md "HybridEP"): DeepEP's (the default) or HybridEP's, and
// the SMs their dispatch and combine kernels take (0: the backend's default,
// core/dispatch.hpp flex_kernels).
enum class FlexBackend : std::uint8_t { deepep, hybridep };
// With HybridEP, Megatron-Core's static shapes (transformer_config.py at
// d98e8a64; docs/cost-model.md "Rank capacity and paged stash"):
// rank_capacity_factor is --moe-expert-rank-capacity-factor, each EP rank's
// receive budget its own tokens x top-k x the factor, rounded up to 256
// (token_dispatcher.py:1098-1112), instead of a size the host reads each
// step (0: dropless, Megatron's None); paged_stash is --moe-paged-stash, the
// experts' saved activations copied at their real size into one page buffer
// of stash_buffer_factor x the in-flight tokens
// (--moe-paged-stash-buffer-size-factor-cuda; positive: of the average
// tokens, budget / factor; negative: of the real ones).
struct FlexSetting {
  FlexBackend backend = FlexBackend::deepep;
  int sms = 0;
  double rank_capacity_factor = 0;
  bool paged_stash = false;
  double stash_buffer_factor = 1.10;
  friend bool operator==(const FlexSetting&, const FlexSetting&) = default;
};
// The format of the linear layers' GEMMs (Megatron-Core --fp8-format hybrid
// with --fp8-recipe, Transformer Engine's recipes; docs/cost-model.md "FP8"):
// bf16; FP8 with delayed scaling (an amax history per tensor), per-tensor
// current scaling, blockwise scaling (1 x 128 activations, 128 x 128
// weights), MXFP8 (1 x 32 blocks, E8M0 scales: Blackwell); NVFP4 (1 x 16
// blocks, E4M3 scales and a per-tensor fp32 scale: Blackwell).
enum class Precision { bf16, fp8_delayed, fp8_current, fp8_blockwise, mxfp8, nvfp4 };

// The optimizer the trainer steps with (--optimizer). Muon: Megatron-Core's
// TensorParallelMuon (megatron/core/optimizer/emerging_optimizers.py at
// cd4afffa) on every 2-D weight but the embedding and the LM head, Adam on
// the rest; with ZeRO 1 the LayerWiseDistributedOptimizer of
// layer_wise_optimizer.py (Megatron-Bridge's dist_muon) — see
// cost/optimizer_step.hpp.
enum class OptimizerKind : std::uint8_t { adam, muon };
// Megatron-Core's --recompute-modules with --recompute-granularity selective
// (TransformerConfig.recompute_modules at Megatron-LM d98e8a64): the
// submodules a selective recomputation re-runs, as bits of
// ParallelPlan::recompute_modules. None given: the attention core alone
// (Megatron's default, cuboid's --recompute selective).
enum class RecomputeModule : std::uint8_t {
  core_attn = 1, mlp = 2, layernorm = 4, moe_act = 8, moe = 16, shared_experts = 32, mla_up_proj = 64,
};
// Megatron-Core's fine-grained activation offloading
// (--fine-grained-activation-offloading --offload-modules, TransformerConfig
// fine_grained_activation_offloading / offload_modules at Megatron-LM
// d98e8a64, transformer_config.py:1323-1340): the submodules whose saved
// tensors go to host memory after their forward and come back for their
// backward (cost/offload.hpp), as bits of ParallelPlan::offload_modules.
// fused_group_mlp (Transformer Engine's op fuser) and gdp_qkv (the
// GatedDeltaProduct mixer) have nothing in cuboid's models to offload.
enum class OffloadModule : std::uint8_t {
  attn_norm = 1, qkv_linear = 2, core_attn = 4, attn_proj = 8, mlp_norm = 16, expert_fc1 = 32, moe_act = 64,
};
// Megatron-Core's --recompute-method with --recompute-granularity full and
// --recompute-num-layers N (megatron/core/recompute.py checkpointed_forward
// at Megatron-LM d98e8a64, run by each TransformerBlock: one model chunk of
// a PP rank). uniform: the chunk's layers in groups of N (the last one
// shorter), each group one checkpoint: its input kept, the whole group
// re-run before its backward. block: the chunk's first N layers each a
// checkpoint of its own, the others storing everything (no recomputation).
// uniform with N = 1 is every layer recomputed, cuboid's `full`.
enum class RecomputeMethod : std::uint8_t { uniform, block };

// Megatron-Core's CUDA graphs (TransformerConfig.cuda_graph_impl and
// cuda_graph_modules at Megatron-LM d98e8a64, transformer_config.py:1075-1105;
// CudaGraphModule in enums.py): none; local or transformer_engine: per-layer
// graphs of the whole decoder layer or of the modules named (attn:
// _forward_attention; mlp: a dense layer's _forward_mlp; moe: an MoE
// layer's; moe_router: an MoE layer's up to its router, the shared experts
// included; moe_preprocess: MoELayer.preprocess, with moe_router; mamba:
// Mamba layers, which no model of cuboid's has); full_iteration: one graph of
// the whole forward-backward path, the optimizer step excluded.
enum class CudaGraphImpl : std::uint8_t { none, local, transformer_engine, full_iteration };
enum class CudaGraphModule : std::uint8_t { attn = 1, mlp = 2, moe = 4, moe_router = 8, moe_preprocess = 16, mamba = 32 };
std::string_view to_string(CudaGraphModule m);
struct CudaGraphs {
  CudaGraphImpl impl = CudaGraphImpl::none;
  std::uint8_t modules = 0;  // CudaGraphModule bits; 0: the whole layer
  bool on() const { return impl != CudaGraphImpl::none; }
  bool captures(CudaGraphModule m) const {
    return impl == CudaGraphImpl::full_iteration ||
           (on() && (modules == 0 || (modules & static_cast<std::uint8_t>(m)) != 0));
  }
  // The module is named in cuda_graph_modules, as Megatron-Core's own
  // membership tests read the list (transformer_layer.py:1563-1600@d98e8a64,
  // the offload's): a whole-layer graph names none.
  bool names(CudaGraphModule m) const { return on() && (modules & static_cast<std::uint8_t>(m)) != 0; }
  // "none", "full_iteration", "local", "transformer_engine:attn,mlp" (the
  // modules in the enum's order)
  std::string str() const;
  static CudaGraphs parse(std::string_view s, const std::string& source, const std::string& field);
  friend bool operator==(const CudaGraphs&, const CudaGraphs&) = default;
};
std::string_view to_string(CudaGraphImpl i);

std::string_view to_string(Recompute r);
std::string_view to_string(Schedule s);
std::string_view to_string(Dim d);
std::string_view to_string(Zero3Unit u);
std::string_view to_string(CpComm c);
std::string_view to_string(MoeDispatcher d);
std::string_view to_string(Precision p);
std::string_view to_string(OptimizerKind o);
std::string_view to_string(AttentionKernel k);
// Parse CLI / JSON spellings; throw InputError(source, field, ...) when unknown.
Recompute parse_recompute(std::string_view s, const std::string& source, const std::string& field);
Schedule parse_schedule(std::string_view s, const std::string& source, const std::string& field);
Zero3Unit parse_zero3_unit(std::string_view s, const std::string& source, const std::string& field);
CpComm parse_cp_comm(std::string_view s, const std::string& source, const std::string& field);
MoeDispatcher parse_moe_dispatcher(std::string_view s, const std::string& source, const std::string& field);
std::string_view to_string(FlexBackend b);
FlexBackend parse_flex_backend(std::string_view s, const std::string& source, const std::string& field);
Precision parse_precision(std::string_view s, const std::string& source, const std::string& field);
// "bf16, fp8-delayed, fp8-current, fp8-blockwise, mxfp8 or nvfp4" for messages.
std::string precision_names();
AttentionKernel parse_attention_kernel(std::string_view s, const std::string& source, const std::string& field);
// "auto, unfused, flash1, flash2, flash3 or cudnn" for messages.
std::string attention_kernel_names();
// A comma-separated list of Megatron's module names, as bits; at least one.
std::uint8_t parse_recompute_modules(std::string_view list, const std::string& source, const std::string& field);
// The bits as Megatron's names, comma-separated, in the enum's order.
std::string recompute_modules_string(std::uint8_t modules);
std::string_view to_string(RecomputeModule m);
// --offload-modules: a comma-separated list of Megatron's module names, as bits; at least one.
std::uint8_t parse_offload_modules(std::string_view list, const std::string& source, const std::string& field);
// The bits as Megatron's names, comma-separated, in the forward's order.
std::string offload_modules_string(std::uint8_t modules);
std::string_view to_string(OffloadModule m);
std::string_view to_string(RecomputeMethod m);
RecomputeMethod parse_recompute_method(std::string_view s, const std::string& source, const std::string& field);

// The rank map's four axes (RankOrder::axes).
enum class RankAxis { tp, cp, dp, pp };

// Which dimension varies fastest across consecutive ranks, as three of TP, DP
// and PP; CP and the experts' groups follow from it. The two orders with TP
// innermost are Megatron-Core's (megatron/core/parallel_state.py
// initialize_model_parallel at Megatron-LM d98e8a64 and cd4afffa; Megatron-LM,
// Megatron-Bridge and NeMo pass one of them): tp-dp-pp is its default
// "tp-cp-ep-dp-pp", tp-pp-dp its "tp-cp-ep-pp-dp" (--use-tp-pp-dp-mapping).
// There CP sits right outside TP (the layers' RankGenerator with EP 1), and
// the experts regroup a stage's TP x CP x DP ranks as ETP innermost, then EP,
// then expert-DP (the expert RankGenerator with CP 1; RankMapping). The other
// four orders are cuboid's own, which no trainer with CP builds: there CP is
// the innermost part of the DP dimension.
struct RankOrder {
  std::array<Dim, 3> inner_to_outer{Dim::tp, Dim::dp, Dim::pp};
  std::string str() const;  // "tp-dp-pp"
  // Megatron-Core's name ("tp-cp-ep-dp-pp" or "tp-cp-ep-pp-dp") of a
  // TP-innermost order; "" for the others.
  std::string megatron_name() const;
  // CP right outside TP (Megatron-Core's orders) rather than inside DP.
  bool cp_next_to_tp() const { return inner_to_outer[0] == Dim::tp; }
  // The rank map's axes, innermost first: tp-cp-dp-pp, tp-cp-pp-dp, or the
  // order's three with CP just inside DP (dp-tp-pp: cp-dp-tp-pp).
  std::array<RankAxis, 4> axes() const;
  // Three dimensions ("tp-pp-dp") or Megatron-Core's names ("tp-cp-ep-pp-dp").
  static RankOrder parse(std::string_view s, const std::string& source, const std::string& field);
  friend bool operator==(const RankOrder&, const RankOrder&) = default;
};

// How the trainer runs what the plan names, beyond the dimensions: what a
// user gets with their trainer and its version rather than chooses one by one
// (presets: cuboid/search/trainer.hpp, `--trainer`).
struct TrainerSettings {
  std::string preset = "megatron-core";
  // DP gradient reduction launched bucket by bucket during the last
  // micro-batch's backward (Megatron-Core --overlap-grad-reduce, torch DDP);
  // off: after each stage's last backward (Megatron-LM's local DDP before 2023).
  bool dp_overlap = true;
  // Bytes per gradient element in the DP reduction: 4 = the fp32 main_grad
  // (Megatron with bf16, which forces accumulate_allreduce_grads_in_fp32);
  // 2 = the 16-bit parameter dtype (Megatron-LM 2021 with --fp16).
  int dp_grad_bytes = 4;
  // Megatron-FSDP's gradients (ZeRO 2 / 3 in Megatron-Core): the bytes per
  // element it accumulates and reduce-scatters them in, whatever
  // dp_grad_bytes says (--megatron-fsdp-main-grads-dtype; its grad-comm dtype
  // follows): 2 = its default, auto (the parameters' dtype, bf16, and bf16
  // for FP8 parameters), 4 = fp32. 0: the trainer has no Megatron-FSDP, its
  // ZeRO 2 / 3 gradients are reduced at dp_grad_bytes.
  int fsdp_grad_bytes = 0;
  // ZeRO-1 with the gradients all-reduced in full (each rank then updates its
  // shard and all-gathers the parameters), as DeepSpeed's pipeline engine
  // does with bf16; off: reduce-scattered (Megatron's distributed optimizer).
  bool zero1_grad_all_reduce = false;
  // The input-gradient all-reduce (with SP: the all-gather and
  // reduce-scatter) of column-parallel layers runs under their wgrad GEMM
  // (Megatron's async_op=True in the linear layers' backward); off: every TP
  // collective blocks (Megatron-LM of 2021).
  bool tp_backward_overlap = true;
  // Context parallelism's ring: each step's K/V (and dK/dV) exchange runs
  // under the step's attention block (Transformer Engine's separate stream);
  // off: the exchange completes before the block (cuboid's executor).
  bool cp_overlap = true;
  // HBM bytes per parameter per micro-batch of the gradient-accumulation pass
  // that runs without gradient-accumulation fusion: 6 = autograd adding a
  // 16-bit gradient to a 16-bit .grad in place (Megatron-LM of 2021 without
  // contiguous buffers: no hook); 10 = Megatron's DDP hook
  // main_grad.add_(grad) (read bf16, read + write fp32); 18 = DeepSpeed's
  // BF16Optimizer, hp_grad.add_(lp_grad.to(fp32)): the cast writes an fp32
  // copy (read 2, write 4) that the add reads beside the fp32 gradient
  // (read 4 + 4, write 4).
  int grad_accum_bytes = 10;
  // With PP > 1 and ZeRO 2 / 3 (FSDP), the pipeline schedule turns FSDP's
  // gradient sync and its resharding after backward off until the step's
  // last backward (torch.distributed.pipelining, stage.py
  // backward_maybe_with_nosync; torchtitan's pipeline): each rank holds its
  // stage's gradients unsharded in fp32 and, ZeRO-3, its parameters
  // gathered in bf16 at the end of the backward (cost/memory.hpp).
  bool pp_fsdp_no_sync = false;

  // How ZeRO-3 gathers parameters and reduces gradients (the defaults are
  // FSDP2's: a block at a time, one block ahead, no host synchronisation).
  // Element counts are per TP rank, as the trainers count a module's
  // parameters; the gradients are reduced at dp_grad_bytes.
  Zero3Unit zero3_unit = Zero3Unit::block;
  // Tensor units: weights and biases with fewer elements stay gathered on
  // every rank (DeepSpeed's stage3_param_persistence_threshold).
  std::int64_t zero3_persist_params = 0;
  // Prefetch: the following units that need a gather, at most
  // zero3_prefetch_units of them (0: no bound by count) and, when
  // zero3_prefetch_params > 0, only until they hold that many elements (the
  // unit that reaches it included). Both 0: no prefetch, each unit is
  // gathered when it is reached.
  int zero3_prefetch_units = 1;
  std::int64_t zero3_prefetch_params = 0;
  // A gathered tensor stays gathered when the units between this use and its
  // next use in the pass hold fewer elements (DeepSpeed's
  // stage3_max_reuse_distance); 0: released after every use.
  std::int64_t zero3_reuse_params = 0;
  // Gradients reduce-scattered once the next unit's would overflow a bucket
  // of this many elements (DeepSpeed's reduce_bucket_size); 0: each unit's
  // right after its backward.
  std::int64_t zero3_reduce_bucket_params = 0;
  // Each parameter tensor's gradients reduce-scattered by a collective of
  // its own (weights, biases and norms alike); off: one per bucket or unit.
  bool zero3_reduce_per_tensor = false;
  // The host waits for the device (torch.cuda.synchronize) before each
  // fetch and before issuing each gather, whose buffer it zero-fills first:
  // gathers overlap only the compute issued since the last wait.
  bool zero3_sync = false;
  // List-form c10d all_gather / reduce_scatter: besides the NCCL kernel, one
  // copy kernel per rank of the group, launched from the host.
  bool zero3_list_collectives = false;
  // Each fetch computes the norm of the unit's gathered parameters and
  // formats it, a read of the whole tensor that the host waits for (a debug
  // message built although it is not printed).
  bool zero3_fetch_norm = false;

  // Kernel launches inside captured CUDA graphs (CudaGraphs above).
  CudaGraphs cuda_graphs;
  // Transformer Engine's userbuffers overlap of the SP all-gathers and
  // reduce-scatters with the linear layers' GEMMs (Megatron-Core
  // --tp-comm-overlap; core/tp_overlap.hpp); needs SP and TP > 1.
  bool tp_comm_overlap = false;
  // The distributed optimizer's parameter all-gather issued bucket by
  // bucket in the next iteration's forward (Megatron-Core
  // --overlap-param-gather) instead of after the step; ZeRO 1 and 2.
  bool overlap_param_gather = false;
  // ... and the first model chunk's gather issued inside the optimizer
  // step, under the other chunks' steps (Megatron-Core
  // --overlap-param-gather-with-optimizer-step; needs overlap_param_gather
  // and virtual stages; every chunk one bucket).
  bool overlap_param_gather_with_optimizer_step = false;
  // ... and, with virtual stages, each chunk's gather issued ahead of it by
  // the interleaved schedule, at the same time on every stage (Megatron-Core
  // align_param_gather; Megatron-LM's default, --no-align-param-gather off):
  // the first two chunks' at its start, chunk c's (c >= 2) before the
  // forward that is, shifted by the stage's rank, chunk c - 1's first.
  bool align_param_gather = false;
  // The DDP gradient bucket of the first stage's first model chunk, in
  // parameters (Megatron-Core's DistributedDataParallelConfig.bucket_size,
  // --ddp-bucket-size); 0: Megatron-Core's rule, max(40M, 1M x DP x CP)
  // (Megatron-LM d98e8a64 training.py resolve_ddp_bucket_size).
  std::int64_t ddp_bucket_params = 0;
  friend bool operator==(const TrainerSettings&, const TrainerSettings&) = default;
};

// Megatron-Core's --pipeline-model-parallel-layout (77732c36, 2025-06;
// megatron/core/transformer/pipeline_parallel_layer_layout.py at d98e8a64):
// the decoder layers of each virtual stage, chunk c of stage s at c x PP + s,
// and the multi-token prediction modules, which cuboid places in the last
// one. The embedding sits on the first virtual stage and the loss (with the
// LM head) on the last, as Megatron builds them (pre_process and
// post_process, megatron/training/training.py). Empty: no layout.
struct PipelineLayout {
  std::vector<int> decoders;
  int mtp = 0;
  bool empty() const { return decoders.empty(); }
  friend bool operator==(const PipelineLayout&, const PipelineLayout&) = default;
};

// The FP8 attention format a recipe runs (ParallelPlan::fp8_attention_format).
inline std::optional<Fp8AttentionFormat> fp8_attention_format_of(Precision p) {
  if (p == Precision::fp8_delayed || p == Precision::fp8_current) return Fp8AttentionFormat::per_tensor;
  if (p == Precision::mxfp8) return Fp8AttentionFormat::mxfp8;
  return std::nullopt;
}

struct ParallelPlan {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  // Context parallel: each sequence split over `cp` ranks in 2 x cp chunks,
  // rank r holding chunks r and 2cp - 1 - r (Megatron's causal balance).
  int cp = 1;
  CpComm cp_comm = CpComm::p2p;
  // Expert parallelism (mixture-of-experts models; Megatron-Core's "MoE
  // parallel folding"): each MoE layer's routed experts split over `ep`
  // ranks, each expert's FFN over `etp` ranks (0: ETP = TP, Megatron's
  // default); the TP x CP x DP ranks of a stage regroup as ETP x EP x
  // expert-DP for the experts (parallel_state.py at d98e8a64).
  int ep = 1;
  int etp = 0;
  // The token dispatcher of an MoE model's plans (alltoall for a dense one,
  // where nothing reads it).
  MoeDispatcher moe_dispatcher = MoeDispatcher::alltoall;
  // The flex dispatcher's backend and SMs (flex plans only).
  FlexSetting moe_flex;
  // Megatron-Core's --overlap-moe-expert-parallel-comm (with
  // --delay-wgrad-compute): the combined 1F1B schedule, each EP exchange of
  // one micro-batch under another's compute (core/ep_overlap.hpp).
  bool moe_ep_overlap = false;
  // ... with the weight gradients delayed (--delay-wgrad-compute, Megatron-Core's
  // delay_wgrad_compute): each module's weight gradient its own node of the
  // layer pair (kEpPairOrderDelayed); off: inside its backward (kEpPairOrder).
  bool moe_delay_wgrad = true;
  int micro_batch = 1;           // sequences per micro-batch
  std::int64_t global_batch = 1; // sequences per iteration
  std::int64_t seq_length = 0;
  int virtual_stages = 1;        // interleaved 1F1B model chunks per GPU
  // Uneven pipeline stages (Megatron's --decoder-first/last-pipeline-num-layers):
  // layers on the first / last stage; 0 = an even split. The middle stages
  // share the rest evenly.
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  // Megatron-Core's --account-for-embedding-in-pipeline-split and
  // --account-for-loss-in-pipeline-split (ef490839, 2025-02): the embedding
  // (the loss) counts as one layer when the layers split evenly over the
  // PP x v virtual stages, and the first (last) virtual stage builds one
  // decoder layer fewer (transformer_block.py get_num_layers_to_build at
  // d98e8a64).
  bool embedding_in_split = false;
  bool loss_in_split = false;
  PipelineLayout pipeline_layout;
  int zero_stage = 0;            // 0: none, 1: optimizer states (= Megatron distributed optimizer), 2: + grads, 3: + params
  Recompute recompute = Recompute::selective;
  // With recompute selective: RecomputeModule bits; 0 = the attention core.
  std::uint8_t recompute_modules = 0;
  // With recompute full: Megatron-Core's --recompute-method and
  // --recompute-num-layers (uniform 1: every layer a checkpoint of its own).
  RecomputeMethod recompute_method = RecomputeMethod::uniform;
  int recompute_num_layers = 1;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::one_f_one_b;
  bool flash_attention = true;
  // Which fused kernel runs the attention core when flash_attention is on;
  // auto: the GPU profile's default (GpuProfile::attention_kernel). Never
  // unfused (that is flash_attention off).
  AttentionKernel attention_kernel = AttentionKernel::auto_;
  // Megatron's gradient-accumulation fusion (--no-gradient-accumulation-fusion
  // turns it off): each linear layer's wgrad GEMM accumulates into the fp32
  // main_grad (beta = 1). Off: the GEMM writes a bf16 gradient and a DDP hook
  // adds it to main_grad per parameter per micro-batch, as Megatron-LM did
  // before March 2022 (and DeepSpeed's and FSDP's accumulation passes do).
  bool grad_accum_fusion = true;
  // The linear layers' GEMMs (and their casts, scaling and FP8 weight
  // copies) in this format; attention, the embedding and the LM head stay
  // bf16. Default bf16: the planner does not search it.
  Precision precision = Precision::bf16;
  // Megatron-Core's --fp8-param-gather (TransformerConfig.fp8_param): the
  // quantized layers' weights are FP8 tensors with no bf16 copy, and the
  // distributed optimizer all-gathers them at 1 byte per element.
  bool fp8_param_gather = false;
  // Megatron-Core's --use-precision-aware-optimizer: Transformer Engine's
  // FusedAdam keeps the optimizer's tensors, Adam's two moments at
  // `adam_moment_bytes` each (--exp-avg-dtype and --exp-avg-sq-dtype: 4
  // fp32, 2 bf16, which needs it). Off: fp32 master weights and moments.
  bool precision_aware_optimizer = false;
  int adam_moment_bytes = 4;
  // Adam (default), or Muon (OptimizerKind): with ZeRO 0 every DP rank
  // orthogonalises all of its stage's matrices; with ZeRO 1 the gradients
  // are all-reduced, each DP rank steps whole parameters of its own and the
  // updated ones are all-gathered after the step (StepDescription).
  OptimizerKind optimizer = OptimizerKind::adam;
  // Megatron-Core's --fp8-dot-product-attention: the attention core runs in
  // cuDNN's FP8 kernels (Transformer Engine's recipe with fp8_dpa), in the
  // format fp8_attention_format gives (plan_check.cpp says where it runs).
  bool fp8_attention = false;
  // Megatron-Core's --cpu-offloading-num-layers (Transformer Engine's CPU
  // offload): the activations of the first N decoder layers go to host
  // memory in the forward and come back for the backward (cost/offload.hpp).
  // 0: none.
  int offload_layers = 0;
  // Megatron-Core's fine-grained activation offloading: OffloadModule bits;
  // 0: off.
  std::uint8_t offload_modules = 0;
  RankOrder order;
  TrainerSettings trainer;

  int world_size() const { return tp * pp * dp * cp; }
  // Whether fine-grained activation offloading offloads module `m`.
  bool offloads(OffloadModule m) const { return (offload_modules & static_cast<std::uint8_t>(m)) != 0; }
  // Activations copied to host memory by either mechanism.
  bool offloads_activations() const { return offload_layers > 0 || offload_modules != 0; }
  // The overlapped parameter gathers of an interleaved schedule: what
  // TrainerSettings::align_param_gather acts on.
  bool interleaved_param_gathers() const {
    return trainer.overlap_param_gather && schedule == Schedule::interleaved && virtual_stages > 1 && dp_cp() > 1;
  }
  // The interleaved schedule issues each chunk's parameter gather ahead of it.
  bool aligns_param_gather() const { return trainer.align_param_gather && interleaved_param_gathers(); }
  // Whether the plan's selective recomputation re-runs module `m`.
  bool recomputes(RecomputeModule m) const {
    if (recompute != Recompute::selective) return false;
    if (recompute_modules == 0) return m == RecomputeModule::core_attn;
    return (recompute_modules & static_cast<std::uint8_t>(m)) != 0;
  }
  // Whether --recompute-modules layernorm recomputes an MoE layer's pre-MLP
  // norm: not where a transformer_engine graph names moe_router, unless it
  // names moe_preprocess too with the alltoall dispatcher; elsewhere the
  // norm's output leaves the graph in a static buffer that cannot be freed
  // (transformer_layer.py:481-531@d98e8a64; cuboid runs no shared-expert
  // overlap, which would refuse it too).
  bool recomputes_moe_mlp_norm() const {
    if (!recomputes(RecomputeModule::layernorm)) return false;
    const CudaGraphs& g = trainer.cuda_graphs;
    if (g.impl != CudaGraphImpl::transformer_engine || !g.names(CudaGraphModule::moe_router)) return true;
    return g.names(CudaGraphModule::moe_preprocess) && moe_dispatcher == MoeDispatcher::alltoall;
  }
  // Whether module `m` is recomputed where it runs. Megatron-Core skips its
  // plain checkpoints (core_attn, mlp, moe, shared_experts:
  // tensor_parallel.checkpoint) while it captures per-layer CUDA graphs
  // (random.py:680-687 at d98e8a64, local and transformer_engine alike): in
  // a captured part they keep their activations and re-run nothing. The
  // output-discarding ones (layernorm, moe_act, mla_up_proj) still run; the
  // full-iteration graph sets no capture flag. An MoE layer's MLP is
  // captured only by a whole-layer graph.
  bool checkpoints(RecomputeModule m) const {
    if (!recomputes(m)) return false;
    const CudaGraphs& g = trainer.cuda_graphs;
    if (!g.on() || g.impl == CudaGraphImpl::full_iteration) return true;
    switch (m) {
      case RecomputeModule::core_attn: return !g.captures(CudaGraphModule::attn);
      case RecomputeModule::mlp: return !g.captures(CudaGraphModule::mlp);
      case RecomputeModule::moe:
      case RecomputeModule::shared_experts: return g.modules != 0;
      default: return true;
    }
  }
  // A full recomputation of only some layers of each chunk (the block
  // method): the others are stored, their backward run without a recompute.
  bool partial_full_recompute() const {
    return recompute == Recompute::full && recompute_method == RecomputeMethod::block;
  }
  // A method or layer count other than uniform 1 (what plan files and
  // exports then state).
  bool recompute_layers_set() const {
    return recompute_method != RecomputeMethod::uniform || recompute_num_layers != 1;
  }
  // Bytes per element of the gradients a GPU keeps, accumulates and reduces
  // over DP, the one rule for memory, the estimate, the simulator and the
  // exports: Megatron-FSDP's own dtype where the trainer has one (ZeRO 2 /
  // 3; Megatron-LM d98e8a64 megatron_fsdp/param_and_grad_buffer.py
  // _resolve_group_grad_dtype: --megatron-fsdp-main-grads-dtype, by default
  // auto, the parameters' dtype; --megatron-fsdp-grad-comm-dtype follows);
  // else ZeRO-3 of an FP8 plan in bf16 (FP8 runs in Megatron-Core only, whose
  // FSDP keeps FP8 parameters' gradients in bf16); else dp_grad_bytes
  // (Megatron-Core's DDP buffer, which every main_grad views: fp32 if
  // grad_reduce_in_fp32 else the parameters' dtype).
  int grad_element_bytes() const {
    if (zero_stage >= 2 && trainer.fsdp_grad_bytes > 0) return trainer.fsdp_grad_bytes;
    if (zero_stage >= 3 && precision != Precision::bf16) return 2;
    return trainer.dp_grad_bytes;
  }
  // Under the precision-aware optimizer, Transformer Engine's FusedAdam
  // holds the master weights and writes the model's itself, and reads the
  // gradient buffer where it is (decoupled_grad: no fp32 copy): fp32 main
  // weights without an FP8 recipe other than delayed scaling (Megatron-LM
  // d98e8a64 optimizer_config.py use_precision_aware_optimizer_no_fp8_or_ds_fp8;
  // distrib_optimizer.py _copy_model_grads_to_main_grads and
  // _copy_main_params_to_model_params return early), outside Megatron-FSDP,
  // which keeps its own main weights.
  bool optimizer_holds_master_weights() const {
    return precision_aware_optimizer && zero_stage < 3 &&
           (precision == Precision::bf16 || precision == Precision::fp8_delayed);
  }
  // FusedAdam keeps of each fp32 master weight only the 16 bits its bf16
  // weight lacks (store_param_remainders, Megatron-Core's default from
  // Transformer Engine 2.1: optimizer_config.py; TE d0067d0d fused_adam.py
  // _initialize_state, for bf16 parameters, not FP8 ones).
  bool master_weight_remainders() const { return optimizer_holds_master_weights() && !fp8_param_gather; }
  // Bytes per parameter of the optimizer's states: the fp32 master weight
  // (2 as remainders) and Adam's two moments.
  double optimizer_state_bytes() const {
    return (master_weight_remainders() ? 2.0 : 4.0) + 2.0 * adam_moment_bytes;
  }
  // The optimizer's fp32 copy of 16-bit gradients at the step (the memory's
  // step_grad_copy_bytes, the step's grad_cast): `.float()` of the
  // distributed optimizer's shard, Megatron-FSDP's update_main_grads; not
  // FSDP2's or DeepSpeed's ZeRO-3, not under FusedAdam's own master weights.
  bool optimizer_casts_gradients() const {
    return grad_element_bytes() < 4 && !(zero_stage >= 3 && trainer.fsdp_grad_bytes == 0) &&
           !optimizer_holds_master_weights();
  }
  // The format of the FP8 attention core: per-tensor E4M3 under delayed and
  // current scaling, MXFP8 under the MXFP8 recipe (Transformer Engine
  // d0067d0d dot_product_attention.py init_fp8_metadata: the recipe's own
  // with NVTE_DPA_FP8_RECIPE unset); none without --fp8-attention or under
  // a recipe that has no FP8 attention (blockwise, NVFP4: refused).
  std::optional<Fp8AttentionFormat> fp8_attention_format() const {
    return fp8_attention ? fp8_attention_format_of(precision) : std::nullopt;
  }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // The ranks that hold the same experts and average their gradients:
  // TP x CP x DP / (ETP x EP).
  int expert_dp() const { return tp * cp * dp / (expert_tp() * ep); }
  // The ranks that hold the same weights and average their gradients (and
  // shard ZeRO states): DP x CP, Megatron's data-parallel group with context
  // parallelism.
  int dp_cp() const { return dp * cp; }
  // Tokens of one micro-batch's sequence on one rank: seq_length / cp.
  std::int64_t seq_per_rank() const { return cp > 1 ? seq_length / cp : seq_length; }
  // Micro-batches per iteration per pipeline: global_batch / (micro_batch * dp).
  std::int64_t num_micro_batches() const { return global_batch / (static_cast<std::int64_t>(micro_batch) * dp); }
  std::int64_t tokens_per_iteration() const { return global_batch * seq_length; }
  friend bool operator==(const ParallelPlan&, const ParallelPlan&) = default;
};

// The plan's layout as every JSON file cuboid writes names it (plan files,
// --json, run measurements, the ranks' run fingerprint): the sizes, batch,
// sequence, virtual stages, ZeRO stage, recomputation, SP, schedule and rank
// order. Each writer adds what it says beyond that.
nlohmann::json plan_layout_json(const ParallelPlan& p);

// Decoder layers of pipeline stage `stage` (0-based): the sum of its chunks'.
int layers_on_stage(const ParallelPlan& plan, std::int64_t num_layers, int stage);
bool has_uneven_stages(const ParallelPlan& plan);
// The embedding or the loss counted as a layer, or a layout given.
bool has_pipeline_layout(const ParallelPlan& plan);
// The layers the split shares out: the decoder layers, plus one each for the
// embedding and the loss where they count as layers.
std::int64_t split_layers(const ParallelPlan& plan, std::int64_t num_layers);
// Model chunks per stage: the virtual stages with the interleaved schedule, else 1.
int chunks_per_stage(const ParallelPlan& plan);
// Decoder layers of model chunk `chunk` of stage `stage`, as Megatron-Core's
// get_num_layers_to_build (transformer_block.py at d98e8a64): the layout's;
// with the embedding or the loss counted, split_layers / (PP x v) less the
// one they take on the first / last virtual stage; else a stage's layers /
// chunks (every stage's chunks equal, uneven stages included).
int layers_in_chunk(const ParallelPlan& plan, std::int64_t num_layers, int stage, int chunk);
// The first layer (0-based) of model chunk `chunk` of stage `stage`. Chunks
// hold the layers in virtual-stage order (chunk c of stage s is virtual stage
// c x PP + s): Megatron-Core's layer offset, uneven stages and layouts
// included (megatron/core/transformer/transformer_layer.py
// get_transformer_layer_offset at d98e8a64).
int first_layer_of_chunk(const ParallelPlan& plan, std::int64_t num_layers, int stage, int chunk);
// A full recomputation on one model chunk (RecomputeMethod): whether the
// chunk's layer `index` (0-based) re-runs its forward before its backward;
// and the chunk's checkpoint groups of a chunk of `layers` layers as
// [first, end) ranges, each keeping the input of its first layer and
// re-running all its layers at once (none without full recomputation).
// Megatron-Core's block method skips the first layers whose input needs no
// gradient under FP8 (recompute.py, te_checkpoint being reentrant): never in
// the plans cuboid prices, where the embedding's output and a received
// activation both need one.
bool recomputes_layer(const ParallelPlan& plan, int index);
std::vector<std::array<int, 2>> recompute_groups(const ParallelPlan& plan, int layers);
// Context parallelism's causal balance (Megatron-Core / Transformer Engine):
// a sequence in 2 x cp chunks, rank r holding chunks r and 2cp - 1 - r, so
// that an early (cheap) chunk pairs with a late (dear) one.
std::array<int, 2> cp_chunks(int cp, int rank);
// The (query, key) pairs causal attention computes on CP rank `rank` for a
// sequence of `seq` tokens (2 x cp divides it): equal on every rank,
// seq^2 / (2 cp) + seq / (2 cp).
std::int64_t cp_causal_pairs(std::int64_t seq, int cp, int rank);

// The uneven split cuboid proposes when PP x `chunks` does not divide the
// layers: the middle stages get ceil(L / PP) layers and the first and last
// stages share the rest (fewer, since they also hold the embedding and the LM
// head), like Llama 3 405B's 126 layers on PP 16 as 7 + 14 x 8 + 7. With
// `chunks` > 1 (interleaving) every stage's count is a multiple of it, as
// Megatron-Core requires (126 on PP 16 in 2 chunks: 8 + 14 x 8 + 6). Returns
// false when no such split exists (e.g. the rest would be < 2 chunks' worth).
bool propose_uneven_stages(std::int64_t num_layers, int pp, int& first, int& last, int chunks = 1);

struct RankCoord {
  int rank = 0;
  int node = 0;
  int gpu = 0;  // local GPU index in the node
  int tp = 0;
  int pp = 0;
  int dp = 0;
  int cp = 0;
};

// rank -> (node, gpu) is rank / gpus_per_node, rank % gpus_per_node (ranks
// fill nodes in order, as mpirun/torchrun do); rank -> (tp, cp, dp, pp)
// follows the plan's RankOrder::axes, as Megatron-Core's RankGenerator lays
// out its orders. A rank's "data index" is cp + CP x dp (the order of
// Megatron's dp-cp group).
class RankMapping {
 public:
  RankMapping(const ParallelPlan& plan, int gpus_per_node);

  // O(1) and allocation-free: the estimator builds one per candidate.
  int world_size() const { return tp_ * pp_ * dp_ * cp_; }
  RankCoord coord(int rank) const;
  int rank_of(int tp, int pp, int dp, int cp = 0) const;
  // Rank of data index `data` (cp + CP x dp) in [0, DP x CP).
  int rank_of_data(int tp, int pp, int data) const { return rank_of(tp, pp, data / cp_, data % cp_); }

  // Process groups, each as ranks in increasing coordinate order.
  std::vector<int> tp_group(int pp, int dp, int cp = 0) const;
  std::vector<int> pp_group(int tp, int dp, int cp = 0) const;
  // The gradient group: DP x CP ranks (DP alone when CP is 1).
  std::vector<int> dp_group(int tp, int pp) const;
  // The ranks that split one sequence.
  std::vector<int> cp_group(int tp, int pp, int dp) const;
  // The experts' groups. A stage's TP x CP x DP ranks in their order
  // (index tp + TP x data) regroup as ETP innermost, then EP, then expert-DP:
  // the EP group of expert-DP rank `edp` and ETP rank `etp`, and the
  // expert-DP group of EP rank `ep` and ETP rank `etp`. This is Megatron-Core's
  // expert RankGenerator (tp-ep-dp-pp, or tp-ep-pp-dp where ETP x EP = TP x
  // CP, which initialize_model_parallel asserts for that order with PP > 1).
  std::vector<int> ep_group(int pp, int edp, int etp = 0) const;
  std::vector<int> expert_dp_group(int pp, int ep, int etp = 0) const;
  std::vector<std::vector<int>> ep_groups() const;
  // Every expert-DP group (pp, then EP rank, then ETP rank).
  std::vector<std::vector<int>> expert_dp_groups() const;
  std::vector<std::vector<int>> tp_groups() const;
  std::vector<std::vector<int>> pp_groups() const;
  std::vector<std::vector<int>> dp_groups() const;
  std::vector<std::vector<int>> cp_groups() const;

  // Nodes spanned by a group; > 1 for a TP group means TP traffic leaves NVLink.
  int nodes_spanned(const std::vector<int>& ranks) const;
  bool tp_crosses_nodes() const;
  // The node of a rank (ranks fill nodes in order).
  int node_of(int rank) const { return rank / gpus_per_node_; }

 private:
  // The rank of index `i` (tp + TP x data) of a stage's TP x CP x DP ranks.
  int rank_of_stage_index(int pp, int i) const { return rank_of_data(i % tp_, pp, i / tp_); }
  int stride(RankAxis a) const { return stride_[static_cast<std::size_t>(a)]; }
  int tp_, pp_, dp_, cp_, ep_, etp_, gpus_per_node_;
  std::array<int, 4> stride_{};  // stride of tp, cp, dp, pp in rank space
};

}  // namespace cuboid
