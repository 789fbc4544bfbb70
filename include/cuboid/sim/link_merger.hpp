#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// Merges a phase's link uses into distinct links with summed weights, as
// the network registers them: a bit set of the links seen, each one's summed
// weight, and the list of them. Indexed by the network's table index (a link
// id, or its rail-0 image's slot when folded).
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <vector>

#include "cuboid/sim/zeroed_array.hpp"

namespace cuboid::sim {

class LinkMerger {
 public:
  using Index = std::uint32_t;
  // Starts a merge over `size` indices (the tables are made, or remade, when
  // the size changes; `mem` holds the weights). Indices left from a merge a
  // throw cut short are cleared here.
  void begin(std::size_t size, std::pmr::memory_resource* mem) {
    if (weight_.size() != size) {
      weight_ = ZeroedArray<double>(size, mem);
      seen_.assign((size + 63) / 64, 0);
      listed_.clear();
    }
    for (Index i : listed_) seen_[i >> 6] = 0;
    listed_.clear();
  }
  bool sized_for(std::size_t size) const { return weight_.size() == size; }
  // A use of index i with weight w. Weights of one index are summed in the
  // order they are added.
  [[gnu::always_inline]] void add(Index i, double w) {
    std::uint64_t& word = seen_[i >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (i & 63);
    if ((word & bit) == 0) {
      word |= bit;
      listed_.push_back(i);
      weight_[i] = w;
    } else {
      weight_[i] += w;
    }
  }
  // The summed weight of an index added since begin (or set directly, for a
  // caller that merges on its own).
  double& weight(Index i) { return weight_[i]; }
  double weight(Index i) const { return weight_[i]; }
  // The merged indices in increasing order into `out`, the bit set cleared.
  // Many of them (a mirrored ring or p2p: thousands) are read off the bit
  // set, cheaper than sorting them; a few are sorted.
  void end(std::vector<Index>& out) {
    out.clear();
    if (listed_.size() * 16 >= seen_.size()) {
      out.reserve(listed_.size());
      for (std::size_t w = 0; w < seen_.size(); ++w) {
        for (std::uint64_t bits = seen_[w]; bits != 0; bits &= bits - 1) {
          out.push_back(static_cast<Index>(64 * w + static_cast<std::size_t>(std::countr_zero(bits))));
        }
        seen_[w] = 0;
      }
    } else {
      out.assign(listed_.begin(), listed_.end());
      std::sort(out.begin(), out.end());
      for (Index i : out) seen_[i >> 6] = 0;
    }
    listed_.clear();
  }

 private:
  ZeroedArray<double> weight_;  // only read where seen_ (or weight()) has set it
  std::vector<std::uint64_t> seen_;
  std::vector<Index> listed_;   // in first-use order
};

}  // namespace cuboid::sim
