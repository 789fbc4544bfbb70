#include "cuboid/core/topology.hpp"

#include "cuboid/core/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace cuboid {

std::string_view to_string(VertexKind k) {
  switch (k) {
    case VertexKind::gpu: return "gpu";
    case VertexKind::nvswitch: return "nvswitch";
    case VertexKind::nic: return "nic";
    case VertexKind::leaf: return "leaf";
    case VertexKind::spine: return "spine";
    case VertexKind::core: return "core";
  }
  return "?";
}

std::string_view to_string(Tier t) {
  switch (t) {
    case Tier::same_gpu: return "same_gpu";
    case Tier::nvlink: return "nvlink";
    case Tier::leaf: return "leaf";
    case Tier::spine: return "spine";
    case Tier::core: return "core";
  }
  return "?";
}

namespace {

// The fat tree's shape, derived once from the card. Everything route() needs is
// arithmetic on these numbers, so a route costs O(path length), never a search.
struct Shape {
  int nodes = 0;
  int gpus_per_node = 0;
  int nics = 0;             // per node; 0 = no inter-node network
  int levels = 0;           // 0 (no network), 1, 2 or 3
  int nodes_per_leaf = 1;
  bool rail = false;        // rail-optimised leaves (one leaf per group and rail)
  int groups = 0;           // leaf groups (scalable units) = ceil(nodes / nodes_per_leaf)
  int leaves = 0;
  int leaves_per_pod = 0;   // 3 levels: leaves under one spine
  int pods = 0;
  int spines = 0;
  int cores = 0;

  explicit Shape(const Cluster& c)
      : nodes(c.nodes), gpus_per_node(c.gpus_per_node), nics(c.inter.kind == "none" ? 0 : c.inter.nics_per_node) {
    if (nics == 0) return;
    levels = c.inter.levels;
    nodes_per_leaf = std::max(1, c.inter.nodes_per_leaf);
    if (levels == 1) {
      // One switch for the whole cluster: rails have nowhere else to meet.
      rail = false;
      groups = 1;
      leaves = 1;
      return;
    }
    rail = c.inter.rail_optimized;
    groups = (nodes + nodes_per_leaf - 1) / nodes_per_leaf;
    leaves = rail ? groups * nics : groups;
    if (levels == 2) {
      spines = 1;
      return;
    }
    leaves_per_pod = c.inter.leaves_per_pod > 0 ? c.inter.leaves_per_pod : leaves;
    pods = (leaves + leaves_per_pod - 1) / leaves_per_pod;
    spines = pods;
    cores = 1;
  }

  int node_of(int gpu) const { return gpu / gpus_per_node; }
  int local_of(int gpu) const { return gpu % gpus_per_node; }
  // GPU i of a node uses NIC (i * nics / gpus): with fewer NICs than GPUs,
  // neighbouring GPUs share one (as on HGX boards with 4 HCAs for 8 GPUs).
  int nic_local_of(int gpu) const { return local_of(gpu) * nics / gpus_per_node; }
  int nic_of(int gpu) const { return node_of(gpu) * nics + nic_local_of(gpu); }
  int leaf_of(int node, int nic_local) const {
    if (levels == 1) return 0;
    const int group = node / nodes_per_leaf;
    return rail ? group * nics + nic_local : group;
  }
  int leaf_of_gpu(int gpu) const { return leaf_of(node_of(gpu), nic_local_of(gpu)); }
  int pod_of_leaf(int leaf) const { return levels == 3 ? leaf / leaves_per_pod : 0; }
  Tier top_tier() const {
    if (nics == 0) return Tier::nvlink;
    if (levels == 1) return Tier::leaf;
    return levels == 2 ? Tier::spine : Tier::core;
  }
};

// "<prefix><number><suffix>", built by appending (GCC 12 -O3 raises a false
// -Wrestrict on "literal" + std::to_string(...)).
std::string label(std::string_view prefix, int number, std::string_view suffix = {}) {
  std::string out(prefix);
  out += std::to_string(number);
  out += suffix;
  return out;
}

std::string link_kind_intra(const std::string& kind) {
  if (kind == "pcie") return "pcie";
  if (kind == "shared-memory") return "shm";
  return "nvlink";  // nvswitch, nvlink
}

// Edges are added top-down (core, spines, leaves, then each node's NICs and
// GPUs), so each vertex's *upward* edge is the first in its out-edge list and
// boost::edge(lower, upper) finds it in O(1) even for a leaf with many ports.
Topology::Edge find_edge(const Topology::Graph& g, Topology::Vertex lower, Topology::Vertex upper) {
  auto [e, ok] = boost::edge(lower, upper, g);
  if (!ok) throw std::logic_error("topology: missing edge " + g[lower].name + " - " + g[upper].name);
  return e;
}

}  // namespace

