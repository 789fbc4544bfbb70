// The max-min fair-sharing solver (maxmin.hpp) on small problems whose rates
// are computed by hand: equal and weighted shares, bottlenecks elsewhere,
// variable bounds, a constraint shared by several variables, ties.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "cuboid/sim/maxmin.hpp"

using namespace cuboid::sim;

namespace {

// A MaxMinSystem that records the order in which the solver fixes its variables.
struct Recorder {
  MaxMinSystem& s;
  std::vector<std::uint32_t> order;
  std::uint32_t num_constraints() const { return s.num_constraints(); }
  std::uint32_t num_variables() const { return s.num_variables(); }
  double capacity(std::uint32_t c) const { return s.capacity(c); }
  double bound(std::uint32_t v) const { return s.bound(v); }
  template <typename F>
  void for_each_term(std::uint32_t c, F&& f) const { s.for_each_term(c, f); }
  template <typename F>
  void for_each_constraint(std::uint32_t v, F&& f) const { s.for_each_constraint(v, f); }
  void fix(std::uint32_t v, double) { order.push_back(v); }
};

}  // namespace

TEST_CASE("maxmin: two variables on one constraint get half each") {
  MaxMinSystem s;
  const auto link = s.add_constraint(10);
  const auto a = s.add_variable();
  const auto b = s.add_variable();
  s.add_term(a, link);
  s.add_term(b, link);
  const std::vector<double> r = s.solve();
  CHECK(r[a] == doctest::Approx(5));
  CHECK(r[b] == doctest::Approx(5));
  CHECK(s.load(link) == doctest::Approx(10));
}

TEST_CASE("maxmin: a variable bottlenecked elsewhere leaves its share to the others") {
  // a and b share link 0 (10); b alone also crosses link 1 (2): b = 2, a = 10 - 2.
  MaxMinSystem s;
  const auto shared = s.add_constraint(10);
  const auto narrow = s.add_constraint(2);
  const auto a = s.add_variable();
  const auto b = s.add_variable();
  s.add_term(a, shared);
  s.add_term(b, shared);
  s.add_term(b, narrow);
  const std::vector<double> r = s.solve();
  CHECK(r[b] == doctest::Approx(2));
  CHECK(r[a] == doctest::Approx(8));
  CHECK(s.load(shared) == doctest::Approx(10));
  CHECK(s.load(narrow) == doctest::Approx(2));
}

TEST_CASE("maxmin: weights share a constraint by weighted load at one common rate") {
  // a loads the link once, b twice (two of its routes cross it): r + 2r = 12.
  MaxMinSystem s;
  const auto link = s.add_constraint(12);
  const auto a = s.add_variable();
  const auto b = s.add_variable();
  s.add_term(a, link, 1.0);
  s.add_term(b, link, 2.0);
  const std::vector<double> r = s.solve();
  CHECK(r[a] == doctest::Approx(4));
  CHECK(r[b] == doctest::Approx(4));
  CHECK(s.load(link) == doctest::Approx(12));
}

TEST_CASE("maxmin: a variable's own bound caps it and the rest goes to the others") {
  MaxMinSystem s;
  const auto link = s.add_constraint(10);
  const auto capped = s.add_variable(3);
  const auto free = s.add_variable();
  s.add_term(capped, link);
  s.add_term(free, link);
  const std::vector<double> r = s.solve();
  CHECK(r[capped] == doctest::Approx(3));
  CHECK(r[free] == doctest::Approx(7));
}

TEST_CASE("maxmin: a chain of constraints, each several variables (a link class's flows)") {
  // Link 0 (capacity 1) carries a and b; link 1 (capacity 2) carries b, c
  // and d. Link 0 fills first at 1/2 (a = b = 1/2); link 1 then has 3/2
  // for c and d: 3/4 each. The third link (100) carries everyone and never fills.
  MaxMinSystem s;
  const auto l0 = s.add_constraint(1);
  const auto l1 = s.add_constraint(2);
  const auto wide = s.add_constraint(100);
  const auto a = s.add_variable();
  const auto b = s.add_variable();
  const auto c = s.add_variable();
  const auto d = s.add_variable();
  for (auto v : {a, b}) s.add_term(v, l0);
  for (auto v : {b, c, d}) s.add_term(v, l1);
  for (auto v : {a, b, c, d}) s.add_term(v, wide);
  const std::vector<double> r = s.solve();
  CHECK(r[a] == doctest::Approx(0.5));
  CHECK(r[b] == doctest::Approx(0.5));
  CHECK(r[c] == doctest::Approx(0.75));
  CHECK(r[d] == doctest::Approx(0.75));
  CHECK(s.load(wide) == doctest::Approx(2.5));
}

TEST_CASE("maxmin: a term given twice adds up; an unloaded variable is unbounded") {
  MaxMinSystem s;
  const auto link = s.add_constraint(9);
  const auto a = s.add_variable();
  const auto b = s.add_variable();
  const auto idle = s.add_variable();
  s.add_term(a, link);
  s.add_term(a, link);  // weight 2
  s.add_term(b, link);
  const std::vector<double> r = s.solve();
  CHECK(r[a] == doctest::Approx(3));
  CHECK(r[b] == doctest::Approx(3));
  CHECK(r[idle] == MaxMinSystem::kUnbounded);
}

TEST_CASE("maxmin: a saturated constraint fixes its variables in term order, once each") {
  // Both links fill at 5; the lower index (link 0) is taken first and fixes
  // its variables in term order, b then a; link 1 then fixes c alone (b is
  // fixed already). Link 1 first would give b, c, a.
  MaxMinSystem s;
  const auto l0 = s.add_constraint(10);
  const auto l1 = s.add_constraint(10);
  const auto a = s.add_variable();
  const auto b = s.add_variable();
  const auto c = s.add_variable();
  s.add_term(b, l0);
  s.add_term(a, l0);
  s.add_term(b, l1);
  s.add_term(c, l1);
  Recorder rec{s, {}};
  MaxMinSolver solver;
  solver.solve(rec);
  CHECK(rec.order == std::vector<std::uint32_t>{b, a, c});
  CHECK(solver.slack(l0) == doctest::Approx(0));
  CHECK(solver.slack(l1) == doctest::Approx(0));
}

TEST_CASE("maxmin: bad input throws") {
  MaxMinSystem s;
  CHECK_THROWS_AS(s.add_constraint(-1), std::invalid_argument);
  const auto link = s.add_constraint(1);
  const auto v = s.add_variable();
  CHECK_THROWS_AS(s.add_term(v, link, 0), std::invalid_argument);
  CHECK_THROWS_AS(s.add_term(v + 1, link), std::out_of_range);
}
