// The ops of one transformer layer, of the embedding and of the LM head for
// one micro-batch on one GPU, after Megatron-LM's tensor-parallel sharding.
// Sources and derivations: docs/internals/cost.md ("Workload").
//
// Conventions (per GPU, one micro-batch; T = s * b tokens, t = TP size):
// * Op::flops: useful FLOPs in Megatron's convention (2 per MAC, the causal
//   attention core at half); Op::m, n, k, batch: the shape the kernel runs
//   (unfused attention GEMMs run the full s x s product).
// * Memory-bound bytes: HBM reads + writes of bf16 (2 B) unless noted, masks
//   1 B; each backward counted kernel by kernel from what Megatron-LM runs.
// * Without SP the norms, dropouts and residual adds run on the full
//   [s, b, h] tensor on every TP rank (Megatron duplicates them); with SP on
//   s/t of it.
// * Collective comm_bytes: the nccl-tests "size" (all-reduce: the tensor; RS:
//   its input; AG: its output), so RS + AG moves what one all-reduce moves.
//   Activation collectives count bf16 elements (Op::compute_dtype).
// * Besides GEMMs, norms and fused element-wise ops, the kernels Megatron-LM
//   runs (megatron/mpu/layers.py, model/transformer.py at 02bb1f5c) are
//   priced: the QKV bias add, the context permute copy, the Q/K/V gradient
//   cat, the residual-fork gradient sums and, without
//   ParallelPlan::grad_accum_fusion, the fp32 main_grad hooks (*_grad_accum).
// * The CPU executor's differences are listed, with reasons, in
//   src/report/validate.cpp.
#include "cuboid/core/workload.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/precision.hpp"