struct TopologyBuilder {
  static void build(Topology& t) {
    const Cluster& c = t.cluster_;
    const Shape s(c);
    auto& g = t.graph_;
    auto add_vertex = [&g](VertexKind kind, int node, int index, std::string name) {
      return boost::add_vertex(VertexInfo{kind, node, index, std::move(name)}, g);
    };
    // Edge ids count the edges in the order they are added (boost::edges' order).
    auto add_edge = [&g, &t](Topology::Vertex a, Topology::Vertex b, double Bps, std::int64_t ns, std::string kind) {
      const auto id = static_cast<std::uint32_t>(boost::num_edges(g));
      boost::add_edge(a, b, LinkInfo{Bps, ns, std::move(kind), id}, g);
      const auto lo = static_cast<std::uint32_t>(std::min(a, b));
      const auto hi = static_cast<std::uint32_t>(std::max(a, b));
      t.edges_.push_back(EdgeRecord{lo, hi, g[lo].kind, g[hi].kind, Bps, ns});
      return id;
    };

    // Physical line rates: NVLink per GPU per direction, the NIC's line rate.
    // Achieved (nccl-tests busbw) figures stay in the card for the cost model.
    const double nvlink_Bps = c.intra.link_bandwidth_GBps * 1e9;
    const double nic_Bps = c.inter.nic_bandwidth_Gbps * 1e9 / 8.0;
    // Latencies: the card's intra-node alpha split over GPU->switch->GPU; the
    // NIC-to-NIC alpha split over NIC->leaf->NIC; every further switch hop adds
    // switch_latency on the edge that reaches it.
    const auto nvlink_ns = static_cast<std::int64_t>(std::llround(c.intra.latency_ns / 2.0));
    const auto nic_leaf_ns = static_cast<std::int64_t>(std::llround(c.inter.latency_ns / 2.0));
    const auto hop_ns = static_cast<std::int64_t>(std::llround(c.inter.switch_latency_ns));
    // A leaf's uplinks carry its designed downlink capacity over the oversubscription.
    const double leaf_down_Bps = s.nics == 0 ? 0.0 : s.nodes_per_leaf * (s.rail ? 1 : s.nics) * nic_Bps;
    const double leaf_up_Bps = leaf_down_Bps / c.inter.oversubscription;

    for (int i = 0; i < s.cores; ++i) t.core_vertices_.push_back(add_vertex(VertexKind::core, -1, i, label("core.", i)));
    for (int p = 0; p < s.spines; ++p) {
      const auto v = add_vertex(VertexKind::spine, -1, p, label("spine.", p));
      t.spine_vertices_.push_back(v);
      if (s.levels == 3) {
        t.spine_up_edge_.push_back(
            add_edge(v, t.core_vertices_[0], s.leaves_per_pod * leaf_up_Bps / c.inter.core_oversubscription, hop_ns, "ib-up"));
      }
    }
    for (int l = 0; l < s.leaves; ++l) {
      std::string name = s.rail ? label("leaf.r", l % s.nics) + label(".g", l / s.nics) : label("leaf.g", l);
      const auto v = add_vertex(VertexKind::leaf, -1, l, std::move(name));
      t.leaf_vertices_.push_back(v);
      t.leaf_pod_.push_back(s.pod_of_leaf(l));
      if (s.levels >= 2) {
        t.leaf_up_edge_.push_back(
            add_edge(v, t.spine_vertices_[static_cast<std::size_t>(s.pod_of_leaf(l))], leaf_up_Bps, hop_ns, "ib-up"));
      }
    }
    const std::string intra_kind = link_kind_intra(c.intra.kind);
    for (int n = 0; n < s.nodes; ++n) {
      const std::string prefix = label("n", n, ".");
      const auto nvs = add_vertex(VertexKind::nvswitch, n, 0, prefix + "nvswitch");
      t.nvswitch_vertices_.push_back(nvs);
      for (int k = 0; k < s.nics; ++k) {
        const auto v = add_vertex(VertexKind::nic, n, k, prefix + label("nic", k));
        t.nic_vertices_.push_back(v);
        t.nic_up_edge_.push_back(add_edge(v, t.leaf_vertices_[static_cast<std::size_t>(s.leaf_of(n, k))], nic_Bps, nic_leaf_ns, "ib"));
      }
      for (int i = 0; i < s.gpus_per_node; ++i) {
        const int gpu = n * s.gpus_per_node + i;
        const auto v = add_vertex(VertexKind::gpu, n, i, prefix + label("gpu", i));
        t.gpu_vertices_.push_back(v);
        t.gpu_nvswitch_edge_.push_back(add_edge(v, nvs, nvlink_Bps, nvlink_ns, intra_kind));
        // The GPU-NIC path (PCIe switch, GPUDirect RDMA) is given the NIC's line
        // rate: PCIe Gen4 x16 (A100) and Gen5 x16 (H100) exceed HDR and NDR
        // respectively, so the NIC, not PCIe, is the bottleneck. Its latency is
        // part of the card's NIC-to-NIC latency.
        if (s.nics > 0) {
          t.gpu_nic_.push_back(s.nic_of(gpu));
          t.gpu_leaf_.push_back(s.leaf_of_gpu(gpu));
          t.gpu_nic_edge_.push_back(add_edge(v, t.nic_vertices_[static_cast<std::size_t>(s.nic_of(gpu))], nic_Bps, 0, "pcie"));
        }
      }
    }
  }
};

