// Route compilation for the network: GPU-to-GPU routes into merged link
// uses and registered link sets, and rail folding (routes walked on their
// rail-0 images).
#include <algorithm>
#include <array>
#include <bit>
#include <optional>
#include <stdexcept>

#include "cuboid/sim/network.hpp"

namespace cuboid::sim {

std::span<const LinkId> Network::route_links(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  return routes_.links(*topo_, src_gpu, dst_gpu);
}

TimeNs Network::route_latency_ns(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  return topo_->route_latency_ns(src_gpu, dst_gpu);
}

// Adds the routes' links to the merger: the same result as appending every
// route's links and merge_uses. Each link's weights are summed in route
// order (merge_uses sums them in its sort's order; the collectives give all
// uses of one link the same weight, so the sums agree bit for bit), without
// sorting the thousands of uses of a mirrored phase.
void Network::merge_routes(std::span<const Route> routes) {
  LinkId hops[Topology::kMaxRouteLinks];
  for (const Route& r : routes) {
    const std::size_t n = topo_->route_ids(r.src_gpu, r.dst_gpu, hops);
    for (std::size_t i = 0; i < n; ++i) merger_.add(hops[i], r.weight);
  }
}

void Network::fold_rails() {
  if (topo_ == nullptr || !topo_->rail_symmetric()) {
    throw std::logic_error("Network: rail folding needs a rail-symmetric topology");
  }
  if (!sets_.empty()) throw std::logic_error("Network: rail folding must come before any link set");
  slot_of_ = topo_->rail0_slots().data();
  slot_link_ = topo_->rail0_slot_links().data();
  num_slots_ = topo_->rail0_slot_links().size();
  init_classes();  // no set yet: every slot in class 0, as every link was
}

// merge_routes over the routes from local GPU 0, each hop on its rail-0
// image; a hop all rails share takes the weight once per rail (added one by
// one: the same sum as the full list gives it, when its weights are equal).
// A whole list (rail0_part false): checks it has as many routes from each
// local GPU (a rotation-closed list has; the converse is the caller's
// promise) and skips the others. A rail-0 part: every route must start on
// local GPU 0.
void Network::merge_routes_folded(std::span<const Route> routes, bool rail0_part) {
  const int gpn = topo_->cluster().gpus_per_node;
  std::array<std::uint32_t, 64> from_local{};
  LinkId hops[Topology::kMaxRouteLinks];
  std::uint8_t fixed[Topology::kMaxRouteLinks];
  const int gpus = topo_->num_gpus();
  // GPU g is local GPU g mod gpn: a mask for the usual power of two (the
  // skipped routes then cost no load of their GPU's hop index).
  const bool pow2 = (gpn & (gpn - 1)) == 0;
  for (const Route& r : routes) {
    if (r.src_gpu < 0 || r.src_gpu >= gpus) (void)topo_->gpu_vertex(r.src_gpu);  // throws
    const int local = pow2 ? (r.src_gpu & (gpn - 1)) : topo_->local_index(r.src_gpu);
    if (rail0_part) {
      if (local != 0) {
        throw std::invalid_argument("Network: a rail-0 route list has a route from GPU " + std::to_string(r.src_gpu) +
                                    " (local GPU " + std::to_string(local) + ")");
      }
    } else {
      if (local < static_cast<int>(from_local.size())) ++from_local[static_cast<std::size_t>(local)];
      if (local != 0) continue;
    }
    const std::size_t n = topo_->route_ids_rail0(r.src_gpu, r.dst_gpu, hops, fixed);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t slot = slot_of_[hops[i]];
      merger_.add(slot, r.weight);
      if (fixed[i] != 0) {
        for (int k = 1; k < gpn; ++k) merger_.weight(slot) += r.weight;
      }
    }
  }
  if (rail0_part) return;
  for (int i = 1; i < std::min<int>(gpn, static_cast<int>(from_local.size())); ++i) {
    if (from_local[static_cast<std::size_t>(i)] != from_local[0]) {
      throw std::logic_error("Network: a folded route list is not closed under the rail rotation");
    }
  }
}

void Network::compile_routes(std::span<const Route> routes, std::vector<LinkUse>& out) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  if (rails_folded()) {
    // The merger holds rail-0 slots; these are links. merge_uses keeps each
    // link's uses in order, so their weights are summed as the merger sums them.
    LinkId hops[Topology::kMaxRouteLinks];
    for (const Route& r : routes) {
      const std::size_t n = topo_->route_ids(r.src_gpu, r.dst_gpu, hops);
      for (std::size_t i = 0; i < n; ++i) out.push_back(LinkUse{hops[i], r.weight});
    }
    merge_uses(out);
    return;
  }
  merger_.begin(num_slots_, mem_);
  for (const LinkUse& u : out) merger_.add(u.link, u.weight);
  merge_routes(routes);
  merger_.end(set_links_);
  out.clear();
  out.reserve(set_links_.size());
  for (LinkId l : set_links_) out.push_back(LinkUse{l, merger_.weight(l)});
}

// Stable: a link's weights are summed in the order they were listed.
void Network::merge_uses(std::vector<LinkUse>& uses) {
  std::stable_sort(uses.begin(), uses.end(), [](const LinkUse& a, const LinkUse& b) { return a.link < b.link; });
  std::size_t w = 0;
  for (std::size_t i = 0; i < uses.size(); ++i) {
    if (w > 0 && uses[w - 1].link == uses[i].link) {
      uses[w - 1].weight += uses[i].weight;
    } else {
      uses[w++] = uses[i];
    }
  }
  uses.resize(w);
}

LinkSetId Network::add_route_set(std::span<const Route> routes) { return add_routes(routes, false); }

LinkSetId Network::add_rail0_route_set(std::span<const Route> rail0_routes) {
  if (!rails_folded()) throw std::logic_error("Network: add_rail0_route_set needs folded rails (fold_rails)");
  return add_routes(rail0_routes, true);
}

LinkSetId Network::add_routes(std::span<const Route> routes, bool rail0_part) {
  const bool cached = RouteSetCache::cacheable(routes);
  std::uint64_t key = 0;
  if (cached) {
    key = RouteSetCache::hash(routes);
    if (const std::optional<LinkSetId> set = route_sets_.find(key, routes, rail0_part)) return *set;
  }
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  merger_.begin(num_slots_, mem_);
  if (rails_folded()) merge_routes_folded(routes, rail0_part);
  else merge_routes(routes);
  merger_.end(set_links_);
  const LinkSetId set = register_links(set_links_);
  if (cached) route_sets_.add(key, routes, rail0_part, set);
  return set;
}

}  // namespace cuboid::sim