namespace cuboid {

std::string_view to_string(OpKind k) {
  switch (k) {
    case OpKind::gemm: return "gemm";
    case OpKind::attention_core: return "attention_core";
    case OpKind::memory_bound: return "memory_bound";
    case OpKind::collective: return "collective";
    case OpKind::p2p: return "p2p";
  }
  return "?";
}

std::string_view to_string(Collective c) { return traits(c).name; }

std::string_view to_string(Group g) {
  switch (g) {
    case Group::none: return "none";
    case Group::tp: return "tp";
    case Group::pp: return "pp";
    case Group::dp: return "dp";
    case Group::cp: return "cp";
    case Group::ep: return "ep";
  }
  return "?";
}

namespace {

// Bytes per element of the element-wise kernels (reads + writes).
constexpr double kNormBytesPerElement = kBf16Bytes + kBf16Bytes;  // read x, write y
// read x and residual, write y and mask
constexpr double kDropoutAddBytesPerElement = kBf16Bytes + kBf16Bytes + kBf16Bytes + kMaskBytes;
// torch's dropout (embedding and attention probabilities): read x, write y
// and a bool mask; its backward (native_dropout_backward) reads dy and the
// mask and writes dx.
constexpr double kDropoutBytesPerElement = kBf16Bytes + kBf16Bytes + kMaskBytes;
constexpr double kDropoutBackwardBytesPerElement = kBf16Bytes + kMaskBytes + kBf16Bytes;
// The unfused causal attention core's s x s kernels (Megatron-LM 2022,
// megatron/fused_kernels/scaled_upper_triang_masked_softmax.h and
// megatron/model/transformer.py CoreAttention). The softmax kernel loads a
// row only up to the diagonal (`element_index < local_seq`, local_seq = row
// + 1) and writes the whole row (zeros above the diagonal); its backward
// loads the gradient and the saved output up to the diagonal and writes the
// whole row (in place). The attention dropout is torch's native_dropout
// over the whole [b, np, s, s] tensor: reads the probabilities, writes the
// output and a bool (1-byte) mask (kDropout*BytesPerElement).
constexpr double kSoftmaxReadBytesPerTriangleElement = kBf16Bytes;  // bf16 scores, lower triangle
constexpr double kSoftmaxWriteBytesPerElement = kBf16Bytes;         // bf16 probabilities, whole row
constexpr double kSoftmaxBackwardReadBytesPerTriangleElement = kBf16Bytes + kBf16Bytes;  // gradient + saved output
constexpr double kSoftmaxBackwardWriteBytesPerElement = kBf16Bytes;
// Vocab-parallel cross-entropy over fp32 logits (megatron/model/gpt_model.py
// post_language_model_processing: `output.float()`, then
// megatron/mpu/cross_entropy.py _VocabParallelCrossEntropy.forward): the
// bf16 -> fp32 cast (read 2, write 4); torch.max over the vocabulary (read
// 4); `logits.sub_(max)` (4 + 4); torch.exp(out=) (4 + 4); exp.sum (read 4);
// `exp_logits.div_(sum)` (4 + 4), which keeps the softmax for backward.
constexpr double kCrossEntropyBytesPerElement = (kBf16Bytes + kFp32Bytes) + kFp32Bytes + (kFp32Bytes + kFp32Bytes) +
                                                (kFp32Bytes + kFp32Bytes) + kFp32Bytes + (kFp32Bytes + kFp32Bytes);
// Its backward: softmax - one_hot then `grad_input.mul_(grad_output)` in
// place (4 + 4; the one-hot subtraction touches one element per token), and
// the cast's backward to bf16 (4 + 2).
constexpr double kCrossEntropyBackwardBytesPerElement = (kFp32Bytes + kFp32Bytes) + (kFp32Bytes + kBf16Bytes);
// Backward of Apex's fused LayerNorm (and RMSNorm): cuComputePartGradGammaBeta
// reads dy and x for the parameter gradients, cuComputeGradInput reads dy
// and x again and writes dx.
constexpr double kNormBackwardBytesPerElement = (kBf16Bytes + kBf16Bytes) + (kBf16Bytes + kBf16Bytes + kBf16Bytes);
// Backward of the JIT-fused bias-dropout-add (nvfuser, which Megatron 2022
// enables for torch >= 1.10): dx = dy * mask * scale (read dy and the bool
// mask, write dx), the bias gradient reduced in the same fused kernel; the
// residual's gradient is dy itself (no kernel): a dropout's backward.
constexpr double kDropoutAddBackwardBytesPerElement = kDropoutBackwardBytesPerElement;
// A gradient sum at a residual fork: read both gradients, write the sum.
constexpr double kResidualGradSumBytesPerElement = kBf16Bytes + kBf16Bytes + kBf16Bytes;

struct Dims {
  // s: a rank's tokens of one sequence (seq_length / cp); s_full: the whole
  // sequence; tokens = s * b.
  std::int64_t b, s, h, a, d, q, kv, f, t, tokens, cp, s_full;
  // Mixture of experts: experts, top-k, one expert's and all shared
  // experts' FFN width, EP and ETP; `routed`: the busiest rank's routed
  // token copies before the ETP all-gather (expert_tokens / etp).
  std::int64_t experts, topk, fe, fs, ep, etp;
  double routed;
  MoeDispatcher dispatcher;
  bool moe, shared_gate;
  // HybridEP with a rank capacity factor: a static receive budget, no host
  // synchronisation (FlexSetting::rank_capacity_factor).
  bool static_budget;
  // Latent attention: the query and key/value ranks, the heads' non-rotary,
  // rotary and value widths. With it `d` is (qk + rope + v) / 2 and q = kv =
  // heads x d: the attention core's FLOPs (2 s^2 (qk + rope) + 2 s^2 v per
  // head) and its Q, K, V, O traffic are then exact.
  bool mla;
  std::int64_t qlora, kvlora, qk, rope, v;
  CpComm cp_comm;
  bool sp, flash, fused_wgrad, alibi;
  AttentionKernel kernel = AttentionKernel::auto_;
  bool cp_overlap;  // the ring's K/V exchange runs under the step's block (TrainerSettings::cp_overlap)
  // Bytes per parameter of the unfused accumulation (TrainerSettings::grad_accum_bytes).
  double grad_accum_bytes;
  Precision precision;  // of the linear layers' GEMMs (ParallelPlan::precision)
  std::optional<Fp8AttentionFormat> fp8_attention;  // the FP8 attention core's (ParallelPlan::fp8_attention_format)
};

Dims dims_of(const ModelSpec& m, const ParallelPlan& plan) {
  Dims x{};
  x.b = plan.micro_batch;
  x.s_full = plan.seq_length > 0 ? plan.seq_length : m.seq_length;
  x.cp = plan.cp > 1 ? plan.cp : 1;
  x.cp_comm = plan.cp_comm;
  x.cp_overlap = plan.trainer.cp_overlap;
  x.s = x.s_full / x.cp;
  x.h = m.hidden_size;
  x.a = m.num_attention_heads;
  x.d = m.head_dim;
  x.q = m.query_projection_size();
  x.kv = m.kv_projection_size();
  x.f = m.ffn_hidden_size;
  x.t = plan.tp > 0 ? plan.tp : 1;
  x.tokens = x.s * x.b;
  x.sp = plan.sequence_parallel && x.t > 1;
  x.flash = plan.flash_attention;
  x.kernel = plan.attention_kernel;
  x.fused_wgrad = plan.grad_accum_fusion;
  x.alibi = m.alibi;
  x.grad_accum_bytes = plan.trainer.grad_accum_bytes;
  x.precision = plan.precision;
  x.fp8_attention = plan.fp8_attention_format();
  x.mla = m.mla.enabled();
  if (x.mla) {
    x.qlora = m.mla.q_lora_rank;
    x.kvlora = m.mla.kv_lora_rank;
    x.qk = m.mla.qk_head_dim;
    x.rope = m.mla.qk_rope_head_dim;
    x.v = m.mla.v_head_dim;
    x.d = (x.qk + x.rope + x.v) / 2;
    x.q = x.kv = x.a * x.d;
  }
  x.moe = m.moe.enabled();
  if (x.moe) {
    x.experts = m.moe.num_experts;
    x.topk = m.moe.experts_per_token;
    x.fe = m.moe.expert_ffn_hidden_size;
    x.fs = m.moe.shared_expert_ffn_hidden_size;
    x.shared_gate = m.moe.shared_expert_gate;
    x.ep = std::max(1, plan.ep);
    x.etp = std::max(1, plan.expert_tp());
    x.dispatcher = plan.moe_dispatcher;
    x.static_budget = plan.moe_dispatcher == MoeDispatcher::flex && plan.moe_flex.rank_capacity_factor > 0;
    x.routed = static_cast<double>(x.tokens / (x.sp ? x.t : 1) * x.topk) * ep_rank_load(m, plan);
  }
  return x;
}

}  // namespace

// Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for
// Mixture-of-Experts" (arXiv 2408.15664), Table 2: MaxVio_global of the 3B
// DeepSeekMoE model (64 experts, top-6) over its validation set, 0.52 with
// the auxiliary loss (alpha 0.001) and 0.04 loss-free. A training batch
// varies more than the whole set, so per micro-batch these are floors.
double expert_max_violation(RouterBalancing b) { return b == RouterBalancing::aux_loss_free ? 0.04 : 0.52; }

double ep_rank_load(const ModelSpec& m, const ParallelPlan& plan) {
  if (!m.moe.enabled() || plan.ep <= 1) return 1.0;
  double load = m.moe.router_load_imbalance;
  if (load <= 0) {
    const double local_experts = static_cast<double>(m.moe.num_experts / plan.ep);
    load = 1.0 + expert_max_violation(m.moe.balancing) / local_experts;
  }
  if (m.moe.capacity_factor > 0) load = std::min(load, m.moe.capacity_factor);
  return load;
}

namespace {

Op gemm(std::string name, Pass pass, std::int64_t m, std::int64_t n, std::int64_t k,
        std::int64_t batch = 1) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::gemm;
  op.pass = pass;
  op.m = m;
  op.n = n;
  op.k = k;
  op.batch = batch;
  op.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
             static_cast<double>(batch);
  return op;
}

Op memory_bound(std::string name, Pass pass, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::memory_bound;
  op.pass = pass;
  op.bytes = bytes;
  return op;
}

Op collective(std::string name, Pass pass, Collective c, Group g, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::collective;
  op.pass = pass;
  op.collective = c;
  op.group = g;
  op.comm_bytes = bytes;
  return op;
}

// A GEMM's backward: dgrad (dX = dY W^T) and wgrad (dW = X^T dY), each with
// the forward's FLOPs. Forward C[m x n] = A[m x k] B[k x n]. A linear layer's
// wgrad with gradient-accumulation fusion (fused_into_main_grad) accumulates
// into the fp32 main_grad (beta = 1): its epilogue reads and writes 4 + 4 B
// per weight instead of writing 2, the extra bytes in Op::bytes.
void add_gemm_backward(std::vector<Op>& out, const Op& fwd, bool fused_into_main_grad = false) {
  Op dgrad = gemm(fwd.name + op::dgrad_suffix, Pass::backward, fwd.m, fwd.k, fwd.n, fwd.batch);
  Op wgrad = gemm(fwd.name + op::wgrad_suffix, Pass::backward, fwd.k, fwd.n, fwd.m, fwd.batch);
  dgrad.flops = fwd.flops;  // keeps the causal-half convention of the attention GEMMs
  wgrad.flops = fwd.flops;
  dgrad.unfused_attention = fwd.unfused_attention;
  wgrad.unfused_attention = fwd.unfused_attention;
  dgrad.grouped = fwd.grouped;
  wgrad.grouped = fwd.grouped;
  if (fused_into_main_grad)
    wgrad.bytes = static_cast<double>(fwd.k) * static_cast<double>(fwd.n) * static_cast<double>(fwd.batch) *
                  (kFp32Bytes + kFp32Bytes - kBf16Bytes);
  out.push_back(std::move(dgrad));
  out.push_back(std::move(wgrad));
}

// The TP collective after a row-parallel GEMM (forward) or after the dgrad of
// a column-parallel GEMM (backward): an all-reduce, or a reduce-scatter with SP.
void add_tp_reduce(std::vector<Op>& out, const Dims& x, std::string name, Pass pass) {
  if (x.t <= 1) return;
  const double bytes = static_cast<double>(x.tokens * x.h) * kBf16Bytes;
  out.push_back(collective(std::move(name), pass,
                           x.sp ? Collective::reduce_scatter : Collective::all_reduce, Group::tp, bytes));
  out.back().compute_dtype = true;
}

// The SP all-gather before a column-parallel GEMM (forward) or before the
// dgrad of a row-parallel GEMM (backward, mirroring the forward reduce-scatter).
void add_sp_gather(std::vector<Op>& out, const Dims& x, std::string name, Pass pass) {
  if (!x.sp) return;
  const double bytes = static_cast<double>(x.tokens * x.h) * kBf16Bytes;
  out.push_back(collective(std::move(name), pass, Collective::all_gather, Group::tp, bytes));
  out.back().compute_dtype = true;
}

// Elements of the attention scores on one rank ([b * heads / t, s, s]) and
// those on or below the diagonal, which the causal softmax kernels read.
double score_elements(const Dims& x) {
  return static_cast<double>(x.b * (x.a / x.t)) * static_cast<double>(x.s) * static_cast<double>(x.s);
}
double score_triangle_elements(const Dims& x) {
  return static_cast<double>(x.b * (x.a / x.t)) * static_cast<double>(x.s) * static_cast<double>(x.s + 1) / 2.0;
}

// Elements of an [s, b, h] tensor each rank touches in element-wise ops.
double hidden_elements(const Dims& x) {
  const double e = static_cast<double>(x.tokens * x.h);
  return x.sp ? e / static_cast<double>(x.t) : e;
}

// Bytes of one rank's K and V ([s / cp, b, 2 kv / t]): the ring's message.
double cp_kv_bytes(const Dims& x) {
  return static_cast<double>(x.tokens) * static_cast<double>(2 * x.kv / x.t) * kBf16Bytes;
}

// One fused attention kernel over `q_tokens` queries and `kv_tokens` keys per
// sequence for `batch` (sequence x head) pairs, `causal` when it is a
// diagonal block (half the products). HBM: Q, K, V read and O written.
Op flash_block(const Dims& x, Pass pass, std::int64_t q_tokens, std::int64_t kv_tokens, std::int64_t batch,
               std::int64_t heads, bool causal) {
  Op op;
  op.name = op::attn_flash;
  op.kind = OpKind::attention_core;
  op.attention_kernel = x.kernel;
  op.pass = pass;
  op.m = q_tokens;
  op.n = x.d;
  op.k = kv_tokens;
  op.batch = batch;
  op.flops = 2.0 * 2.0 * static_cast<double>(q_tokens) * static_cast<double>(kv_tokens) * static_cast<double>(x.d) *
             static_cast<double>(batch) * (causal ? 0.5 : 1.0);
  const double q_width = static_cast<double>(heads * x.d);
  const double kv_width = q_width * static_cast<double>(x.kv) / static_cast<double>(x.q);
  op.bytes = static_cast<double>(x.b) *
             (2.0 * static_cast<double>(q_tokens) * q_width + 2.0 * static_cast<double>(kv_tokens) * kv_width) * kBf16Bytes;
  return op;
}

// The attention core with context parallelism (Transformer Engine's
// context_parallel.py, which Megatron-Core runs). A rank holds chunks r and
// 2cp - 1 - r of its sequence: s / cp queries.
// p2p (AttnFuncWithCPAndKVP2P): cp steps of equal work: step 0 the two local
// chunks against themselves (causal), each later step half of a full block
// (both query chunks against the first K/V chunk of an earlier rank, or the
// second query chunk against both K/V chunks of a later rank). While step i
// computes, the K/V chunk of step i + 1 is sent on around the ring (cp - 1
// sends; the last step sends nothing). The representative is rank 0, whose
// later steps are the second half of its queries against a whole chunk pair.
// a2a (AttnFuncWithCPAndQKVOA2A): an all-to-all of Q, K and V gives each rank
// heads / (t cp) heads of the whole sequence, one causal kernel over it, and
// an all-to-all returns the output.
void add_cp_attention_forward(std::vector<Op>& out, const Dims& x, Pass pass) {
  const std::int64_t heads = x.a / x.t;
  if (x.cp_comm == CpComm::a2a) {
    const double qkv = static_cast<double>(x.tokens) * static_cast<double>((x.q + 2 * x.kv) / x.t) * kBf16Bytes;
    out.push_back(collective(op::cp_a2a_qkv, pass, Collective::all_to_all, Group::cp, qkv));
    out.back().compute_dtype = true;
    const std::int64_t h_cp = heads / x.cp;
    out.push_back(flash_block(x, pass, x.s_full, x.s_full, x.b * h_cp, h_cp, true));
    const double o = static_cast<double>(x.tokens) * static_cast<double>(x.q / x.t) * kBf16Bytes;
    out.push_back(collective(op::cp_a2a_out, pass, Collective::all_to_all, Group::cp, o));
    out.back().compute_dtype = true;
    return;
  }
  for (std::int64_t i = 0; i < x.cp; ++i) {
    if (i + 1 < x.cp) {
      out.push_back(collective(op::cp_kv_p2p, pass, Collective::send_recv, Group::cp, cp_kv_bytes(x)));
      out.back().kind = OpKind::p2p;
      out.back().compute_dtype = true;
      out.back().overlaps_next = x.cp_overlap;
    }
    const Op block = i == 0 ? flash_block(x, pass, x.s, x.s, x.b * heads, heads, true)
                            : flash_block(x, pass, x.s / 2, x.s, x.b * heads, heads, false);
    // flash_attn_fwd_out_correction(_init): the step's output scaled by its
    // softmax statistics and added into the running output (read the step's,
    // read + write the running one).
    const double elements = static_cast<double>(block.m * x.b) * static_cast<double>(x.q / x.t);
    out.push_back(block);
    out.push_back(memory_bound(op::cp_out_correct, pass, elements * (kBf16Bytes + kBf16Bytes + kBf16Bytes)));
  }
}

// Its backward. p2p: step i sends on the K/V of step i + 1 and the dK/dV
// summed so far (step 0 K/V only, the last step dK/dV only), each under the
// step's backward kernel (2.5x its forward FLOPs, as without CP). a2a: the
// output gradient all-to-all'd to the head layout, the kernel, dQ, dK and dV
// all-to-all'd back.
void add_cp_attention_backward(std::vector<Op>& out, const Dims& x, const std::vector<Op>& fwd) {
  auto bwd_of = [&](const Op& f) {
    Op op = f;
    op.name = op::attn_flash_bwd;
    op.pass = Pass::backward;
    op.flops = 2.5 * f.flops;
    op.bytes = 2.0 * f.bytes;  // Q, K, V, O, dO read; dQ, dK, dV written
    return op;
  };
  std::vector<const Op*> blocks;
  for (const Op& f : fwd)
    if (f.kind == OpKind::attention_core) blocks.push_back(&f);
  if (x.cp_comm == CpComm::a2a) {
    const double o = static_cast<double>(x.tokens) * static_cast<double>(x.q / x.t) * kBf16Bytes;
    out.push_back(collective(op::cp_a2a_out_bwd, Pass::backward, Collective::all_to_all, Group::cp, o));
    out.back().compute_dtype = true;
    for (const Op* b : blocks) out.push_back(bwd_of(*b));
    const double qkv = static_cast<double>(x.tokens) * static_cast<double>((x.q + 2 * x.kv) / x.t) * kBf16Bytes;
    out.push_back(collective(op::cp_a2a_qkv_bwd, Pass::backward, Collective::all_to_all, Group::cp, qkv));
    out.back().compute_dtype = true;
    return;
  }
  const std::size_t n = blocks.size();
  for (std::size_t i = 0; i < n; ++i) {
    const double bytes = cp_kv_bytes(x) * (i == 0 || i + 1 == n ? 1.0 : 2.0);
    out.push_back(collective(op::cp_kv_dkv_p2p_bwd, Pass::backward, Collective::send_recv, Group::cp, bytes));
    out.back().kind = OpKind::p2p;
    out.back().compute_dtype = true;
    out.back().overlaps_next = x.cp_overlap;
    const Op& f = *blocks[n - 1 - i];
    out.push_back(bwd_of(f));
    // The step's dQ added into dQ and its dK/dV into the travelling dK/dV
    // (read both, write the sum).
    const double elements = static_cast<double>(x.b) * (static_cast<double>(f.m) * static_cast<double>(x.q / x.t) +
                                                        static_cast<double>(f.k) * static_cast<double>(2 * x.kv / x.t));
    out.push_back(memory_bound(op::cp_grad_sum_bwd, Pass::backward, elements * (kBf16Bytes + kBf16Bytes + kBf16Bytes)));
  }
}

// The attention core, forward. Flash: one fused kernel, shape of O = P V per
// (batch, head) so wave quantisation follows its grid of query blocks; HBM
// traffic is Q, K, V read and O written. Unfused: QK^T, softmax + dropout, AV.
void add_attention_forward(std::vector<Op>& out, const Dims& x, Pass pass) {
  if (x.cp > 1) {
    add_cp_attention_forward(out, x, pass);
    return;
  }
  const std::int64_t heads = x.a / x.t;
  const std::int64_t batch = x.b * heads;
  const double causal = 0.5;
  if (x.flash) {
    Op op;
    op.name = op::attn_flash;
    op.kind = OpKind::attention_core;
    op.attention_kernel = x.kernel;
    op.pass = pass;
    op.m = x.s;
    op.n = x.d;
    op.k = x.s;
    op.batch = batch;
    op.flops = 2.0 * 2.0 * static_cast<double>(x.s) * static_cast<double>(x.s) *
               static_cast<double>(x.d) * static_cast<double>(batch) * causal;
    op.bytes = static_cast<double>(x.tokens) * static_cast<double>(2 * x.q + 2 * x.kv) /
               static_cast<double>(x.t) * kBf16Bytes;
    out.push_back(std::move(op));
    return;
  }
  Op qk = gemm(op::attn_qk, pass, x.s, x.s, x.d, batch);
  qk.flops *= causal;
  if (x.alibi) {
    // BigScience's Megatron-DeepSpeed (megatron/model/transformer.py) passes
    // the [b * heads, 1, s] ALiBi tensor as baddbmm's input with beta = 1:
    // PyTorch copies it, expanded, into the s x s result (write 2 B per
    // score), and the GEMM reads that C back (2 B more on its memory side).
    out.push_back(memory_bound(op::attn_alibi_bias, pass, score_elements(x) * kBf16Bytes));
    qk.bytes += score_elements(x) * kBf16Bytes;
  }
  out.push_back(std::move(qk));
  out.push_back(memory_bound(op::attn_softmax, pass,
                             score_triangle_elements(x) * kSoftmaxReadBytesPerTriangleElement +
                                 score_elements(x) * (kSoftmaxWriteBytesPerElement + kDropoutBytesPerElement)));
  Op av = gemm(op::attn_av, pass, x.s, x.d, x.s, batch);
  av.flops *= causal;
  out.push_back(std::move(av));
  // [b, heads, s, d] -> [s, b, heads * d]: the permute + contiguous copy.
  out.push_back(memory_bound(op::attn_ctx_copy, pass, static_cast<double>(x.tokens * (x.q / x.t)) * (kBf16Bytes + kBf16Bytes)));
  for (auto it = out.end() - 4; it != out.end(); ++it) it->unfused_attention = true;  // QK^T, softmax, AV, copy
}

// Elements of the QKV GEMM's output on one rank ([T, (q + 2kv)/t]).
double qkv_elements(const Dims& x) { return static_cast<double>(x.tokens * ((x.q + 2 * x.kv) / x.t)); }

// The attention core, backward. Flash: 2x the forward FLOPs (dgrad-like and
// wgrad-like products of QK^T and AV) plus the recomputed QK^T (half the
// forward), i.e. 2.5x; HBM: Q, K, V, O, dO read and dQ, dK, dV written.
// Unfused: the backward of AV, of softmax + dropout and of QK^T.
void add_attention_backward(std::vector<Op>& out, const Dims& x, const std::vector<Op>& fwd) {
  if (x.cp > 1) {
    add_cp_attention_backward(out, x, fwd);
    return;
  }
  if (x.flash) {
    for (const Op& f : fwd) {
      if (f.kind != OpKind::attention_core) continue;
      Op op = f;
      op.name = op::attn_flash_bwd;
      op.pass = Pass::backward;
      op.flops = 2.5 * f.flops;
      op.bytes = static_cast<double>(x.tokens) * static_cast<double>(4 * x.q + 4 * x.kv) /
                 static_cast<double>(x.t) * kBf16Bytes;
      out.push_back(std::move(op));
    }
    return;
  }
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    if (it->name == op::attn_av || it->name == op::attn_qk) {
      add_gemm_backward(out, *it);
    } else if (it->name == op::attn_softmax) {
      // Dropout backward, then the softmax backward, kernel by kernel (not
      // 2x the forward: 9 B per score element against the forward's 8).
      out.push_back(memory_bound(op::attn_softmax_bwd, Pass::backward,
                                 score_elements(x) * (kDropoutBackwardBytesPerElement + kSoftmaxBackwardWriteBytesPerElement) +
                                     score_triangle_elements(x) * kSoftmaxBackwardReadBytesPerTriangleElement));
      out.back().unfused_attention = true;
    }
    if (it->name == op::attn_qk) {
      // torch.baddbmm's autograd (tools/autograd/derivatives.yaml) scales
      // both input gradients by alpha = 1 / norm_factor in separate
      // element-wise kernels (maybe_multiply): dQ and dK, [b * np, s, d]
      // each, read + write.
      out.push_back(memory_bound(op::attn_qk_scale_bwd, Pass::backward,
                                 2.0 * static_cast<double>(x.b * (x.a / x.t) * x.s * x.d) * (kBf16Bytes + kBf16Bytes)));
      out.back().unfused_attention = true;
    }
  }
  // SplitBackward: cat of the Q, K, V gradients (read + write).
  out.push_back(memory_bound(op::attn_qkv_grad_cat, Pass::backward, qkv_elements(x) * (kBf16Bytes + kBf16Bytes)));
  out.back().unfused_attention = true;
}

