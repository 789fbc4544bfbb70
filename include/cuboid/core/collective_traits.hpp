#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// NCCL's collectives, one row each: the facts every layer prices them with.
// Source: nccl-tests src/{all_reduce,reduce_scatter,all_gather,broadcast,
// sendrecv}.cu (the *GetBw bus factors) and NCCL's ring algorithm (the steps).
#include <array>
#include <cstddef>
#include <string_view>

namespace cuboid {

enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, send_recv };

struct CollectiveTraits {
  Collective op;
  std::string_view name;
  // Bytes each rank sends on a ring of n ranks, as a fraction of the size
  // (nccl-tests "size"); equal to nccl-tests' bus-bandwidth factor.
  double (*ring_bytes)(double n);
  // Latency terms (alpha) of the ring: its number of sequential steps.
  double (*ring_steps)(double n);
};

// Each expression keeps the operation order the cost model and simulator
// always used, so results stay bit-identical.
inline constexpr std::array<CollectiveTraits, 5> kCollectiveTraits{{
    {Collective::all_reduce, "all_reduce", [](double n) { return 2.0 * (n - 1.0) / n; },
     [](double n) { return 2.0 * (n - 1.0); }},
    {Collective::reduce_scatter, "reduce_scatter", [](double n) { return (n - 1.0) / n; },
     [](double n) { return n - 1.0; }},
    {Collective::all_gather, "all_gather", [](double n) { return (n - 1.0) / n; }, [](double n) { return n - 1.0; }},
    {Collective::broadcast, "broadcast", [](double) { return 1.0; }, [](double n) { return n - 1.0; }},
    {Collective::send_recv, "send_recv", [](double) { return 1.0; }, [](double) { return 1.0; }},
}};

// The table is indexed by the enum.
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
