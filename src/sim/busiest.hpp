#pragma once
// The k busiest of a stream of links: highest peak utilisation first, ties
// in link order (what a stable sort of them all by peak would put first),
// whatever order they come in, kept in a fixed array, so a fabric of any size
// costs no allocation. The report shows 8.
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
  // Each link at most once.
  void offer(LinkId l, const LinkStats& st) {
    const double p = st.peak_utilisation;
    std::size_t at = n_;
    while (at > 0 && before(p, l, top_[at - 1])) --at;
    if (at == K) return;
    if (n_ < K) ++n_;
    for (std::size_t i = n_ - 1; i > at; --i) top_[i] = top_[i - 1];
    top_[at] = Entry{l, st};
  }
  // Would this link, with this peak, get in? (False: no later link of that
  // peak or lower can, since the bar only rises.)
  bool could_take(double peak, LinkId l) const { return n_ < K || before(peak, l, top_[K - 1]); }
  std::size_t size() const { return n_; }
  const Entry& operator[](std::size_t i) const { return top_[i]; }

 private:
  static bool before(double p, LinkId l, const Entry& e) {
    return e.stats.peak_utilisation < p || (e.stats.peak_utilisation == p && l < e.link);
  }
  std::array<Entry, K> top_{};
  std::size_t n_ = 0;
};

}  // namespace cuboid::sim::detail
