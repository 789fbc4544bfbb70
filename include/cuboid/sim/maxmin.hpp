#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// Max-min fair sharing by progressive filling, the network model's solver kept
// apart from it as SimGrid keeps its lmm solver (src/kernel/lmm/) apart from
// its network models. Variables (flows) load constraints (links) with a
// weight each: constraint c holds sum_v weight(v, c) * rate(v) <= capacity(c).
// Every unfixed variable's rate rises together; the first constraint to fill,
// or the first variable to reach its own bound, fixes the variables on it at
// the current level; repeat until every variable is fixed.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace cuboid::sim {

class MaxMinSolver {
 public:
  // Solves one problem (a connected component, for the network) given as
  //   p.num_constraints(), p.num_variables()
  //   p.capacity(c)                 constraint c's capacity
  //   p.bound(v)                    variable v's own upper bound (+inf: none)
  //   p.for_each_term(c, f)         f(v, weight) for each variable on c, in a
  //                                 fixed order; none at all: c does not bind
  //                                 (its limit is part of its variable's bound)
  //   p.for_each_constraint(v, f)   f(c, weight) for each binding constraint of v
  //   p.fix(v, rate)                v's rate, once per variable, in fixing order
  // Ties (equal levels) go to the lower index, constraints before variables:
  // the order is part of the result (rates are summed in it).
  template <typename Problem>
  void solve(Problem& p);
  // Constraint c's capacity left after the last solve (capacity - load).
  double slack(std::uint32_t c) const { return slack_[c]; }

 private:
  struct LevelEntry {
    double level = 0;
    std::uint32_t index = 0;  // < constraints: a constraint; else constraints + variable
  };
  static bool later(const LevelEntry& a, const LevelEntry& b) {
    return a.level != b.level ? a.level > b.level : a.index > b.index;
  }
  // Kept between solves: the network solves at every flow start and end.
  std::vector<double> slack_, weight_sum_;
  std::vector<LevelEntry> heap_;
  // Variable v is fixed when fixed_[v] == stamp_: a new solve takes a new
  // stamp instead of clearing the table.
  std::vector<std::uint32_t> fixed_;
  std::uint32_t stamp_ = 0;
};

// Constraint c fills at level slack / weight_sum (slack: capacity minus what
// fixed variables take; every unfixed variable sits at the common level).
// Fixing a variable at level x <= slack / weight_sum only raises its
// constraints' levels, so heap keys are lower bounds: a popped constraint is
// checked against its current level and pushed back if that is higher (lazy
// increase-key). O((constraints + variables) log) per solve, plus the terms of
// the fixed variables.
template <typename Problem>
void MaxMinSolver::solve(Problem& p) {
  const std::uint32_t nc = p.num_constraints();
  const std::uint32_t nv = p.num_variables();
  slack_.assign(nc, 0.0);
  weight_sum_.assign(nc, 0.0);
  if (fixed_.size() < nv) fixed_.resize(nv, stamp_);
  if (++stamp_ == 0) {  // wrapped: no entry may look fixed
    std::fill(fixed_.begin(), fixed_.end(), 0u);
    stamp_ = 1;
  }
  for (std::uint32_t c = 0; c < nc; ++c) {
    slack_[c] = p.capacity(c);
    double w = 0;
    p.for_each_term(c, [&](std::uint32_t, double weight) { w += weight; });
    weight_sum_[c] = w;
  }
  heap_.clear();
  for (std::uint32_t c = 0; c < nc; ++c) {
    if (weight_sum_[c] > 0) heap_.push_back(LevelEntry{slack_[c] / weight_sum_[c], c});
  }
  for (std::uint32_t v = 0; v < nv; ++v) heap_.push_back(LevelEntry{p.bound(v), nc + v});
  std::make_heap(heap_.begin(), heap_.end(), later);
  const auto fix = [&](std::uint32_t v, double level) {
    fixed_[v] = stamp_;
    p.for_each_constraint(v, [&](std::uint32_t c, double w) {
      slack_[c] -= w * level;
      weight_sum_[c] -= w;
      // Rounding leaves a fully fixed constraint a crumb of weight.
      if (weight_sum_[c] <= 1e-12 * w) weight_sum_[c] = 0;
    });
    p.fix(v, level);
  };
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const LevelEntry top = heap_.back();
    heap_.pop_back();
    const double level = std::max(0.0, top.level);
    if (top.index >= nc) {
      const std::uint32_t v = top.index - nc;
      if (fixed_[v] != stamp_) fix(v, level);
      continue;
    }
    if (weight_sum_[top.index] <= 0) continue;  // every variable on it is fixed
    const double current = slack_[top.index] / weight_sum_[top.index];
    if (current > level * (1 + 1e-12) + 1e-9) {
      heap_.push_back(LevelEntry{current, top.index});
      std::push_heap(heap_.begin(), heap_.end(), later);
      continue;
    }
    p.for_each_term(top.index, [&](std::uint32_t v, double) {
      if (fixed_[v] != stamp_) fix(v, level);
    });
  }
}

// A problem held in plain tables, for tests and one-off uses: add the
// constraints, the variables and their terms, then solve.
class MaxMinSystem {
 public:
  static constexpr double kUnbounded = std::numeric_limits<double>::infinity();
  std::uint32_t add_constraint(double capacity);
  std::uint32_t add_variable(double bound = kUnbounded);
  // Variable v loads constraint c with `weight` (> 0); a pair given twice adds up.
  void add_term(std::uint32_t v, std::uint32_t c, double weight = 1.0);
  // Every variable's rate, by index.
  std::vector<double> solve();
  // Constraint c's load after solve(), and its capacity minus that.
  double load(std::uint32_t c) const { return capacity_[c] - solver_.slack(c); }

  // The solver's interface (MaxMinSolver::solve).
  std::uint32_t num_constraints() const { return static_cast<std::uint32_t>(capacity_.size()); }
  std::uint32_t num_variables() const { return static_cast<std::uint32_t>(bound_.size()); }
  double capacity(std::uint32_t c) const { return capacity_[c]; }
  double bound(std::uint32_t v) const { return bound_[v]; }
  template <typename F>
  void for_each_term(std::uint32_t c, F&& f) const {
    for (const Term& t : on_constraint_[c]) f(t.other, t.weight);
  }
  template <typename F>
  void for_each_constraint(std::uint32_t v, F&& f) const {
    for (const Term& t : on_variable_[v]) f(t.other, t.weight);
  }
  void fix(std::uint32_t v, double rate) { rate_[v] = rate; }

 private:
  struct Term {
    std::uint32_t other = 0;  // the variable (in a constraint's list) or the constraint (in a variable's)
    double weight = 0;
  };
  std::vector<double> capacity_, bound_, rate_;
  std::vector<std::vector<Term>> on_constraint_, on_variable_;
  MaxMinSolver solver_;
};

}  // namespace cuboid::sim
