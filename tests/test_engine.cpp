// Event engine: (time, seq) ordering, stream FIFO semantics, dependencies,
// collective rendezvous, independence of engines, determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory_resource>
#include <span>
#include <stdexcept>
#include <vector>

#include "counting_resource.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/sim/engine.hpp"
#include "fixtures.hpp"
#include "cuboid/sim/huge_pages.hpp"

using namespace cuboid;
using namespace cuboid::sim;

TEST_CASE("tasks on one stream run FIFO, back to back") {
  Engine e;
  const StreamId s = e.add_stream(0, StreamKind::compute);
  const TaskId a = e.add_compute(s, 100);
  const TaskId b = e.add_compute(s, 50);
  const TaskId c = e.add_compute(s, 0);
  const RunStats st = e.run();
  CHECK(e.start_ns(a) == 0);
  CHECK(e.end_ns(a) == 100);
  CHECK(e.start_ns(b) == 100);
  CHECK(e.end_ns(b) == 150);
  CHECK(e.start_ns(c) == 150);
  CHECK(e.end_ns(c) == 150);
  CHECK(st.end_ns == 150);
  CHECK(st.tasks_done == 3);
  CHECK(st.tasks_unfinished == 0);
  CHECK(e.stream(s).busy_ns == 150);
  CHECK(e.stream(s).tasks == 3);
}

TEST_CASE("streams run in parallel; dependencies across streams wait") {
  Engine e;
  const StreamId comp = e.add_stream(0, StreamKind::compute);
  const StreamId comm = e.add_stream(0, StreamKind::tp);
  const TaskId a = e.add_compute(comp, 100);
  const TaskId b = e.add_compute(comm, 30);
  const TaskId dep[] = {a, b};
  const TaskId c = e.add_compute(comm, 10, dep);  // waits for a although its stream is free at 30
  const TaskId d = e.add_compute(comp, 5);        // not blocked by c
  e.run();
  CHECK(e.end_ns(b) == 30);
  CHECK(e.start_ns(c) == 100);
  CHECK(e.end_ns(c) == 110);
  CHECK(e.start_ns(d) == 100);
  CHECK(e.stream(comm).busy_ns == 40);
  CHECK(e.stream(comm).wait_ns == 70);  // c arrived at 30, started at 100
}

TEST_CASE("a task on several streams heads each of them, and their queues go on after it") {
  // One link of 1 GB/s: a flow of 1000 bytes takes 1000 ns.
  Network net(std::vector<double>{1e9});
  Engine e(net);
  const StreamId s0 = e.add_stream(0, StreamKind::pp);
  const StreamId s1 = e.add_stream(1, StreamKind::pp);
  const LinkUse link[] = {{0, 1.0}};
  const TaskId a = e.add_compute(s0, 100);
  const TaskId b = e.add_compute(s1, 300);
  const StreamId both[] = {s0, s1};
  const TaskId c = e.add_flow(link, 1000, 0, both);  // heads both streams at 300
  const TaskId d = e.add_compute(s0, 50);
  const TaskId f = e.add_compute(s1, 70);
  const StreamId reversed[] = {s1, s0};
  const TaskId g = e.add_flow(link, 1000, 0, reversed);  // after d and f
  const TaskId h = e.add_compute(s0, 10);
  const TaskId k = e.add_compute(s1, 20);
  e.run();
  CHECK(e.end_ns(a) == 100);
  CHECK(e.end_ns(b) == 300);
  CHECK(e.start_ns(c) == 300);
  CHECK(e.end_ns(c) == 1300);
  CHECK(e.start_ns(d) == 1300);
  CHECK(e.start_ns(f) == 1300);
  CHECK(e.start_ns(g) == 1370);
  CHECK(e.end_ns(g) == 2370);
  CHECK(e.start_ns(h) == 2370);
  CHECK(e.end_ns(k) == 2390);
  CHECK(e.stream(s0).tasks == 5);
  CHECK(e.stream(s0).wait_ns == 200 + 20);  // c waited 200 ns for s1, g 20 ns for f
  // A stream emptied and filled again: its next task arrives when added.
  const TaskId m = e.add_compute(s1, 5);
  e.run();
  CHECK(e.start_ns(m) == 2390);
  CHECK(e.end_ns(m) == 2395);
}

