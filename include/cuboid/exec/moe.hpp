#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The MoE MLP of one rank, as Megatron-Core's MoELayer with the alltoall
// token dispatcher runs it (megatron/core/transformer/moe/ at d98e8a64) with
// ETP 1: the rank routes its own tokens (its sequence-parallel shard), takes
// each token's top-k experts by logit with the probabilities a softmax over
// those k logits (topk_routing_with_score_function, use_pre_softmax off),
// copies the tokens into expert order, exchanges the per-expert counts and
// then the tokens and their probabilities with the EP group (all-to-all with
// varying blocks), sorts what it received by local expert, runs each local
// expert's MLP on its rows (the grouped GEMMs; the activation weighted by
// the probabilities, as the experts' activation_func_with_probs), and sends
// the results back, where each token sums its k copies. Dropless: every
// copy is computed. The backward mirrors it, down to the router's logits.
//
// The routing decision (top-k over the logits) is taken on the host, as
// Megatron's dispatcher synchronises with the host for the split sizes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::exec {

class OpTimer;

// Which GEMM of a linear layer: forward (input x weight), dgrad (output
// gradient x weight^T), wgrad (input^T x output gradient).
enum class GemmRole { forward, dgrad, wgrad };
// How Transformer Engine's recipe quantizes that GEMM's operands (the formats
// as cuboid's exports write them, src/io/export.cpp mcore_quantization):
// fp8-current per tensor, hybrid (E4M3 input and weight, E5M2 gradient);
// mxfp8 in 32-element blocks, E4M3 throughout. Only for those two precisions.
GemmQuantization gemm_quantization(Precision p, GemmRole role);
// The GEMM of a linear layer (QKV, projection, FC1, FC2, an expert's) in the
// plan's precision: Backend::gemm for bf16, else Backend::gemm_quantized.
void linear_gemm(Backend& be, Precision precision, GemmRole role, Trans trans_a, Trans trans_b, std::int64_t m,
                 std::int64_t n, std::int64_t k, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
                 DeviceSpan c);

struct MoeDims {
  std::int64_t tokens = 0;  // tokens this rank routes (its SP shard)
  std::int64_t hidden = 0;
  std::int64_t experts = 0;
  std::int64_t topk = 0;
  std::int64_t ffn = 0;  // one expert's FFN width
  int ep = 1;
  bool gated = false;
  Precision precision = Precision::bf16;  // of the expert GEMMs (the router stays bf16)
  std::int64_t local_experts() const { return experts / ep; }
  std::int64_t fc1_cols() const { return gated ? 2 * ffn : ffn; }
  std::int64_t copies() const { return tokens * topk; }
  // The router ([h, experts]) and this rank's experts (each [h, fc1] then [ffn, h]).
  std::size_t router_param_count() const { return static_cast<std::size_t>(hidden * experts); }
  std::size_t expert_param_count() const {
    return static_cast<std::size_t>(local_experts() * (hidden * fc1_cols() + ffn * hidden));
  }
};

// `tokens`: the rank's tokens at the MLP (LayerDims::local_tokens).
MoeDims moe_dims(const ModelSpec& model, const ParallelPlan& plan, std::int64_t tokens);

// Views into the flat buffers: the router lives with the layer's other
// weights (replicated over TP and DP), the experts in the experts' buffer
// (reduced over expert-DP).
struct MoeParams {
  DeviceSpan router;            // [h, experts]
  std::vector<DeviceSpan> fc1;  // per local expert [h, fc1]
  std::vector<DeviceSpan> fc2;  // per local expert [ffn, h]
};
MoeParams expert_params_at(DeviceSpan flat, std::size_t offset, const MoeDims& d);

// What the backward needs from one forward (sizes depend on the routing).
struct MoeActs {
  std::vector<std::size_t> send_rows, recv_rows;  // token copies to / from each EP rank
  std::vector<std::int64_t> expert_rows;          // rows of each local expert after the sort
  std::vector<std::int32_t> top_expert;           // [tokens, topk] on the host
  std::vector<float> top_prob;                    // [tokens, topk]
  std::int64_t received = 0;                      // rows the local experts compute
  DeviceBuffer perm_ids;                          // i32 [copies]: token of each copy, in expert order
  DeviceBuffer sort_ids, unsort_ids;              // i32 [received]
  DeviceBuffer x_sorted, fc1, act, act_scaled;    // [received, *]
  DeviceBuffer probs_sorted;                      // f32 [received]
};

class MoeRunner {
 public:
  // `ep`: the EP group (null or size 1 without EP).
  MoeRunner(Backend& backend, Communicator* ep, const MoeDims& dims, OpTimer& timer);

  const MoeDims& dims() const { return d_; }

  // y = moe(x); x, y: [tokens, h]. `pass` is backward for a recomputation.
  void forward(const MoeParams& w, ConstDeviceSpan x, MoeActs& acts, DeviceSpan y, Pass pass = Pass::forward);
  // dx = dL/dx from dy (overwritten); the router's and the experts'
  // gradients accumulate into g.
  void backward(const MoeParams& w, const MoeParams& g, ConstDeviceSpan x, MoeActs& acts, ConstDeviceSpan dy,
                DeviceSpan dx);

 private:
  void route(const std::vector<float>& logits, MoeActs& a) const;
  void exchange_counts(MoeActs& a, Pass pass);
  void dispatch(const char* name, Pass pass, ConstDeviceSpan send, std::span<const std::size_t> send_rows,
                DeviceSpan recv, std::span<const std::size_t> recv_rows, std::int64_t width);
  // Runs f(expert, first row, rows) for every local expert with rows.
  template <typename F>
  void each_expert(const MoeActs& a, F&& f) const;

  Backend& be_;
  Communicator* ep_;
  MoeDims d_;
  OpTimer& timer_;
  // Scratch, grown to the largest routing seen.
  DeviceBuffer logits_, dlogits_, permuted_, recv_, y_sorted_, copy_probs_, recv_probs_, counts_send_, counts_recv_;
  DeviceBuffer d_sorted_, d_act_, d_fc1_, d_probs_, d_probs_recv_;
};

}  // namespace cuboid::exec
