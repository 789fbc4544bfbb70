#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// The work of one transformer layer (and of the embedding and LM head) for one
// micro-batch on one GPU, as an ordered list of ops with shapes, FLOPs, HBM
// bytes and communication sizes, after TP sharding (column-parallel QKV and
// FC1, row-parallel projection and FC2). The analytical estimator sums their
// costs; the discrete-event simulator plays them on streams.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/core/collective_traits.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

enum class OpKind { gemm, attention_core, memory_bound, collective, p2p };
enum class Group { none, tp, pp, dp, cp, ep };
enum class Pass { forward, backward };

std::string_view to_string(OpKind k);
std::string_view to_string(Collective c);
std::string_view to_string(Group g);

struct Op {
  std::string name;           // "qkv", "attn_core", "proj", "tp_ar_attn", "fc1", "act", "fc2", ...
  OpKind kind = OpKind::gemm;
  Pass pass = Pass::forward;
  // GEMM shape per GPU: C[m x n] = A[m x k] * B[k x n], `batch` times (attention core: batch = b * heads / tp).
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  double flops = 0;           // per GPU
  double bytes = 0;           // HBM traffic of a memory-bound op (read + write), per GPU; of a GEMM:
                              // traffic beyond A, B and a bf16 C (fused fp32 main_grad accumulation)
  Collective collective = Collective::all_reduce;
  Group group = Group::none;
  double comm_bytes = 0;      // collective: the NCCL "size" (buffer bytes per rank); p2p: bytes sent
  // comm_bytes count bf16 (2-byte) elements of the compute dtype (activations,
  // their gradients): a backend whose activations are another size (the CPU
  // executor's f32) moves comm_bytes x element size / 2, see comm_size_bytes
  // in calibration.hpp. False for fp32 data (cross-entropy statistics).
  bool compute_dtype = false;
  // A kernel of the unfused attention core (QK^T, softmax + dropout, AV, the
  // context copy and their backward): its HBM side is priced at the profile's
  // unfused_attention_efficiency where it has one.
  bool unfused_attention = false;
  // A fused attention block's kernel (the plan's; auto: the GPU profile's
  // default), whose sourced rates price it (GpuProfile::attention_rates).
  AttentionKernel attention_kernel = AttentionKernel::auto_;
  // A CP exchange that the next op (a block of attention) runs under: the
  // ring's send/recv of the next K/V chunk, started before the block that
  // uses the current one and waited for after it (Transformer Engine).
  bool overlaps_next = false;
  // A grouped GEMM (one product per local expert, `batch` of them, the rows
  // split among them as the router sends tokens; m is the even split): a
  // calibrated card prices it by FLOPs as calibrate measured it inside the
  // executor's MoE layer, since one GEMM shape cannot stand for the split.
  bool grouped = false;
  // A GEMM's input format: a linear layer's GEMMs (forward, dgrad, wgrad)
  // in an FP8 / FP4 plan run in ParallelPlan::precision, and the quantizer's
  // cast before each writes it; every other op bf16.
  Precision precision = Precision::bf16;
  // An EP exchange of the allgather or flex dispatcher: priced and played
  // as dispatch_traffic's copies per link (core/dispatch.hpp), comm_bytes the
  // rank's tokens x the bytes of one copy; alltoall: an NCCL collective.
  MoeDispatcher dispatcher = MoeDispatcher::alltoall;
  // Replayed from a captured CUDA graph (TrainerSettings::cuda_graphs): no
  // host launch of its own. The first kernel of each graph keeps one, which
  // stands for the graph's launch (mark_graphed).
  bool graphed = false;
};

struct LayerOps {
  std::vector<Op> forward;
  std::vector<Op> backward;   // dgrad + wgrad GEMMs, backward of memory-bound ops, TP collectives
  std::vector<Op> recompute;  // forward work repeated before backward (empty for recompute none)
};

// One transformer layer, one micro-batch, one GPU; with experts, an MoE
// layer (its MLP the router, the dispatch, the experts and the combine).
LayerOps transformer_layer_ops(const ModelSpec& m, const ParallelPlan& plan);
// One layer of an MoE model's kind `moe_layer`: its MoE layers' or (false)
// its dense layers' (an MLP of ffn_hidden_size; DeepSeek-V3's first three).
LayerOps transformer_layer_ops(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer);

