#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// The bytes an MoE token dispatcher moves per EP rank and per link
// (docs/cost-model.md "Token dispatchers"), for the estimate (cost) and the
// simulator's flows (sim) alike. Routing is taken as uniform over the
// experts (each token's top-k a uniform draw without repeats; with
// group-limited routing, its groups first), the experts split in order over
// the EP ranks and the ranks in order over their nodes, as Megatron-Core
// places them (token_dispatcher.py local_expert_indices at d98e8a64). The
// busiest rank's token count, the one place a routing imbalance scales what
// a rank sends and receives, is the caller's (workload.cpp
// ep_rank_tokens).
#include <cstdint>

#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

// Where one EP group's ranks sit: `ranks` in all over `nodes` nodes, the
// same number on each.
struct EpSpread {
  int ranks = 1;
  int nodes = 1;
  int per_node() const { return ranks / nodes; }
};

// The probability that a token's top-k experts include one on a given unit
// of `units` that split the experts evenly in order (an EP rank, or a node):
// 1 - C(E - E/u, k) / C(E, k); with group-limited routing (G groups, k
// experts from the M best groups) over the M groups' experts, the unit's
// groups drawn first. The expected number of units a token reaches is
// units x this.
double unit_hit_probability(const MoeSpec& moe, int units);

// Bytes one EP rank sends per dispatch (its `tokens` tokens of `hidden`
// elements each), by where they go. The combine sends the same back (the
// allgather dispatcher's reduce-scatter in fp32, the probabilities' dtype).
struct DispatchTraffic {
  double nic_bytes = 0;     // through the rank's NIC to other nodes
  double nvlink_bytes = 0;  // through the rank's NVLink port to the node's other GPUs
  // Per-token copies behind them: over the network to other nodes, over
  // NVLink to the node's other ranks (flex: what the rank sends of its own
  // and forwards of what its rail brought in).
  double node_copies = 0, nvlink_copies = 0;
  double bytes_per_token = 0;  // what one copy of a token carries
};

// alltoall (NCCL's all-to-all, PXN): every top-k copy sent, (n - g) / n of
// them to other nodes through the rank's NIC, (g - 1) / g over NVLink (what
// stays on the node and what the other rails' GPUs hand to it to forward).
// allgather (ring all-gather over the rails, then NVLink): the rank's tokens,
// probabilities and routing map to all others: N - 1 copies over the NIC,
// N (g - 1) over NVLink. flex (DeepEP / HybridEP): a token once to each
// other node it reaches (to the GPU on the sender's rail), then from there
// once to each rank it reaches on that node: (N - 1) p_node over the NIC,
// N (g - 1) p_rank over NVLink.
DispatchTraffic dispatch_traffic(MoeDispatcher d, const MoeSpec& moe, std::int64_t hidden, double tokens,
                                 EpSpread spread);

// DeepEP's normal (training) kernels as Megatron-Core runs them: measured
// bandwidth over the link's peak, and the SMs they hold. DeepEP 91bb69a8
// README "Normal kernels with NVLink and RDMA forwarding" (H800, NVLink
// ~160 GB/s, CX7 400 Gb/s ~50 GB/s, 4096 tokens, hidden 7168, top-8):
// intranode dispatch 153 GB/s of 160; internode EP 16 dispatch 43 GB/s of
// 50 (the lowest of its three internode rows: 43, 58, 51 GB/s at EP 16, 32,
// 64, which count local-rank traffic too). SMs: Megatron-LM d98e8a64
// token_dispatcher.py _DeepepManager: set_deepep_num_sms(20) unless
// moe_flex_dispatcher_num_sms; DeepEP 91bb69a8 deep_ep/buffer.py num_sms = 20.
constexpr double kDeepEpNvlinkEfficiency = 153.0 / 160.0;
constexpr double kDeepEpRdmaEfficiency = 43.0 / 50.0;
constexpr int kDeepEpSms = 20;

// HybridEP (DeepEP's hybrid-ep branch, NVIDIA; Megatron-Core's
// _HybridEPManager at d98e8a64): the same two levels, its first the NVLink
// domain (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN, by default the ranks
// the group reaches over NVLink: here the EP ranks on one node, a whole
// NVL72 rack on a GB200 card). Measured in docs/README_Hybrid-EP.md
// (hybrid-ep 17cfb817; 4096 tokens, hidden 7168, top-8, uniform routing,
// BF16, "Torch API", algorithm bandwidth: the bytes a rank receives, its
// own included): GB200 NVLink, 36 ranks, the slower of dispatch and
// combine, 418.27 GB/s at 16 SMs and 447.89 at 32, x 35/36 on the wire,
// over the 722 GB/s cuboid's GB200 card prices NVLink at; RDMA, H100 and
// 400 Gb/s CX7 (~50 GB/s), the lowest of its 16/32/64-rank rows at the
// default 8 SMs, 41.46 GB/s (64 ranks, dispatch). SMs: csrc/hybrid_ep/
// config.cuh (hybrid-ep 94a9f8f6) num_sms_dispatch_api and _combine_api
// default to 24 in one NVLink domain, 8 across domains.
constexpr double kHybridEpNvlinkGBps16Sms = 418.27 * 35.0 / 36.0;
constexpr double kHybridEpNvlinkGBps32Sms = 447.89 * 35.0 / 36.0;
constexpr double kHybridEpMeasuredNvlinkBusbwGBps = 722.0;
constexpr double kHybridEpRdmaEfficiency = 41.46 / 50.0;
constexpr int kHybridEpSmsOneDomain = 24;
constexpr int kHybridEpSmsDomains = 8;

// The flex dispatcher's kernels as a plan runs them over `domains` nodes
// (NVLink domains): each link's measured share and the SMs held. DeepEP:
// its figures above, `setting.sms` or 20. HybridEP: `setting.sms` or its
// default; its NVLink share linear in the SMs between the 16 and 32 SM
// rows, the nearest row outside them.
struct FlexKernels {
  double nvlink_efficiency = 1.0;
  double rdma_efficiency = 1.0;
  int sms = 0;
};
FlexKernels flex_kernels(const FlexSetting& setting, int domains);

}  // namespace cuboid