void add_moe_forward(std::vector<Op>& out, const ModelSpec& m, const Dims& x, Pass pass);
void add_mla_forward(std::vector<Op>& out, const Dims& x, Pass pass);

void layer_forward(std::vector<Op>& out, const ModelSpec& m, const Dims& x, Pass pass) {
  const double hid = hidden_elements(x);
  const std::int64_t fc1_n = (m.gated_mlp() ? 2 * x.f : x.f) / x.t;
  out.push_back(memory_bound(op::norm_in, pass, hid * kNormBytesPerElement));
  if (x.mla) {
    add_mla_forward(out, x, pass);
  } else {
    add_sp_gather(out, x, op::tp_ag_attn, pass);
    out.push_back(gemm(op::qkv, pass, x.tokens, (x.q + 2 * x.kv) / x.t, x.h));
    // `output + bias` after the GEMM (read + write of the output).
    if (m.linear_bias) out.push_back(memory_bound(op::qkv_bias, pass, qkv_elements(x) * (kBf16Bytes + kBf16Bytes)));
  }
  add_attention_forward(out, x, pass);
  out.push_back(gemm(op::proj, pass, x.tokens, x.h, x.mla ? x.a / x.t * x.v : x.q / x.t));
  add_tp_reduce(out, x, x.sp ? op::tp_rs_attn : op::tp_ar_attn, pass);
  out.push_back(memory_bound(op::drop_add_attn, pass, hid * kDropoutAddBytesPerElement));
  out.push_back(memory_bound(op::norm_mlp, pass, hid * kNormBytesPerElement));
  if (x.moe) {
    add_moe_forward(out, m, x, pass);
    out.push_back(memory_bound(op::drop_add_mlp, pass, hid * kDropoutAddBytesPerElement));
    return;
  }
  add_sp_gather(out, x, op::tp_ag_mlp, pass);
  out.push_back(gemm(op::fc1, pass, x.tokens, fc1_n, x.h));
  // GeLU reads and writes the f/t-wide tensor; SwiGLU reads both halves.
  const double act_elems = static_cast<double>(x.tokens * (x.f / x.t));
  const double act_bytes = act_elems * (m.gated_mlp() ? (2 + 2 + 2) : (2 + 2));
  out.push_back(memory_bound(op::act, pass, act_bytes));
  out.push_back(gemm(op::fc2, pass, x.tokens, x.h, x.f / x.t));
  add_tp_reduce(out, x, x.sp ? op::tp_rs_mlp : op::tp_ar_mlp, pass);
  out.push_back(memory_bound(op::drop_add_mlp, pass, hid * kDropoutAddBytesPerElement));
}

const Op& find_op(const std::vector<Op>& ops, std::string_view name) {
  for (const Op& op : ops) {
    if (op.name == name) return op;
  }
  return ops.front();  // unreachable: every name asked for is emitted by layer_forward
}

// Parameters of one layer's linear layers on one TP rank (weights and
// biases): column-parallel QKV and FC1 are split by output, row-parallel
// proj and FC2 by input, with their biases whole on every rank.
struct LinearParams {
  double qkv, proj, fc1, fc2;
};

LinearParams linear_params(const ModelSpec& m, const Dims& x) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const std::int64_t qkv_n = (x.q + 2 * x.kv) / x.t;
  const std::int64_t fc1_n = (m.gated_mlp() ? 2 * x.f : x.f) / x.t;
  const double bias = m.linear_bias ? 1.0 : 0.0;
  return {d(x.h * qkv_n) + bias * d(qkv_n), d((x.q / x.t) * x.h) + bias * d(x.h), d(x.h * fc1_n) + bias * d(fc1_n),
          d((x.f / x.t) * x.h) + bias * d(x.h)};
}

// The main_grad hook of a linear layer's weight (and bias), when the wgrad
// GEMM does not accumulate into main_grad itself. With fusion the bias
// gradients are still hooked: a few thousand parameters, not charged.
void add_grad_accum(std::vector<Op>& out, const Dims& x, std::string name, double params) {
  if (x.fused_wgrad) return;
  out.push_back(memory_bound(std::move(name), Pass::backward, params * x.grad_accum_bytes));
}


// The MoE MLP (Megatron-Core's MoELayer with the alltoall dispatcher,
// megatron/core/transformer/moe/ at d98e8a64): each rank routes its own
// tokens (s x b / TP with sequence parallelism), permutes their top-k copies
// by expert, sends them to the experts' EP ranks (an all-to-all of the
// tokens and one of their probabilities), all-gathers them over ETP, sorts
// them by local expert, runs the local experts as grouped GEMMs (one GEMM
// per expert: experts / EP of them, each with its share of the tokens) and
// goes back the same way; the shared experts are a TP MLP beside them.
// Sizes are the busiest rank's (Dims::routed): every rank of the EP group
// waits for it at the combine.
double moe_local_tokens(const Dims& x) { return static_cast<double>(x.tokens / (x.sp ? x.t : 1)); }
std::int64_t local_experts(const Dims& x) { return x.experts / x.ep; }
// The busiest EP rank's tokens (its own tokens x the load, Dims::routed / k):
// what every dispatcher's exchange sends and receives scales with it, here
// only, so that a routing imbalance applies to all of them in one place.
double ep_rank_tokens(const Dims& x) { return x.routed / static_cast<double>(x.topk); }
// Token copies the local experts compute (after the ETP all-gather).
double expert_rows(const Dims& x) { return x.routed * static_cast<double>(x.etp); }
std::int64_t expert_fc1_n(const ModelSpec& m, const Dims& x) { return (m.gated_mlp() ? 2 * x.fe : x.fe) / x.etp; }

// A grouped GEMM of the local experts: `rows` token copies spread over them,
// one [rows / experts, k] x [k, n] product each (cuBLAS / CUTLASS grouped
// GEMM; the FLOPs those of all rows).
Op grouped_gemm(std::string name, Pass pass, double rows, std::int64_t n, std::int64_t k, std::int64_t experts) {
  const auto per_expert = static_cast<std::int64_t>(rows / static_cast<double>(experts) + 0.5);
  Op op = gemm(std::move(name), pass, std::max<std::int64_t>(1, per_expert), n, k, experts);
  op.flops = 2.0 * rows * static_cast<double>(n) * static_cast<double>(k);
  op.grouped = true;
  return op;
}

// The router's top-k over its logits: read the bf16 logits, write and read
// fp32 scores, write the routing map (1 B): 11 B per logit; its backward
// reads the probabilities' gradient and the scores (4 + 4) and writes the
// logits' gradient (2).
constexpr double kRouterTopkBytesPerLogit = kBf16Bytes + kFp32Bytes + kFp32Bytes + kMaskBytes;
constexpr double kRouterTopkBackwardBytesPerLogit = kFp32Bytes + kFp32Bytes + kBf16Bytes;

void add_moe_collective(std::vector<Op>& out, std::string name, Pass pass, Collective c, Group g, double bytes,
                        bool compute_dtype = true) {
  out.push_back(collective(std::move(name), pass, c, g, bytes));
  out.back().compute_dtype = compute_dtype;
}