TEST_CASE("equal-time events complete in FIFO (scheduling) order") {
  Engine e;
  std::vector<StreamId> streams;
  for (int i = 0; i < 5; ++i) streams.push_back(e.add_stream(i, StreamKind::compute));
  std::vector<TaskId> order;
  e.set_on_complete([&](TaskId t, TimeNs) { order.push_back(t); });
  for (int i = 0; i < 5; ++i) e.add_compute(streams[static_cast<std::size_t>(i)], 42);
  e.run();
  CHECK(order == std::vector<TaskId>{0, 1, 2, 3, 4});
}

TEST_CASE("a task on no stream is a timer / join point") {
  Engine e;
  const StreamId s = e.add_stream(0, StreamKind::compute);
  const TaskId a = e.add_compute(s, 10);
  const TaskId deps[] = {a};
  const TaskId j = e.add_compute(kNoStream, 5, deps);
  e.run();
  CHECK(e.start_ns(j) == 10);
  CHECK(e.end_ns(j) == 15);
}

TEST_CASE("tasks added from the completion callback run in the same run") {
  Engine e;
  const StreamId s = e.add_stream(0, StreamKind::compute);
  int added = 0;
  e.set_on_complete([&](TaskId t, TimeNs) {
    if (added < 3) {
      ++added;
      const TaskId d[] = {t};
      e.add_compute(s, 7, d);
    }
  });
  e.add_compute(s, 7);
  const RunStats st = e.run();
  CHECK(st.tasks_done == 4);
  CHECK(st.end_ns == 28);
}

TEST_CASE("run(until) stops early and resumes") {
  Engine e;
  const StreamId s = e.add_stream(0, StreamKind::compute);
  e.add_compute(s, 10);
  const TaskId b = e.add_compute(s, 10);
  e.run(15);
  CHECK_FALSE(e.done(b));
  e.run();
  CHECK(e.end_ns(b) == 20);
}

TEST_CASE("two engines are independent") {
  Engine e1;
  Engine e2;
  const StreamId s1 = e1.add_stream(0, StreamKind::compute);
  const StreamId s2 = e2.add_stream(0, StreamKind::compute);
  e1.add_compute(s1, 100);
  e2.add_compute(s2, 7);
  e2.add_compute(s2, 7);
  CHECK(e2.run().end_ns == 14);
  CHECK(e1.run().end_ns == 100);
  CHECK(e1.num_tasks() == 1);
  CHECK(e2.events() == 2);
}

// A group's mirrors are stored back to back in one vector; each reads back
// as its own member list, in the order pushed, whatever its size.
TEST_CASE("mirror groups: member lists read back in order, one span each") {
  MirrorGroups m{{4, 5}, {6, 7}};
  const std::vector<int> three{8, 9, 10};
  m.push_back(three);
  m.push_back({11});
  REQUIRE(m.size() == 4);
  CHECK_FALSE(m.empty());
  const std::vector<std::vector<int>> want{{4, 5}, {6, 7}, {8, 9, 10}, {11}};
  std::size_t i = 0;
  for (std::span<const int> g : m) {
    REQUIRE(i < want.size());
    CHECK(std::vector<int>(g.begin(), g.end()) == want[i]);
    CHECK(m[i].size() == want[i].size());
    CHECK(m[i].data() == g.data());
    ++i;
  }
  CHECK(i == want.size());
  CHECK(MirrorGroups{}.empty());
}

TEST_CASE("bad inputs are rejected") {
  Engine e;
  const StreamId s = e.add_stream(0, StreamKind::compute);
  const TaskId later[] = {5};
  CHECK_THROWS_AS(e.add_compute(s, 1, later), std::out_of_range);
  CHECK_THROWS_AS(e.add_compute(s + 1, 1), std::out_of_range);
  CHECK_THROWS_AS(e.add_compute(s, -1), std::invalid_argument);
  CHECK_THROWS_AS(e.add_group(CommGroup{{0, 1}, {{2}}}), std::invalid_argument);
  CHECK(to_string(StreamKind::dp) == "dp");
}

namespace {

// A pseudo-random DAG over several streams; returns every task's (start, end).
std::vector<std::pair<TimeNs, TimeNs>> random_run(unsigned seed, std::pmr::memory_resource* mem = huge_page_resource()) {
  Engine e(mem);
  std::vector<StreamId> streams;
  for (int i = 0; i < 6; ++i) streams.push_back(e.add_stream(i / 2, StreamKind::compute));
  unsigned x = seed;
  auto next = [&x] { x = x * 1664525u + 1013904223u; return x >> 8; };
  for (int i = 0; i < 500; ++i) {
    std::vector<TaskId> deps;
    if (i > 0) deps.push_back(static_cast<TaskId>(next() % static_cast<unsigned>(i)));
    if (i > 1) deps.push_back(static_cast<TaskId>(next() % static_cast<unsigned>(i)));
    e.add_compute(streams[next() % streams.size()], static_cast<TimeNs>(next() % 5), deps);  // many ties
  }
  const RunStats st = e.run();
  REQUIRE(st.tasks_unfinished == 0);
  std::vector<std::pair<TimeNs, TimeNs>> out;
  for (TaskId t = 0; t < e.num_tasks(); ++t) out.emplace_back(e.start_ns(t), e.end_ns(t));
  return out;
}

}  // namespace

