#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// One transformer layer on one tensor-parallel rank, forward and backward,
// as the executor runs it: Megatron-LM's sharding (column-parallel QKV and
// FC1, head-parallel attention core, row-parallel projection and FC2, a TP
// all-reduce after each row-parallel GEMM, or reduce-scatter / all-gather
// with sequence parallelism). Tokens are laid out [s, b] (sequence-major, as
// Megatron's [s, b, h]) so that a sequence-parallel shard is a block of rows.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/exec/moe.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::exec {

class OpTimer;

struct LayerDims {
  std::int64_t seq = 0;            // s: this rank's positions (the sequence / CP)
  std::int64_t micro_batch = 0;    // b
  std::int64_t tokens = 0;         // T = s b
  std::int64_t local_tokens = 0;   // T / tp with sequence parallelism, else T
  std::int64_t hidden = 0;         // h
  std::int64_t heads = 0;          // attention heads on this rank
  std::int64_t kv_heads = 0;       // KV heads on this rank
  std::int64_t head_dim = 0;
  std::int64_t ffn = 0;            // FFN width on this rank
  std::int64_t vocab = 0;          // padded vocabulary rows on this rank
  int tp = 1;
  int cp = 1;                      // context parallelism: the ranks that split one sequence
  bool flash = false;              // the fused attention core (with its log-sum-exp), else unfused
  bool sequence_parallel = false;
  bool gated = false;              // SwiGLU
  bool rmsnorm = false;
  float norm_eps = 1e-5f;
  float dropout = 0.0f;
  std::int64_t experts = 0;        // routed experts of an MoE layer (0: a dense model)
  Precision precision = Precision::bf16;  // of the linear layers' GEMMs (linear_gemm)
  // The dense layer's linear GEMMs, C[m x n] = A[m x k] B[k x n], as the
  // workload gives them (transformer_layer_ops): the shapes the op timer
  // reports, their dgrad (m, k, n) and wgrad (k, n, m) as the workload's.
  struct Linear {
    std::int64_t m = 0, n = 0, k = 0;
  };
  Linear qkv, proj, fc1, fc2;

  std::int64_t q_cols() const { return heads * head_dim; }
  std::int64_t kv_cols() const { return kv_heads * head_dim; }
  std::int64_t qkv_cols() const { return q_cols() + 2 * kv_cols(); }
  std::int64_t fc1_cols() const { return gated ? 2 * ffn : ffn; }
};

// Context parallelism: CP rank `r` of `cp` holds chunks r and 2 cp - 1 - r
// of every sequence as its positions [0, s/2) and [s/2, s) (s = `local_seq`);
// the position in the whole sequence of its position `p`.
inline std::int64_t cp_global_position(std::int64_t p, std::int64_t local_seq, int r, int cp) {
  if (cp <= 1) return p;
  const std::int64_t half = local_seq / 2;
  const std::int64_t chunk = p < half ? r : 2 * cp - 1 - r;
  return chunk * half + p % half;
}

// The dims of one TP rank of `plan` (tp = 1: the unsharded layer).
LayerDims layer_dims(const ModelSpec& model, const ParallelPlan& plan, float dropout);

// A layer's parameters (or their gradients) as views into one flat buffer.
// Stored row-major as [in, out]: y = x W.
struct LayerParams {
  DeviceSpan norm1_gamma, norm1_beta;  // beta empty for RMSNorm
  DeviceSpan w_qkv;                    // [h, q + 2 kv] (this rank's heads: [Q | K | V])
  DeviceSpan w_proj;                   // [q, h]
  DeviceSpan norm2_gamma, norm2_beta;
  DeviceSpan w_fc1;                    // [h, ffn] or [h, 2 ffn] as [gate | up]; empty in an MoE layer
  DeviceSpan w_fc2;                    // [ffn, h]; empty in an MoE layer
  bool moe = false;                    // an MoE layer: the MLP is `experts`
  MoeParams experts;                   // its router (here) and local experts (in the experts' buffer)
};
// An MoE layer holds the router ([h, experts]) where a dense one holds FC1
// and FC2; its experts are laid out apart (expert_params_at).
std::size_t layer_param_count(const LayerDims& d, bool moe_layer = false);
LayerParams layer_params_at(DeviceSpan flat, std::size_t offset, const LayerDims& d, bool moe_layer = false);
// Points an MoE layer's expert views at the experts' buffer `flat` from
// `offset` (expert_params_at); its router stays where layer_params_at put it.
void set_expert_params(LayerParams& p, DeviceSpan flat, std::size_t offset, const MoeDims& d);
// The half-width of the uniform draw of every weight and of the embedding
// (the step runner's and init_layer_params').
inline constexpr float kInitScale = 0.02f;
// Random weights (uniform, +-kInitScale), norm gains 1 and biases 0; deterministic in `seed`.
void init_layer_params(Backend& backend, const LayerParams& p, std::uint64_t seed);

// What the backward pass of one layer needs from its forward.
struct LayerActs {
  DeviceBuffer norm1, norm1_mean, norm1_rstd, norm1_full;  // *_full: gathered (sequence parallel)
  DeviceBuffer qkv, probs, ctx, mid;
  DeviceBuffer lse;  // fused attention: the softmax's log-sum-exp, [tokens, heads] f32
  DeviceBuffer norm2, norm2_mean, norm2_rstd, norm2_full;
  DeviceBuffer fc1, act;
  MoeActs moe;  // an MoE layer's routing and expert activations
};