// What the balancing adds to the routing of each micro-batch (Megatron-Core's
// TopKRouter.routing and moe_utils.py at d98e8a64, unfused). The auxiliary
// loss (also DeepSeek-V3's complementary sequence-wise one beside its expert
// bias, --moe-aux-loss-coeff 1e-4 in Megatron-LM's example) scores the logits
// a second time (softmax, top-k, routing map: as router_topk), counts each
// expert's tokens and sums its probabilities (read the map and the fp32
// scores: 5 B per logit) and all-reduces the counts over TP (int64 per
// expert; the TP x CP group, of which CP's part is not priced); its backward
// writes the loss's gradient of the scores and runs the softmax's backward
// (write 4, read 4 + 4, write 4: 16 B per logit). The loss-free expert bias
// also counts the tokens (1 B per logit); its update is once per iteration.
constexpr double kAuxLossBytesPerLogit = kMaskBytes + kFp32Bytes;
constexpr double kAuxLossBackwardBytesPerLogit = kFp32Bytes + kFp32Bytes + kFp32Bytes + kFp32Bytes;
void add_router_balancing(std::vector<Op>& out, const ModelSpec& m, const Dims& x, Pass pass) {
  const double logits = moe_local_tokens(x) * static_cast<double>(x.experts);
  out.push_back(memory_bound(op::router_aux_scores, pass, logits * kRouterTopkBytesPerLogit));
  out.push_back(memory_bound(op::router_aux_loss, pass, logits * kAuxLossBytesPerLogit));
  if (x.t > 1)
    add_moe_collective(out, op::tp_ar_aux_counts, pass, Collective::all_reduce, Group::tp,
                       static_cast<double>(x.experts) * 8.0, false);
  if (m.moe.balancing == RouterBalancing::aux_loss_free)
    out.push_back(memory_bound(op::router_bias_counts, pass, logits * kMaskBytes));
}

// Dropless routing's host synchronisation (token_dispatcher.py at d98e8a64,
// MoEAlltoAllTokenDispatcher.preprocess / _maybe_dtoh_and_synchronize): the
// token counts the host needs to size the all-to-all and the grouped GEMM
// (per local expert, per EP rank sent and received, per ETP rank, the
// total: int64 each) are copied to the host, which waits for them once per
// layer and forward, before the EP all-to-all (or, without EP and ETP,
// before the experts). The stream then idles until the released host
// launches the next kernel: priced as one memory-bound kernel of those
// bytes, i.e. one launch overhead.
void add_host_sync(std::vector<Op>& out, const Dims& x, Pass pass) {
  const double counts = static_cast<double>(local_experts(x) + 2 * x.ep + x.etp + 1);
  out.push_back(memory_bound(op::moe_host_sync, pass, counts * 8.0));
}

// An exchange of the allgather or flex dispatcher (Op::dispatcher).
void add_dispatcher_exchange(std::vector<Op>& out, std::string name, Pass pass, Collective c, const Dims& x,
                             double bytes_per_token, bool compute_dtype) {
  add_moe_collective(out, std::move(name), pass, c, Group::ep, ep_rank_tokens(x) * bytes_per_token, compute_dtype);
  out.back().dispatcher = x.dispatcher;
}

// The dispatch of the plan's dispatcher (token_dispatcher.py at d98e8a64).
// alltoall: the preprocess's all-to-all of every rank's tokens per expert
// ([experts] int64 counts), which the host waits for to size the token
// all-to-alls, then the top-k copies (bf16) and their probabilities (fp32).
// allgather: every rank's tokens (bf16), probabilities [tokens, experts]
// (fp32) and routing map (bool) all-gathered. flex: DeepEP's notify (the
// counts, which the host waits for) and its dispatch of each token once per
// rank and node with its top-k indices (int64) and weights (fp32).
void add_moe_dispatch(std::vector<Op>& out, const Dims& x, Pass pass) {
  const double h = static_cast<double>(x.h), e = static_cast<double>(x.experts), k = static_cast<double>(x.topk);
  if (x.dispatcher != MoeDispatcher::allgather)
    add_moe_collective(out, op::ep_a2a_counts, pass, Collective::all_to_all, Group::ep, e * 8.0, false);
  switch (x.dispatcher) {
    case MoeDispatcher::alltoall:
      add_moe_collective(out, op::ep_a2a_dispatch, pass, Collective::all_to_all, Group::ep, x.routed * h * kBf16Bytes);
      add_moe_collective(out, op::ep_a2a_probs, pass, Collective::all_to_all, Group::ep, x.routed * kFp32Bytes, false);
      return;
    case MoeDispatcher::allgather:
      add_dispatcher_exchange(out, op::ep_ag_dispatch, pass, Collective::all_gather, x, h * kBf16Bytes, true);
      add_dispatcher_exchange(out, op::ep_ag_probs, pass, Collective::all_gather, x, e * (kFp32Bytes + kMaskBytes),
                              false);
      return;
    case MoeDispatcher::flex:
      add_dispatcher_exchange(out, op::ep_flex_dispatch, pass, Collective::all_to_all, x, h * kBf16Bytes, true);
      add_dispatcher_exchange(out, op::ep_flex_probs, pass, Collective::all_to_all, x, k * (8.0 + kFp32Bytes), false);
      return;
  }
}

// The way back: alltoall's all-to-all of the copies (bf16); allgather's
// reduce-scatter in the probabilities' dtype (fp32: token_combine casts to
// local_probs.dtype); flex's DeepEP combine (bf16), each token once per rank
// and node, summed on the way.
void add_moe_combine(std::vector<Op>& out, const Dims& x, Pass pass) {
  const double h = static_cast<double>(x.h);
  switch (x.dispatcher) {
    case MoeDispatcher::alltoall:
      add_moe_collective(out, op::ep_a2a_combine, pass, Collective::all_to_all, Group::ep, x.routed * h * kBf16Bytes);
      return;
    case MoeDispatcher::allgather:
      add_dispatcher_exchange(out, op::ep_rs_combine, pass, Collective::reduce_scatter, x, h * kFp32Bytes, false);
      return;
    case MoeDispatcher::flex:
      add_dispatcher_exchange(out, op::ep_flex_combine, pass, Collective::all_to_all, x, h * kBf16Bytes, true);
      return;
  }
}

// Backward, in reverse: the combine's gradient goes out as a dispatch does
// (allgather: all-gathered in fp32) ...
void add_moe_combine_backward(std::vector<Op>& out, const Dims& x) {
  const Pass b = Pass::backward;
  const double h = static_cast<double>(x.h);
  switch (x.dispatcher) {
    case MoeDispatcher::alltoall:
      add_moe_collective(out, op::ep_a2a_combine_bwd, b, Collective::all_to_all, Group::ep, x.routed * h * kBf16Bytes);
      return;
    case MoeDispatcher::allgather:
      add_dispatcher_exchange(out, op::ep_rs_combine_bwd, b, Collective::all_gather, x, h * kFp32Bytes, false);
      return;
    case MoeDispatcher::flex:
      add_dispatcher_exchange(out, op::ep_flex_combine_bwd, b, Collective::all_to_all, x, h * kBf16Bytes, true);
      return;
  }
}

// ... and the dispatch's gradients come back as a combine does (allgather:
// reduce-scattered, the tokens' bf16 and the probabilities' fp32).
void add_moe_dispatch_backward(std::vector<Op>& out, const Dims& x) {
  const Pass b = Pass::backward;
  const double h = static_cast<double>(x.h), e = static_cast<double>(x.experts), k = static_cast<double>(x.topk);
  switch (x.dispatcher) {
    case MoeDispatcher::alltoall:
      add_moe_collective(out, op::ep_a2a_dispatch_bwd, b, Collective::all_to_all, Group::ep, x.routed * h * kBf16Bytes);
      add_moe_collective(out, op::ep_a2a_probs_bwd, b, Collective::all_to_all, Group::ep, x.routed * kFp32Bytes, false);
      return;
    case MoeDispatcher::allgather:
      add_dispatcher_exchange(out, op::ep_ag_dispatch_bwd, b, Collective::reduce_scatter, x, h * kBf16Bytes, true);
      add_dispatcher_exchange(out, op::ep_ag_probs_bwd, b, Collective::reduce_scatter, x, e * kFp32Bytes, false);
      return;
    case MoeDispatcher::flex:
      add_dispatcher_exchange(out, op::ep_flex_dispatch_bwd, b, Collective::all_to_all, x, h * kBf16Bytes, true);
      add_dispatcher_exchange(out, op::ep_flex_probs_bwd, b, Collective::all_to_all, x, k * kFp32Bytes, false);
      return;
  }
}

void add_moe_forward(std::vector<Op>& out, const ModelSpec& m, const Dims& x, Pass pass) {
  const double tl = moe_local_tokens(x), copies = tl * static_cast<double>(x.topk), h = static_cast<double>(x.h);
  const double rows = expert_rows(x);
  const std::int64_t fe_local = x.fe / x.etp;
  out.push_back(gemm(op::router, pass, static_cast<std::int64_t>(tl), x.experts, x.h));
  out.push_back(memory_bound(op::router_topk, pass, tl * static_cast<double>(x.experts) * kRouterTopkBytesPerLogit));
  add_router_balancing(out, m, x, pass);
  // Each token copied k times into expert order (read, write).
  out.push_back(memory_bound(op::moe_permute, pass, copies * h * (kBf16Bytes + kBf16Bytes)));
  // With a rank capacity factor HybridEP runs non-blocking on the static
  // budget: no host wait for the counts (d98e8a64 token_dispatcher.py:
  // 1098-1112 and 1175-1178, fused_a2a.py:417 non_blocking = budget given;
  // DeepEP hybrid-ep executor.cu:166-175@94a9f8f6 synchronises the stream
  // only when blocking).
  if (!x.static_budget) add_host_sync(out, x, pass);
  if (x.ep > 1) {
    // The dispatcher's preprocess: every rank's tokens per expert to every
    // EP rank (an all-to-all of [experts] int64 counts), which the host
    // waits for to size the token all-to-alls (token_dispatcher.py).
    add_moe_dispatch(out, x, pass);
  }
  if (x.etp > 1)
    add_moe_collective(out, op::etp_ag_dispatch, pass, Collective::all_gather, Group::tp, rows * h * kBf16Bytes);
  if (local_experts(x) > 1) out.push_back(memory_bound(op::moe_sort, pass, rows * h * (kBf16Bytes + kBf16Bytes)));
  out.push_back(grouped_gemm(op::expert_fc1, pass, rows, expert_fc1_n(m, x), x.h, local_experts(x)));
  const double act_elems = rows * static_cast<double>(fe_local);
  out.push_back(memory_bound(op::expert_act, pass, act_elems * (m.gated_mlp() ? (2 + 2 + 2) : (2 + 2))));
  out.push_back(grouped_gemm(op::expert_fc2, pass, rows, x.h, fe_local, local_experts(x)));
  if (local_experts(x) > 1) out.push_back(memory_bound(op::moe_unsort, pass, rows * h * (kBf16Bytes + kBf16Bytes)));
  if (x.etp > 1)
    add_moe_collective(out, op::etp_rs_combine, pass, Collective::reduce_scatter, Group::tp, rows * h * kBf16Bytes);
  if (x.ep > 1) add_moe_combine(out, x, pass);
  // The k copies weighted by their probabilities and summed per token.
  out.push_back(memory_bound(op::moe_unpermute, pass, copies * (h * kBf16Bytes + kFp32Bytes) + tl * h * kBf16Bytes));
  if (x.fs > 0) {
    add_sp_gather(out, x, op::tp_ag_shared, pass);
    out.push_back(gemm(op::shared_fc1, pass, x.tokens, (m.gated_mlp() ? 2 * x.fs : x.fs) / x.t, x.h));
    const double shared_elems = static_cast<double>(x.tokens * (x.fs / x.t));
    out.push_back(memory_bound(op::shared_act, pass, shared_elems * (m.gated_mlp() ? (2 + 2 + 2) : (2 + 2))));
    out.push_back(gemm(op::shared_fc2, pass, x.tokens, x.h, x.fs / x.t));
    add_tp_reduce(out, x, op::tp_rs_shared, pass);
    // routed + shared (read both, write the sum).
    out.push_back(memory_bound(op::shared_add, pass, tl * h * (kBf16Bytes + kBf16Bytes + kBf16Bytes)));
  }
}