Topology::Topology(const Cluster& cluster) : cluster_(cluster) {
  if (cluster_.nodes <= 0 || cluster_.gpus_per_node <= 0) {
    throw std::invalid_argument("Topology: cluster has no GPUs (load it with load_cluster)");
  }
  if (Shape(cluster_).nics == 0 && cluster_.nodes > 1) {
    throw std::invalid_argument("Topology: several nodes but no inter-node network (load it with load_cluster)");
  }
  TopologyBuilder::build(*this);
  index_hops();
  if (cluster_.calibration && cluster_.calibration->gemm_operand_pool_bytes > 0) {
    for (std::size_t i = 0; i < cluster_.calibration->other_pools.size(); ++i) {
      Cluster view = cluster_;
      view.calibration = std::make_shared<const Calibration>(operand_pool_view(*cluster_.calibration, i));
      view.gpu.calibration = view.calibration;
      pool_views_.emplace_back(view.calibration->gemm_operand_pool_bytes, std::make_shared<const Topology>(view));
    }
  }
}

const Topology& Topology::for_operand_pool(double pool_bytes) const {
  if (pool_views_.empty() || !(pool_bytes > 0)) return *this;
  auto distance = [&](double pool) { return std::abs(std::log(pool / pool_bytes)); };
  const Topology* best = this;
  double nearest = distance(cluster_.calibration->gemm_operand_pool_bytes);
  for (const auto& [pool, topo] : pool_views_)
    if (distance(pool) < nearest) {
      nearest = distance(pool);
      best = topo.get();
    }
  return *best;
}

