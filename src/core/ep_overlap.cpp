#include "cuboid/core/ep_overlap.hpp"

#include <algorithm>
#include <limits>

#include "cuboid/core/schedule.hpp"

namespace cuboid {

EpNode ep_node(const EpSplit& s, std::size_t i) {
  if (i < s.ex0_begin) return EpNode::seg0;
  if (i < s.ex0_end) return EpNode::ex0;
  if (i < s.ex1_begin) return EpNode::seg1;
  if (i < s.ex1_end) return EpNode::ex1;
  return EpNode::seg2;
}

EpNode ep_waits_for(EpNode n) {
  switch (n) {
    case EpNode::seg0: return EpNode::seg0;
    case EpNode::ex0: return EpNode::seg0;
    case EpNode::seg1: return EpNode::ex0;
    case EpNode::seg1w: return EpNode::seg1;
    case EpNode::ex1: return EpNode::seg1;
    case EpNode::seg2: return EpNode::ex1;
    case EpNode::seg2w: return EpNode::seg2;
  }
  return EpNode::seg0;
}

int ep_seg_index(EpNode n) {
  switch (n) {
    case EpNode::seg1: return 1;
    case EpNode::seg2: return 2;
    case EpNode::seg1w: return 3;
    case EpNode::seg2w: return 4;
    default: return 0;
  }
}

double EpPassTimes::serial_ns() const {
  double t = ex[0] + ex[1];
  for (const EpSegment& s : seg) t += s.compute_ns + s.blocking_ns;
  return t;
}

namespace {

int ex_index(EpNode n) { return n == EpNode::ex0 ? 0 : 1; }

// Two FIFO streams, each node after the one before it in its own pass: the
// compute stream's kernels run at compute_ns / held_ns of their pace while
// the communication stream runs an exchange.
class PairPlayer {
 public:
  PairPlayer(const EpPassTimes& f, const EpPassTimes& b, bool delayed_wgrad) : pass_{&f, &b} {
    for (const EpPairStep& s : ep_pair_order(delayed_wgrad)) {
      if (is_exchange(s.node))
        comm_[nm_++] = s;
      else
        comp_[nc_++] = s;
    }
  }

  EpPairTime play() {
    while (start_ready()) advance();
    EpPairTime r;
    r.paired_ns = t_;
    for (const EpPassTimes* p : pass_) {
      r.serial_ns += p->serial_ns();
      r.exchange_ns += p->ex[0] + p->ex[1];
      for (const EpSegment& s : p->seg) r.sm_cost_ns -= s.compute_ns + s.blocking_ns;
    }
    r.sm_cost_ns += comp_busy_;
    r.exposed_ns = t_ - comp_busy_;
    return r;
  }

 private:
  bool ready(const EpPairStep& s) const {
    return s.node == EpNode::seg0 || done_[s.backward ? 1 : 0][static_cast<int>(ep_waits_for(s.node))];
  }
  void finish(const EpPairStep& s) { done_[s.backward ? 1 : 0][static_cast<int>(s.node)] = true; }
  const EpSegment& seg(const EpPairStep& s) const {
    return pass_[s.backward ? 1 : 0]->seg[static_cast<std::size_t>(ep_seg_index(s.node))];
  }

  // Starts each stream's next node if it may; false once both are done.
  bool start_ready() {
    for (bool moved = true; moved;) {
      moved = false;
      if (!comm_on_ && mi_ < nm_ && ready(comm_[mi_])) {
        const double d = pass_[comm_[mi_].backward ? 1 : 0]->ex[ex_index(comm_[mi_].node)];
        if (d <= 0) {
          finish(comm_[mi_++]);
          moved = true;
        } else {
          comm_on_ = true;
          comm_end_ = t_ + d;
        }
      }
      if (!comp_on_ && ci_ < nc_ && ready(comp_[ci_])) {
        const EpSegment& s = seg(comp_[ci_]);
        if (s.compute_ns + s.blocking_ns <= 0) {
          finish(comp_[ci_++]);
          moved = true;
        } else {
          comp_on_ = true;
          work_ = s.compute_ns;
          blocking_ = s.blocking_ns;
        }
      }
    }
    return comp_on_ || comm_on_;
  }

  void advance() {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    double rate = 1.0;
    if (comp_on_ && comm_on_) {
      const EpSegment& s = seg(comp_[ci_]);
      if (s.held_ns > s.compute_ns && s.compute_ns > 0) rate = s.compute_ns / s.held_ns;
    }
    const double comp_dt = !comp_on_ ? kInf : work_ > 0 ? work_ / rate : blocking_;
    const double comm_dt = comm_on_ ? comm_end_ - t_ : kInf;
    const double dt = std::min(comp_dt, comm_dt);
    if (comp_on_) {
      comp_busy_ += dt;
      if (work_ > 0)
        work_ = dt == comp_dt ? 0 : work_ - dt * rate;
      else
        blocking_ = dt == comp_dt ? 0 : blocking_ - dt;
      if (work_ <= 0 && blocking_ <= 0) {
        comp_on_ = false;
        finish(comp_[ci_++]);
      }
    }
    t_ += dt;
    if (comm_on_ && dt == comm_dt) {
      comm_on_ = false;
      finish(comm_[mi_++]);
    }
  }

  std::array<const EpPassTimes*, 2> pass_;
  std::array<EpPairStep, 8> comp_{};
  std::array<EpPairStep, 4> comm_{};
  std::size_t nc_ = 0, nm_ = 0, ci_ = 0, mi_ = 0;
  bool done_[2][7]{};
  bool comp_on_ = false, comm_on_ = false;
  double t_ = 0, comm_end_ = 0, work_ = 0, blocking_ = 0, comp_busy_ = 0;
};

}  // namespace

EpPairTime ep_pair_time(const EpPassTimes& f, const EpPassTimes& b, bool delayed_wgrad) {
  return PairPlayer(f, b, delayed_wgrad).play();
}

int ep_overlap_steps(int pp, int stage, int micro_batches, int virtual_stages) {
  if (pp <= 1) return ep_overlap_pairs(micro_batches);
  const int total = micro_batches * virtual_stages;
  return total - warmup_steps(Schedule::interleaved, pp, stage, micro_batches, virtual_stages, true);
}

std::vector<int> ep_overlap_chunk_steps(int pp, int stage, int micro_batches, int virtual_stages) {
  const int v = std::max(1, virtual_stages);
  std::vector<int> out(static_cast<std::size_t>(v * v), 0);
  if (pp <= 1) {
    out[0] = ep_overlap_pairs(micro_batches);
    return out;
  }
  const int w = micro_batches * v - ep_overlap_steps(pp, stage, micro_batches, v);
  const int group = pp * v;
  for (int k = 0; k + w < micro_batches * v; ++k) {
    const int f = ((k + w) % group) / pp;
    const int b = v - 1 - (k % group) / pp;
    ++out[static_cast<std::size_t>(f * v + b)];
  }
  return out;
}

}  // namespace cuboid