// Tokens of one micro-batch that the busiest rank's local experts compute in
// an MoE layer (after the ETP all-gather): ETP x its EP rank's routed token
// copies, which are top-k x the rank's tokens (s x b / TP with sequence
// parallelism) times ep_rank_load.
double expert_tokens(const ModelSpec& m, const ParallelPlan& plan);
// HybridEP's static receive budget of an EP rank under
// --moe-expert-rank-capacity-factor (FlexSetting::rank_capacity_factor;
// token_dispatcher.py:1098-1112 at d98e8a64): int(the rank's tokens (s x b /
// TP with sequence parallelism) x top-k x the factor), rounded up to 256
// (moe_utils.py:1473-1474, the op fuser's grouped tensors); 0 without a
// factor or experts. The receive buffer and every expert tensor are this
// many rows; the busiest rank's expert_tokens above it are dropped (and
// Megatron-Core reruns the step dropless: paged_stash.py PagedStashRunner).
double rank_budget_rows(const ModelSpec& m, const ParallelPlan& plan);
// Rows of the experts' saved activations of one MoE layer and micro-batch
// that stay on the GPU: expert_tokens when dropless; the budget with a
// capacity factor; with the paged stash the page buffer's share,
// |stash_buffer_factor| x the average rows (int(budget / factor),
// experts.py:773-777) or, negative, the real ones (expert_tokens)
// (paged_stash.py allocate_stash_buffers).
double saved_expert_rows(const ModelSpec& m, const ParallelPlan& plan);
// The busiest EP rank's routed token copies over the mean, per MoE layer and
// micro-batch (>= 1; 1 with EP 1 or without experts): the factor on what
// the slowest EP rank receives, computes and sends back, which every rank
// of its EP group waits for. The card's (or --moe-imbalance's)
// router_load_imbalance where given, else 1 + the busiest expert's measured
// excess (expert_max_violation) spread over the rank's experts / EP local
// experts (the others at the mean); capped by the capacity factor where
// tokens are dropped.
double ep_rank_load(const ModelSpec& m, const ParallelPlan& plan);
// The busiest expert's tokens over the mean, minus 1 (MaxVio), that a router
// trained with this balancing shows.
double expert_max_violation(RouterBalancing b);
// Embedding lookup (first stage) and LM head + cross-entropy (last stage).
LayerOps embedding_ops(const ModelSpec& m, const ParallelPlan& plan);
LayerOps lm_head_ops(const ModelSpec& m, const ParallelPlan& plan);
// One multi-token prediction module on the last stage (Megatron-Core's
// MultiTokenPredictionLayer): the next tokens' embedding lookup, the norms of
// it and of the hidden state, the 2h -> h projection, a layer of the last
// layer's kind and an LM head with its loss; the backward in reverse.
LayerOps mtp_ops(const ModelSpec& m, const ParallelPlan& plan);

// A layer's linear layers on one TP rank, in forward order: QKV, the
// projection, FC1 (with SwiGLU's gate: one fused GEMM, as Megatron's
// linear_fc1) and FC2. Column-parallel weights and biases are split by
// output, row-parallel weights by input, with their biases whole.
struct LayerWeight {
  const char* op;      // the forward GEMM's op name (op_names.hpp)
  double weight = 0;   // elements on one TP rank
  double bias = 0;
};
std::vector<LayerWeight> layer_weights(const ModelSpec& m, const ParallelPlan& plan);

// A layer's op list cut where each linear layer's module starts, as hooks
// that fetch ZeRO-3 parameters per module see it: in a forward (or
// recompute) list at the weight's GEMM, in a backward list at its dgrad.
// Ops before the first cut form a part of their own (weight -1).
struct WeightPart {
  std::size_t first = 0, end = 0;  // ops [first, end)
  int weight = -1;                 // index into layer_weights, -1: none
};
std::vector<WeightPart> split_by_weight(const std::vector<Op>& ops, Pass pass);

// Elements of the weights a layer's op list runs in FP8 / FP4 (the B operand
// of each quantized forward GEMM): what the quantizer casts once per step and
// keeps as FP8 copies (0 for a bf16 plan).
double quantized_weight_elements(const LayerOps& ops);

// Bytes of activations sent between consecutive pipeline stages per
// micro-batch per GPU (s*b*h*2 / tp with Megatron's scatter-gather optimisation).
double pipeline_message_bytes(const ModelSpec& m, const ParallelPlan& plan);

}  // namespace cuboid
