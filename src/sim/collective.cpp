// Collective algorithms as phases of flows. Each phase is one flow (one rate
// variable) whose routes are the algorithm's edges, with per-route weights
// that encode channels: k channels each carrying 1/k of the data are routes of
// weight 1/k, so a link used by one channel gets 1/k of the load and a link
// used by all of them (a GPU's NVLink) the full load.
#include "cuboid/sim/collective.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuboid/core/busbw_curve.hpp"
#include "cuboid/core/collective_traits.hpp"
#include "cuboid/core/calibration.hpp"

namespace cuboid::sim {

namespace {

constexpr std::array<AlgorithmInfo, 4> kAlgorithms{{
    {"auto", "NCCL-like choice: ring inside a node; ring or tree by alpha-beta estimate for all_reduce across nodes"},
    {"ring", "ring (chain for broadcast); across nodes one channel per local GPU, each on its own rail (PXN)"},
    {"tree", "double binary tree across nodes with an intra-node chain, one channel per local GPU (all_reduce)"},
    {"hierarchical", "intra-node reduce-scatter, inter-node all-reduce of S/k per rail, intra-node all-gather"},
}};

// An edge of the algorithm between two members (indices into ranks), weight w.
struct IdxEdge {
  int from = 0;
  int to = 0;
  double weight = 1.0;
};

// Members grouped by node, nodes in order of first appearance: per node a
// span of indices into ranks, all in one flat vector (a DP group of 128
// nodes would otherwise allocate 128 vectors per collective planned).
struct NodeLayout {
  NodeLayout() = default;
  NodeLayout(const NodeLayout&) = delete;  // the spans point into `order`
  NodeLayout& operator=(const NodeLayout&) = delete;
  NodeLayout(NodeLayout&&) noexcept = default;  // a moved vector keeps its buffer
  NodeLayout& operator=(NodeLayout&&) noexcept = default;
  std::vector<std::span<const int>> members;  // per node: indices into ranks
  int max_per_node = 0;
  int min_per_node = 0;