TEST_CASE("runs are deterministic") {
  CHECK(random_run(7) == random_run(7));
  CHECK(random_run(7) != random_run(8));
}

TEST_CASE("an engine keeps its tables in the memory resource it is given; the run is the same") {
  test::CountingResource counted;
  {
    CHECK(random_run(7, &counted) == random_run(7));
    CHECK(counted.total_bytes >= 500 * 64);  // the 500 tasks' table at least (a task is a cache line)
  }
  CHECK(counted.live_bytes == 0);  // all given back, each with its size
  SimArena arena;
  CHECK(random_run(7, &arena) == random_run(7));
  CHECK(random_run(7, std::pmr::new_delete_resource()) == random_run(7));
}

TEST_CASE("huge_page_resource: blocks of 2 MiB and more start on a huge-page boundary; all are writable") {
  std::pmr::memory_resource* r = huge_page_resource();
  CHECK(huge_page_resource() == r);
  for (const std::size_t bytes : {std::size_t{64}, std::size_t{1} << 20, kHugePageBytes, 3 * kHugePageBytes + 5}) {
    CAPTURE(bytes);
    auto* p = static_cast<unsigned char*>(r->allocate(bytes, 64));
    CHECK(reinterpret_cast<std::uintptr_t>(p) % (bytes >= kHugePageBytes ? kHugePageBytes : 64) == 0);
    std::memset(p, 7, bytes);
    CHECK(p[0] == 7);
    CHECK(p[bytes - 1] == 7);
    r->deallocate(p, bytes, 64);
  }
  // A monotonic arena over it: vectors on it keep their contents as they grow.
  SimArena arena;
  std::pmr::vector<std::uint64_t> v(&arena);
  const std::uint64_t n = SimArena::kFirstBlock / sizeof(std::uint64_t) + 100000;  // past the first block
  for (std::uint64_t i = 0; i < n; ++i) v.push_back(i * 3);
  bool same = true;
  for (std::uint64_t i = 0; i < v.size(); ++i) same = same && v[i] == i * 3;
  CHECK(same);
  CHECK(v.size() == n);
}

TEST_CASE("user values read back; tasks given none read zero") {
  Engine e;
  const StreamId s = e.add_stream(0, StreamKind::compute);
  const TaskId a = e.add_compute(s, 1);
  const TaskId b = e.add_compute(s, 1, {}, 42);
  const TaskId c = e.add_compute(s, 1);
  CHECK(e.user(a) == 0);
  CHECK(e.user(b) == 42);
  CHECK(e.user(c) == 0);
}

// The event being processed stays at the heap's root until the first event it
// schedules replaces it: a callback that throws must not leave it there.
TEST_CASE("a throwing completion callback leaves the engine able to resume") {
  Engine e;
  const StreamId s0 = e.add_stream(0, StreamKind::compute);
  const StreamId s1 = e.add_stream(1, StreamKind::compute);
  const TaskId a = e.add_compute(s0, 10);  // nothing waits for it: its end schedules nothing
  const TaskId b = e.add_compute(s1, 20);
  bool thrown = false;
  e.set_on_complete([&](TaskId t, TimeNs) {
    if (t == a && !thrown) {
      thrown = true;
      throw std::runtime_error("callback");
    }
  });
  CHECK_THROWS_AS(e.run(), std::runtime_error);
  const RunStats st = e.run();
  CHECK(e.end_ns(a) == 10);
  CHECK(e.end_ns(b) == 20);
  CHECK(st.tasks_done == 2);
  CHECK(st.events == 2);
  CHECK(st.tasks_unfinished == 0);
}

