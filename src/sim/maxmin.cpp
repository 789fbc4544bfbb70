// The plain-table problem of the max-min solver (maxmin.hpp).
#include "cuboid/sim/maxmin.hpp"

#include <stdexcept>

namespace cuboid::sim {

std::uint32_t MaxMinSystem::add_constraint(double capacity) {
  if (!(capacity >= 0)) throw std::invalid_argument("MaxMinSystem: a capacity must be >= 0");
  capacity_.push_back(capacity);
  on_constraint_.emplace_back();
  return static_cast<std::uint32_t>(capacity_.size() - 1);
}

std::uint32_t MaxMinSystem::add_variable(double bound) {
  if (!(bound >= 0)) throw std::invalid_argument("MaxMinSystem: a bound must be >= 0");
  bound_.push_back(bound);
  rate_.push_back(0.0);
  on_variable_.emplace_back();
  return static_cast<std::uint32_t>(bound_.size() - 1);
}

void MaxMinSystem::add_term(std::uint32_t v, std::uint32_t c, double weight) {
  if (v >= bound_.size() || c >= capacity_.size()) throw std::out_of_range("MaxMinSystem: no such variable or constraint");
  if (!(weight > 0)) throw std::invalid_argument("MaxMinSystem: a weight must be > 0");
  for (Term& t : on_variable_[v]) {
    if (t.other != c) continue;
    t.weight += weight;
    for (Term& u : on_constraint_[c]) {
      if (u.other == v) u.weight += weight;
    }
    return;
  }
  on_variable_[v].push_back(Term{c, weight});
  on_constraint_[c].push_back(Term{v, weight});
}

std::vector<double> MaxMinSystem::solve() {
  solver_.solve(*this);
  return rate_;
}

}  // namespace cuboid::sim