void add_moe_backward(std::vector<Op>& out, const ModelSpec& m, const Dims& x, const std::vector<Op>& fwd) {
  const Pass b = Pass::backward;
  const double tl = moe_local_tokens(x), copies = tl * static_cast<double>(x.topk), h = static_cast<double>(x.h);
  const double rows = expert_rows(x);
  const std::int64_t fe_local = x.fe / x.etp;
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  if (x.fs > 0) {
    add_sp_gather(out, x, op::tp_ag_shared_bwd, b);
    add_gemm_backward(out, find_op(fwd, op::shared_fc2), x.fused_wgrad);
    add_grad_accum(out, x, op::shared_fc2_grad_accum, d(x.fs / x.t * x.h));
    const double shared_elems = static_cast<double>(x.tokens * (x.fs / x.t));
    out.push_back(memory_bound(op::shared_act_bwd, b, shared_elems * (m.gated_mlp() ? (2 + 4 + 4) : (2 + 2 + 2))));
    add_gemm_backward(out, find_op(fwd, op::shared_fc1), x.fused_wgrad);
    add_tp_reduce(out, x, op::tp_rs_shared_bwd, b);
    add_grad_accum(out, x, op::shared_fc1_grad_accum, d(x.h * ((m.gated_mlp() ? 2 * x.fs : x.fs) / x.t)));
  }
  // The probabilities' gradient needs the experts' output (read again).
  out.push_back(memory_bound(op::moe_unpermute_bwd, b, tl * h * kBf16Bytes + copies * (h * (kBf16Bytes + kBf16Bytes) + kFp32Bytes)));
  if (x.ep > 1) add_moe_combine_backward(out, x);
  if (x.etp > 1)
    add_moe_collective(out, op::etp_rs_combine_bwd, b, Collective::all_gather, Group::tp, rows * h * kBf16Bytes);
  if (local_experts(x) > 1) out.push_back(memory_bound(op::moe_unsort_bwd, b, rows * h * (kBf16Bytes + kBf16Bytes)));
  add_gemm_backward(out, find_op(fwd, op::expert_fc2), x.fused_wgrad);
  add_grad_accum(out, x, op::expert_fc2_grad_accum, d(local_experts(x) * fe_local * x.h));
  const double act_elems = rows * static_cast<double>(fe_local);
  out.push_back(memory_bound(op::expert_act_bwd, b, act_elems * (m.gated_mlp() ? (2 + 4 + 4) : (2 + 2 + 2))));
  add_gemm_backward(out, find_op(fwd, op::expert_fc1), x.fused_wgrad);
  add_grad_accum(out, x, op::expert_fc1_grad_accum, d(local_experts(x) * x.h * expert_fc1_n(m, x)));
  if (local_experts(x) > 1) out.push_back(memory_bound(op::moe_sort_bwd, b, rows * h * (kBf16Bytes + kBf16Bytes)));
  if (x.etp > 1)
    add_moe_collective(out, op::etp_ag_dispatch_bwd, b, Collective::reduce_scatter, Group::tp, rows * h * kBf16Bytes);
  if (x.ep > 1) add_moe_dispatch_backward(out, x);
  // The copies' gradients added back per token (read them, read and write
  // the sum), and the MLP input's three gradients (router, tokens, shared
  // experts) summed: a residual-fork sum.
  out.push_back(memory_bound(op::moe_permute_bwd, b,
                             copies * h * kBf16Bytes + tl * h * (kBf16Bytes + kBf16Bytes) + tl * h * kResidualGradSumBytesPerElement));
  out.push_back(
      memory_bound(op::router_aux_loss_bwd, b, tl * static_cast<double>(x.experts) * kAuxLossBackwardBytesPerLogit));
  out.push_back(
      memory_bound(op::router_topk_bwd, b, tl * static_cast<double>(x.experts) * kRouterTopkBackwardBytesPerLogit));
  add_gemm_backward(out, find_op(fwd, op::router), x.fused_wgrad);
  add_grad_accum(out, x, op::router_grad_accum, d(x.h * x.experts));
}


// Multi-head latent attention (Megatron-Core's MLASelfAttention with
// Transformer Engine's layers, megatron/core/transformer/
// multi_latent_attention.py at d98e8a64): the down projections h -> q_lora
// and h -> kv_lora + rope are duplicated on every TP rank and run on its
// sequence shard (s b / TP tokens with SP), each followed by its RMSNorm; the
// latents are all-gathered over TP (the query's, and the key/value's with
// the rotary key) for the column-parallel up projections q_lora -> heads /
// TP x (qk + rope) and kv_lora -> heads / TP x (qk + v). Without a query
// rank the query is projected from the (gathered) hidden state directly.
// The rotary embedding's element-wise kernels are not priced.
void add_mla_forward(std::vector<Op>& out, const Dims& x, Pass pass) {
  const std::int64_t tl = x.sp ? x.tokens / x.t : x.tokens;
  const std::int64_t heads = x.a / x.t;
  if (x.qlora > 0) {
    out.push_back(gemm(op::mla_q_down, pass, tl, x.qlora, x.h));
    out.push_back(memory_bound(op::mla_q_norm, pass, static_cast<double>(tl * x.qlora) * kNormBytesPerElement));
  }
  out.push_back(gemm(op::mla_kv_down, pass, tl, x.kvlora + x.rope, x.h));
  out.push_back(memory_bound(op::mla_kv_norm, pass, static_cast<double>(tl * x.kvlora) * kNormBytesPerElement));
  const Collective gather = Collective::all_gather;
  if (x.sp) {
    if (x.qlora > 0) {
      out.push_back(collective(op::mla_ag_q, pass, gather, Group::tp, static_cast<double>(x.tokens * x.qlora) * kBf16Bytes));
      out.back().compute_dtype = true;
    } else {
      add_sp_gather(out, x, op::tp_ag_attn, pass);
    }
    out.push_back(
        collective(op::mla_ag_kv, pass, gather, Group::tp, static_cast<double>(x.tokens * (x.kvlora + x.rope)) * kBf16Bytes));
    out.back().compute_dtype = true;
  }
  out.push_back(gemm(op::mla_q_up, pass, x.tokens, heads * (x.qk + x.rope), x.qlora > 0 ? x.qlora : x.h));
  out.push_back(gemm(op::mla_kv_up, pass, x.tokens, heads * (x.qk + x.v), x.kvlora));
}

// Its backward: the up projections' dgrad and wgrad, each with the
// reduce-scatter of its input gradient (the gather's backward; an all-reduce
// without SP) under its wgrad, the norms, the down projections, and the
// hidden state's two (three) input gradients summed.
void add_mla_backward(std::vector<Op>& out, const Dims& x, const std::vector<Op>& fwd) {
  const Pass b = Pass::backward;
  const std::int64_t tl = x.sp ? x.tokens / x.t : x.tokens;
  const Collective reduce = x.sp ? Collective::reduce_scatter : Collective::all_reduce;
  auto latent_reduce = [&](const char* name, std::int64_t width) {
    if (x.t <= 1) return;
    out.push_back(collective(name, b, reduce, Group::tp, static_cast<double>(x.tokens * width) * kBf16Bytes));
    out.back().compute_dtype = true;
  };
  add_gemm_backward(out, find_op(fwd, op::mla_kv_up), x.fused_wgrad);
  latent_reduce(op::mla_ag_kv_bwd, x.kvlora + x.rope);
  add_gemm_backward(out, find_op(fwd, op::mla_q_up), x.fused_wgrad);
  if (x.qlora > 0)
    latent_reduce(op::mla_ag_q_bwd, x.qlora);
  else
    add_tp_reduce(out, x, x.sp ? op::tp_rs_attn_bwd : op::tp_ar_attn_bwd, b);
  out.push_back(
      memory_bound(op::mla_kv_norm_bwd, b, static_cast<double>(tl * x.kvlora) * kNormBackwardBytesPerElement));
  add_gemm_backward(out, find_op(fwd, op::mla_kv_down), x.fused_wgrad);
  if (x.qlora > 0) {
    out.push_back(
        memory_bound(op::mla_q_norm_bwd, b, static_cast<double>(tl * x.qlora) * kNormBackwardBytesPerElement));
    add_gemm_backward(out, find_op(fwd, op::mla_q_down), x.fused_wgrad);
    out.push_back(memory_bound(op::mla_down_grad_sum, b, static_cast<double>(tl * x.h) * kResidualGradSumBytesPerElement));
  }
  if (!x.fused_wgrad) {
    const std::int64_t heads = x.a / x.t;
    const double params = static_cast<double>(x.qlora > 0 ? x.h * x.qlora + x.qlora * heads * (x.qk + x.rope)
                                                          : x.h * heads * (x.qk + x.rope)) +
                          static_cast<double>(x.h * (x.kvlora + x.rope) + x.kvlora * heads * (x.qk + x.v));
    out.push_back(memory_bound(op::mla_grad_accum, b, params * x.grad_accum_bytes));
  }
}

// Backward in reverse order. TP collectives mirror Megatron's f / g operators:
// the forward all-reduce after a row-parallel GEMM is the identity backward;
// the identity before a column-parallel GEMM becomes an all-reduce of the
// input gradient; with SP, all-gather <-> reduce-scatter swap. The simulator
// overlaps that collective with the wgrad GEMM (dgrad, wgrad, reduce are
// consecutive here; sim/program.cpp), as Megatron's async TP all-reduce does;
// the parameter's main_grad hook runs after the autograd function returns,
// i.e. after the collective.
void layer_backward(std::vector<Op>& out, const ModelSpec& m, const Dims& x, const std::vector<Op>& fwd) {
  const double hid = hidden_elements(x);
  const LinearParams params = linear_params(m, x);
  const double act_elems = static_cast<double>(x.tokens * (x.f / x.t));
  // GeLU (Megatron's bias_gelu_back): read dy and the saved input, write dx;
  // the bias gradient is autograd's sum_to over the tokens (one more read).
  // SwiGLU: read dy and both halves, write both halves' gradients.
  const double act_bytes = m.gated_mlp() ? act_elems * (2 + 4 + 4)
                                         : act_elems * (2 + 2 + 2 + (m.linear_bias ? kBf16Bytes : 0.0));
  auto elementwise = [&](std::string name, double bytes_per_element) {
    out.push_back(memory_bound(std::move(name), Pass::backward, hid * bytes_per_element));
  };
  elementwise(op::drop_add_mlp_bwd, kDropoutAddBackwardBytesPerElement);
  if (x.moe) {
    add_moe_backward(out, m, x, fwd);
  } else {
    add_sp_gather(out, x, op::tp_ag_mlp_bwd, Pass::backward);
    add_gemm_backward(out, find_op(fwd, op::fc2), x.fused_wgrad);
    add_grad_accum(out, x, op::fc2_grad_accum, params.fc2);
    out.push_back(memory_bound(op::act_bwd, Pass::backward, act_bytes));
    add_gemm_backward(out, find_op(fwd, op::fc1), x.fused_wgrad);
    add_tp_reduce(out, x, x.sp ? op::tp_rs_mlp_bwd : op::tp_ar_mlp_bwd, Pass::backward);
    add_grad_accum(out, x, op::fc1_grad_accum, params.fc1);
  }
  elementwise(op::norm_mlp_bwd, kNormBackwardBytesPerElement);
  elementwise(op::residual_add_bwd, kResidualGradSumBytesPerElement);
  elementwise(op::drop_add_attn_bwd, kDropoutAddBackwardBytesPerElement);
  add_sp_gather(out, x, op::tp_ag_attn_bwd, Pass::backward);
  add_gemm_backward(out, find_op(fwd, op::proj), x.fused_wgrad);
  add_grad_accum(out, x, op::proj_grad_accum, params.proj);
  add_attention_backward(out, x, fwd);
  if (x.mla) {
    add_mla_backward(out, x, fwd);
    elementwise(op::norm_in_bwd, kNormBackwardBytesPerElement);
    elementwise(op::residual_add_bwd, kResidualGradSumBytesPerElement);
    return;
  }
  add_gemm_backward(out, find_op(fwd, op::qkv), x.fused_wgrad);
  add_tp_reduce(out, x, x.sp ? op::tp_rs_attn_bwd : op::tp_ar_attn_bwd, Pass::backward);
  // grad_output.sum(dim=0): one read of the QKV output's gradient. Megatron
  // runs it after the wgrad, under the async reduce; it is listed after the
  // reduce because the simulator's overlap window (sim/program.cpp) is
  // dgrad, wgrad, reduce. Pessimistic by at most this small kernel.
  if (m.linear_bias) out.push_back(memory_bound(op::qkv_bias_grad, Pass::backward, qkv_elements(x) * kBf16Bytes));
  add_grad_accum(out, x, op::qkv_grad_accum, params.qkv);
  elementwise(op::norm_in_bwd, kNormBackwardBytesPerElement);
  elementwise(op::residual_add_bwd, kResidualGradSumBytesPerElement);
}

