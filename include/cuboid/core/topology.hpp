#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// The cluster as a Boost.Graph graph: GPUs, the NVSwitch of each node, NICs,
// leaf / spine / core switches as vertices; links (capacity per direction and
// latency) as edges. Routes are found structurally (fat-tree up/down routing)
// and are deterministic.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <span>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "cuboid/core/cluster.hpp"

namespace cuboid {

enum class VertexKind { gpu, nvswitch, nic, leaf, spine, core };
std::string_view to_string(VertexKind k);

struct VertexInfo {
  VertexKind kind = VertexKind::gpu;
  int node = -1;    // owning node for gpu / nvswitch / nic; -1 for switches
  int index = -1;   // gpu or nic index inside the node; switch number otherwise
  std::string name; // "n3.gpu5", "n3.nic5", "leaf.r5.g0", "spine.0"
};

struct LinkInfo {
  double bandwidth_Bps = 0;   // per direction
  std::int64_t latency_ns = 0;
  std::string kind;           // "nvlink", "pcie", "ib", "ib-up"
  std::uint32_t id = 0;       // edges numbered in the order they were added (boost::edges' order)
};

// An edge as a flat record, by id (the order edges were added): what the
// simulator's Network reads for each of its ~100k links on a 16k-GPU fabric,
// without walking Boost's edge list.
struct EdgeRecord {
  std::uint32_t lo = 0, hi = 0;  // its vertices, lower id first
  VertexKind lo_kind = VertexKind::gpu, hi_kind = VertexKind::gpu;
  double bandwidth_Bps = 0;      // = LinkInfo::bandwidth_Bps
  std::int64_t latency_ns = 0;   // = LinkInfo::latency_ns
};

// How far apart two GPUs are: the highest level a message between them crosses.
enum class Tier { same_gpu = 0, nvlink = 1, leaf = 2, spine = 3, core = 4 };
std::string_view to_string(Tier t);

class Topology {
 public:
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, VertexInfo, LinkInfo>;
  using Vertex = Graph::vertex_descriptor;
  using Edge = Graph::edge_descriptor;

  explicit Topology(const Cluster& cluster);

  const Graph& graph() const { return graph_; }
  const Cluster& cluster() const { return cluster_; }
  int num_gpus() const { return cluster_.total_gpus(); }
  Vertex gpu_vertex(int global_gpu) const;
  // Every edge's record, index = LinkInfo::id.
  const std::vector<EdgeRecord>& edges() const { return edges_; }

