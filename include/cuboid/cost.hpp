#pragma once
// Cost models: time of a GEMM, of a memory-bound kernel and of a collective,
// from the GPU profile and the fabric constants of the cluster card. No magic
// numbers here: every constant comes from the cards.
#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/cluster.hpp"
#include "cuboid/topology.hpp"
#include "cuboid/workload.hpp"

namespace cuboid {

struct CollectiveCalibration;  // calibration.hpp

// Calibrated profiles (gpu.calibration, see calibration.hpp) take precedence:
// a measured or interpolated GEMM time, a memory-bound op's samples by op
// name, a collective's samples by tier and group size (interpolated inside
// the measured sizes, the alpha-beta fit outside: calibration.hpp). Outside the
// measured GEMM shapes the roofline below prices the GEMM with the best
// measured FLOP/s in place of peak x gemm_max_efficiency.
//
// Fraction of peak a GEMM achieves: the profile's best efficiency times the
// wave-quantisation efficiency of 128x128 output tiles over the SMs, and
// limited by the roofline (HBM bytes of A, B and C at the achievable bandwidth).
double gemm_efficiency(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t batch = 1);
std::int64_t gemm_time_ns(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                          std::int64_t batch = 1);
std::int64_t memory_bound_time_ns(const GpuProfile& gpu, double bytes);
// A memory-bound kernel by the workload's op name ("act", "norm_in_bwd", and
// "adam" for the optimizer step with bytes = shard parameters x 32): its
// calibrated fit when the profile has one, else memory_bound_time_ns.
std::int64_t kernel_time_ns(const GpuProfile& gpu, const std::string& name, double bytes);

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
};

// Ring-algorithm time in NCCL's bus-bandwidth convention for `size_bytes`
// (the nccl-tests "size"): all_reduce 2(n-1)/n * S / busbw + 2(n-1) alpha;
// reduce_scatter / all_gather (n-1)/n * S / busbw + (n-1) alpha;
// broadcast S / busbw + (n-1) alpha; send_recv S / busbw + alpha.
// A fitted link charges its alpha once.
std::int64_t collective_time_ns(Collective c, double size_bytes, int group_size, const LinkParams& link);

// Link parameters for a collective among `ranks` (global GPU indices), from
// the tier the group spans: inside a node the NVSwitch busbw; across nodes the
// NIC bandwidth that the group's GPUs on each node can use (their share of the
// node's NICs when every GPU communicates at once), divided by the fabric's
// oversubscription when the group leaves a leaf switch. A calibrated card's
// fit for (c, tier, group size) replaces all of that (tier: "intra_node" when
// the group sits in one node, else "inter_node").
LinkParams group_link_params(const Topology& topo, Collective c, const std::vector<int>& ranks);

// The time of one op of the workload on this GPU / group.
std::int64_t op_time_ns(const GpuProfile& gpu, const Op& op);

}  // namespace cuboid