// FP8 / FP4 linear layers, as Megatron-Core d98e8a64 runs them through
// Transformer Engine d0067d0d (module/linear.py _linear_forward and
// _linear_backward, layernorm_linear.py, grouped_linear.py; base.py
// grad_output_preprocess): the GEMMs of the layers TE builds (QKV, the
// projection, FC1, FC2, the shared and the routed experts, latent
// attention's projections) run quantized, forward, dgrad and wgrad alike;
// the attention core, the router, the embedding and the LM head stay bf16.
// Before each quantized GEMM its bf16 input (in the backward: the output
// gradient) is quantized: the cast writes the rowwise copy the GEMM reads and
// the columnwise one the other pass's GEMM reads (set_usage(rowwise=True,
// columnwise=True)), after the amax pass and the scale kernel where the
// recipe has them (precision.hpp). With SP a column-parallel input (and a
// row-parallel output gradient) is quantized on the rank's shard and
// all-gathered quantized (gather_along_first_dim with the quantizer), and a
// current-scaling amax is all-reduced over TP first
// (set_quantizer_amax_reduction_group). Simplifications: the norm's fused
// quantized output (delayed scaling) is priced as the norm and a cast; with
// per-tensor FP8 and SP, TE gathers the rowwise copy only and transposes it
// in the backward: the same bytes, priced in the forward.
bool quantized_linear(std::string_view name) {
  static constexpr const char* kLinear[] = {op::qkv,        op::proj,       op::fc1,        op::fc2,
                                            op::shared_fc1, op::shared_fc2, op::expert_fc1, op::expert_fc2,
                                            op::mla_q_down, op::mla_kv_down, op::mla_q_up,  op::mla_kv_up};
  for (const char* n : kLinear)
    if (name == n) return true;
  return false;
}

// The SP all-gathers right before a linear layer's GEMM (forward) or dgrad (backward).
bool is_sp_gather(const Op& op) {
  static constexpr const char* kGathers[] = {op::tp_ag_attn,     op::tp_ag_mlp,     op::tp_ag_shared,
                                             op::tp_ag_attn_bwd, op::tp_ag_mlp_bwd, op::tp_ag_shared_bwd};
  if (op.kind != OpKind::collective || op.group != Group::tp || op.collective != Collective::all_gather) return false;
  for (const char* n : kGathers)
    if (op.name == n) return true;
  return false;
}

// The quantizer's kernels for `elements` bf16 elements; `tp_amax`: its amax
// is all-reduced over TP (a 4-byte fp32 MAX, which TE waits for).
void add_quantize(std::vector<Op>& out, const Dims& x, Pass pass, double elements, bool tp_amax, const char* cast) {
  if (separate_amax(x.precision)) {
    out.push_back(memory_bound(op::fp8_amax, pass, elements * kBf16Bytes));
    if (tp_amax) out.push_back(collective(op::tp_ar_amax, pass, Collective::all_reduce, Group::tp, kFp32Bytes));
    // nvte_compute_scale_from_amax: reads the amax, writes the scale.
    if (x.precision == Precision::fp8_current) out.push_back(memory_bound(op::fp8_scale, pass, kFp32Bytes + kFp32Bytes));
  }
  out.push_back(memory_bound(cast, pass, elements * (kBf16Bytes + 2.0 * quantized_element_bytes(x.precision))));
  out.back().precision = x.precision;  // the format it writes (cost.cpp prices an MXFP8 cast at its own rate)
}

// Each quantized GEMM of the list with its quantizer's kernels before it
// (before the SP gather, which then moves the quantized tensor). What is
// quantized is A[m x k]: a forward GEMM's input, a dgrad's output gradient
// (dX[m x k'] = dY[m x n'] W: its own k is the forward's n).
void quantize_list(std::vector<Op>& ops, const Dims& x, bool backward) {
  std::vector<Op> out;
  out.reserve(ops.size() + 24);
  const double element_ratio = quantized_element_bytes(x.precision) / kBf16Bytes;
  for (const Op& op : ops) {
    const std::string_view name = op.name;
    const std::string_view dg = op::dgrad_suffix, wg = op::wgrad_suffix;
    const auto base_is_linear = [&](std::string_view suffix) {
      return name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix &&
             quantized_linear(name.substr(0, name.size() - suffix.size()));
    };
    if (op.kind != OpKind::gemm) {
      out.push_back(op);
      continue;
    }
    if (backward && base_is_linear(wg)) {
      out.push_back(op);
      out.back().precision = x.precision;
      continue;
    }
    if (backward ? !base_is_linear(dg) : !quantized_linear(name)) {
      out.push_back(op);
      continue;
    }
    const bool gathered = !out.empty() && is_sp_gather(out.back());
    double elements = static_cast<double>(op.m) * static_cast<double>(op.k) * static_cast<double>(op.batch);
    Op gather;
    if (gathered) {
      gather = out.back();
      out.pop_back();
      gather.comm_bytes *= element_ratio;
      elements /= static_cast<double>(x.t);
    }
    add_quantize(out, x, op.pass, elements, gathered, backward ? op::fp8_grad_cast : op::fp8_cast);
    if (gathered) out.push_back(std::move(gather));
    out.push_back(op);
    out.back().precision = x.precision;
  }
  ops = std::move(out);
}

void quantize_linear_layers(LayerOps& ops, const Dims& x) {
  if (x.precision == Precision::bf16) return;
  quantize_list(ops.forward, x, false);
  quantize_list(ops.backward, x, true);
}

// Elements of the attention core's Q, K and V on one rank (latent
// attention: heads x (2 (qk + rope) + v), the core's unpadded inputs) and
// of its output O (heads x v; else [T, q / t]).
double core_input_elements(const Dims& x) {
  if (!x.mla) return qkv_elements(x);
  return static_cast<double>(x.tokens) * static_cast<double>(x.a / x.t) * static_cast<double>(2 * (x.qk + x.rope) + x.v);
}
double core_output_elements(const Dims& x) {
  return static_cast<double>(x.tokens) * static_cast<double>(x.a / x.t) * static_cast<double>(x.mla ? x.v : x.d);
}

// An FP8 attention core's quantizer on `elements` bf16 elements: the amax
// pass and the scale under current scaling, then the cast writing the
// rowwise E4M3 copy (per-tensor: get_attention_quantizers sets rowwise
// only) or the rowwise and columnwise MXFP8 copies with their scales
// (MXFP8: columnwise_usage for QKV and dO, which the backward reads).
// No amax all-reduce: the core's tensors are the rank's own heads (TE
// reduces the DPA amaxes over CP only, which cuboid refuses).
void add_attention_quantize(std::vector<Op>& out, const Dims& x, Pass pass, double elements, const char* cast) {
  if (separate_amax(x.precision)) {
    out.push_back(memory_bound(op::fp8_amax, pass, elements * kBf16Bytes));
    if (x.precision == Precision::fp8_current) out.push_back(memory_bound(op::fp8_scale, pass, kFp32Bytes + kFp32Bytes));
  }
  const double copies = *x.fp8_attention == Fp8AttentionFormat::mxfp8 ? 2.0 : 1.0;
  out.push_back(memory_bound(cast, pass, elements * (kBf16Bytes + copies * quantized_element_bytes(x.precision))));
  out.back().precision = x.precision;  // the format it writes (an MXFP8 cast at its own rate)
}

// FP8 attention (--fp8-attention), as Transformer Engine d0067d0d runs it
// (attention/dot_product_attention/backends.py FusedAttnFunc, utils.py
// get_attention_quantizers, combine_and_quantize): Q, K and V quantized
// before the forward kernel, the output gradient before the backward one,
// both kernels at cuDNN's FP8 rates of the format (cost.cpp: the op's
// precision). Under delayed scaling cuDNN writes O and dQ, dK, dV in FP8,
// dequantized to bf16 for the layers around it (read 1, write 2); under
// current scaling (NVTE_DPA_FP8CS_O_in_F16, default 1) and MXFP8 they are
// bf16. The kernels' HBM side stays priced at bf16 bytes (they are
// compute-bound at training lengths).
void quantize_attention_core(LayerOps& ops, const Dims& x) {
  if (!x.fp8_attention) return;
  const bool delayed = x.precision == Precision::fp8_delayed;
  const double dequantize = kFp8Bytes + kBf16Bytes;
  for (const bool backward : {false, true}) {
    std::vector<Op>& list = backward ? ops.backward : ops.forward;
    std::vector<Op> out;
    out.reserve(list.size() + 8);
    for (const Op& op : list) {
      if (op.kind != OpKind::attention_core) {
        out.push_back(op);
        continue;
      }
      add_attention_quantize(out, x, op.pass, backward ? core_output_elements(x) : core_input_elements(x),
                             backward ? op::fp8_grad_cast : op::fp8_cast);
      out.push_back(op);
      out.back().precision = x.precision;
      if (delayed)
        out.push_back(memory_bound(op::fp8_dequantize, op.pass,
                                   (backward ? core_input_elements(x) : core_output_elements(x)) * dequantize));
    }
    list = std::move(out);
  }
}

// The forward's MLP module: what runs between the pre-MLP norm and the
// bias-dropout-add after it.
void append_mlp_forward(std::vector<Op>& out, const std::vector<Op>& forward) {
  std::size_t first = forward.size(), last = forward.size();
  for (std::size_t i = 0; i < forward.size(); ++i) {
    if (forward[i].name == op::norm_mlp) first = i + 1;
    if (forward[i].name == op::drop_add_mlp) last = i;
  }
  if (first < last) out.insert(out.end(), forward.begin() + static_cast<std::ptrdiff_t>(first),
                               forward.begin() + static_cast<std::ptrdiff_t>(last));
}

