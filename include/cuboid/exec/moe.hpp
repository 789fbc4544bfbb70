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
//
// With the flex dispatcher (MoEFlexTokenDispatcher over DeepEP's normal
// kernels) the tokens travel as DeepEP's internode dispatch moves them
// (deepseek-ai/DeepEP dd758caf csrc/kernels/legacy/internode.cu: a rank is
// (rdma_rank, nvl_rank), 128; notify counts a token once per node holding
// one of its ranks, 308-314; the sender writes it to that node's rank of
// its own nvl_rank, 620 and 634-645; kRDMAAndNVLForwarder passes it on over
// NVLink, 487; the combine's forwarder sums the node's copies, 2091, the
// receiver the nodes', 2207): each token once to every other node holding one of
// its experts, to the rank on the sender's rail (the same local index), with
// its top-k expert indices and weights; that rank forwards it once to every
// rank of its node that holds one of the token's experts (the intra-node
// leg); the expert rank expands it into one row per local expert. The
// combine reverses it, summing each token's rows at the expert rank, then at
// the forwarding rank, then at the source. The rows each expert computes, in
// the order it computes them, are the alltoall dispatcher's, so both give
// the same numbers.
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

// Where the EP group's ranks sit, for the flex dispatcher: per EP rank its
// node (0 .. nodes - 1, in order of first appearance in the group) and its
// local index on that node; every node holds the same number of them.
struct EpLayout {
  std::vector<int> node, local;
  int nodes() const;
  int per_node() const;
  // The EP rank at node `n`, local index `l`.
  int rank_at(int n, int l) const;
};
// The layout of an EP group from its members' nodes (RankMapping::node_of);
// ExecError when the nodes hold different numbers of the group's ranks.
EpLayout ep_layout(const std::vector<int>& member_nodes);

// The flex dispatcher's first leg at one source rank (`me` of the layout):
// its tokens bound for each node (the nodes of their top-k experts, expert e
// on EP rank e / local_experts), each token once per node, in token order.
struct FlexRoute {
  std::vector<std::int32_t> token;     // [sum of per_node]: node 0's tokens, then node 1's, ...
  std::vector<std::size_t> per_node;   // tokens to each node (this rank's own node included)
  std::vector<std::size_t> per_rank;   // tokens reaching each EP rank (a token once per rank)
  // Tokens that cross to another node: the inter-node leg's rows.
  std::size_t inter_node_tokens(const EpLayout& lay, int me) const;
};
FlexRoute flex_route(const std::vector<std::int32_t>& top_expert, std::int64_t topk, std::int64_t local_experts,
                     const EpLayout& lay, int me);

// The flex dispatcher's communicators: the EP ranks of this rank's node
// (ordered by local index) and those on its rail (the same local index,
// ordered by node).
struct FlexGroups {
  Communicator* intra = nullptr;
  Communicator* rail = nullptr;
  EpLayout layout;
};

struct MoeDims {
  std::int64_t tokens = 0;  // tokens this rank routes (its SP shard)
  std::int64_t hidden = 0;
  std::int64_t experts = 0;
  std::int64_t topk = 0;
  std::int64_t ffn = 0;  // one expert's FFN width
  int ep = 1;
  MoeDispatcher dispatcher = MoeDispatcher::alltoall;
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
  // flex: the legs' rows (source: per node; forwarder: per local rank) and
  // the gathers and scatters between them.
  struct Flex {
    std::vector<std::size_t> rail_send, rail_recv;    // tokens, per node
    std::vector<std::size_t> intra_send, intra_recv;  // tokens, per local rank
    std::size_t rail_sent = 0, rail_received = 0, intra_sent = 0, intra_received = 0;
    std::vector<std::int32_t> token;      // host copy of token_ids
    std::vector<std::size_t> from_source;  // tokens each EP rank sends this rank (a token once)
    DeviceBuffer token_ids;    // i32 [rail_sent]: the source's token of each first-leg row
    DeviceBuffer forward_ids;  // i32 [intra_sent]: the first-leg row each forwarded row copies
    DeviceBuffer expand_ids;   // i32 [received]: the second-leg row of each expert row
    DeviceBuffer slot_ids;     // i32 [received]: that row x topk + the expert's place in the token's top-k
  } flex;
};

class MoeRunner {
 public:
  // `ep`: the EP group (null or size 1 without EP).
  // `flex`: the flex dispatcher's groups (required when dims.dispatcher is flex and EP > 1).
  MoeRunner(Backend& backend, Communicator* ep, const MoeDims& dims, OpTimer& timer,
            const FlexGroups* flex = nullptr);

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
  bool flex() const { return flex_ != nullptr; }
  void router_logit_grads(const MoeActs& a, const std::vector<float>& g_slot, DeviceSpan dlogits) const;
  void flex_counts(MoeActs& a, Pass pass);
  // The top-k indices and weights to the expert ranks (ep_flex_probs): the
  // forwarding and expansion indices and the expert rows' probabilities.
  void flex_probs(MoeActs& a, Pass pass, DeviceSpan recv_probs);
  // Rows of the first leg's layout ([rail_sent, width]) to the expert rows
  // ([received, width]), and the way back (summing).
  void flex_out(const char* name, Pass pass, const MoeActs& a, ConstDeviceSpan first, DeviceSpan rows,
                std::int64_t width);
  void flex_back(const char* name, Pass pass, const MoeActs& a, ConstDeviceSpan rows, ConstDeviceSpan ids,
                 std::int64_t per_row, DeviceSpan first, std::int64_t width);
  double flex_bytes(const MoeActs& a, std::int64_t width, DType dtype) const;
  // Runs f(expert, first row, rows) for every local expert with rows.
  template <typename F>
  void each_expert(const MoeActs& a, F&& f) const;

  Backend& be_;
  Communicator* ep_;
  const FlexGroups* flex_ = nullptr;
  MoeDims d_;
  OpTimer& timer_;
  // Scratch, grown to the largest routing seen.
  DeviceBuffer logits_, dlogits_, permuted_, recv_, y_sorted_, copy_probs_, recv_probs_, counts_send_, counts_recv_;
  DeviceBuffer d_sorted_, d_act_, d_fc1_, d_probs_, d_probs_recv_;
  DeviceBuffer first_, first_meta_, leg1_, leg1_meta_, leg2_send_, leg2_, leg2_meta_, back2_, back1_, back1_recv_;
};

}  // namespace cuboid::exec
