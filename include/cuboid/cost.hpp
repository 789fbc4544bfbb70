#pragma once
// Cost models: time of a GEMM, of a memory-bound kernel and of a collective,
// from the GPU profile and the fabric constants of the cluster card. No magic
// numbers here: every constant comes from the cards.
#include <cstdint>
#include <vector>

#include "cuboid/cluster.hpp"
#include "cuboid/topology.hpp"
#include "cuboid/workload.hpp"

namespace cuboid {

// Fraction of peak a GEMM achieves: the profile's best efficiency times the
// wave-quantisation efficiency of 128x128 output tiles over the SMs, and
// limited by the roofline (HBM bytes of A, B and C at the achievable bandwidth).
double gemm_efficiency(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::int64_t batch = 1);
std::int64_t gemm_time_ns(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                          std::int64_t batch = 1);
std::int64_t memory_bound_time_ns(const GpuProfile& gpu, double bytes);

// Alpha-beta parameters of one collective over one group: busbw in NCCL's
// convention and the per-step latency.
struct LinkParams {
  double busbw_Bps = 0;
  double latency_ns = 0;
};

// Ring-algorithm time in NCCL's bus-bandwidth convention for `size_bytes`
// (the nccl-tests "size"): all_reduce 2(n-1)/n * S / busbw + 2(n-1) alpha;
// reduce_scatter / all_gather (n-1)/n * S / busbw + (n-1) alpha;
// broadcast S / busbw + (n-1) alpha; send_recv S / busbw + alpha.
std::int64_t collective_time_ns(Collective c, double size_bytes, int group_size, const LinkParams& link);

// Link parameters for a collective among `ranks` (global GPU indices), from
// the tier the group spans: inside a node the NVSwitch busbw; across nodes the
// NIC bandwidth that the group's GPUs on each node can use (their share of the
// node's NICs when every GPU communicates at once), divided by the fabric's
// oversubscription when the group leaves a leaf switch.
LinkParams group_link_params(const Topology& topo, Collective c, const std::vector<int>& ranks);

// The time of one op of the workload on this GPU / group.
std::int64_t op_time_ns(const GpuProfile& gpu, const Op& op);

}  // namespace cuboid
