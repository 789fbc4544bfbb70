#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// The network's two route caches: each GPU pair's directed links
// (RouteCache), and the link sets of big route lists already registered
// (RouteSetCache).
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cuboid/core/topology.hpp"

namespace cuboid::sim {

using LinkId = std::uint32_t;
using LinkSetId = std::uint32_t;

// A GPU-to-GPU route of a flow (over Topology::route), counted `weight` times.
struct Route {
  int src_gpu = 0;
  int dst_gpu = 0;
  double weight = 1.0;
};

// Topology::route_ids per (src, dst) pair, compiled on first use. The links
// live in fixed blocks, never moved, so a span handed out stays valid as long
// as the cache.
class RouteCache {
 public:
  // `mem` holds the blocks (null: the default heap); not owned.
  explicit RouteCache(std::pmr::memory_resource* mem = nullptr) : mem_(mem) {}
  std::span<const LinkId> links(const Topology& topo, int src_gpu, int dst_gpu);

 private:
  static constexpr std::size_t kBlock = 4096;
  std::pmr::memory_resource* mem_ = nullptr;
  std::unordered_map<std::uint64_t, std::span<const LinkId>> by_pair_;  // (src, dst) -> links in blocks_
  std::vector<std::pmr::vector<LinkId>> blocks_;
  std::size_t block_used_ = 0;
};

// Route lists of kMinSize routes or more and the link set each was
// registered as: a DP group's reduce-scatter and all-gather rings are the
// same routes over the same links, compiled and registered once. Lists are
// equal when their pairs, weights (bit for bit) and order are.
class RouteSetCache {
 public:
  static constexpr std::size_t kMinSize = 64;
  explicit RouteSetCache(std::pmr::memory_resource* mem = nullptr) : mem_(mem) {}
  static bool cacheable(std::span<const Route> routes) { return routes.size() >= kMinSize; }
  static std::uint64_t hash(std::span<const Route> routes);
  // The set of an equal list added with the same `rail0_part`, given its hash.
  std::optional<LinkSetId> find(std::uint64_t hash, std::span<const Route> routes, bool rail0_part) const;
  void add(std::uint64_t hash, std::span<const Route> routes, bool rail0_part, LinkSetId set);

 private:
  struct Entry {
    std::pmr::vector<Route> routes;
    LinkSetId set = 0;
    bool rail0_part = false;  // routes is a folded list's rail-0 part (Network::add_rail0_route_set)
  };
  std::pmr::memory_resource* mem_ = nullptr;
  std::vector<Entry> entries_;
  std::unordered_multimap<std::uint64_t, std::uint32_t> index_;  // hash -> entries_
};

}  // namespace cuboid::sim