void Topology::index_hops() {
  // Directed link id of an edge taken from `from` to `to` (sim::Network's numbering).
  auto link = [](std::uint32_t edge, Vertex from, Vertex to) { return 2 * edge + (from < to ? 0u : 1u); };
  gpu_hops_.resize(gpu_vertices_.size());
  for (std::size_t g = 0; g < gpu_vertices_.size(); ++g) {
    GpuHops& h = gpu_hops_[g];
    const Vertex v = gpu_vertices_[g];
    h.node = static_cast<int>(g) / cluster_.gpus_per_node;
    h.first = static_cast<std::uint32_t>(h.node * cluster_.gpus_per_node);
    const Vertex nvs = nvswitch_vertices_[static_cast<std::size_t>(h.node)];
    h.nvswitch_up = link(gpu_nvswitch_edge_[g], v, nvs);
    h.nvswitch_down = link(gpu_nvswitch_edge_[g], nvs, v);
    if (g >= gpu_nic_.size()) continue;  // no inter-node network
    const auto nic = static_cast<std::size_t>(gpu_nic_[g]);
    const auto leaf = static_cast<std::size_t>(gpu_leaf_[g]);
    const Vertex nic_v = nic_vertices_[nic];
    const Vertex leaf_v = leaf_vertices_[leaf];
    h.leaf = static_cast<int>(leaf);
    h.up[0] = link(gpu_nic_edge_[g], v, nic_v);
    h.down[0] = link(gpu_nic_edge_[g], nic_v, v);
    h.up[1] = link(nic_up_edge_[nic], nic_v, leaf_v);
    h.down[1] = link(nic_up_edge_[nic], leaf_v, nic_v);
    h.depth = 2;
    if (leaf >= leaf_up_edge_.size()) continue;  // one leaf: no spine
    const auto pod = static_cast<std::size_t>(leaf_pod_[leaf]);
    const Vertex spine_v = spine_vertices_[pod];
    h.pod = static_cast<int>(pod);
    h.up[2] = link(leaf_up_edge_[leaf], leaf_v, spine_v);
    h.down[2] = link(leaf_up_edge_[leaf], spine_v, leaf_v);
    h.depth = 3;
    if (pod >= spine_up_edge_.size()) continue;  // one pod: no core
    h.up[3] = link(spine_up_edge_[pod], spine_v, core_vertices_[0]);
    h.down[3] = link(spine_up_edge_[pod], core_vertices_[0], spine_v);
    h.depth = 4;
  }
  gpu_latency_.assign(gpu_hops_.size(), GpuLatency{});
  for (std::size_t g = 0; g < gpu_hops_.size(); ++g) {
    const GpuHops& h = gpu_hops_[g];
    GpuLatency& l = gpu_latency_[g];
    l.nvswitch_ns = edges_[h.nvswitch_up / 2].latency_ns;
    std::int64_t sum = 0;
    for (std::size_t k = 0; k < h.depth; ++k) {
      sum += edges_[h.up[k] / 2].latency_ns;
      l.up_to[k] = sum;
    }
  }
  index_rails();
}

