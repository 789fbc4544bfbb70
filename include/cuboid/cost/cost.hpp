#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// Cost models: time of a GEMM, of a memory-bound kernel and of a collective,
// from the GPU profile and the fabric constants of the cluster card. No magic
// numbers here: every constant comes from the cards.
#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/time.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

struct CollectiveCalibration;  // calibration.hpp
struct BusbwCurve;             // busbw_curve.hpp

// A calibrated profile (calibration.hpp) takes precedence: measured GEMM
// shapes, kernels by op name and collectives by tier and group size; outside
// the measured GEMM shapes the roofline uses the best measured FLOP/s as peak.
//
// Fraction of peak a GEMM achieves: the profile's best efficiency times the
// wave-quantisation efficiency of 128x128 output tiles over the SMs, and
// limited by the roofline (HBM bytes of A, B and C at the achievable bandwidth).
double gemm_efficiency(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t batch = 1);
// extra_bytes: HBM traffic beyond A, B and a bf16 C (a wgrad GEMM that
// accumulates into an fp32 main_grad), added to the roofline's memory side;
// a calibrated GEMM time (measured with a bf16 C) is used as it is.
TimeNs gemm_time_ns(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                    std::int64_t batch = 1,
                    double extra_bytes = 0);
TimeNs memory_bound_time_ns(const GpuProfile& gpu, double bytes);
// A memory-bound kernel by the workload's op name ("act", "norm_in_bwd", and
// the optimizer step's "adam" with bytes = shard parameters x 28, see
// optimizer_step.hpp): its calibrated fit when the profile has one, else
// memory_bound_time_ns.
TimeNs kernel_time_ns(const GpuProfile& gpu, const std::string& name, double bytes);

// The copy kernels around a list-form c10d all_gather or reduce_scatter of
// `bytes` (the gathered tensor, or the one reduced) over `group_size` ranks:
// ProcessGroupNCCL flattens the list into one buffer and copies each rank's
// slice in (reduce_scatter) or out (all_gather) with its own copy_, one
// kernel per rank launched from the host, each reading and writing
// bytes / group_size: group_size x memory_bound_time_ns(2 x bytes /
// group_size), i.e. the data's HBM time plus a kernel launch per rank.
TimeNs list_collective_copies_ns(const GpuProfile& gpu, double bytes, int group_size);

// Alpha-beta parameters of one collective over one group: busbw in NCCL's
// convention and the per-step latency.
struct LinkParams {
  double busbw_Bps = 0;
  double latency_ns = 0;
  // A calibrated fit (time = alpha + size x bus factor / busbw): latency_ns
  // is then the fit's whole alpha, charged once, not a per-step latency.
  bool fitted = false;
  // The fit's samples (calibration.hpp): inside their size range the
  // interpolated measurement prices the collective instead of the line.
  const CollectiveCalibration* calibrated = nullptr;
  // The tier's size-dependent busbw (busbw_curve.hpp), else null: the time is
  // then the larger of the alpha-beta line above and the curve's time.
  const BusbwCurve* curve = nullptr;
};

// Ring-algorithm time of `size_bytes` (the nccl-tests "size"):
// ring_bytes x S / busbw + ring_steps x alpha (collective_traits.hpp). A
// fitted link charges its alpha once; a busbw curve's time is a floor
// (busbw_curve.hpp).
TimeNs collective_time_ns(Collective c, double size_bytes, int group_size, const LinkParams& link);

// Link parameters for a collective among `ranks` (global GPU indices), from
// the tier the group spans: inside a node the NVSwitch busbw (and the card's
// allreduce_busbw_curve for all-reduce, reduce-scatter, all-gather); across
// nodes the group's share of the node's NICs, divided by the oversubscription
// when it leaves a leaf switch (and the core's when it crosses the core). A
// calibrated fit for (c, tier, group size) replaces all of that; with
// `cold_buffers` (the data-parallel collectives on the gradient and
// parameter buffers) the card's cold table where it has one
// (CollectiveKey::cold).
LinkParams group_link_params(const Topology& topo, Collective c, const std::vector<int>& ranks,
                             bool cold_buffers = false);

// How the rings of a phase in which `groups` all communicate at once (every
// DP group, every pipeline pair) load the oversubscribed uplinks: per leaf
// switch and per pod, the edges of the groups' rings over nodes (the nodes in
// the order of their first rank, cyclic; a pair's ring is its two
// directions) that leave it. Each such edge carries one group's ring rate.
struct UplinkLoad {
  int leaf_edges = 0;  // ring edges leaving the busiest leaf
  int pod_edges = 0;   // ring edges leaving the busiest pod
};
UplinkLoad uplink_load(const Topology& topo, const std::vector<std::vector<int>>& groups);

// uplink_load one rank at a time, without the groups as vectors (a phase of
// 100,000 GPUs is scored for every placement of a search).
class UplinkCounter {
 public:
  explicit UplinkCounter(const Topology& topo);
  void begin_group();
  void add(int rank);  // the group's ranks in order
  void end_group();
  UplinkLoad load() const;

