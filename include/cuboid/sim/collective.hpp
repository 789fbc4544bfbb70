#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// Collective algorithms: how an NCCL collective over a group of GPUs becomes
// phases of flows on the network (network.hpp). Each algorithm is registered
// by name with a one-line description (`cuboid list collectives`).
//
// Conventions (NCCL / nccl-tests): `size_bytes` is the nccl-tests "size", the
// buffer per rank. Uncontended, a ring moves the bus-bandwidth volume
// (collective_traits.hpp: ring_bytes x S) over each ring edge at the link's
// achievable rate, plus one alpha per step, so it reproduces cost.hpp's
// collective_time_ns and hence the nccl-tests busbw of the card. A calibrated card's fit for the group's
// (collective, tier, size) replaces the algorithm: one ring phase scaled so
// that, uncontended, it takes exactly the calibrated time (the measured
// samples interpolated inside their sizes, the fitted alpha + S x bus factor
// / busbw outside), while its flows still share the links with other traffic.
//
// Symmetry: a CommGroup may carry mirrors, the groups of identical replicas
// (other DP replicas, other TP ranks) that run the same collective at the same
// time but are not simulated. Their routes are added, with their weights, to
// the representative's flow of each phase: they load the real links (and show
// in link bytes and utilisation), and since they share the representative's
// rate variable the representative proceeds at the pace of the slowest mirror,
// as lockstep replicas do. Their completions are not tracked.
// Mirror only where the mirrored traffic can meet simulated traffic: DP and PP
// flows that cross NICs, leaves and spines. A TP collective inside a node
// loads only that node's NVSwitch links, so mirroring it onto the nodes of
// unsimulated replicas changes no simulated time and only costs work.
// Send/recv mirrors: Engine::add_send_recv takes them as (src, dst) routes.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cuboid/sim/network.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {
struct CollectiveCalibration;  // calibration.hpp
struct BusbwCurve;             // busbw_curve.hpp
}

namespace cuboid::sim {

enum class Algorithm : std::uint8_t {
  automatic,     // NCCL-like choice, see choose_algorithm
  ring,          // ring (chain for broadcast), one channel per GPU of a node across nodes
  tree,          // double binary tree (all_reduce only; others fall back to ring)
  hierarchical,  // intra-node reduce-scatter, inter-node all-reduce per rail, intra-node all-gather
};

struct AlgorithmInfo {
  std::string_view name;
  std::string_view description;
};

// The registry, in a stable order (automatic first).
std::span<const AlgorithmInfo> collective_algorithms();
std::string_view to_string(Algorithm a);
// Throws std::invalid_argument naming the known algorithms.
Algorithm parse_algorithm(std::string_view name);

// The member lists of a group's mirrors, one after another in one vector: a
// mirrored p2p group of a 16k-GPU job has a thousand two-member mirrors, and
// a vector each was a thousand allocations to make and free per group.
// Reads like a vector of member lists (m[i] is a std::span<const int>).
class MirrorGroups {
 public:
  MirrorGroups() = default;
  MirrorGroups(std::initializer_list<std::initializer_list<int>> mirrors) {
    for (const auto& m : mirrors) push_back(m);
  }
  void push_back(std::span<const int> members) {
    for (int r : members) ranks_.push_back(r);
    ends_.push_back(static_cast<std::uint32_t>(ranks_.size()));
  }
  void push_back(std::initializer_list<int> members) { push_back(std::span<const int>(members.begin(), members.size())); }
  void reserve(std::size_t mirrors, std::size_t members_each) {
    ends_.reserve(mirrors);
    ranks_.reserve(mirrors * members_each);
  }
  std::size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  std::span<const int> operator[](std::size_t i) const {
    const std::uint32_t begin = i == 0 ? 0 : ends_[i - 1];
    return {ranks_.data() + begin, ends_[i] - begin};
  }

  class iterator {
   public:
    iterator(const MirrorGroups* g, std::size_t i) : g_(g), i_(i) {}
    std::span<const int> operator*() const { return (*g_)[i_]; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const iterator& o) const { return i_ == o.i_; }

