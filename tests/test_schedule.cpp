// Pipeline schedules: completeness, causality, hand-written orders of small
// cases, and a minimal event replay (unit times, no communication) whose
// bubble must equal the textbook (p - 1) / (v m).
#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cuboid/core/schedule.hpp"

using namespace cuboid;

namespace {

// "F0" / "B3" for v = 1, "F0.1" (micro-batch 0, chunk 1) otherwise.
std::string render(const StageOrder& order, bool chunks) {
  std::string out;
  for (const ScheduleStep& s : order) {
    if (!out.empty()) out += ' ';
    out += s.dir == Direction::forward ? 'F' : 'B';
    out += std::to_string(s.micro_batch);
    if (chunks) out += "." + std::to_string(s.chunk);
  }
  return out;
}

// Minimal replay: each stage runs its steps in order on one "stream"; a step
// starts when the stage is free and its input is ready (forward: the previous
// virtual stage's forward; backward: the next virtual stage's backward, or
// this micro-batch's last forward). Communication is free. Returns the
// makespan, or -1 on deadlock.
double replay(const std::vector<StageOrder>& orders, int v, double tf, double tb) {
  const int pp = static_cast<int>(orders.size());
  const int vstages = pp * v;
  std::map<std::tuple<int, int, int>, double> done;  // (dir, mb, virtual stage) -> end time
  std::vector<std::size_t> next(orders.size(), 0);
  std::vector<double> free_at(orders.size(), 0.0);
  double makespan = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      const auto us = static_cast<std::size_t>(s);
      while (next[us] < orders[us].size()) {
        const ScheduleStep& st = orders[us][next[us]];
        const int vs = st.chunk * pp + s;
        double ready = 0;
        bool ok = true;
        auto need = [&](int dir, int mb, int at) {
          auto it = done.find({dir, mb, at});
          if (it == done.end()) {
            ok = false;
          } else {
            ready = std::max(ready, it->second);
          }
        };
        if (st.dir == Direction::forward) {
          if (vs > 0) need(0, st.micro_batch, vs - 1);
        } else if (vs + 1 < vstages) {
          need(1, st.micro_batch, vs + 1);
        } else {
          need(0, st.micro_batch, vs);
        }
        if (!ok) break;
        const double start = std::max(ready, free_at[us]);
        const double end = start + (st.dir == Direction::forward ? tf : tb) / v;
        done[{st.dir == Direction::forward ? 0 : 1, st.micro_batch, vs}] = end;
        free_at[us] = end;
        makespan = std::max(makespan, end);
        ++next[us];
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < orders.size(); ++s) {
    if (next[s] != orders[s].size()) return -1;
  }
  return makespan;
}

double bubble_fraction(Schedule sched, int pp, int m, int v, double tf, double tb) {
  const double t = replay(pipeline_order(sched, pp, m, v), v, tf, tb);
  const double ideal = m * (tf + tb);
  return (t - ideal) / ideal;
}

}  // namespace

TEST_CASE("every (micro-batch, chunk) runs once forward and once backward, backward after forward") {
  struct Case {
    Schedule s;
    int pp, m, v;
  };
  for (const Case& c : {Case{Schedule::gpipe, 4, 8, 1}, Case{Schedule::one_f_one_b, 4, 8, 1},
                        Case{Schedule::one_f_one_b, 4, 2, 1}, Case{Schedule::one_f_one_b, 1, 3, 1},
                        Case{Schedule::interleaved, 4, 8, 2}, Case{Schedule::interleaved, 2, 4, 3},
                        Case{Schedule::interleaved, 4, 4, 2}, Case{Schedule::interleaved, 8, 16, 4}}) {
    CAPTURE(to_string(c.s));
    CAPTURE(c.pp);
    CAPTURE(c.m);
    CAPTURE(c.v);
    const auto orders = pipeline_order(c.s, c.pp, c.m, c.v);
    REQUIRE(orders.size() == static_cast<std::size_t>(c.pp));
    for (const StageOrder& order : orders) {
      CHECK(order.size() == static_cast<std::size_t>(2 * c.m * c.v));
      std::map<std::pair<int, int>, int> fwd_at, bwd_at;
      for (std::size_t i = 0; i < order.size(); ++i) {
        const auto key = std::make_pair(order[i].micro_batch, order[i].chunk);
        auto& slot = order[i].dir == Direction::forward ? fwd_at : bwd_at;
        CHECK(slot.count(key) == 0);
        slot[key] = static_cast<int>(i);
      }
      CHECK(fwd_at.size() == static_cast<std::size_t>(c.m * c.v));
      CHECK(bwd_at.size() == static_cast<std::size_t>(c.m * c.v));
      for (const auto& [key, at] : bwd_at) CHECK(fwd_at.at(key) < at);
    }
  }
}