 private:
  void edge(int from, int to);
  const Topology& topo_;
  int gpn_ = 1;
  std::vector<int> leaf_out_, pod_out_;
  int first_ = -1, prev_ = -1;  // the group's first rank and the rank of its node last seen
};

// group_link_params with the phase's load: an oversubscribed uplink slows the
// group's ring only as far as the phase's crossing edges (each at the ring's
// rate) exceed its capacity (the leaf's, or the pod's, designed downlinks at
// the NICs' busbw over the oversubscription), where without the load every
// GPU under the switch is taken to cross it (the full oversubscription).
LinkParams group_link_params(const Topology& topo, Collective c, const std::vector<int>& ranks, const UplinkLoad& load,
                             bool cold_buffers = false);

// The time of one op of the workload on this GPU / group.
TimeNs op_time_ns(const GpuProfile& gpu, const Op& op);

// The GPU as a kernel sees it while a collective holds `sms_taken` SMs (NCCL:
// one CTA per channel, IntraNodeFabric::nccl_channels): sm_count - sms_taken
// SMs for the wave quantisation, and the peak FLOP/s scaled by the same
// fraction (tensor-core FLOP/s are per SM). HBM bandwidth is kept: an SM
// subset of an A100 still saturates HBM with streaming kernels.
GpuProfile with_sms_taken(const GpuProfile& gpu, int sms_taken);

// op_time_ns of an op running while a collective holds `sms_taken` SMs. Only
// GEMMs change (the ops Megatron overlaps with a collective). A calibrated
// GEMM time (measured on every SM) is scaled by the model's ratio of its
// reduced-SM time to its full-SM time. sms_taken <= 0: op_time_ns.
TimeNs op_time_sms_taken_ns(const GpuProfile& gpu, const Op& op, int sms_taken);

// op_time_sms_taken_ns for many ops: the model's full and reduced GPUs built
// once (a profile copy per op costs more than pricing the op).
class SmsTakenPricer {
 public:
  SmsTakenPricer(const GpuProfile& gpu, int sms_taken);
  TimeNs operator()(const Op& op) const;

 private:
  const GpuProfile& gpu_;
  int sms_taken_;
  GpuProfile full_, reduced_;  // the model's, without the calibration
};

// SMs a ring collective's kernel holds on each member GPU of a group with
// `members_per_node` members on each of its `nodes` nodes (NCCL: one CTA per
// channel, resident for the whole collective). Inside one node: the NVLink
// tier's nccl_channels. Across nodes, NCCL's topology search (src/graph/
// search.cc ncclTopoCompute, v2.12-v2.18) finds one ring per NIC that the
// node's members reach, at the fastest of its speedArrayInter entries that
// the NIC carries (NCCL's IB width: line rate / 8); a ring speed of 25 GB/s
// or more is duplicated there (dupChannels, up to maxChannels = 16), and
// connect.cc ncclTopoPostset doubles every channel (up to MAXCHANNELS = 32).
// 200 Gb/s HDR (24 GB/s rings): 2 per NIC used; 400 Gb/s NDR (48): 4. 0 where
// the card does not model NCCL's SMs (no nccl_channels on its NVLink tier) or
// has no NICs.
int nccl_ring_channels(const Cluster& cl, int members_per_node, int nodes);
// The same for the group of these ranks (its nodes and most members on one).
int nccl_ring_channels(const Cluster& cl, const std::vector<int>& ranks);

// SMs an EP exchange of `dispatcher` holds on its GPUs while the EP overlap
// runs compute beside it (core/ep_overlap.hpp): flex, its backend's kernels'
// (flex_kernels: DeepEP's 20, HybridEP's 24 or 8, or the plan's), over the
// nodes the group spans; alltoall, NCCL's channels for the EP group
// (nccl_ring_channels, the figure cuboid has for an NCCL kernel's CTAs).
int ep_exchange_sms(const Cluster& cl, MoeDispatcher dispatcher, const FlexSetting& flex, const std::vector<int>& ep_ranks);
// The flex dispatcher's SMs over `domains` NVLink domains, one SM left.
int flex_exchange_sms(int sm_count, const FlexSetting& flex, int domains);

// The extra time a stretch of compute takes when a collective holding SMs
// runs beside it: the collective lasts `collective_ns`, the compute alone
// `compute_ns`, and with the SMs taken it runs `ratio` (>= 1) times slower.
// The compute is slowed for the collective's length or for all of itself,
// whichever ends first: min(collective x (1 - 1/ratio), compute x (ratio - 1)).
double sm_contention_ns(double collective_ns, double compute_ns, double ratio);

// Time of a compute op started together with a collective that lasts
// `collective_ns`: it runs at its reduced-SM pace (reduced_ns for the whole
// op) while the collective holds its SMs, at full pace (full_ns for the
// whole op) after. collective_ns >= reduced_ns: reduced_ns; else
// collective_ns + (1 - collective_ns / reduced_ns) x full_ns.
TimeNs overlapped_time_ns(TimeNs collective_ns, TimeNs reduced_ns, TimeNs full_ns);

}  // namespace cuboid