// Which of Megatron-Core's partial MoE graphs an op of an MoE layer's MLP
// part replays in (moe_layer.py at d98e8a64: the moe_router graph runs
// TransformerLayer._forward_mlp up to MoELayer.route, i.e. the pre-MLP norm,
// the shared experts and the router with its balancing; the moe_preprocess
// graph MoELayer.preprocess, the dispatcher's dispatch_preprocess: the
// permutation; TE captures each graph's backward too), as the module bit.
// 0: neither (the host sync, the exchanges, the experts, the unpermutation
// and the sum with the shared experts run eagerly after the graphs).
std::uint8_t moe_graph_module(std::string_view name) {
  static constexpr std::string_view kRouter[] = {
      op::norm_mlp,         op::router,           op::router_topk,       op::router_aux_scores, op::router_aux_loss,
      op::router_bias_counts, op::tp_ar_aux_counts, op::tp_ag_shared,   op::shared_fc1,        op::shared_act,
      op::shared_fc2,       op::tp_rs_shared,     op::norm_mlp_bwd,      op::tp_ag_shared_bwd,  op::tp_rs_shared_bwd,
      op::router_dgrad,     op::router_wgrad,     op::router_topk_bwd,   op::router_aux_loss_bwd, op::router_grad_accum,
      op::shared_fc1_dgrad, op::shared_fc1_wgrad, op::shared_act_bwd,   op::shared_fc2_dgrad,  op::shared_fc2_wgrad,
      op::shared_fc1_grad_accum, op::shared_fc2_grad_accum};
  if (name == op::moe_permute || name == op::moe_permute_bwd)
    return static_cast<std::uint8_t>(CudaGraphModule::moe_preprocess);
  for (std::string_view r : kRouter)
    if (name == r) return static_cast<std::uint8_t>(CudaGraphModule::moe_router);
  return 0;
}

// The forward's ops of the given names, in order, each quantized GEMM with
// its quantizer's kernels (the run of amax / scale / cast ops before it or
// before its SP gather): what a checkpointed module runs again.
void append_forward_ops(std::vector<Op>& out, const std::vector<Op>& forward,
                        std::initializer_list<std::string_view> names) {
  std::vector<const Op*> quantizer;
  for (const Op& op : forward) {
    const std::string_view name = op.name;
    if (name == op::fp8_amax || name == op::tp_ar_amax || name == op::fp8_scale || name == op::fp8_cast) {
      quantizer.push_back(&op);
      continue;
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      for (const Op* q : quantizer) out.push_back(*q);
      out.push_back(op);
    }
    quantizer.clear();
  }
}

// Megatron-Core's CUDA graphs (TrainerSettings::cuda_graphs; Megatron-LM
// d98e8a64 transformer_config.py:1075-1105): which ops of a layer's list
// replay from a captured graph. The attention part is what
// TransformerLayer._forward_attention runs (the ops before the MLP's norm
// in a forward list, after it in a backward one), the MLP part the rest;
// the "mlp" module captures a dense layer's MLP only, "moe" an MoE layer's,
// "moe_router" and "moe_preprocess" the ops moe_graph_module names. A
// per-layer graph is a run of captured ops of one part (the MoE router's
// graph: its ops wherever they sit in the list); its first op keeps a
// launch, which stands for the graph's own (cudaGraphLaunch, one host call).
// The full-iteration graph is launched once per iteration: no op keeps one.
// `mlp(i)`: whether ops[i] is of the MLP part.
template <class IsMlp>
void mark_graphed(std::vector<Op>& ops, const CudaGraphs& g, bool moe_layer, IsMlp mlp) {
  const bool whole = g.impl == CudaGraphImpl::full_iteration;
  const bool moe_whole = g.modules == 0 || g.captures(CudaGraphModule::moe);
  int previous = -1;  // the part of the graph the last op replayed in, -1: none
  bool router_seen = false;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const bool in_mlp = mlp(i);
    const std::uint8_t moe_part = in_mlp && moe_layer && !moe_whole ? moe_graph_module(ops[i].name) : 0;
    const bool captured =
        whole || (in_mlp ? (moe_layer ? moe_whole || (moe_part != 0 && (g.modules & moe_part) != 0)
                                      : g.captures(CudaGraphModule::mlp))
                         : g.captures(CudaGraphModule::attn));
    const int part = captured ? (moe_part != 0 ? 2 : in_mlp ? 1 : 0) : -1;
    ops[i].graphed = captured && (whole || part == previous || (part == 2 && router_seen));
    router_seen = router_seen || part == 2;
    previous = part;
  }
}

void mark_layer_graphs(LayerOps& ops, const CudaGraphs& g, bool moe_layer) {
  if (!g.on()) return;
  std::size_t cut = ops.forward.size();
  for (std::size_t i = 0; i < ops.forward.size(); ++i)
    if (ops.forward[i].name == op::norm_mlp) cut = i;
  std::size_t bwd_cut = 0;
  for (std::size_t i = 0; i < ops.backward.size(); ++i)
    if (ops.backward[i].name == op::norm_mlp_bwd) bwd_cut = i + 1;
  // A recomputation's ops are copies of forward ops: the part of the forward op of their name.
  std::vector<std::string_view> mlp_names;
  for (std::size_t i = cut; i < ops.forward.size(); ++i) mlp_names.push_back(ops.forward[i].name);
  const std::vector<Op>& recompute = ops.recompute;
  mark_graphed(ops.recompute, g, moe_layer, [&](std::size_t i) {
    return std::find(mlp_names.begin(), mlp_names.end(), recompute[i].name) != mlp_names.end();
  });
  mark_graphed(ops.forward, g, moe_layer, [&](std::size_t i) { return i >= cut; });
  mark_graphed(ops.backward, g, moe_layer, [&](std::size_t i) { return i < bwd_cut; });
}

// The full-iteration graph holds every op of the forward-backward path.
void mark_whole_iteration(LayerOps& ops, const ParallelPlan& plan) {
  if (plan.trainer.cuda_graphs.impl != CudaGraphImpl::full_iteration) return;
  for (std::vector<Op>* list : {&ops.forward, &ops.backward, &ops.recompute})
    for (Op& op : *list) op.graphed = true;
}

// Megatron-FSDP with --fp8-param-gather (ZeRO-3 of an FP8 plan) gathers
// each layer's FP8 rowwise data again for its backward and makes the
// columnwise copy from it on the compute stream (Megatron-LM d98e8a64
// megatron_fsdp.py all_gather_and_wait_parameters_ready: bwd and
// is_float8tensor -> fp8_create_transpose_cache, Transformer Engine's
// post_all_gather_processing): read and write the format's bytes. MXFP8
// gathers its columnwise shard instead (fp8_need_transpose_data: a
// transpose buffer of its own), with nothing to make.
void transpose_gathered_weights(LayerOps& ops, const ParallelPlan& plan) {
  if (plan.zero_stage < 3 || !plan.fp8_param_gather || plan.precision == Precision::bf16 ||
      plan.precision == Precision::mxfp8)
    return;
  const double e = quantized_element_bytes(plan.precision);
  ops.backward.insert(ops.backward.begin(),
                      memory_bound(op::fp8_weight_transpose, Pass::backward, quantized_weight_elements(ops) * (e + e)));
}

}  // namespace

double quantized_weight_elements(const LayerOps& ops) {
  double elements = 0;
  for (const Op& op : ops.forward)
    if (op.kind == OpKind::gemm && op.precision != Precision::bf16)
      elements += static_cast<double>(op.k) * static_cast<double>(op.n) * static_cast<double>(op.batch);
  return elements;
}

std::vector<LayerWeight> layer_weights(const ModelSpec& m, const ParallelPlan& plan) {
  const Dims x = dims_of(m, plan);
  const LinearParams p = linear_params(m, x);
  const double bias = m.linear_bias ? 1.0 : 0.0;
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const std::int64_t qkv_n = (x.q + 2 * x.kv) / x.t;
  const std::int64_t fc1_n = (m.gated_mlp() ? 2 * x.f : x.f) / x.t;
  const double qkv_b = bias * d(qkv_n), proj_b = bias * d(x.h), fc1_b = bias * d(fc1_n), fc2_b = bias * d(x.h);
  return {{op::qkv, p.qkv - qkv_b, qkv_b},
          {op::proj, p.proj - proj_b, proj_b},
          {op::fc1, p.fc1 - fc1_b, fc1_b},
          {op::fc2, p.fc2 - fc2_b, fc2_b}};
}

std::vector<WeightPart> split_by_weight(const std::vector<Op>& ops, Pass pass) {
  static constexpr const char* kForward[] = {op::qkv, op::proj, op::fc1, op::fc2};
  static constexpr const char* kBackward[] = {op::qkv_dgrad, op::proj_dgrad, op::fc1_dgrad, op::fc2_dgrad};
  std::vector<WeightPart> parts;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    int w = -1;
    for (int k = 0; k < 4; ++k) {
      if (ops[i].name == (pass == Pass::forward ? kForward[k] : kBackward[k])) w = k;
    }
    if (w >= 0 || parts.empty()) parts.push_back(WeightPart{i, i, w});
    parts.back().end = i + 1;
  }
  return parts;
}

double expert_tokens(const ModelSpec& m, const ParallelPlan& plan) {
  const Dims x = dims_of(m, plan);
  return x.moe ? expert_rows(x) : 0.0;
}

double rank_budget_rows(const ModelSpec& m, const ParallelPlan& plan) {
  const double factor = plan.moe_flex.rank_capacity_factor;
  if (!m.moe.enabled() || factor <= 0) return 0.0;
  // Megatron-Core's setup_metadata: budget = int(num_tokens x topk x factor),
  // then budget += -budget % pad_multiple (256 with the op fuser or grouped
  // tensors, which the factor needs with HybridEP: transformer_config.py:1875-1883).
  constexpr std::int64_t kPadMultiple = 256;
  const double tokens = static_cast<double>(plan.seq_per_rank()) * plan.micro_batch /
                        (plan.sequence_parallel ? plan.tp : 1);
  const auto budget = static_cast<std::int64_t>(tokens * static_cast<double>(m.moe.experts_per_token) * factor);
  return static_cast<double>((budget + kPadMultiple - 1) / kPadMultiple * kPadMultiple);
}

double saved_expert_rows(const ModelSpec& m, const ParallelPlan& plan) {
  const FlexSetting& f = plan.moe_flex;
  if (f.rank_capacity_factor <= 0) return expert_tokens(m, plan);
  const double budget = rank_budget_rows(m, plan);
  if (!f.paged_stash) return budget;
  // experts.py:773-777: avg_num_tokens = int(max_num_tokens // cap_factor).
  const double average = std::floor(budget / f.rank_capacity_factor);
  return f.stash_buffer_factor >= 0 ? f.stash_buffer_factor * average
                                    : -f.stash_buffer_factor * expert_tokens(m, plan);
}

namespace {

// What Megatron-Core d98e8a64 runs again in the backward for the MoE and
// latent-attention modules of --recompute-modules (each checkpoint re-runs
// its forward when its output's gradient arrives; one inside another, as
// moe_act or shared_experts inside moe, runs once more in the re-run):
//   layernorm   the input norm before latent attention and the pre-MLP norm
//               of an MoE layer, where they are modules of their own
//               (transformer_layer.py:470-531; fused into the linear layers,
//               an IdentityOp, elsewhere);
//   mla_up_proj the latents' norms, their SP all-gathers and the two up
//               projections (multi_latent_attention.py:983-988; the rotary
//               embedding's kernels are not priced, as in the forward);
//   moe_act     the experts' activation (experts.py:1019-1030);
//   shared_experts  the shared experts' MLP with its TP collectives
//               (moe_layer.py:517-529, tensor_parallel.checkpoint);
//   moe         the whole MoE MLP: router, permute, the dispatcher's
//               exchanges, the experts, the combine and the shared experts
//               (moe_layer.py:701-716).
void add_module_recompute(LayerOps& ops, const ParallelPlan& plan, const Dims& x) {
  using M = RecomputeModule;
  if (plan.recomputes(M::layernorm)) {
    if (x.mla) append_forward_ops(ops.recompute, ops.forward, {op::norm_in});
    if (x.moe && plan.recomputes_moe_mlp_norm()) append_forward_ops(ops.recompute, ops.forward, {op::norm_mlp});
  }
  if (x.mla && plan.recomputes(M::mla_up_proj)) {
    const std::string_view q_gather = x.qlora > 0 ? std::string_view(op::mla_ag_q) : std::string_view(op::tp_ag_attn);
    append_forward_ops(ops.recompute, ops.forward,
                       {op::mla_q_norm, op::mla_kv_norm, q_gather, op::mla_ag_kv, op::mla_q_up, op::mla_kv_up});
  }
  if (!x.moe) return;
  if (plan.checkpoints(M::moe)) append_mlp_forward(ops.recompute, ops.forward);
  if (plan.recomputes(M::moe_act)) append_forward_ops(ops.recompute, ops.forward, {op::expert_act});
  if (plan.checkpoints(M::shared_experts) && x.fs > 0)
    append_forward_ops(ops.recompute, ops.forward,
                       {op::tp_ag_shared, op::shared_fc1, op::shared_act, op::shared_fc2, op::tp_rs_shared});
}

}  // namespace

