#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm,
// with --delay-wgrad-compute): the combined 1F1B schedule runs one
// micro-batch's forward beside another's backward, layer by layer, the
// exchanges on a communication stream and the computation on the compute
// stream, so each exchange of one pass runs under the other pass's compute
// (Megatron-LM d98e8a64 megatron/core/pipeline_parallel/combined_1f1b.py
// combined_1f1b_schedule_for_no_pipelining; megatron/core/models/common/
// model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run).
//
// One description, two readers: the estimator folds a layer pair with
// ep_pair_time, the simulator plays kEpPairOrder on its streams; both split
// a layer's pass at its EP exchanges with ep_split.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace cuboid {

// A layer's pass cut at its EP exchanges: seg0, ex0, seg1, ex1, seg2. Forward:
// attention .. router (pre_dispatch_computation), the dispatch's exchanges
// (ex0: every exchange before the last), the experts (mlp), the combine (ex1:
// the last exchange), what follows it. Backward, the other way round: what
// precedes the combine's gradient, the combine's gradient (ex0: the first
// exchange), the experts' backward, the dispatch's gradients (ex1: the
// rest), the attention's backward (pre_dispatch backward). Item i of the pass
// lies in seg0 for i < ex0_begin, ex0 for i < ex0_end, and so on.
struct EpSplit {
  std::size_t ex0_begin = 0, ex0_end = 0, ex1_begin = 0, ex1_end = 0, size = 0;
  bool has_exchanges = false;  // false: no EP exchange (a dense layer, EP 1): all of it is seg0
};
// seg1w, seg2w: with the weight gradients delayed (--delay-wgrad-compute), a
// backward's seg1 and seg2 keep their data gradients and these nodes take
// their weight-gradient kernels (the experts', and the attention's and
// shared experts', each a module's backward_dw()).
enum class EpNode : std::uint8_t { seg0, ex0, seg1, ex1, seg2, seg1w, seg2w };
// The node of item i under `s`.
EpNode ep_node(const EpSplit& s, std::size_t i);
// The node of a backward's item at `node` that is (`wgrad`) or is not a
// weight-gradient kernel, with the weight gradients delayed.
inline EpNode ep_delayed_node(EpNode node, bool wgrad) {
  if (!wgrad) return node;
  return node == EpNode::seg1 ? EpNode::seg1w : node == EpNode::seg2 ? EpNode::seg2w : node;
}
// The node of its own pass a node waits for (itself for seg0): the one
// before it; a delayed weight gradient's data gradient, and the dispatch's
// gradient waits for the experts' data gradient only.
EpNode ep_waits_for(EpNode node);

// `is_ep(i)`: whether item i of a pass of `size` items is an EP exchange.
template <class IsEp>
EpSplit ep_split(std::size_t size, bool forward, IsEp is_ep) {
  EpSplit s;
  s.size = size;
  std::size_t first = size, last = size;
  for (std::size_t i = 0; i < size; ++i) {
    if (!is_ep(i)) continue;
    if (first == size) first = i;
    last = i;
  }
  if (first == size) {  // nothing to split: seg0 holds the pass
    s.ex0_begin = s.ex0_end = s.ex1_begin = s.ex1_end = size;
    return s;
  }
  s.has_exchanges = true;
  if (forward) {
    // ex1 is the last exchange alone; ex0 runs from the first to the last before it.
    s.ex1_begin = last;
    s.ex1_end = last + 1;
    std::size_t before = first;
    for (std::size_t i = first; i < last; ++i)
      if (is_ep(i)) before = i;
    s.ex0_begin = first;
    s.ex0_end = first == last ? first : before + 1;
  } else {
    // ex0 is the first exchange alone; ex1 runs from the next one to the last.
    s.ex0_begin = first;
    s.ex0_end = first + 1;
    std::size_t next = last + 1;
    for (std::size_t i = first + 1; i <= last; ++i)
      if (is_ep(i)) {
        next = i;
        break;
      }
    s.ex1_begin = first == last ? last + 1 : next;
    s.ex1_end = last + 1;
  }
  return s;
}