  // The links a message from gpu_a to gpu_b crosses, in order.
  std::vector<Edge> route(int gpu_a, int gpu_b) const;
  // The same hops as directed link ids, appended to `out`: 2 x LinkInfo::id,
  // + 1 when the hop goes from the higher vertex id to the lower (sim::Network's links).
  void route_ids(int gpu_a, int gpu_b, std::vector<std::uint32_t>& out) const;
  // The same into out[0..n), returning n (at most kMaxRouteLinks: GPU, NIC,
  // leaf, spine, core and back down): no allocation, for hot loops.
  static constexpr std::size_t kMaxRouteLinks = 8;
  // Inline: the simulator's mirrored collectives ask for ~50k routes per plan.
  std::size_t route_ids(int gpu_a, int gpu_b, std::uint32_t* out) const {
    const auto [a, b] = hops_pair(gpu_a, gpu_b);
    return a == b ? 0 : route_hops<false>(*a, *b, *a, *b, out, nullptr);
  }
  // The sum of the route's hop latencies, from per-GPU sums kept with the
  // hop index (no walk over the edge records: a DP ring of 128 nodes asks
  // this for each of its edges).
  std::int64_t route_latency_ns(int gpu_a, int gpu_b) const {
    const auto [a, b] = hops_pair(gpu_a, gpu_b);
    if (a == b) return 0;
    const GpuLatency& la = gpu_latency_[static_cast<std::size_t>(gpu_a)];
    const GpuLatency& lb = gpu_latency_[static_cast<std::size_t>(gpu_b)];
    if (a->node == b->node) return la.nvswitch_ns + lb.nvswitch_ns;
    const std::size_t levels = a->leaf == b->leaf ? 2 : a->pod == b->pod ? 3 : 4;
    return la.up_to[levels - 1] + lb.up_to[levels - 1];
  }
  // Rail symmetry. Rotating every node's GPUs by one (local GPU i -> i + 1
  // mod GPUs per node) maps the fabric onto itself when each GPU has its own
  // NIC and the leaves and pods are laid out alike for every rail: GPU i's
  // NVLink, its NIC's links and (rail-optimised) its rail's leaf uplinks go
  // to GPU i + 1's; links every rail shares (a leaf or spine above all the
  // node's rails) stay. Checked on the built fabric.
  bool rail_symmetric() const { return rail_symmetric_; }
  // Rail-symmetric fabrics only: each directed link's image on rail 0 (the
  // link of local GPU 0 it rotates to; a shared link is its own image).
  const std::vector<std::uint32_t>& rail0_links() const { return rail0_links_; }
  // The images numbered densely, in link id order (a folded network's
  // per-link tables hold only them, a GPUs-per-node-th of the links): per
  // link, its image's number; per number, the image.
  const std::vector<std::uint32_t>& rail0_slots() const { return rail0_slots_; }
  const std::vector<std::uint32_t>& rail0_slot_links() const { return rail0_slot_links_; }
  // The links whose image has this number, in id order (the image among them).
  std::span<const std::uint32_t> rail0_slot_members(std::uint32_t slot) const {
    const std::uint32_t begin = rail0_member_start_[slot];
    return {rail0_members_.data() + begin, rail0_member_start_[slot + 1] - begin};
  }
  // GPU i of its node (gpu in range).
  int local_index(int gpu) const { return gpu - static_cast<int>(gpu_hops_[static_cast<std::size_t>(gpu)].first); }
  // route_ids with every hop given as its rail-0 image, and fixed[k] = 1 where
  // the hop is a link all rails share (rail-symmetric fabrics only).
  std::size_t route_ids_rail0(int gpu_a, int gpu_b, std::uint32_t* out, std::uint8_t* fixed) const {
    const auto [a, b] = hops_pair(gpu_a, gpu_b);
    return a == b ? 0 : route_hops<true>(*a, *b, gpu_hops_[a->first], gpu_hops_[b->first], out, fixed);
  }
  double bottleneck_bandwidth_Bps(const std::vector<Edge>& path) const;
  std::int64_t latency_ns(const std::vector<Edge>& path) const;
  Tier tier(int gpu_a, int gpu_b) const;
  // The highest tier any pair of the group crosses.
  Tier group_tier(const std::vector<int>& gpus) const;
  // The leaf switch and the pod (the leaves under one spine; 0 below three
  // levels) of the GPU's NIC; -1 without an inter-node network.
  int leaf_of(int gpu) const;
  int pod_of(int gpu) const;
  int num_leaves() const { return static_cast<int>(leaf_vertices_.size()); }
  int num_pods() const { return std::max(1, static_cast<int>(spine_vertices_.size())); }

  // A calibrated card with several operand pools (Calibration::other_pools):
  // the same fabric with the card as the pool nearest `pool_bytes` (in
  // ratio) reads it; this topology itself when its own pool is nearest or
  // the card has one pool. cost/operand_pool.hpp picks it for a plan.
  const Topology& for_operand_pool(double pool_bytes) const;
  bool has_operand_pool_views() const { return !pool_views_.empty(); }