enum class AttentionMemory { keep_probs, recompute_probs };

// Runs layers of one shape on one rank. Holds the scratch buffers shared by
// every layer (gathered tensors, gradients in flight), so a step allocates
// nothing once warm.
class LayerRunner {
 public:
  // `moe`: the experts' shape when the model has MoE layers (null: none);
  // `ep`: their EP group (null without EP); `cp`: the CP group (null
  // without context parallelism).
  LayerRunner(Backend& backend, Communicator* tp, const LayerDims& dims, OpTimer& timer,
              const MoeDims* moe = nullptr, Communicator* ep = nullptr, Communicator* cp = nullptr,
              const FlexGroups* flex = nullptr);

  const LayerDims& dims() const { return d_; }
  LayerActs make_acts(AttentionMemory mem);

  // y = layer(x); x, y: [local_tokens, h]. Keeps in `acts` what backward
  // needs (without the attention probabilities for recompute_probs). `pass`
  // is backward when this forward is a recomputation.
  void forward(const LayerParams& w, ConstDeviceSpan x, LayerActs& acts, DeviceSpan y, std::uint64_t seed,
               AttentionMemory mem, Pass pass = Pass::forward);
  // dx = dL/dx from dy = dL/dy; parameter gradients accumulate into g.
  void backward(const LayerParams& w, const LayerParams& g, ConstDeviceSpan x, LayerActs& acts, ConstDeviceSpan dy,
                DeviceSpan dx, std::uint64_t seed, AttentionMemory mem);
  // Full recomputation: the forward again (TP collectives included) from the
  // kept input x into scratch activations, then the backward.
  void recompute_backward(const LayerParams& w, const LayerParams& g, ConstDeviceSpan x, ConstDeviceSpan dy,
                          DeviceSpan dx, std::uint64_t seed);

  // The TP collectives around a tensor-parallel region ([T, h] <-> [local_tokens, h]).
  // reduce: all-reduce in place (full -> full, `local` unused) or reduce-scatter (full -> local).
  // Returns the span holding the result.
  DeviceSpan tp_reduce(const char* name, Pass pass, DeviceSpan full, DeviceSpan local);
  // gather: all-gather (local -> full) with SP; without SP returns `local` (already full).
  ConstDeviceSpan tp_gather(const char* name, Pass pass, ConstDeviceSpan local, DeviceSpan full);

  // Norm forward/backward on [local_tokens, h] with the model's norm kind.
  void norm_forward(const char* name, Pass pass, ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan beta,
                    DeviceSpan y, DeviceSpan mean, DeviceSpan rstd);
  void norm_backward(const char* name, ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                     ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma, DeviceSpan dbeta);

  Backend& backend() { return be_; }
  OpTimer& timer() { return timer_; }

 private:
  DeviceSpan mlp_backward(const LayerParams& w, const LayerParams& g, LayerActs& a, Pass bw);
  void attention_backward(const LayerParams& w, const LayerParams& g, ConstDeviceSpan x, LayerActs& a, DeviceSpan dx,
                          std::uint64_t seed, AttentionMemory mem);
  void attention_scores(const LayerActs& a, DeviceSpan probs, Pass pass);
  void unfused_attention_forward(LayerActs& a, AttentionMemory mem, Pass pass);
  void unfused_attention_backward(LayerActs& a, AttentionMemory mem);
  // The fused attention core (flash): forward from a.qkv into a.ctx and
  // a.lse; backward from dctx_ into dqkv_. With CP, Transformer Engine's
  // ring (AttnFuncWithCPAndKVP2P): see layer.cpp.
  struct KvView;
  struct Block;
  void flash_forward(LayerActs& a, Pass pass);
  void flash_backward(const LayerActs& a);
  void flash_block_forward(const LayerActs& a, const Block& blk, const KvView& kv, DeviceSpan out, DeviceSpan lse,
                           Pass pass);
  void flash_block_backward(const LayerActs& a, const Block& blk, const KvView& kv, DeviceSpan dkv, bool first);
  Block ring_block(int step) const;
  void block_scores(const LayerActs& a, const Block& blk, const KvView& kv);
  void pack_kv(const LayerActs& a, DeviceSpan kv, Pass pass);

  Backend& be_;
  Communicator* tp_;
  LayerDims d_;
  OpTimer& timer_;
  std::unique_ptr<MoeRunner> moe_;
  Communicator* cp_ = nullptr;
  // Scratch, [T, *] unless noted.
  DeviceBuffer full_a_, full_b_;     // [T, h]
  DeviceBuffer local_a_, local_b_;   // [local_tokens, h]
  DeviceBuffer dqkv_, dctx_, dprobs_, probs_tmp_, dfc1_, dact_;
  DeviceBuffer kv_a_, kv_b_, dkv_a_, dkv_b_;  // CP: [T, 2 kv] K | V (and their gradients) around the ring
  DeviceBuffer blk_out_, blk_lse_, delta_;    // CP: one ring step's output and log-sum-exp; dO . O
  LayerActs scratch_;                // full recompute: the recomputed forward
  DeviceBuffer scratch_out_;         // [local_tokens, h]
};

}  // namespace cuboid::exec