// Many tasks end at once and each starts several successors: the order in
// which equal-time ends complete is still the order they were scheduled.
TEST_CASE("equal-time ends that start several tasks each keep FIFO order") {
  Engine e;
  std::vector<StreamId> streams;
  for (int i = 0; i < 12; ++i) streams.push_back(e.add_stream(i, StreamKind::compute));
  std::vector<TaskId> roots;
  for (int i = 0; i < 4; ++i) roots.push_back(e.add_compute(streams[static_cast<std::size_t>(i)], 10));
  for (int i = 0; i < 4; ++i) {
    const TaskId d[] = {roots[static_cast<std::size_t>(i)]};
    for (int j = 0; j < 2; ++j) e.add_compute(streams[static_cast<std::size_t>(4 + 2 * i + j)], 7, d);
  }
  std::vector<TaskId> order;
  e.set_on_complete([&](TaskId t, TimeNs) { order.push_back(t); });
  e.run();
  CHECK(order == std::vector<TaskId>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("events leave in (time, scheduling) order at every heap size") {
  // Heaps of 1..40 events (last nodes full and partial), durations with many ties.
  for (int n = 1; n <= 40; ++n) {
    Engine e;
    std::vector<TaskId> order;
    e.set_on_complete([&order](TaskId t, TimeNs) { order.push_back(t); });
    std::vector<std::pair<TimeNs, TaskId>> expected;
    for (int i = 0; i < n; ++i) {
      const StreamId s = e.add_stream(i, StreamKind::compute);
      const TimeNs d = (i * 7) % 5;
      expected.emplace_back(d, e.add_compute(s, d));
    }
    e.run();
    std::sort(expected.begin(), expected.end());
    REQUIRE(order.size() == expected.size());
    for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == expected[i].second);
  }
}

namespace {
CommGroup pair() {
  CommGroup g;
  g.ranks = {0, 1};
  return g;
}
}  // namespace

TEST_CASE("a collective holding SMs slows the compute beside it while it runs (hold_sms)") {
  // Two GPUs of one node; a 64 MB all-gather between them lasts D alone.
  const Topology topo(test::dgx_a100(1));
  auto collective_alone = [&] {
    Network net(topo);
    Engine e(net);
    const GroupId g = e.add_group(pair());
    const StreamId d = e.add_stream(0, StreamKind::dp);
    const StreamId d1[] = {d};
    const TaskId t = e.add_collective(Collective::all_gather, g, 64e6, d1);
    e.run();
    return e.end_ns(t);
  };
  const TimeNs D = collective_alone();
  REQUIRE(D > 1000);
  const TimeNs full = 3 * D, held = 4 * D;
  for (const bool hold : {false, true}) {
    CAPTURE(hold);
    Network net(topo);
    Engine e(net);
    const GroupId g = e.add_group(pair());
    const StreamId c = e.add_stream(0, StreamKind::compute);
    const StreamId d = e.add_stream(0, StreamKind::dp);
    if (hold) e.hold_sms(d, c);
    const StreamId d1[] = {d};
    // Both start at 0: D of held pace (D / 4D of the work), then the rest
    // at full pace: D + (1 - 1/4) x 3D = 3.25 D (overlapped_time_ns).
    const TaskId a = e.add_compute(c, full, {}, 0, held);
    const TaskId t = e.add_collective(Collective::all_gather, g, 64e6, d1);
    // A second collective after the compute, and compute behind it that
    // starts while it runs: held from its start, D - 1 of it at held pace.
    const TaskId b = e.add_compute(c, 2, {}, 0, 4);
    const TaskId a_done[] = {a};
    const TaskId t2 = e.add_collective(Collective::all_gather, g, 64e6, d1, a_done);
    const TaskId b2 = e.add_compute(c, full, a_done, 0, held);
    // A task without a held pace is never slowed.
    const TaskId f = e.add_compute(c, 100, {}, 0, 0);
    e.run();
    CHECK(e.end_ns(t) == D);
    if (!hold) {
      CHECK(e.end_ns(a) == full);
      CHECK(e.end_ns(b2) == e.start_ns(b2) + full);
      continue;
    }
    CHECK(e.end_ns(a) == overlapped_time_ns(D, held, full));
    // b (2 ns, 4 held) starts at a's end while t2 runs: it takes 4.
    CHECK(e.start_ns(t2) == e.end_ns(a));
    CHECK(e.end_ns(b) == e.end_ns(a) + 4);
    // b2 starts 4 ns into t2 and runs held until t2 ends (D - 4), then free.
    CHECK(e.start_ns(b2) == e.end_ns(b));
    CHECK(e.end_ns(t2) == e.start_ns(t2) + D);
    const TimeNs lap = D - 4;
    const double done = static_cast<double>(lap) / static_cast<double>(held);
    CHECK(e.end_ns(b2) == e.end_ns(t2) + std::llround((1.0 - done) * static_cast<double>(full)));
    CHECK(e.end_ns(f) == e.end_ns(b2) + 100);
  }
}
