// The network's route caches (route_cache.hpp).
#include "cuboid/sim/route_cache.hpp"

#include <algorithm>
#include <bit>

namespace cuboid::sim {

namespace {

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xFF51AFD7ED558CCDull;
}

// Hashes of a few evenly spaced entries and the length: a lookup compares
// the whole content anyway, so the hash only has to tell most misses apart.
constexpr std::size_t kHashSamples = 16;

bool same_routes(std::span<const Route> a, std::span<const Route> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const Route& x, const Route& y) {
    return x.src_gpu == y.src_gpu && x.dst_gpu == y.dst_gpu &&
           std::bit_cast<std::uint64_t>(x.weight) == std::bit_cast<std::uint64_t>(y.weight);
  });
}

}  // namespace

std::span<const LinkId> RouteCache::links(const Topology& topo, int src_gpu, int dst_gpu) {
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(src_gpu)) << 32) |
                            static_cast<std::uint32_t>(dst_gpu);
  auto it = by_pair_.find(key);
  if (it == by_pair_.end()) {
    LinkId hops[Topology::kMaxRouteLinks];
    const std::size_t n = topo.route_ids(src_gpu, dst_gpu, hops);
    if (blocks_.empty() || block_used_ + n > kBlock) {
      blocks_.emplace_back(std::max(kBlock, n), LinkId{0}, mem_ != nullptr ? mem_ : std::pmr::get_default_resource());
      block_used_ = 0;
    }
    LinkId* links = blocks_.back().data() + block_used_;
    std::copy(hops, hops + n, links);
    block_used_ += n;
    it = by_pair_.emplace(key, std::span<const LinkId>(links, n)).first;
  }
  return it->second;
}

std::uint64_t RouteSetCache::hash(std::span<const Route> routes) {
  std::uint64_t h = routes.size();
  const std::size_t step = std::max<std::size_t>(1, routes.size() / kHashSamples);
  for (std::size_t i = 0; i < routes.size(); i += step) {
    const Route& r = routes[i];
    h = mix(h, (static_cast<std::uint64_t>(static_cast<std::uint32_t>(r.src_gpu)) << 32) | static_cast<std::uint32_t>(r.dst_gpu));
    h = mix(h, std::bit_cast<std::uint64_t>(r.weight));
  }
  return h;
}

std::optional<LinkSetId> RouteSetCache::find(std::uint64_t hash, std::span<const Route> routes, bool rail0_part) const {
  for (auto [it, end] = index_.equal_range(hash); it != end; ++it) {
    const Entry& e = entries_[it->second];
    if (e.rail0_part == rail0_part && same_routes(e.routes, routes)) return e.set;
  }
  return std::nullopt;
}

void RouteSetCache::add(std::uint64_t hash, std::span<const Route> routes, bool rail0_part, LinkSetId set) {
  index_.emplace(hash, static_cast<std::uint32_t>(entries_.size()));
  entries_.push_back(Entry{std::pmr::vector<Route>(routes.begin(), routes.end(),
                                                   mem_ != nullptr ? mem_ : std::pmr::get_default_resource()),
                           set, rail0_part});
}

}  // namespace cuboid::sim