 private:
  friend NodeLayout layout_of(const Topology& topo, const std::vector<int>& ranks);
  std::vector<int> order;
};

NodeLayout layout_of(const Topology& topo, const std::vector<int>& ranks) {
  const int gpn = std::max(1, topo.cluster().gpus_per_node);
  NodeLayout out;
  // (node, index) sorted: each node's members in index order; the nodes then
  // in order of their first member (a DP group of 128 nodes: no quadratic search).
  std::vector<std::pair<int, int>> by_node;
  by_node.reserve(ranks.size());
  for (int i = 0; i < static_cast<int>(ranks.size()); ++i) by_node.emplace_back(ranks[static_cast<std::size_t>(i)] / gpn, i);
  std::sort(by_node.begin(), by_node.end());
  std::vector<std::pair<int, std::size_t>> firsts;  // (first member, where its node starts in by_node)
  for (std::size_t k = 0; k < by_node.size(); ++k) {
    if (k == 0 || by_node[k].first != by_node[k - 1].first) firsts.emplace_back(by_node[k].second, k);
  }
  std::sort(firsts.begin(), firsts.end());
  out.order.reserve(by_node.size());
  std::vector<std::size_t> starts;
  starts.reserve(firsts.size() + 1);
  for (const auto& [first, at] : firsts) {
    starts.push_back(out.order.size());
    const int node = by_node[at].first;
    for (std::size_t k = at; k < by_node.size() && by_node[k].first == node; ++k) out.order.push_back(by_node[k].second);
  }
  starts.push_back(out.order.size());
  out.members.reserve(firsts.size());
  out.min_per_node = std::numeric_limits<int>::max();
  for (std::size_t n = 0; n + 1 < starts.size(); ++n) {
    const std::span<const int> m(out.order.data() + starts[n], starts[n + 1] - starts[n]);
    out.members.push_back(m);
    out.max_per_node = std::max(out.max_per_node, static_cast<int>(m.size()));
    out.min_per_node = std::min(out.min_per_node, static_cast<int>(m.size()));
  }
  return out;
}

int at(std::span<const int> v, int i) {
  const int n = static_cast<int>(v.size());
  return v[static_cast<std::size_t>(((i % n) + n) % n)];
}

// Ring edges. One node: a single ring in rank order. Several nodes: k channels
// (k = most members on a node); channel c enters each node at its member c,
// visits the node's members, returns to member c over NVLink (PXN: the data
// reaches the GPU on the rail) and leaves through member c's NIC to member c
// of the next node, so inter-node traffic stays on rail c.
void ring_edges(const NodeLayout& lay, std::vector<IdxEdge>& out) {
  if (lay.members.size() == 1) {
    const auto& m = lay.members[0];
    const int n = static_cast<int>(m.size());
    for (int i = 0; i < n; ++i) out.push_back({m[static_cast<std::size_t>(i)], at(m, i + 1), 1.0});
    return;
  }
  const int k = lay.max_per_node;
  const double w = 1.0 / k;
  const int nodes = static_cast<int>(lay.members.size());
  for (int c = 0; c < k; ++c) {
    for (int j = 0; j < nodes; ++j) {
      const auto& m = lay.members[static_cast<std::size_t>(j)];
      const int kn = static_cast<int>(m.size());
      if (kn > 1) {
        for (int i = 0; i < kn; ++i) out.push_back({at(m, c + i), at(m, c + i + 1), w});
      }
      out.push_back({at(m, c), at(lay.members[static_cast<std::size_t>((j + 1) % nodes)], c), w});
    }
  }
}

// A send/recv: of two ranks one message, 0 -> 1; of more a ring shift, each
// rank to the next in the group's order over one connection (nccl-tests'
// sendrecv_perf, the CP ring of send/recv pairs).
void shift_edges(int n, std::vector<IdxEdge>& out) {
  if (n == 2) {
    out.push_back({0, 1, 1.0});
    return;
  }
  for (int i = 0; i < n; ++i) out.push_back({i, (i + 1) % n, 1.0});
}

// Double binary tree among `count` items: tree 0 is heap-shaped over
// positions 0..count-1, tree 1 the same over the reversed order, so most
// inner nodes of one tree are leaves of the other (NCCL's construction differs
// in detail, not in load). Calls edge(parent, child) for both trees.
template <typename F>
void double_binary_tree(int count, F&& edge) {
  for (int t = 0; t < 2; ++t) {
    for (int p = 1; p < count; ++p) {
      const int parent = (p - 1) / 2;
      if (t == 0) edge(parent, p);
      else edge(count - 1 - parent, count - 1 - p);
    }
  }
}

int tree_depth(int count) {
  int d = 0;
  while ((1 << (d + 1)) <= count) ++d;
  return d;  // floor(log2(count))
}

// The group's routes over `edges`: the representative's, then each mirror's.
void group_routes(const CommGroup& g, const std::vector<IdxEdge>& edges, std::vector<Route>& routes) {
  routes.reserve(edges.size() * (1 + g.mirrors.size()));
  auto take = [&](std::span<const int> ranks) {
    for (const IdxEdge& e : edges) {
      routes.push_back({ranks[static_cast<std::size_t>(e.from)], ranks[static_cast<std::size_t>(e.to)], e.weight});
    }
  };
  take(g.ranks);
  for (const auto& m : g.mirrors) take(m);
}

CommPhase make_phase(Network& net, const CommGroup& g, const std::vector<IdxEdge>& edges, double bytes_per_size,
                     double steps) {
  CommPhase ph;
  ph.bytes_per_size = bytes_per_size;
  TimeNs alpha = 0;
  for (const IdxEdge& e : edges) {
    alpha = std::max(alpha, net.route_latency_ns(g.ranks[static_cast<std::size_t>(e.from)],
                                                 g.ranks[static_cast<std::size_t>(e.to)]));
  }
  ph.latency_ns = static_cast<TimeNs>(std::llround(steps * static_cast<double>(alpha)));
  // A rail-0 group (folded rails only, check_group) is the part of its family
  // that leaves local GPU 0: the network walks it as the whole family. Any
  // other list the network folds itself (checking it closed) or walks.
  std::vector<Route> routes;
  group_routes(g, edges, routes);
  ph.set = g.rail0_part ? net.add_rail0_route_set(routes) : net.add_route_set(routes);
  return ph;
}

// The representative's uncontended rate over its own edges (mirrors aside):
// min over its links of capacity / weight.
double representative_rate_Bps(Network& net, const CommGroup& g, const std::vector<IdxEdge>& edges) {
  std::vector<Route> own;
  own.reserve(edges.size());
  for (const IdxEdge& e : edges) {
    own.push_back({g.ranks[static_cast<std::size_t>(e.from)], g.ranks[static_cast<std::size_t>(e.to)], e.weight});
  }
  std::vector<LinkUse> uses;
  net.compile_routes(own, uses);
  double rate_Bps = std::numeric_limits<double>::infinity();
  for (const LinkUse& u : uses) rate_Bps = std::min(rate_Bps, net.link_capacity_Bps(u.link) / u.weight);
  return rate_Bps;
}

void plan_ring(Network& net, Collective op, const CommGroup& g, const NodeLayout& lay, CollectivePlan& plan) {
  const int n = static_cast<int>(g.ranks.size());
  double volume = ring_bytes(op, n);
  const double steps = ring_steps(op, n);
  std::vector<IdxEdge> edges;
  if (op == Collective::send_recv) {
    shift_edges(static_cast<int>(g.ranks.size()), edges);
  } else {
    // Broadcast is a pipelined chain; it is modelled on the full ring (one
    // extra edge loaded back into the root, same uncontended time).
    ring_edges(lay, edges);
  }
  // NVLink SHARP (H100/H200) reduces in the switch: an intra-node all-reduce
  // reaches allreduce_busbw, above the other collectives' busbw that the
  // links are scaled to. Fewer bytes cross the links, so scale the bytes.
  const Cluster& c = net.topology()->cluster();
  if (op == Collective::all_reduce && lay.members.size() == 1 && net.options().achievable_bandwidth &&
      c.intra.allreduce_busbw_GBps > 0 && c.intra.busbw_GBps > 0) {
    volume *= c.intra.busbw_GBps / c.intra.allreduce_busbw_GBps;
  }
  CommPhase ph = make_phase(net, g, edges, volume, steps);
  // The size-dependent busbw of the node's fabric (achievable rates only:
  // the curve is an nccl-tests measurement, like the busbw the links carry).
  const bool curved_op = op == Collective::all_reduce || op == Collective::reduce_scatter ||
                         op == Collective::all_gather;
  if (curved_op && lay.members.size() == 1 && net.options().achievable_bandwidth && c.intra.allreduce_busbw_curve) {
    const double rate_Bps = representative_rate_Bps(net, g, edges);
    if (std::isfinite(rate_Bps) && rate_Bps > 0) {
      ph.curve = c.intra.allreduce_busbw_curve.get();
      ph.collective = op;
      ph.group_size = n;
      ph.rate_Bps = rate_Bps;
    }
  }
  plan.phases.push_back(std::move(ph));
}

// Tree all-reduce: per channel c, a chain through each node's members from
// member c (reduce up, broadcast down: both directions) and a double binary
// tree among the nodes' members c. Each tree carries half of the data.
void plan_tree(Network& net, const CommGroup& g, const NodeLayout& lay, CollectivePlan& plan) {
  const int nodes = static_cast<int>(lay.members.size());
  const int k = lay.max_per_node;
  const double w = 1.0 / k;
  std::vector<IdxEdge> edges;
  for (int c = 0; c < k; ++c) {
    for (const auto& m : lay.members) {
      const int kn = static_cast<int>(m.size());
      for (int i = 0; i + 1 < kn; ++i) {
        edges.push_back({at(m, c + i), at(m, c + i + 1), w});
        edges.push_back({at(m, c + i + 1), at(m, c + i), w});
      }
    }
    double_binary_tree(nodes, [&](int parent, int child) {
      const int a = at(lay.members[static_cast<std::size_t>(parent)], c);
      const int b = at(lay.members[static_cast<std::size_t>(child)], c);
      edges.push_back({b, a, 0.5 * w});  // reduce
      edges.push_back({a, b, 0.5 * w});  // broadcast
    });
  }
  // Latency: up and down the inter-node tree and the intra-node chain. The
  // phase's alpha is its slowest edge, so count chain hops at that alpha too
  // (NCCL's tree latency model is similarly coarse).
  const double steps = 2.0 * (tree_depth(nodes) + (lay.max_per_node - 1));
  plan.phases.push_back(make_phase(net, g, edges, 1.0, std::max(1.0, steps)));
}

void plan_hierarchical(Network& net, const CommGroup& g, const NodeLayout& lay, CollectivePlan& plan) {
  const int k = lay.max_per_node;
  const int nodes = static_cast<int>(lay.members.size());
  std::vector<IdxEdge> intra;
  for (const auto& m : lay.members) {
    for (int i = 0; i < k; ++i) intra.push_back({at(m, i), at(m, i + 1), 1.0});
  }
  std::vector<IdxEdge> inter;
  for (int r = 0; r < k; ++r) {
    for (int j = 0; j < nodes; ++j) {
      inter.push_back({at(lay.members[static_cast<std::size_t>(j)], r),
                       at(lay.members[static_cast<std::size_t>((j + 1) % nodes)], r), 1.0});
    }
  }
  // Reduce-scatter inside the node, an all-reduce of 1/k of the data across
  // nodes on each rail, all-gather inside the node.
  const double dk = k;
  const double dm = nodes;
  const CollectiveTraits& rs = traits(Collective::reduce_scatter);
  const CollectiveTraits& ar = traits(Collective::all_reduce);
  const CollectiveTraits& ag = traits(Collective::all_gather);
  plan.phases.push_back(make_phase(net, g, intra, rs.ring_bytes(dk), rs.ring_steps(dk)));
  plan.phases.push_back(make_phase(net, g, inter, ar.ring_bytes(dm) / dk, ar.ring_steps(dm)));
  plan.phases.push_back(make_phase(net, g, intra, ag.ring_bytes(dk), ag.ring_steps(dk)));
}

// The calibrated fit of this collective over this group (tier: one node or
// several), or null when the card has none.
const CollectiveCalibration* calibrated_fit(const Network& net, Collective op, const CommGroup& g,
                                            const NodeLayout& lay) {
  const Topology* topo = net.topology();
  if (topo == nullptr || !topo->cluster().calibration) return nullptr;
  return find_collective(*topo->cluster().calibration, op, lay.members.size() == 1 ? "intra_node" : "inter_node",
                         static_cast<int>(g.ranks.size()), g.cold_buffers);
}

// A calibrated collective: the measured curve replaces the algorithm's
// alpha-beta model, whatever algorithm the library ran when it was measured.
// Its traffic still crosses the ring's links, so other flows and the group's
// mirrors contend with it as before: one ring phase whose bytes are scaled so
// that, alone on the network, the representative's ring (rate: min over its
// links of capacity / weight) drains and then waits its latency in exactly
// the curve's time T(S) (phase_flow_bytes / phase_latency_ns: the samples
// interpolated inside their sizes; outside, the fit: S x bus factor / busbw
// of flow, then alpha). bytes_per_size / latency_ns keep the fit's line.
void plan_calibrated(Network& net, Collective op, const CommGroup& g, const NodeLayout& lay,
                     const CollectiveCalibration& fit, CollectivePlan& plan) {
  std::vector<IdxEdge> edges;
  if (op == Collective::send_recv) {
    shift_edges(static_cast<int>(g.ranks.size()), edges);
  } else {
    ring_edges(lay, edges);
  }
  const double rate_Bps = representative_rate_Bps(net, g, edges);
  CommPhase ph = make_phase(net, g, edges, 0.0, 0.0);
  if (std::isfinite(rate_Bps) && fit.busbw_GBps > 0) {
    ph.bytes_per_size = bus_factor(op, static_cast<int>(g.ranks.size())) * rate_Bps / (fit.busbw_GBps * 1e9);
  }
  ph.latency_ns = static_cast<TimeNs>(std::llround(fit.alpha_ns));
  if (std::isfinite(rate_Bps) && rate_Bps > 0) {
    ph.calibrated = &fit;
    ph.collective = op;
    ph.group_size = static_cast<int>(g.ranks.size());
    ph.rate_Bps = rate_Bps;
  }
  plan.algorithm = Algorithm::ring;
  plan.phases.push_back(std::move(ph));
}

// All-to-all (nccl-tests' alltoall: NCCL groups one send and one receive per
// peer, all at once): every member sends size / n to every other member, as
// one phase of one flow (the members' sends are issued together and finish
// together on a symmetric fabric) and one latency. Inside a node the send
// crosses NVLink; to another node it goes as NCCL's PXN sends it (on by
// default since NCCL 2.12): over NVLink to the GPU of the sender's node on
// the destination's rail, then over that GPU's NIC on the rail. So a node's
// NICs carry (n - k) / n of each member's size and stay off the spine of a
// rail-optimised tree, as cost.cpp's all-to-all busbw assumes.
void all_to_all_routes(std::span<const int> ranks, int gpn, std::vector<Route>& out) {
  for (const int a : ranks)
    for (const int b : ranks) {
      if (a == b) continue;
      if (a / gpn == b / gpn) {
        out.push_back({a, b, 1.0});
        continue;
      }
      const int proxy = a / gpn * gpn + b % gpn;
      if (proxy != a) out.push_back({a, proxy, 1.0});
      out.push_back({proxy, b, 1.0});
    }
}

// A dispatcher's exchange (CommGroup::dispatch): from every member once to
// each other node of the group, on its own rail, and to each other member
// of its node over NVLink, at the weights dispatch_traffic gives.
void dispatch_routes(std::span<const int> ranks, int gpn, const CommGroup::DispatchWeights& w, std::vector<Route>& out) {
  std::vector<int> nodes;
  for (const int b : ranks)
    if (std::find(nodes.begin(), nodes.end(), b / gpn) == nodes.end()) nodes.push_back(b / gpn);
  for (const int a : ranks) {
    if (w.node > 0)
      for (const int node : nodes)
        if (node != a / gpn) out.push_back({a, node * gpn + a % gpn, w.node});
    if (w.nvlink > 0)
      for (const int b : ranks)
        if (b != a && b / gpn == a / gpn) out.push_back({a, b, w.nvlink});
  }
}

void plan_dispatch(Network& net, const CommGroup& g, CollectivePlan& plan) {
  const int gpn = std::max(1, net.topology()->cluster().gpus_per_node);
  std::vector<Route> routes;
  dispatch_routes(g.ranks, gpn, *g.dispatch, routes);
  for (const auto& m : g.mirrors) dispatch_routes(m, gpn, *g.dispatch, routes);
  CommPhase ph;
  ph.bytes_per_size = 1.0;
  TimeNs alpha = 0;
  for (const int a : g.ranks)
    for (const int b : g.ranks)
      if (a != b) alpha = std::max(alpha, net.route_latency_ns(a, b));
  ph.latency_ns = alpha;
  if (!routes.empty()) ph.set = net.add_route_set(routes);
  plan.algorithm = Algorithm::ring;  // reported as the default algorithm
  plan.phases.push_back(std::move(ph));
}

void plan_all_to_all(Network& net, const CommGroup& g, const CollectiveCalibration* fit, CollectivePlan& plan) {
  const int n = static_cast<int>(g.ranks.size());
  const int gpn = std::max(1, net.topology()->cluster().gpus_per_node);
  std::vector<Route> own;
  all_to_all_routes(g.ranks, gpn, own);
  std::vector<Route> routes = own;
  for (const auto& m : g.mirrors) all_to_all_routes(m, gpn, routes);
  CommPhase ph;
  ph.bytes_per_size = 1.0 / n;
  TimeNs alpha = 0;
  for (const int a : g.ranks)
    for (const int b : g.ranks)
      if (a != b) alpha = std::max(alpha, net.route_latency_ns(a, b));
  ph.latency_ns = alpha;
  ph.set = net.add_route_set(routes);
  if (fit != nullptr) {
    // As plan_calibrated: the same flow, its bytes scaled so that alone it
    // drains and waits in the measured time.
    std::vector<LinkUse> uses;
    net.compile_routes(own, uses);
    double rate_Bps = std::numeric_limits<double>::infinity();
    for (const LinkUse& u : uses) rate_Bps = std::min(rate_Bps, net.link_capacity_Bps(u.link) / u.weight);
    ph.bytes_per_size = 0;
    if (std::isfinite(rate_Bps) && fit->busbw_GBps > 0)
      ph.bytes_per_size = bus_factor(Collective::all_to_all, n) * rate_Bps / (fit->busbw_GBps * 1e9);
    ph.latency_ns = static_cast<TimeNs>(std::llround(fit->alpha_ns));
    if (std::isfinite(rate_Bps) && rate_Bps > 0) {
      ph.calibrated = fit;
      ph.collective = Collective::all_to_all;
      ph.group_size = n;
      ph.rate_Bps = rate_Bps;
    }
  }
  plan.algorithm = Algorithm::ring;  // NCCL's p2p; reported as the default algorithm
  plan.phases.push_back(std::move(ph));
}

void check_group(const Network& net, const CommGroup& g) {
  if (net.topology() == nullptr) throw std::logic_error("collective: the network has no topology");
  if (g.rail0_part && !net.rails_folded()) {
    throw std::logic_error("collective: a rail-0 group (CommGroup::rail0_part) needs a network with folded rails");
  }
  const int total = net.topology()->num_gpus();
  auto check_ranks = [total](std::span<const int> r) {
    for (int x : r) {
      if (x < 0 || x >= total) throw std::out_of_range("collective: GPU " + std::to_string(x) + " outside the cluster");
    }
  };
  check_ranks(g.ranks);
  for (const auto& m : g.mirrors) {
    if (m.size() != g.ranks.size()) throw std::invalid_argument("collective: a mirror group differs in size");
    check_ranks(m);
  }
}

}  // namespace

double phase_flow_bytes(const CommPhase& ph, double size_bytes) {
  if (ph.curve != nullptr) {
    const double line_bytes = ph.bytes_per_size * size_bytes;
    const auto t_ns = curve_time_ns(*ph.curve, ph.collective, ph.group_size, size_bytes);
    if (!t_ns) return line_bytes;
    return std::max(line_bytes, (*t_ns - static_cast<double>(ph.latency_ns)) * 1e-9 * ph.rate_Bps);
  }
  if (ph.calibrated == nullptr) return ph.bytes_per_size * size_bytes;
  const double t_ns = collective_curve_ns(*ph.calibrated, ph.collective, ph.group_size, size_bytes);
  return std::max(0.0, t_ns - std::min(ph.calibrated->alpha_ns, t_ns)) * 1e-9 * ph.rate_Bps;
}

TimeNs phase_latency_ns(const CommPhase& ph, double size_bytes) {
  if (ph.calibrated == nullptr) return ph.latency_ns;
  const double t_ns = collective_curve_ns(*ph.calibrated, ph.collective, ph.group_size, size_bytes);
  return static_cast<TimeNs>(std::llround(std::min(ph.calibrated->alpha_ns, t_ns)));
}

std::span<const AlgorithmInfo> collective_algorithms() { return kAlgorithms; }

std::string_view to_string(Algorithm a) { return kAlgorithms[static_cast<std::size_t>(a)].name; }

Algorithm parse_algorithm(std::string_view name) {
  for (std::size_t i = 0; i < kAlgorithms.size(); ++i) {
    if (kAlgorithms[i].name == name) return static_cast<Algorithm>(i);
  }
  std::string known;
  for (const auto& a : kAlgorithms) known += (known.empty() ? "" : ", ") + std::string(a.name);
  throw std::invalid_argument("unknown collective algorithm '" + std::string(name) + "' (known: " + known + ")");
}

// NCCL picks the algorithm with the lowest predicted time from its tuning
// model (src/graph/tuning.cc). Here: ring inside a node (NCCL's intra-node
// default without NVLS); for an all_reduce across nodes the lower of the two
// alpha-beta estimates, with the same per-node bandwidth B (k rails):
//   ring: 2(n-1)/n * S / B + 2(n-1) alpha
//   tree: 2 * S / B + 2(log2(nodes) + k - 1) alpha   (busiest tree link carries 2S)
// so the tree wins for small messages over many ranks, the ring for large ones.
Algorithm choose_algorithm(Network& net, Collective op, const CommGroup& group, double size_bytes) {
  if (op != Collective::all_reduce || group.ranks.size() <= 2 || net.topology() == nullptr) return Algorithm::ring;
  const Topology& topo = *net.topology();
  const NodeLayout lay = layout_of(topo, group.ranks);
  if (lay.members.size() <= 1) return Algorithm::ring;
  if (calibrated_fit(net, op, group, lay) != nullptr) return Algorithm::ring;  // the fit is played as a ring
  const Cluster& c = topo.cluster();
  const double B = lay.max_per_node * std::max(1e-9, c.inter.nic_busbw_GBps) * 1e9;
  const double alpha = c.inter.latency_ns * 1e-9;
  const double n = static_cast<double>(group.ranks.size());
  const CollectiveTraits& ar = traits(Collective::all_reduce);
  const double ring = ar.ring_bytes(n) * size_bytes / B + ar.ring_steps(n) * alpha;
  const double tree = 2.0 * size_bytes / B +
                      2.0 * (tree_depth(static_cast<int>(lay.members.size())) + lay.max_per_node - 1) * alpha;
  return tree < ring ? Algorithm::tree : Algorithm::ring;
}

CollectivePlan plan_collective(Network& net, Collective op, const CommGroup& group, Algorithm algo) {
  if (algo == Algorithm::automatic) throw std::invalid_argument("plan_collective: resolve 'auto' first");
  check_group(net, group);
  CollectivePlan plan;
  plan.algorithm = algo;
  const int n = static_cast<int>(group.ranks.size());
  if (n <= 1) return plan;
  const NodeLayout lay = layout_of(*net.topology(), group.ranks);
  if (group.dispatch) {
    plan_dispatch(net, group, plan);
    return plan;
  }
  if (op == Collective::all_to_all) {
    if (group.rail0_part) throw std::invalid_argument("collective: an all-to-all group cannot be a rail-0 part");
    plan_all_to_all(net, group, calibrated_fit(net, op, group, lay), plan);
    return plan;
  }
  if (const CollectiveCalibration* fit = calibrated_fit(net, op, group, lay)) {
    plan_calibrated(net, op, group, lay, *fit, plan);
    return plan;
  }
  const bool multi_node = lay.members.size() > 1;
  if (op != Collective::all_reduce || !multi_node || op == Collective::send_recv) algo = Algorithm::ring;
  if (algo == Algorithm::hierarchical && (lay.min_per_node != lay.max_per_node || lay.max_per_node == 1)) {
    algo = Algorithm::ring;  // uneven or one GPU per node: the flat ring is the hierarchy
  }
  plan.algorithm = algo;
  switch (algo) {
    case Algorithm::tree: plan_tree(net, group, lay, plan); break;
    case Algorithm::hierarchical: plan_hierarchical(net, group, lay, plan); break;
    default: plan_ring(net, op, group, lay, plan); break;
  }
  return plan;
}

}  // namespace cuboid::sim