TEST_CASE("1F1B orders written out by hand") {
  const auto p2 = pipeline_order(Schedule::one_f_one_b, 2, 4);
  CHECK(render(p2[0], false) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(render(p2[1], false) == "F0 B0 F1 B1 F2 B2 F3 B3");
  const auto p4 = pipeline_order(Schedule::one_f_one_b, 4, 8);
  CHECK(render(p4[0], false) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(render(p4[1], false) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(render(p4[3], false) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than stages: the warm-up is cut to m.
  const auto short_pipe = pipeline_order(Schedule::one_f_one_b, 4, 2);
  CHECK(render(short_pipe[0], false) == "F0 F1 B0 B1");
}

TEST_CASE("GPipe orders written out by hand") {
  const auto p2 = pipeline_order(Schedule::gpipe, 2, 4);
  CHECK(render(p2[0], false) == "F0 F1 F2 F3 B0 B1 B2 B3");
  CHECK(render(p2[1], false) == "F0 F1 F2 F3 B0 B1 B2 B3");
}

TEST_CASE("interleaved orders written out by hand (Megatron's schedule)") {
  // pp 2, m 4, v 2: stage 0 warms up (2-0-1)*2 + (2-1)*2 = 4 steps, stage 1 two.
  const auto p2 = pipeline_order(Schedule::interleaved, 2, 4, 2);
  CHECK(render(p2[0], true) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(render(p2[1], true) == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // pp 4, m 8, v 2: stage 0 warms up 3*2 + 4 = 10 steps; the last stage 4.
  const auto p4 = pipeline_order(Schedule::interleaved, 4, 8, 2);
  CHECK(render(p4[0], true) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
        "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
        "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  CHECK(render(p4[3], true) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 "
        "F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
        "B4.0 B5.0 B6.0 B7.0");
  // m == pp: Megatron runs every forward first.
  const auto all_warm = pipeline_order(Schedule::interleaved, 2, 2, 2);
  CHECK(render(all_warm[1], true) == "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST_CASE("warm-up counts") {
  CHECK(warmup_steps(Schedule::one_f_one_b, 4, 0, 8) == 3);
  CHECK(warmup_steps(Schedule::one_f_one_b, 4, 3, 8) == 0);
  CHECK(warmup_steps(Schedule::interleaved, 4, 0, 8, 2) == 10);
  CHECK(warmup_steps(Schedule::interleaved, 4, 3, 8, 2) == 4);
  CHECK(warmup_steps(Schedule::interleaved, 4, 0, 4, 2) == 8);
  CHECK(warmup_steps(Schedule::gpipe, 4, 1, 8) == 8);
}

TEST_CASE("bad sizes are rejected") {
  CHECK_THROWS_AS(pipeline_order(Schedule::interleaved, 4, 6, 2), std::invalid_argument);
  CHECK_THROWS_AS(pipeline_order(Schedule::one_f_one_b, 4, 8, 2), std::invalid_argument);
  CHECK_THROWS_AS(pipeline_order(Schedule::gpipe, 0, 8, 1), std::invalid_argument);
}

TEST_CASE("registry lists every schedule by its command-line name") {
  const auto all = pipeline_schedules();
  REQUIRE(all.size() == 3);
  for (const ScheduleInfo& s : all) {
    CHECK(s.name == to_string(s.schedule));
    CHECK_FALSE(s.description.empty());
  }
}

TEST_CASE("replayed bubble equals (p - 1) / (v m) on uniform stages") {
  struct Case {
    Schedule s;
    int pp, m, v;
  };
  for (const Case& c : {Case{Schedule::gpipe, 4, 8, 1}, Case{Schedule::gpipe, 2, 4, 1},
                        Case{Schedule::one_f_one_b, 2, 4, 1}, Case{Schedule::one_f_one_b, 4, 8, 1},
                        Case{Schedule::one_f_one_b, 8, 32, 1}, Case{Schedule::interleaved, 2, 4, 2},
                        Case{Schedule::interleaved, 4, 8, 2}, Case{Schedule::interleaved, 4, 16, 4},
                        Case{Schedule::interleaved, 8, 64, 3}}) {
    CAPTURE(to_string(c.s));
    CAPTURE(c.pp);
    CAPTURE(c.m);
    CAPTURE(c.v);
    const double expected = static_cast<double>(c.pp - 1) / (c.v * c.m);
    // Backward twice the forward (the usual ratio) and equal times.
    CHECK(bubble_fraction(c.s, c.pp, c.m, c.v, 1.0, 2.0) == doctest::Approx(expected));
    CHECK(bubble_fraction(c.s, c.pp, c.m, c.v, 1.0, 1.0) == doctest::Approx(expected));
  }
}

TEST_CASE("interleaving reduces the replayed bubble") {
  const double plain = bubble_fraction(Schedule::one_f_one_b, 4, 8, 1, 1.0, 2.0);
  const double inter = bubble_fraction(Schedule::interleaved, 4, 8, 2, 1.0, 2.0);
  CHECK(inter < plain);
}