// One step of a layer pair as TransformerLayerSchedulePlan.run issues it
// (f_layer: the forward of micro-batch i + 1; b_layer: the backward of
// micro-batch i):
//   comm stream: combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
//   comp stream: pre_dispatch_fwd | mlp_bwd -> mlp_fwd | pre_dispatch_bwd
// Each node waits for the one before it in its own pass; each stream runs
// its nodes in this order. The forward's seg2 (the combine's postprocess,
// which Megatron-Core runs in the combine node) follows the backward's
// seg2 on the compute stream, so the combine overlaps the attention's
// backward. This order is the one without --delay-wgrad-compute (each
// module's weight gradient inside its backward, backward_dw() a no-op:
// models/common/utils.py); with it, kEpPairOrderDelayed.
struct EpPairStep {
  bool backward = false;  // which pass's node
  EpNode node = EpNode::seg0;
};
inline constexpr std::array<EpPairStep, 10> kEpPairOrder{{
    {true, EpNode::seg0},
    {true, EpNode::ex0},
    {false, EpNode::seg0},
    {true, EpNode::seg1},
    {false, EpNode::ex0},
    {true, EpNode::ex1},
    {false, EpNode::seg1},
    {false, EpNode::ex1},
    {true, EpNode::seg2},
    {false, EpNode::seg2},
}};
// With --delay-wgrad-compute, as TransformerLayerSchedulePlan.run issues it:
//   comm stream: combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
//   comp stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd |
//                pre_dispatch_bwd -> pre_dispatch_bwd_dw
// The dispatch's gradient waits for the experts' data gradient only, so it
// runs under their weight gradient; the attention's (and shared experts')
// weight gradient follows its data gradient, and the next layer's combine
// gradient waits for the data gradient only. The forward's seg2 (the
// combine's postprocess, in Megatron-Core's combine node) follows both, as
// it follows the backward's seg2 above. Simplified: the chunk's last layer's
// attention weight gradient is delayed like the others (Megatron-Core runs
// it after the pair, under the chunk's p2p).
inline constexpr std::array<EpPairStep, 12> kEpPairOrderDelayed{{
    {true, EpNode::seg0},
    {true, EpNode::ex0},
    {false, EpNode::seg0},
    {true, EpNode::seg1},
    {false, EpNode::ex0},
    {true, EpNode::seg1w},
    {true, EpNode::ex1},
    {false, EpNode::seg1},
    {false, EpNode::ex1},
    {true, EpNode::seg2},
    {true, EpNode::seg2w},
    {false, EpNode::seg2},
}};
inline std::span<const EpPairStep> ep_pair_order(bool delayed_wgrad) {
  if (delayed_wgrad) return kEpPairOrderDelayed;
  return kEpPairOrder;
}
inline bool is_exchange(EpNode n) { return n == EpNode::ex0 || n == EpNode::ex1; }

// A compute node's time: `compute_ns` of kernels alone on the GPU, the same
// kernels taking `held_ns` while an exchange holds its SMs (DeepEP's 20 or
// NCCL's channels: the overlap's cost), and `blocking_ns` of TP collectives
// between them (not slowed).
struct EpSegment {
  double compute_ns = 0, held_ns = 0, blocking_ns = 0;
};
// A layer's pass by node: the compute nodes seg0, seg1, seg2 and, with the
// weight gradients delayed, a backward's seg1w and seg2w; two exchanges.
struct EpPassTimes {
  std::array<EpSegment, 5> seg{};
  std::array<double, 2> ex{};
  double serial_ns() const;
};

// A layer pair played on two streams in kEpPairOrder, the compute slowed to
// its held pace while an exchange runs.
struct EpPairTime {
  double serial_ns = 0;   // both passes one after the other, nothing overlapped
  double paired_ns = 0;   // the pair's makespan
  double exchange_ns = 0; // both passes' exchanges
  double exposed_ns = 0;  // of them, what the compute stream waits for
  double sm_cost_ns = 0;  // the compute's longer time under the exchanges
  double hidden_ns() const { return exchange_ns - exposed_ns; }
  double saved_ns() const { return serial_ns - paired_ns; }
};
EpPairTime ep_pair_time(const EpPassTimes& f, const EpPassTimes& b, bool delayed_wgrad = false);
// A compute node's index in EpPassTimes::seg.
int ep_seg_index(EpNode n);

// Combined steps (a forward beside a backward) per iteration with PP 1:
// the first forward and the last backward run alone, m - 1 pairs.
inline int ep_overlap_pairs(int micro_batches) { return micro_batches > 1 ? micro_batches - 1 : 0; }

// With PP > 1 (the interleaved schedule, v model chunks per stage):
// forward_backward_pipelining_with_interleaving (schedules.py at d98e8a64)
// sends every step through combined_1f1b_schedule_for_interleaved_pipelining,
// but only the steady state's steps carry both a forward and a backward: PP
// rank `stage` runs m v chunk forwards, the warm-up's
// warmup_steps(interleaved, ..., ep_overlap = true) alone (one more than
// without the overlap, lines 966-970), then forward step w + k beside
// backward step k, then the cool-down's backwards alone. The combined steps:
// m v - w.
int ep_overlap_steps(int pp, int stage, int micro_batches, int virtual_stages);

// Those steps by the model chunks they pair: [forward chunk * v + backward
// chunk] -> steps (the forward of chunk (j mod pp v) / pp of step j, the
// backward of chunk v - 1 - (k mod pp v) / pp of step k: get_model_chunk_id).
// Each runs the forward chunk's layer i beside the backward chunk's layer
// n_b - 1 - i for i < min(n_f, n_b) (TransformerModelChunkSchedulePlan.run,
// model_chunk_schedule_plan.py:249-289), the rest alone.
std::vector<int> ep_overlap_chunk_steps(int pp, int stage, int micro_batches, int virtual_stages);

}  // namespace cuboid