// Is the rotation of every node's GPUs by one an automorphism of the fabric
// that maps routes to routes? Per node and level, the GPUs' uplinks must be
// all one link (shared: the rotation fixes it) or all different (it moves
// them along), with equal capacities and latencies; the leaves must be one
// for the node or one per GPU in rail order (leaf(n, i) = leaf(n, 0) + i,
// leaf(n, 0) a multiple of the GPU count), so that two GPUs share a leaf
// exactly when their rotations do; and the node's GPUs must share a pod.
// Then rotating a route's ends rotates the route (route_ids decides its
// levels from leaf and pod equality alone).
void Topology::index_rails() {
  const int gpn = cluster_.gpus_per_node;
  const auto un = static_cast<std::size_t>(gpn);
  rail_symmetric_ = false;
  rail0_links_.clear();
  rail0_slots_.clear();
  rail0_slot_links_.clear();
  rail0_member_start_.clear();
  rail0_members_.clear();
  if (gpn < 2) return;
  auto same_edge = [&](std::uint32_t a, std::uint32_t b) {
    const EdgeRecord& x = edges_[a / 2];
    const EdgeRecord& y = edges_[b / 2];
    return x.bandwidth_Bps == y.bandwidth_Bps && x.latency_ns == y.latency_ns;
  };
  std::vector<std::uint32_t> ups;
  for (std::size_t base = 0; base < gpu_hops_.size(); base += un) {
    const GpuHops& h0 = gpu_hops_[base];
    const bool rail_leaves = h0.depth > 0 && gpu_hops_[base + 1].leaf != h0.leaf;
    if (rail_leaves && h0.leaf % gpn != 0) return;
    for (std::size_t i = 1; i < un; ++i) {
      const GpuHops& h = gpu_hops_[base + i];
      if (h.depth != h0.depth || h.pod != h0.pod) return;
      if (h.leaf != (rail_leaves ? h0.leaf + static_cast<int>(i) : h0.leaf)) return;
      if (!same_edge(h.nvswitch_up, h0.nvswitch_up) || h.nvswitch_up == h0.nvswitch_up) return;
    }
    std::uint8_t shared = 0;
    for (std::size_t k = 0; k < h0.depth; ++k) {
      // All one link, or all different.
      ups.clear();
      for (std::size_t i = 0; i < un; ++i) {
        const GpuHops& h = gpu_hops_[base + i];
        if (!same_edge(h.up[k], h0.up[k])) return;
        ups.push_back(h.up[k]);
      }
      std::sort(ups.begin(), ups.end());
      const auto distinct = static_cast<std::size_t>(std::unique(ups.begin(), ups.end()) - ups.begin());
      if (distinct == 1) shared = static_cast<std::uint8_t>(shared | (1u << k));
      else if (distinct != un) return;
    }
    for (std::size_t i = 0; i < un; ++i) gpu_hops_[base + i].shared = shared;
  }
  // Each link's rail-0 image: the same hop of the node's GPU 0.
  rail0_links_.assign(2 * edges_.size(), 0);
  for (std::uint32_t l = 0; l < rail0_links_.size(); ++l) rail0_links_[l] = l;
  for (std::size_t g = 0; g < gpu_hops_.size(); ++g) {
    const GpuHops& h = gpu_hops_[g];
    const GpuHops& h0 = gpu_hops_[h.first];
    rail0_links_[h.nvswitch_up] = h0.nvswitch_up;
    rail0_links_[h.nvswitch_down] = h0.nvswitch_down;
    for (std::size_t k = 0; k < h.depth; ++k) {
      rail0_links_[h.up[k]] = h0.up[k];
      rail0_links_[h.down[k]] = h0.down[k];
    }
  }
  // The images (the links that are their own), numbered in link id order.
  rail0_slots_.assign(rail0_links_.size(), 0);
  for (std::uint32_t l = 0; l < rail0_links_.size(); ++l) {
    if (rail0_links_[l] != l) continue;
    rail0_slots_[l] = static_cast<std::uint32_t>(rail0_slot_links_.size());
    rail0_slot_links_.push_back(l);
  }
  for (std::uint32_t l = 0; l < rail0_links_.size(); ++l) rail0_slots_[l] = rail0_slots_[rail0_links_[l]];
  // Each slot's links, in id order: counted, then placed.
  rail0_member_start_.assign(rail0_slot_links_.size() + 1, 0);
  for (std::uint32_t s : rail0_slots_) ++rail0_member_start_[s + 1];
  for (std::size_t s = 0; s + 1 < rail0_member_start_.size(); ++s) rail0_member_start_[s + 1] += rail0_member_start_[s];
  rail0_members_.assign(rail0_links_.size(), 0);
  std::vector<std::uint32_t> fill(rail0_member_start_.begin(), rail0_member_start_.end() - 1);
  for (std::uint32_t l = 0; l < rail0_links_.size(); ++l) rail0_members_[fill[rail0_slots_[l]]++] = l;
  rail_symmetric_ = true;
}

Topology::Vertex Topology::gpu_vertex(int global_gpu) const {
  if (global_gpu < 0 || global_gpu >= num_gpus()) {
    throw std::out_of_range("Topology: GPU " + std::to_string(global_gpu) + " outside 0.." +
                            std::to_string(num_gpus() - 1));
  }
  return gpu_vertices_[static_cast<std::size_t>(global_gpu)];
}

