#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// NCCL's collectives, one row each: the facts every layer prices them with.
// Source: nccl-tests src/{all_reduce,reduce_scatter,all_gather,broadcast,
// sendrecv,alltoall}.cu (the *GetBw bus factors) and NCCL's ring algorithm
// (the steps). All-to-all is no ring: NCCL runs it as one grouped send and
// receive per peer, all at once (one latency step); its "size" is the whole
// buffer per rank, of which each peer gets size / n, and nccl-tests' alltoall
// bus factor is (n - 1) / n, the bytes that leave a rank.
#include <array>
#include <cstddef>
#include <string_view>

namespace cuboid {

enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, send_recv, all_to_all };

struct CollectiveTraits {
  Collective op;
  std::string_view name;
  // On a ring of n ranks each rank sends bus_scale (n - 1) / n + bus_offset
  // times the size (nccl-tests "size"): nccl-tests' bus-bandwidth factor.
  double bus_scale;
  double bus_offset;
  // The ring's sequential steps (its latency terms): step_scale (n - 1) + step_offset.
  double step_scale;
  double step_offset;

  constexpr double ring_bytes(double n) const { return bus_scale * (n - 1.0) / n + bus_offset; }
  constexpr double ring_steps(double n) const { return step_scale * (n - 1.0) + step_offset; }
};

inline constexpr std::array<CollectiveTraits, 6> kCollectiveTraits{{
    //                                               bus_scale  bus_offset  step_scale  step_offset
    {Collective::all_reduce, "all_reduce",           2.0,       0.0,        2.0,        0.0},
    {Collective::reduce_scatter, "reduce_scatter",   1.0,       0.0,        1.0,        0.0},
    {Collective::all_gather, "all_gather",           1.0,       0.0,        1.0,        0.0},
    {Collective::broadcast, "broadcast",             0.0,       1.0,        1.0,        0.0},
    {Collective::send_recv, "send_recv",             0.0,       1.0,        0.0,        1.0},
    {Collective::all_to_all, "all_to_all",           1.0,       0.0,        0.0,        1.0},
}};

static_assert([] {
  for (std::size_t i = 0; i < kCollectiveTraits.size(); ++i) {
    if (static_cast<std::size_t>(kCollectiveTraits[i].op) != i) return false;
  }
  return true;
}());

constexpr const CollectiveTraits& traits(Collective c) { return kCollectiveTraits[static_cast<std::size_t>(c)]; }

// Bytes each rank sends on a ring of n ranks, per byte of size.
constexpr double ring_bytes(Collective c, int n) { return traits(c).ring_bytes(static_cast<double>(n)); }
constexpr double ring_steps(Collective c, int n) { return traits(c).ring_steps(static_cast<double>(n)); }

// NCCL's bus-bandwidth factor (busbw = algbw x factor); a group of one moves
// nothing, so its factor is 0.
constexpr double bus_factor(Collective c, int n) { return n <= 1 ? 0.0 : ring_bytes(c, n); }

}  // namespace cuboid