LayerOps transformer_layer_ops(const ModelSpec& m, const ParallelPlan& plan) {
  return transformer_layer_ops(m, plan, m.moe.enabled());
}

LayerOps transformer_layer_ops(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  Dims x = dims_of(m, plan);
  x.moe = x.moe && moe_layer;
  LayerOps ops;
  ops.forward.reserve(16);
  layer_forward(ops.forward, m, x, Pass::forward);
  ops.backward.reserve(28);
  layer_backward(ops.backward, m, x, ops.forward);
  quantize_linear_layers(ops, x);
  quantize_attention_core(ops, x);
  transpose_gathered_weights(ops, plan);
  switch (plan.recompute) {
    case Recompute::none:
      break;
    case Recompute::full:
      // Megatron's full (uniform) recompute re-runs the layer's forward,
      // TP all-reduces included, before its backward.
      ops.recompute = ops.forward;
      break;
    case Recompute::selective:
      // The unfused attention core (QK^T, softmax, dropout, AV); flash
      // attention already recomputes inside its backward.
      if (plan.checkpoints(RecomputeModule::core_attn) && !x.flash) add_attention_forward(ops.recompute, x, Pass::backward);
      // A dense MLP (Megatron-Core's recompute_mlp: the MLP module under
      // tensor_parallel.checkpoint, so its forward runs again, its SP
      // all-gather, quantize kernels and TP reduction included).
      if (plan.checkpoints(RecomputeModule::mlp) && !x.moe) append_mlp_forward(ops.recompute, ops.forward);
      add_module_recompute(ops, plan, x);
      break;
  }
  mark_layer_graphs(ops, plan.trainer.cuda_graphs, x.moe);
  return ops;
}

LayerOps embedding_ops(const ModelSpec& m, const ParallelPlan& plan) {
  const Dims x = dims_of(m, plan);
  LayerOps ops;
  // Vocab-parallel lookup: each rank writes the full [s, b, h] output (zeros
  // outside its vocabulary shard), then the TP reduce sums the shards.
  // Megatron-LM 2022 (megatron/mpu/layers.py VocabParallelEmbedding,
  // megatron/model/language_model.py Embedding.forward): F.embedding (read
  // the rows, write the output: 2 + 2); with TP, `output_parallel[input_mask,
  // :] = 0.0` writes zeros over the (t - 1) / t of the rows outside the
  // shard; then (after the reduce, priced here with the lookup) the learned
  // position embedding's lookup (2 + 2) and add (2 + 2 + 2), and the
  // [b, s, h] -> [s, b, h] `transpose(0, 1).contiguous()` copy (2 + 2).
  const double full = static_cast<double>(x.tokens * x.h);
  const double mask_zero = x.t > 1 ? full * kBf16Bytes * static_cast<double>(x.t - 1) / static_cast<double>(x.t) : 0.0;
  const double positions = m.learned_position_embeddings ? full * ((kBf16Bytes + kBf16Bytes) + (kBf16Bytes + kBf16Bytes + kBf16Bytes)) : 0.0;
  const double lookup = full * (kBf16Bytes + kBf16Bytes) + mask_zero + positions + full * (kBf16Bytes + kBf16Bytes);
  ops.forward.push_back(memory_bound(op::embed_lookup, Pass::forward, lookup));
  add_tp_reduce(ops.forward, x, x.sp ? op::tp_rs_embed : op::tp_ar_embed, Pass::forward);
  const double hid = hidden_elements(x);
  ops.forward.push_back(memory_bound(op::embed_dropout, Pass::forward, hid * kDropoutBytesPerElement));

  ops.backward.push_back(memory_bound(op::embed_dropout_bwd, Pass::backward, hid * kDropoutBackwardBytesPerElement));
  add_sp_gather(ops.backward, x, op::tp_ag_embed_bwd, Pass::backward);
  // The lookups' backward, kernel by kernel: the transpose copy's backward
  // (read + write); for each table, torch's embedding_dense_backward zeroes
  // a bf16 gradient of the table's size and scatter-adds the [T, h]
  // gradient into its rows (read the gradient, read + write the rows); with
  // TP the in-place masking's backward (index_put) first copies the gradient
  // and zeroes the rows outside the shard. Then DDP's main_grad hook on each
  // table (TrainerSettings::grad_accum_bytes).
  const double word_params = static_cast<double>(padded_vocab_size(m.vocab_size, x.t) / x.t) * static_cast<double>(x.h);
  const double position_params =
      m.learned_position_embeddings
          ? static_cast<double>(m.max_position_embeddings > 0 ? m.max_position_embeddings : x.s_full) * static_cast<double>(x.h)
          : 0.0;
  const double scatter_add = full * (kBf16Bytes + kBf16Bytes + kBf16Bytes);
  const double mask_backward = x.t > 1 ? full * (kBf16Bytes + kBf16Bytes) + mask_zero : 0.0;
  const double tables = (word_params + position_params) * (kBf16Bytes + x.grad_accum_bytes);
  const double grad = full * (kBf16Bytes + kBf16Bytes) + scatter_add * (position_params > 0 ? 2.0 : 1.0) + mask_backward + tables;
  ops.backward.push_back(memory_bound(op::embed_grad, Pass::backward, grad));
  mark_whole_iteration(ops, plan);
  return ops;
}

LayerOps lm_head_ops(const ModelSpec& m, const ParallelPlan& plan) {
  const Dims x = dims_of(m, plan);
  const std::int64_t vocab_shard = padded_vocab_size(m.vocab_size, x.t) / x.t;
  LayerOps ops;
  const double hid = hidden_elements(x);
  const double logits = static_cast<double>(x.tokens) * static_cast<double>(vocab_shard);
  ops.forward.push_back(memory_bound(op::norm_final, Pass::forward, hid * kNormBytesPerElement));
  add_sp_gather(ops.forward, x, op::tp_ag_head, Pass::forward);
  const Op logit = gemm(op::logits, Pass::forward, x.tokens, vocab_shard, x.h);
  ops.forward.push_back(logit);
  ops.forward.push_back(memory_bound(op::xent, Pass::forward, logits * kCrossEntropyBytesPerElement));
  if (x.t > 1) {
    // Vocab-parallel cross-entropy: all-reduces of the per-token max, of the
    // sum of exponentials and of the target logit (fp32 per token).
    const double per_token = static_cast<double>(x.tokens) * kFp32Bytes;
    ops.forward.push_back(collective(op::tp_ar_xent_max, Pass::forward, Collective::all_reduce, Group::tp, per_token));
    ops.forward.push_back(collective(op::tp_ar_xent_sum, Pass::forward, Collective::all_reduce, Group::tp, per_token));
    ops.forward.push_back(collective(op::tp_ar_xent_tgt, Pass::forward, Collective::all_reduce, Group::tp, per_token));
  }
  ops.backward.push_back(memory_bound(op::xent_bwd, Pass::backward, logits * kCrossEntropyBackwardBytesPerElement));
  add_gemm_backward(ops.backward, logit, x.fused_wgrad);
  add_tp_reduce(ops.backward, x, x.sp ? op::tp_rs_head_bwd : op::tp_ar_head_bwd, Pass::backward);
  // The output layer's weight gradient into main_grad: DDP's hook (10 B per
  // parameter) on an untied head or on the last stage's copy of a tied one
  // (PP > 1). With PP 1 a tied table's two gradients are summed by autograd
  // (6 B per parameter) and hooked once; charging the hook here as well
  // (4 B per parameter more) keeps the op list independent of PP, which the
  // estimator's per-layer cache relies on.
  // Megatron's output layer runs the same linear autograd function as the
  // column-parallel layers, so fusion covers it too.
  const double head_params = static_cast<double>(vocab_shard) * static_cast<double>(x.h);
  if (!x.fused_wgrad)
    ops.backward.push_back(memory_bound(op::logits_grad_accum, Pass::backward, head_params * x.grad_accum_bytes));
  ops.backward.push_back(memory_bound(op::norm_final_bwd, Pass::backward, hid * kNormBackwardBytesPerElement));
  mark_whole_iteration(ops, plan);
  return ops;
}

LayerOps mtp_ops(const ModelSpec& m, const ParallelPlan& plan) {
  const Dims x = dims_of(m, plan);
  const bool last_is_moe = m.moe.enabled() && m.moe.moe_layers.back();
  const LayerOps embed = embedding_ops(m, plan);
  const LayerOps layer = transformer_layer_ops(m, plan, last_is_moe);
  const LayerOps head = lm_head_ops(m, plan);
  const double hid = hidden_elements(x);
  LayerOps ops;
  auto append = [](std::vector<Op>& to, const std::vector<Op>& from) { to.insert(to.end(), from.begin(), from.end()); };
  append(ops.forward, embed.forward);
  // The two norms and the concatenation [norm(embedding), norm(hidden)]
  // (read both, write 2h); the projection splits its 2h input over TP
  // (row-parallel-like: each rank's share of the FLOPs) and reduces.
  ops.forward.push_back(memory_bound(op::mtp_norms, Pass::forward, hid * (2 * kNormBytesPerElement + 2 * (kBf16Bytes + kBf16Bytes))));
  add_sp_gather(ops.forward, x, op::tp_ag_attn, Pass::forward);
  const Op proj = gemm(op::mtp_eh_proj, Pass::forward, x.tokens, x.h, 2 * x.h / x.t);
  ops.forward.push_back(proj);
  add_tp_reduce(ops.forward, x, op::tp_rs_mtp, Pass::forward);
  append(ops.forward, layer.forward);
  append(ops.forward, head.forward);
  append(ops.backward, head.backward);
  append(ops.backward, layer.recompute);
  append(ops.backward, layer.backward);
  add_sp_gather(ops.backward, x, op::tp_ag_mtp_bwd, Pass::backward);
  add_gemm_backward(ops.backward, proj, x.fused_wgrad);
  add_tp_reduce(ops.backward, x, x.sp ? op::tp_rs_attn_bwd : op::tp_ar_attn_bwd, Pass::backward);
  ops.backward.push_back(memory_bound(op::mtp_norms_bwd, Pass::backward, hid * 2 * kNormBackwardBytesPerElement));
  append(ops.backward, embed.backward);
  mark_whole_iteration(ops, plan);
  return ops;
}

// Megatron's scatter-gather optimisation: each TP rank sends 1/t of the
// [s, b, h] activation. With SP the activation is already split along the
// sequence, so the 1/t shard is all there is; without SP the receiving stage
// all-gathers the shards over NVLink (the estimator prices that all-gather).
double pipeline_message_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  const Dims x = dims_of(m, plan);
  return static_cast<double>(x.tokens * x.h) * kBf16Bytes / static_cast<double>(x.t);
}

}  // namespace cuboid