 private:
  Cluster cluster_;
  // (pool bytes, the topology of that pool's view), one per other pool.
  std::vector<std::pair<double, std::shared_ptr<const Topology>>> pool_views_;
  Graph graph_;
  std::vector<EdgeRecord> edges_;
  std::vector<Vertex> gpu_vertices_;
  std::vector<Vertex> nvswitch_vertices_;
  std::vector<Vertex> nic_vertices_;     // node * nics_per_node + nic
  std::vector<Vertex> leaf_vertices_;
  std::vector<Vertex> spine_vertices_;
  std::vector<Vertex> core_vertices_;
  // For route_ids: edge ids of each vertex's uplink, and where each GPU attaches.
  std::vector<std::uint32_t> gpu_nvswitch_edge_, gpu_nic_edge_, nic_up_edge_, leaf_up_edge_, spine_up_edge_;
  std::vector<int> gpu_nic_, gpu_leaf_, leaf_pod_;
  // Per GPU, its directed link ids up the tree (GPU->NIC, NIC->leaf,
  // leaf->spine, spine->core) and down it (the reverse hops, in the order a
  // route ending at this GPU meets them backwards): a route is a prefix of
  // the source's ups and the destination's downs, reversed.
  struct GpuHops {
    std::uint32_t nvswitch_up = 0, nvswitch_down = 0;
    std::uint32_t up[4] = {};
    std::uint32_t down[4] = {};
    int node = 0, leaf = -1, pod = -1;
    std::uint32_t first = 0;  // the node's GPU 0 (no division in hot loops)
    std::uint8_t depth = 0;   // valid entries of up / down (0: no inter-node network)
    std::uint8_t shared = 0;  // bit k: up[k] / down[k] are links every GPU of the node crosses
  };
  std::vector<GpuHops> gpu_hops_;
  // Per GPU, the latency of its NVSwitch link and the summed latencies of
  // its first k + 1 links up the tree (a link's two directions have its
  // edge's one latency, so the way down sums the same).
  struct GpuLatency {
    std::int64_t nvswitch_ns = 0;
    std::int64_t up_to[4] = {};
  };
  std::vector<GpuLatency> gpu_latency_;
  bool rail_symmetric_ = false;
  std::vector<std::uint32_t> rail0_links_;
  std::vector<std::uint32_t> rail0_slots_, rail0_slot_links_;
  std::vector<std::uint32_t> rail0_member_start_, rail0_members_;  // per slot, its links (CSR)
  void index_rails();
  void index_hops();
  [[noreturn]] void throw_bad_gpus(int gpu_a, int gpu_b) const;
  std::pair<const GpuHops*, const GpuHops*> hops_pair(int gpu_a, int gpu_b) const {
    const auto ua = static_cast<std::size_t>(gpu_a);
    const auto ub = static_cast<std::size_t>(gpu_b);
    if (ua >= gpu_hops_.size() || ub >= gpu_hops_.size()) throw_bad_gpus(gpu_a, gpu_b);  // negative too
    return {&gpu_hops_[ua], &gpu_hops_[ub]};
  }
  // The route from a to b: its levels from a's and b's leaf and pod, its hops
  // read off `up` (a, or a's rail-0 image) and `down` (b, or b's image); with
  // kFixed, fixed[k] = 1 where the hop is a link every rail shares.
  template <bool kFixed>
  static std::size_t route_hops(const GpuHops& a, const GpuHops& b, const GpuHops& up, const GpuHops& down,
                                std::uint32_t* out, std::uint8_t* fixed) {
    if (a.node == b.node) {
      out[0] = up.nvswitch_up;
      out[1] = down.nvswitch_down;
      if constexpr (kFixed) fixed[0] = fixed[1] = 0;
      return 2;
    }
    // Up to the lowest common switch: the leaf, the pod's spine, or the core.
    const std::size_t levels = a.leaf == b.leaf ? 2 : a.pod == b.pod ? 3 : 4;
    for (std::size_t i = 0; i < levels; ++i) {
      out[i] = up.up[i];
      if constexpr (kFixed) fixed[i] = static_cast<std::uint8_t>((up.shared >> i) & 1u);
    }
    for (std::size_t i = 0; i < levels; ++i) {
      const std::size_t k = levels - 1 - i;
      out[levels + i] = down.down[k];
      if constexpr (kFixed) fixed[levels + i] = static_cast<std::uint8_t>((down.shared >> k) & 1u);
    }
    return 2 * levels;
  }
  // Helpers for structural routing are private to topology.cpp.
  friend struct TopologyBuilder;
};

}  // namespace cuboid
