#pragma once
// The k busiest of a stream of links seen in id order: highest peak
// utilisation first, ties in link order (what a stable sort of them all by
// peak would put first), kept in a fixed array, so a 100k-link fabric costs
// no allocation. The report shows 8.
#include <array>
#include <cstddef>

#include "cuboid/sim/network.hpp"

namespace cuboid::sim::detail {

template <std::size_t K>
class BusiestLinks {
 public:
  struct Entry {
    LinkId link = 0;
    LinkStats stats;
  };
  // Links must come in increasing id order.
  void offer(LinkId l, const LinkStats& st) {
    const double p = st.peak_utilisation;
    std::size_t at = n_;
    while (at > 0 && top_[at - 1].stats.peak_utilisation < p) --at;  // a tie stays behind
    if (at == K) return;
    if (n_ < K) ++n_;
    for (std::size_t i = n_ - 1; i > at; --i) top_[i] = top_[i - 1];
    top_[at] = Entry{l, st};
  }
  std::size_t size() const { return n_; }
  const Entry& operator[](std::size_t i) const { return top_[i]; }

 private:
  std::array<Entry, K> top_{};
  std::size_t n_ = 0;
};

}  // namespace cuboid::sim::detail