   private:
    const MirrorGroups* g_;
    std::size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  std::vector<int> ranks_;
  std::vector<std::uint32_t> ends_;  // per mirror: one past its last member in ranks_
};

// A communicator: the ranks (global GPU ids, in ring order; ranks[0] is the
// broadcast root and the sender of a send_recv) and the groups it mirrors.
// Every mirror has the same size as `ranks`; mirror[i] plays ranks[i]'s role.
// rail0_part (networks with folded rails, Network::fold_rails): ranks and
// mirrors are only the groups on local GPU 0 of a family closed under the
// rail rotation (each GPU to the next of its node), which stands for every
// rotation of them: the caller's promise, as the builder's rails_foldable
// makes it. Its phases are registered with Network::add_rail0_route_set.
struct CommGroup {
  std::vector<int> ranks;
  MirrorGroups mirrors;
  bool rail0_part = false;
  // The data-parallel traffic on the gradient and parameter buffers: a
  // calibrated card's cold table (CollectiveKey::cold) prices it.
  bool cold_buffers = false;
  // An EP group's allgather or flex dispatcher (core/dispatch.hpp): its
  // exchanges play as one flow of the size (a rank's tokens x the bytes of
  // a copy) whose routes carry, from every member, `node` of it to each
  // other node of the group (to the GPU on its own rail there: RDMA) and
  // `nvlink` of it to each other member on its node; none: NCCL's.
  struct DispatchWeights {
    double node = 0, nvlink = 0;
  };
  std::optional<DispatchWeights> dispatch{};
};

// One phase: a single flow (shared rate) over the links of `set` carrying
// bytes_per_size * size_bytes per route, followed by latency_ns of alpha terms.
struct CommPhase {
  LinkSetId set = 0;  // its links on the network, representative + mirrors (Network::add_route_set)
  double bytes_per_size = 0;
  TimeNs latency_ns = 0;
  // A calibrated collective (else null): inside the measured sizes its time
  // follows the interpolated samples, not the line bytes_per_size and
  // latency_ns encode, so the flow's bytes and the latency depend on the size:
  // use phase_flow_bytes / phase_latency_ns.
  const CollectiveCalibration* calibrated = nullptr;
  // The tier's busbw curve (an intra-node ring of all-reduce, reduce-scatter
  // or all-gather on a card with intra_node.allreduce_busbw_curve), else
  // null: the flow carries max(bytes_per_size x S, (curve time - latency) x
  // rate_Bps), so uncontended the phase takes max(alpha-beta, curve time)
  // like cost.hpp's collective_time_ns, and under contention the stretched
  // flow still shares its links max-min.
  const BusbwCurve* curve = nullptr;
  Collective collective = Collective::all_reduce;
  int group_size = 0;
  double rate_Bps = 0;  // the representative's uncontended rate
};

// Bytes of the phase's flow and its latency for a collective of size_bytes.
// Calibrated: uncontended, latency + flow take the curve's time T(S), with
// latency min(alpha, T(S)); outside the samples that is the fit itself.
// With a busbw curve: see CommPhase::curve.
double phase_flow_bytes(const CommPhase& ph, double size_bytes);
TimeNs phase_latency_ns(const CommPhase& ph, double size_bytes);

// Phases run one after the other. Independent of the size: the engine caches
// plans per (group, collective, algorithm) and scales bytes.
struct CollectivePlan {
  Algorithm algorithm = Algorithm::ring;
  std::vector<CommPhase> phases;
};

// NCCL-like default (documented in collective.cpp): ring inside a node and for
// every collective but all_reduce; for an all_reduce across nodes the faster
// of ring and tree by their alpha-beta estimate, as NCCL's tuning model does.
Algorithm choose_algorithm(Network& net, Collective op, const CommGroup& group, double size_bytes);

// Decomposes the collective into phases on `net` (which must have a topology).
// `algo` must not be automatic. A group of one rank gives no phase. Each
// phase's links are registered on `net` as a link set (CommPhase::set).
CollectivePlan plan_collective(Network& net, Collective op, const CommGroup& group, Algorithm algo);

}  // namespace cuboid::sim
