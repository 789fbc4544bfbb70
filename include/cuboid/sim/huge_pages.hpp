#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// Memory for the simulator's tables. A simulation builds its task graph in
// fresh memory and then visits it in time order, not in the order it was
// built: with 4 KiB pages every new page is a page fault, and a 2 MiB
// transparent huge page is one fault for 512 of them (and one TLB entry).
// What the faults cost: docs/internals/sim.md.
//
//   huge_page_resource()  blocks of 2 MiB and more on huge-page-aligned
//                         mappings with huge pages requested (Linux madvise;
//                         elsewhere, or when the kernel says no, ordinary
//                         pages), smaller ones from operator new.
//   SimArena              a per-simulation monotonic arena over it: every
//                         table of one simulation is carved from 2 MiB+
//                         blocks and all of it is unmapped at once.
// Same contents either way: only where the bytes live changes.
#include <cstddef>
#include <memory_resource>

namespace cuboid::sim {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Stateless and thread-safe (each block is its own mapping); lives forever.
std::pmr::memory_resource* huge_page_resource();

// Monotonic: a freed block (a regrown vector's old storage) is reused only
// when the arena goes; reserve what can be reserved. Not thread-safe, like
// the simulation that owns it.
class SimArena : public std::pmr::monotonic_buffer_resource {
 public:
  // The blocks grow from here; only the pages touched count in memory, and
  // each block's last huge page is part used, so fewer, bigger blocks waste less.
  static constexpr std::size_t kFirstBlock = std::size_t{16} << 20;
  SimArena() : std::pmr::monotonic_buffer_resource(kFirstBlock, huge_page_resource()) {}
};

}  // namespace cuboid::sim