std::vector<Topology::Edge> Topology::route(int gpu_a, int gpu_b) const {
  const Vertex a = gpu_vertex(gpu_a);
  const Vertex b = gpu_vertex(gpu_b);
  std::vector<Edge> path;
  if (gpu_a == gpu_b) return path;
  const Shape s(cluster_);
  const int node_a = s.node_of(gpu_a);
  const int node_b = s.node_of(gpu_b);
  if (node_a == node_b) {
    const Vertex nvs = nvswitch_vertices_[static_cast<std::size_t>(node_a)];
    path.reserve(2);
    path.push_back(find_edge(graph_, a, nvs));
    path.push_back(find_edge(graph_, b, nvs));
    return path;
  }
  // Up from the source GPU only as far as the lowest switch both sides share, then down.
  const Vertex nic_a = nic_vertices_[static_cast<std::size_t>(s.nic_of(gpu_a))];
  const Vertex nic_b = nic_vertices_[static_cast<std::size_t>(s.nic_of(gpu_b))];
  const int leaf_a = s.leaf_of_gpu(gpu_a);
  const int leaf_b = s.leaf_of_gpu(gpu_b);
  const Vertex lv_a = leaf_vertices_[static_cast<std::size_t>(leaf_a)];
  const Vertex lv_b = leaf_vertices_[static_cast<std::size_t>(leaf_b)];
  path.reserve(8);
  path.push_back(find_edge(graph_, a, nic_a));
  path.push_back(find_edge(graph_, nic_a, lv_a));
  if (leaf_a != leaf_b) {
    const int pod_a = s.pod_of_leaf(leaf_a);
    const int pod_b = s.pod_of_leaf(leaf_b);
    const Vertex sp_a = spine_vertices_[static_cast<std::size_t>(pod_a)];
    const Vertex sp_b = spine_vertices_[static_cast<std::size_t>(pod_b)];
    path.push_back(find_edge(graph_, lv_a, sp_a));
    if (pod_a != pod_b) {
      path.push_back(find_edge(graph_, sp_a, core_vertices_[0]));
      path.push_back(find_edge(graph_, sp_b, core_vertices_[0]));
    }
    path.push_back(find_edge(graph_, lv_b, sp_b));
  }
  path.push_back(find_edge(graph_, nic_b, lv_b));
  path.push_back(find_edge(graph_, b, nic_b));
  return path;
}

// route() without Boost: the same hops, from the edge ids recorded while
// building (a 16k-GPU fabric asks for ~50k routes while planning its collectives).
void Topology::route_ids(int gpu_a, int gpu_b, std::vector<std::uint32_t>& out) const {
  std::uint32_t hops[kMaxRouteLinks];
  const std::size_t n = route_ids(gpu_a, gpu_b, hops);
  out.insert(out.end(), hops, hops + n);
}

void Topology::throw_bad_gpus(int gpu_a, int gpu_b) const {
  (void)gpu_vertex(gpu_a);  // throws for the one out of range
  (void)gpu_vertex(gpu_b);
  throw std::logic_error("Topology: GPU hop index out of step with the GPUs");
}

double Topology::bottleneck_bandwidth_Bps(const std::vector<Edge>& path) const {
  double bw = std::numeric_limits<double>::infinity();
  for (const Edge& e : path) bw = std::min(bw, graph_[e].bandwidth_Bps);
  return bw;
}

std::int64_t Topology::latency_ns(const std::vector<Edge>& path) const {
  std::int64_t ns = 0;
  for (const Edge& e : path) ns += graph_[e].latency_ns;
  return ns;
}

Tier Topology::tier(int gpu_a, int gpu_b) const {
  (void)gpu_vertex(gpu_a);
  (void)gpu_vertex(gpu_b);
  if (gpu_a == gpu_b) return Tier::same_gpu;
  const Shape s(cluster_);
  if (s.node_of(gpu_a) == s.node_of(gpu_b)) return Tier::nvlink;
  const int leaf_a = s.leaf_of_gpu(gpu_a);
  const int leaf_b = s.leaf_of_gpu(gpu_b);
  if (leaf_a == leaf_b) return Tier::leaf;
  return s.pod_of_leaf(leaf_a) == s.pod_of_leaf(leaf_b) ? Tier::spine : Tier::core;
}

int Topology::leaf_of(int gpu) const {
  (void)gpu_vertex(gpu);
  return gpu_leaf_.empty() ? -1 : gpu_leaf_[static_cast<std::size_t>(gpu)];
}

int Topology::pod_of(int gpu) const {
  const int leaf = leaf_of(gpu);
  return leaf < 0 ? -1 : leaf_pod_[static_cast<std::size_t>(leaf)];
}

Tier Topology::group_tier(const std::vector<int>& gpus) const {
  // Rail-optimised trees are not ultrametric (two GPUs of one node can sit on
  // different leaves), so every pair is checked; the loop stops at the tree's top.
  const Tier top = Shape(cluster_).top_tier();
  Tier worst = Tier::same_gpu;
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    for (std::size_t j = i + 1; j < gpus.size(); ++j) {
      worst = std::max(worst, tier(gpus[i], gpus[j]));
      if (worst == top) return worst;
    }
  }
  if (gpus.size() == 1) (void)gpu_vertex(gpus[0]);
  return worst;
}

}  // namespace cuboid
