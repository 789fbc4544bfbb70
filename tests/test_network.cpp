// Flow-level network: max-min sharing with hand-computed rates, re-solving at
// flow end, latency; collectives against the alpha-beta closed forms of
// cost.hpp; contention (shared NICs, oversubscribed spine, rail vs non-rail);
// symmetry (mirrors load links).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <vector>

#include "cuboid/cost/cost.hpp"
#include "cuboid/sim/engine.hpp"
#include "cuboid/core/topology.hpp"
#include "counting_resource.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::sim;

namespace {

// DGX A100-like nodes (dgx_a100 of fixtures.hpp): NVSwitch busbw 220 GB/s
// (all_reduce 230), HDR NICs at 25 GB/s line rate, 24 GB/s achieved; here with
// a choice of rail optimisation and NICs per node. The network reads no GPU field.
Cluster dgx(int nodes, int nodes_per_leaf = 32, double oversubscription = 1.0, bool rail = true, int nics = 8) {
  Cluster c = test::dgx_a100(nodes, nodes_per_leaf, oversubscription);
  c.inter.rail_optimized = rail;
  c.inter.nics_per_node = nics;
  return c;
}

std::vector<int> iota(int first, int count, int stride = 1) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i * stride);
  return v;
}

// Simulated time of one collective alone on the network.
TimeNs sim_collective(const Topology& topo, Collective op, const CommGroup& g, double bytes,
                      Algorithm algo = Algorithm::ring) {
  Network net(topo);
  Engine e(net);
  const GroupId gid = e.add_group(g);
  e.add_collective(op, gid, bytes, {}, {}, algo);
  const RunStats st = e.run();
  REQUIRE(st.tasks_unfinished == 0);
  return st.end_ns;
}

TimeNs closed_form(const Topology& topo, Collective op, const std::vector<int>& ranks, double bytes) {
  return collective_time_ns(op, bytes, static_cast<int>(ranks.size()), group_link_params(topo, op, ranks));
}

double rel(TimeNs a, TimeNs b) { return std::abs(static_cast<double>(a - b)) / static_cast<double>(b); }

constexpr double kGB = 1e9;

}  // namespace

TEST_CASE("max-min: two flows on one link get half each; the survivor speeds up") {
  Network net({1 * kGB});
  Engine e(net);
  const LinkUse l0[] = {{0, 1.0}};
  const TaskId a = e.add_flow(l0, 0.5 * kGB, 0);
  const TaskId b = e.add_flow(l0, 1.0 * kGB, 0);
  e.run();
  CHECK(e.end_ns(a) == 1'000'000'000);  // 0.5 GB at 0.5 GB/s
  CHECK(e.end_ns(b) == 1'500'000'000);  // 0.5 GB left at 1 GB/s after a ends
  CHECK(net.link_stats(0).bytes == doctest::Approx(1.5 * kGB));
  CHECK(net.link_stats(0).peak_utilisation == doctest::Approx(1.0));
}

TEST_CASE("max-min: the classic three-flow examples") {
  SUBCASE("parking lot: one long flow, two short ones, equal links") {
    Network net({1 * kGB, 1 * kGB});
    const LinkUse ab[] = {{0, 1}, {1, 1}};
    const LinkUse a[] = {{0, 1}};
    const LinkUse b[] = {{1, 1}};
    const FlowId f0 = net.start_flow(ab, kGB, 0, 0);
    const FlowId f1 = net.start_flow(a, kGB, 0, 1);
    const FlowId f2 = net.start_flow(b, kGB, 0, 2);
    CHECK(net.rate_Bps(f0) == doctest::Approx(0.5 * kGB));
    CHECK(net.rate_Bps(f1) == doctest::Approx(0.5 * kGB));
    CHECK(net.rate_Bps(f2) == doctest::Approx(0.5 * kGB));
  }
  SUBCASE("a flow bottlenecked elsewhere leaves the rest to the other") {
    // L0 = 10, L1 = 2: the long flow and C split L1 (1 each); B takes 10 - 1.
    Network net({10 * kGB, 2 * kGB});
    const LinkUse ab[] = {{0, 1}, {1, 1}};
    const LinkUse a[] = {{0, 1}};
    const LinkUse b[] = {{1, 1}};
    const FlowId f0 = net.start_flow(ab, kGB, 0, 0);
    const FlowId f1 = net.start_flow(a, kGB, 0, 1);
    const FlowId f2 = net.start_flow(b, kGB, 0, 2);
    CHECK(net.rate_Bps(f0) == doctest::Approx(1 * kGB));
    CHECK(net.rate_Bps(f1) == doctest::Approx(9 * kGB));
    CHECK(net.rate_Bps(f2) == doctest::Approx(1 * kGB));
    CHECK(net.solves() == 1);  // started at one instant: one batched solve
  }
  SUBCASE("weights: a flow crossing a link three times loads it three times") {
    Network net({3 * kGB});
    const LinkUse w3[] = {{0, 3}};
    const FlowId f = net.start_flow(w3, kGB, 0, 0);
    CHECK(net.rate_Bps(f) == doctest::Approx(1 * kGB));
  }
  SUBCASE("disjoint components are solved separately") {
    Network net({1 * kGB, 1 * kGB});
    const LinkUse a[] = {{0, 1}};
    const LinkUse b[] = {{1, 1}};
    net.start_flow(a, kGB, 0, 0);
    net.start_flow(b, kGB, 0, 1);
    std::vector<std::uint64_t> done;
    net.advance_to(1'000'000'000, done);
    CHECK(done == std::vector<std::uint64_t>{0, 1});  // equal finish: start order
    CHECK(net.active_flows() == 0);
  }
}

TEST_CASE("link sets: flows over one registered set share its links like separate flows") {
  // Link 0: 10 GB/s crossed once; link 1: 5 GB/s crossed twice. Alone, a flow
  // is held by link 1 (5 / 2 = 2.5 GB/s); two flows of the set split it.
  Network net({10 * kGB, 5 * kGB});
  const LinkUse uses[] = {{0, 1.0}, {1, 2.0}, {1, 0.0}};
  const LinkSetId set = net.add_link_set(std::span<const LinkUse>(uses, 2));
  CHECK(net.num_link_sets() == 1);
  const FlowId f0 = net.start_flow(set, 1 * kGB, 0, 0);
  CHECK(net.rate_Bps(f0) == doctest::Approx(2.5 * kGB));
  const FlowId f1 = net.start_flow(set, 2 * kGB, 0, 1);
  CHECK(net.rate_Bps(f0) == doctest::Approx(1.25 * kGB));
  CHECK(net.rate_Bps(f1) == doctest::Approx(1.25 * kGB));
  std::vector<std::uint64_t> done;
  net.advance_to(900'000'000, done);  // f0: 1 GB at 1.25 GB/s, done at 0.8 s
  CHECK(done == std::vector<std::uint64_t>{0});
  CHECK(net.rate_Bps(f1) == doctest::Approx(2.5 * kGB));  // alone again
  // Finished flows count in the link totals, the running one pro rata:
  // f1 moved 1 GB by 0.8 s and 0.25 GB since.
  CHECK(net.link_stats(0).bytes == doctest::Approx(2.25 * kGB));
  CHECK(net.link_stats(1).bytes == doctest::Approx(4.5 * kGB));
  net.advance_to(1'300'000'000, done);  // f1: 1 GB left at 0.8 s, at 2.5 GB/s
  CHECK(done == std::vector<std::uint64_t>{0, 1});
  CHECK(net.link_stats(0).bytes == doctest::Approx(3 * kGB));
  CHECK(net.link_stats(1).bytes == doctest::Approx(6 * kGB));
  CHECK(net.link_stats(1).peak_utilisation == doctest::Approx(1.0));
  CHECK(net.link_stats(0).peak_utilisation == doctest::Approx(0.25));  // 2.5 of 10 GB/s
  // A weight <= 0 is no use: the set built from all three uses is the same.
  CHECK(net.start_flow(uses, 1 * kGB, 2'000'000'000, 2) == f1);  // reuses the free slot
  CHECK(net.rate_Bps(f1) == doctest::Approx(2.5 * kGB));
}

TEST_CASE("link sets: bad ids are rejected before anything is registered") {
  Network net({1 * kGB});
  const LinkUse bad[] = {{0, 1.0}, {7, 1.0}};
  CHECK_THROWS_WITH_AS(net.add_link_set(bad), "Network: link id out of range", std::out_of_range);
  CHECK_THROWS_WITH_AS(net.start_flow(LinkSetId{3}, kGB, 0, 0), "Network: link set out of range", std::out_of_range);
  CHECK(net.num_link_sets() == 0);
  CHECK(net.active_flows() == 0);
}

TEST_CASE("many flows on one link: processor sharing, finishing smallest first") {
  // n flows of 1..n GB on a 1 GB/s link: between two completions the k flows
  // left share it, so flow i ends at sum_{j<=i} (n - j + 1) x 1 GB / 1 GB/s.
  // Six flows spill a link's flow list out of its inline slot and back.
  Network net({1 * kGB});
  Engine e(net);
  const LinkUse l0[] = {{0, 1.0}};
  const int n = 6;
  std::vector<TaskId> t;
  for (int i = 1; i <= n; ++i) t.push_back(e.add_flow(l0, i * kGB, 0));
  const RunStats st = e.run();
  CHECK(st.tasks_unfinished == 0);
  TimeNs expected = 0;
  for (int i = 1; i <= n; ++i) {
    expected += static_cast<TimeNs>(n - i + 1) * 1'000'000'000;
    CHECK(std::llabs(e.end_ns(t[static_cast<std::size_t>(i - 1)]) - expected) <= 10);  // ns rounding
  }
  CHECK(net.link_stats(0).bytes == doctest::Approx(21 * kGB));
  // The list is usable again after draining: a lone flow gets the whole link.
  const FlowId f = net.start_flow(l0, kGB, st.end_ns, 99);
  CHECK(net.rate_Bps(f) == doctest::Approx(1 * kGB));
}

TEST_CASE("a flow's latency is added once, after its bytes") {
  Network net({2 * kGB});
  Engine e(net);
  const LinkUse l0[] = {{0, 1.0}};
  const TaskId a = e.add_flow(l0, 1 * kGB, 1234);
  e.run();
  CHECK(e.end_ns(a) == 500'000'000 + 1234);
}

TEST_CASE("algorithm registry") {
  CHECK(collective_algorithms().size() == 4);
  CHECK(parse_algorithm("hierarchical") == Algorithm::hierarchical);
  CHECK(to_string(Algorithm::automatic) == "auto");
  CHECK_THROWS_WITH_AS(parse_algorithm("bogus"),
                       "unknown collective algorithm 'bogus' (known: auto, ring, tree, hierarchical)",
                       std::invalid_argument);
}

TEST_CASE("topology routes become directed links") {
  const Topology topo(dgx(2));
  Network net(topo);
  const auto fwd = net.route_links(0, 8);
  const auto back = net.route_links(8, 0);
  REQUIRE(fwd.size() == 4);
  CHECK(net.link_name(fwd[0]) == "n0.gpu0->n0.nic0");
  CHECK(net.link_name(fwd[3]) == "n1.nic0->n1.gpu0");
  CHECK(fwd[0] != back[3]);  // the two directions are separate resources
  CHECK(net.route_latency_ns(0, 8) == 3000);
  CHECK(net.route_latency_ns(0, 1) == 1000);
  CHECK(net.link_stats(fwd[0]).capacity_Bps == doctest::Approx(24e9));
  CHECK(net.link_stats(net.route_links(0, 1)[0]).capacity_Bps == doctest::Approx(220e9));
}

// Network::route_links comes from Topology::route_ids (edge ids recorded
// while building, no graph search): every pair's links must be the hops of
// Topology::route, in order and in the direction travelled, on every shape.
TEST_CASE("route ids: the links of Topology::route, in order and direction, on every fabric shape") {
  auto check_all_pairs = [](const Cluster& c) {
    const Topology topo(c);
    Network net(topo);
    const auto& g = topo.graph();
    std::size_t pos = 0;
    for (auto [it, end] = boost::edges(g); it != end; ++it, ++pos) CHECK(g[*it].id == pos);
    for (int a = 0; a < topo.num_gpus(); ++a) {
      for (int b = 0; b < topo.num_gpus(); ++b) {
        const auto path = topo.route(a, b);
        const auto links = net.route_links(a, b);
        REQUIRE(links.size() == path.size());
        auto cur = topo.gpu_vertex(a);
        for (std::size_t i = 0; i < path.size(); ++i) {
          const auto next = boost::source(path[i], g) == cur ? boost::target(path[i], g) : boost::source(path[i], g);
          CHECK(net.link_name(links[i]) == g[cur].name + "->" + g[next].name);
          cur = next;
        }
      }
    }
  };
  SUBCASE("one node") { check_all_pairs(dgx(1)); }
  SUBCASE("rail-optimised, two leaf groups") { check_all_pairs(dgx(4, 2)); }
  SUBCASE("non-rail, two leaf groups") { check_all_pairs(dgx(4, 2, 1.0, false)); }
  SUBCASE("four NICs for eight GPUs") { check_all_pairs(dgx(4, 2, 1.0, true, 4)); }
  SUBCASE("one switch") {
    Cluster c = dgx(3);
    c.inter.levels = 1;
    check_all_pairs(c);
  }
  SUBCASE("three levels, rail-optimised and not") {
    Cluster c = dgx(6, 2);
    c.inter.levels = 3;
    c.inter.leaves_per_pod = 4;
    check_all_pairs(c);
    c.inter.rail_optimized = false;
    c.inter.leaves_per_pod = 2;
    check_all_pairs(c);
  }
}

// compile_routes lists a phase's links in increasing id order with the
// routes' weights summed per link; a big phase reads them off a bit set, a
// small one sorts them. Both must give exactly the reference merge.
TEST_CASE("compile_routes: links in id order, weights summed, small and big phases alike") {
  const Topology topo(dgx(256, 16));  // ~13k links: a handful of routes is "small"
  Network net(topo);
  auto reference = [&net](const std::vector<Route>& routes, std::vector<LinkUse> prior) {
    std::map<LinkId, double> sum;
    for (const LinkUse& u : prior) sum[u.link] += u.weight;
    for (const Route& r : routes) {
      for (LinkId l : net.route_links(r.src_gpu, r.dst_gpu)) sum[l] += r.weight;
    }
    std::vector<LinkUse> out;
    for (const auto& [l, w] : sum) out.push_back({l, w});
    return out;
  };
  auto check = [&](const std::vector<Route>& routes, const std::vector<LinkUse>& prior) {
    std::vector<LinkUse> got = prior;
    net.compile_routes(routes, got);
    const std::vector<LinkUse> want = reference(routes, prior);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].link == want[i].link);
      CHECK(got[i].weight == want[i].weight);
    }
    return got.size();
  };
  // A few routes (the sort) and a mirrored ring over every node (the bit set),
  // both with links listed twice and weights that do not sum exactly in binary.
  const std::vector<Route> small{{3, 4, 1.0}, {0, 9, 0.1}, {0, 9, 0.2}};
  CHECK(check(small, {}) <= 8);
  std::vector<Route> big;
  for (int local = 0; local < 8; ++local) {
    for (int node = 0; node < 64; ++node) big.push_back({8 * node + local, 8 * ((node + 1) % 64) + local, 0.125});
    for (int node = 0; node < 64; node += 2) big.push_back({8 * node + local, 8 * node + (local + 1) % 8, 0.7});
  }
  CHECK(check(big, {}) > 1000);
  // Uses already in `out` are merged in too, on either path.
  std::vector<LinkUse> prior;
  net.compile_routes(small, prior);
  check(big, prior);
  check(small, prior);
  // The scratch is clean after each call: the same input, the same output.
  std::vector<LinkUse> a, b;
  net.compile_routes(big, a);
  net.compile_routes(big, b);
  CHECK(a.size() == b.size());
  // Also after a call cut short by a GPU out of range, midway through the routes.
  std::vector<Route> bad = big;
  bad.insert(bad.begin() + 100, Route{0, 99999, 1.0});
  std::vector<LinkUse> cut;
  CHECK_THROWS_AS(net.compile_routes(bad, cut), std::out_of_range);
  check(small, {});
  check(big, {});
}

// add_route_set = compile_routes + add_link_set; a big route list equal to
// an earlier one (a DP group's reduce-scatter and all-gather rings) gives the
// earlier set back, a small or different one a new set.
TEST_CASE("add_route_set: the compiled set, registered once per big route list") {
  const Topology topo(dgx(16, 16));
  Network net(topo);
  std::vector<Route> ring;
  for (int local = 0; local < 8; ++local) {
    for (int node = 0; node < 16; ++node) ring.push_back({8 * node + local, 8 * ((node + 1) % 16) + local, 1.0});
  }
  REQUIRE(ring.size() >= 64);
  const LinkSetId a = net.add_route_set(ring);
  CHECK(net.add_route_set(ring) == a);
  CHECK(net.num_link_sets() == 1);
  std::vector<Route> other = ring;
  other.back().weight = 2.0;  // one weight differs: another set
  CHECK(net.add_route_set(other) != a);
  const std::vector<Route> small(ring.begin(), ring.begin() + 4);
  const LinkSetId s1 = net.add_route_set(small);
  CHECK(net.add_route_set(small) != s1);
  CHECK(net.num_link_sets() == 4);
  // The set loads exactly compile_routes' links: a flow of 1 GB puts
  // weight x 1 GB on each of them.
  std::vector<LinkUse> uses;
  net.compile_routes(ring, uses);
  net.start_flow(a, kGB, 0, 0);
  std::vector<std::uint64_t> done;
  net.advance_to(net.next_completion(), done);
  REQUIRE(done.size() == 1);
  for (const LinkUse& u : uses) CHECK(net.link_stats(u.link).bytes == doctest::Approx(u.weight * kGB));
}

// Finished flows' bytes reach the link totals in batches (Network::settle):
// links private to one set get its flows folded once per distinct weight,
// shared links entry by entry. The totals must be exactly (==) the sums of
// adding every finished flow to every link in finish order.
TEST_CASE("link byte totals: exactly the finish-order sums, private and shared links alike") {
  Network net({kGB, kGB, kGB, kGB, kGB});
  // Set a: links 0 and 3 with one weight (folded once), 4 with another; link 1 shared with b.
  const LinkUse a_uses[] = {{0, 0.1}, {1, 0.1}, {3, 0.1}, {4, 0.3}};
  const LinkUse b_uses[] = {{1, 0.7}, {2, 0.1}};
  const LinkSetId sets[2] = {net.add_link_set(a_uses), net.add_link_set(b_uses)};
  const std::span<const LinkUse> uses[2] = {a_uses, b_uses};
  std::vector<double> expected(5, 0.0);
  std::vector<std::uint64_t> done;
  TimeNs t = 0;
  for (int k = 0; k < 60; ++k) {
    const int which = (k * 7) % 3 == 0 ? 1 : 0;
    const double bytes = (k + 1) * 0.37e9 / 3.0;
    net.start_flow(sets[which], bytes, t, static_cast<std::uint64_t>(k));
    t = net.next_completion();
    net.advance_to(t, done);
    for (const LinkUse& u : uses[which]) expected[u.link] += u.weight * bytes;
    if (k == 29 || k == 59) {  // two batches: the second starts from unequal totals
      for (LinkId l = 0; l < 5; ++l) CHECK(net.link_stats(l).bytes == expected[l]);
    }
  }
  CHECK(done.size() == 60);
}

// Link classes: links that every set crosses alike are one class; a set that
// crosses a class in part, or with two weights, splits it.
TEST_CASE("link classes: refined by each set, counted per class") {
  Network net({kGB, kGB, kGB, kGB, 2 * kGB});
  CHECK(net.num_link_classes() == 1);  // class 0: no set crosses any link
  const LinkUse a_uses[] = {{0, 1.0}, {1, 1.0}, {2, 1.0}, {3, 1.0}};
  net.add_link_set(a_uses);
  CHECK(net.num_link_classes() == 2);  // {0,1,2,3}
  const LinkUse b_uses[] = {{2, 1.0}, {3, 1.0}, {4, 1.0}};  // part of a's class, and link 4
  net.add_link_set(b_uses);
  CHECK(net.num_link_classes() == 4);  // {0,1}, {2,3}, {4}
  const LinkUse c_uses[] = {{0, 1.0}, {1, 2.0}};  // a's rest, with two weights
  net.add_link_set(c_uses);
  CHECK(net.num_link_classes() == 5);  // {0}, {1}, {2,3}, {4}
  const LinkUse d_uses[] = {{2, 0.5}, {3, 0.5}};  // a whole class, one weight: no split
  net.add_link_set(d_uses);
  CHECK(net.num_link_classes() == 5);
  // Links of one capacity only: class 0's links split by capacity too.
  Network mixed({kGB, 2 * kGB, kGB});
  const LinkUse all[] = {{0, 1.0}, {1, 1.0}, {2, 1.0}};
  mixed.add_link_set(all);
  CHECK(mixed.num_link_classes() == 3);  // class 0 (now empty), {0,2}, {1}
}

TEST_CASE("link sets: a link listed twice is rejected before anything is registered") {
  Network net({kGB, kGB});
  const LinkUse twice[] = {{0, 1.0}, {1, 1.0}, {0, 2.0}};
  CHECK_THROWS_WITH_AS(net.add_link_set(twice), "Network: a link set lists link 0 twice", std::invalid_argument);
  CHECK(net.num_link_sets() == 0);
  CHECK(net.num_link_classes() == 1);
}

// A class split while flows run (a set added mid-run) must leave the run as
// if the new set had been registered before they started: the same finish
// times, totals and peaks, link by link.
TEST_CASE("link classes: a split while flows run changes nothing") {
  const std::vector<double> caps{kGB, kGB, 3 * kGB, kGB, 2 * kGB, kGB};
  const LinkUse a_uses[] = {{0, 1.0}, {1, 1.0}, {2, 1.0}, {3, 1.0}};
  const LinkUse b_uses[] = {{1, 1.0}, {2, 2.0}, {4, 1.0}};
  const LinkUse c_uses[] = {{3, 1.0}, {5, 1.0}};
  struct Outcome {
    std::vector<std::uint64_t> done;
    std::vector<TimeNs> at;
    std::vector<double> bytes, peak;
  };
  auto play = [&](bool late) {
    Network net(caps);
    const LinkSetId a = net.add_link_set(a_uses);
    LinkSetId b = 0, c = 0;
    if (!late) {
      b = net.add_link_set(b_uses);
      c = net.add_link_set(c_uses);
    }
    // Two flows of a share its links at 0.5 GB/s each.
    net.start_flow(a, 2 * kGB, 0, 0);
    net.start_flow(a, 1 * kGB, 0, 1);
    Outcome o;
    net.advance_to(100'000'000, o.done);
    if (late) {
      b = net.add_link_set(b_uses);  // splits a's classes while a's flows run
      c = net.add_link_set(c_uses);
    }
    // No flow of b or c yet: when flow 1 ends (2 s), flow 0 must speed up
    // to 1 GB/s (1 GB left: done at 3 s), split classes or not.
    net.advance_to(2'500'000'000, o.done);
    CHECK(o.done == std::vector<std::uint64_t>{1});
    CHECK(net.next_completion() == 3'000'000'000);
    net.start_flow(b, 1.5 * kGB, 2'500'000'000, 2);
    net.start_flow(c, 0.5 * kGB, 2'500'000'000, 3);
    for (TimeNs t = net.next_completion(); t != kNever; t = net.next_completion()) {
      net.advance_to(t, o.done);
      o.at.push_back(t);
    }
    for (LinkId l = 0; l < caps.size(); ++l) {
      o.bytes.push_back(net.link_stats(l).bytes);
      o.peak.push_back(net.link_stats(l).peak_utilisation);
    }
    // Class 0 (no link left in it) and one class per link: a splits {0,1,3}
    // from {2} by capacity, b splits off {1} and takes 4, c splits off {3}.
    CHECK(net.num_link_classes() == 7);
    return o;
  };
  const Outcome early = play(false);
  const Outcome late = play(true);
  CHECK(late.done == early.done);
  CHECK(late.at == early.at);
  CHECK(late.bytes == early.bytes);
  CHECK(late.peak == early.peak);
  CHECK(early.done.size() == 4);
  // Link 3 carries a's 3 GB and c's 0.5 GB; link 2 a's 3 GB and b's 2 x 1.5 GB.
  CHECK(early.bytes[3] == doctest::Approx(3.5 * kGB));
  CHECK(early.bytes[2] == doctest::Approx(6 * kGB));
}

TEST_CASE("rail folding: only for rail-symmetric fabrics, before any set, for rotation-closed lists") {
  const Topology topo(dgx(4));
  REQUIRE(topo.rail_symmetric());
  {
    Network net(std::vector<double>{1e9, 1e9});
    CHECK_THROWS_WITH_AS(net.fold_rails(), "Network: rail folding needs a rail-symmetric topology", std::logic_error);
  }
  {
    Network net(topo);
    const std::vector<Route> one{{0, 8, 1.0}};
    (void)net.add_route_set(one);
    CHECK_THROWS_WITH_AS(net.fold_rails(), "Network: rail folding must come before any link set", std::logic_error);
  }
  Network net(topo);
  net.fold_rails();
  CHECK(net.rails_folded());
  // GPU 0 -> GPU 8 alone is not closed under the rotation (GPUs 1..7 send nothing).
  const std::vector<Route> open{{0, 8, 1.0}};
  CHECK_THROWS_WITH_AS(net.add_route_set(open), "Network: a folded route list is not closed under the rail rotation",
                       std::logic_error);
  // Every rail sends node 0 -> node 1: rail 0's links carry one route each,
  // and every rail's links report rail 0's figures.
  std::vector<Route> all;
  for (int i = 0; i < 8; ++i) all.push_back({i, 8 + i, 1.0});
  const LinkSetId set = net.add_route_set(all);
  std::vector<std::uint64_t> done;
  net.start_flow(set, 1e9, 0, 1);
  net.advance_to(net.next_completion(), done);
  REQUIRE(done.size() == 1);
  for (int i = 0; i < 8; ++i) {
    for (LinkId l : net.route_links(i, 8 + i)) {
      CAPTURE(net.link_name(l));
      CHECK(net.link_stats(l).bytes == doctest::Approx(1e9));
      CHECK(net.link_stats(l).peak_utilisation == doctest::Approx(1.0));
    }
  }
  CHECK(net.link_stats(net.route_links(0, 1)[0]).bytes == 0);  // NVLink: no route crosses it
}

TEST_CASE("ZeroedArray: all zeros, small (calloc) and large (a fresh mapping), and movable") {
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20}) {
    CAPTURE(n);
    ZeroedArray<double> a(n);
    REQUIRE(a.size() == n);
    bool zeros = true;
    for (std::size_t i = 0; i < n; i += 97) zeros = zeros && a[i] == 0.0;
    CHECK(zeros);
    CHECK(a[n - 1] == 0.0);
    a[n - 1] = 2.5;
    ZeroedArray<double> b(std::move(a));
    CHECK(a.size() == 0);
    CHECK(b.size() == n);
    CHECK(b[n - 1] == 2.5);
    ZeroedArray<double> c;
    c = std::move(b);
    CHECK(c[n - 1] == 2.5);
    CHECK(c[0] == (n == 1 ? 2.5 : 0.0));
  }
  ZeroedArray<std::uint32_t> none(0);
  CHECK(none.size() == 0);
}

TEST_CASE("ZeroedArray from a memory resource: cleared even where the resource's bytes are not, and given back") {
  test::CountingResource dirty(true);  // hands out 0xA5 bytes
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20}) {
    CAPTURE(n);
    ZeroedArray<double> a(n, &dirty);
    bool zeros = true;
    for (std::size_t i = 0; i < n; ++i) zeros = zeros && a[i] == 0.0;
    CHECK(zeros);
    a[n - 1] = 2.5;
    ZeroedArray<double> b(std::move(a));
    ZeroedArray<double> c(4, &dirty);
    c = std::move(b);  // c's own block goes back first
    CHECK(c.size() == n);
    CHECK(c[n - 1] == 2.5);
  }
  CHECK(dirty.allocations == 6);
  CHECK(dirty.live_bytes == 0);
}

TEST_CASE("a network on a memory resource keeps its tables there and gives the same figures") {
  const Topology topo(dgx(8));
  // 64 routes node k -> node k + 1 (a DP ring's step): the list is cached.
  std::vector<Route> ring;
  for (int g = 0; g < 64; ++g) ring.push_back({g, (g + 8) % 64, 1.0});
  for (const bool fold : {false, true}) {
    CAPTURE(fold);
    auto play = [&](Network& net) {
      if (fold) net.fold_rails();
      const LinkSetId set = net.add_route_set(ring);
      CHECK(net.add_route_set(ring) == set);  // from the cache
      std::vector<std::uint64_t> done;
      net.start_flow(set, 1e9, 0, 1);
      net.start_flow(set, 5e8, 1000, 2);
      std::vector<double> figures;  // completion times, then per link bytes and peak
      while (done.size() < 2) {
        const TimeNs t = net.next_completion();
        figures.push_back(static_cast<double>(t));
        net.advance_to(t, done);
      }
      for (int g = 0; g < 64; ++g) {
        for (LinkId l : net.route_links(g, (g + 8) % 64)) {
          figures.push_back(net.link_stats(l).bytes);
          figures.push_back(net.link_stats(l).peak_utilisation);
        }
      }
      return figures;
    };
    Network plain(topo);
    test::CountingResource counted;
    std::vector<double> with;
    {
      Network net(topo, {}, &counted);
      with = play(net);
      CHECK(counted.allocations >= 4);  // per-link tables, merge weights, route block, cached routes
    }
    CHECK(counted.live_bytes == 0);
    CHECK(with == play(plain));
  }
}

TEST_CASE("rail folding: a list's rail-0 part registers what the whole list does") {
  const Topology topo(dgx(4));
  // Two nodes per leaf, every NIC of a node on one leaf: the leaf-spine
  // links carry all rails (a rail-0 hop that takes its weight once per rail).
  const Topology shared(dgx(4, 2, 1.0, false));
  REQUIRE(shared.rail_symmetric());
  // Every rail sends node k -> node k + 1 (mod 4), twice over: 64 routes, 8 from local GPU 0.
  std::vector<Route> all;
  std::vector<Route> part;
  for (int rep = 0; rep < 2; ++rep) {
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 8; ++i) {
        const Route r{8 * k + i, 8 * ((k + 1) % 4) + i, 0.5};
        all.push_back(r);
        if (i == 0) part.push_back(r);
      }
    }
  }
  // Walked in full, folded from the whole list, folded from its rail-0 part.
  enum Mode { full, folded, rail0 };
  auto play = [&](const Topology& fabric, Mode mode) {
    Network net(fabric);
    if (mode != full) net.fold_rails();
    const LinkSetId set = mode == rail0 ? net.add_rail0_route_set(part) : net.add_route_set(all);
    std::vector<std::uint64_t> done;
    net.start_flow(set, 1e9, 0, 1);
    const TimeNs at = net.next_completion();
    net.advance_to(at, done);
    std::vector<double> figures{static_cast<double>(at)};
    std::vector<std::pair<LinkId, double>> loaded;
    net.for_each_link_stats([&](LinkId l, const LinkStats& st) {
      figures.push_back(st.bytes);
      figures.push_back(st.peak_utilisation);
      figures.push_back(st.capacity_Bps);
      if (st.bytes > 0) loaded.emplace_back(l, st.capacity_Bps);
    });
    // The loaded links alone: the same links, in the same order, same figures.
    std::vector<std::pair<LinkId, double>> only;
    net.for_each_loaded_link_stats([&](LinkId l, const LinkStats& st) { only.emplace_back(l, st.capacity_Bps); });
    CHECK(only == loaded);
    CHECK(loaded.size() > 8);
    return figures;
  };
  for (const Topology* fabric : {&topo, &shared}) {
    const std::vector<double> walked = play(*fabric, full);
    CHECK(play(*fabric, folded) == walked);
    CHECK(play(*fabric, rail0) == walked);
  }

  Network flat(topo);
  CHECK_THROWS_WITH_AS(flat.add_rail0_route_set(part), "Network: add_rail0_route_set needs folded rails (fold_rails)",
                       std::logic_error);
  // compile_routes gives links, folded or not (the folded tables hold only
  // rail 0's slots); raw link sets cannot join folded rails.
  {
    Network folded_net(shared);
    folded_net.fold_rails();
    Network walked_net(shared);
    std::vector<LinkUse> a{{0, 0.25}};
    std::vector<LinkUse> b{{0, 0.25}};
    folded_net.compile_routes(all, a);
    walked_net.compile_routes(all, b);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].link == b[i].link);
      CHECK(a[i].weight == b[i].weight);
    }
    CHECK(a.size() > 20);
    CHECK_THROWS_WITH_AS(folded_net.add_link_set(a),
                         "Network: raw link sets (add_link_set, start_flow over uses) cannot join folded rails",
                         std::logic_error);
  }
  Network net(topo);
  net.fold_rails();
  const std::vector<Route> off{{3, 11, 1.0}};
  CHECK_THROWS_WITH_AS(net.add_rail0_route_set(off), "Network: a rail-0 route list has a route from GPU 3 (local GPU 3)",
                       std::invalid_argument);
  // A rail-0 part is cached apart from whole lists: the same 64 routes given
  // as a whole list are not closed (only local GPU 0 sends).
  std::vector<Route> big;
  for (int k = 0; k < 64; ++k) big.push_back({8 * (k % 4), 8 * ((k + 1) % 4), 1.0});
  (void)net.add_rail0_route_set(big);
  CHECK(net.add_rail0_route_set(big) == net.add_rail0_route_set(big));
  CHECK_THROWS_WITH_AS(net.add_route_set(big), "Network: a folded route list is not closed under the rail rotation",
                       std::logic_error);
}

TEST_CASE("rail folding: a rail-0 group stands for the rotations of its members") {
  const Topology topo(dgx(4));
  const double S = 64.0 * (1 << 20);
  // TP rank 0's DP ring across the 4 nodes; the family mirrors it on every rail.
  CommGroup family{iota(0, 4, 8), {}};
  for (int t = 1; t < 8; ++t) family.mirrors.push_back(iota(t, 4, 8));
  CommGroup part{iota(0, 4, 8), {}};
  part.rail0_part = true;
  auto play = [&](const CommGroup& g, Collective op, bool fold = true) {
    Network net(topo);
    if (fold) net.fold_rails();
    Engine eng(net);
    const GroupId gid = eng.add_group(g);
    const StreamId streams[1] = {eng.add_stream(g.ranks[0], StreamKind::dp)};
    const TaskId t = eng.add_collective(op, gid, S, streams, {}, Algorithm::ring);
    eng.run();
    std::vector<double> figures{static_cast<double>(eng.end_ns(t))};
    for (const LinkStats& st : net.all_link_stats()) {
      figures.push_back(st.bytes);
      figures.push_back(st.peak_utilisation);
    }
    return figures;
  };
  for (Collective op : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
    CAPTURE(to_string(op));
    const std::vector<double> a = play(part, op);
    CHECK(a == play(family, op));
    CHECK(a == play(family, op, false));  // walked in full
    CHECK(a.front() > 0);
  }
  // A rail-0 group needs folded rails; and its members must sit on local GPU 0.
  {
    Network net(topo);
    Engine eng(net);
    const GroupId gid = eng.add_group(part);
    const StreamId streams[1] = {eng.add_stream(0, StreamKind::dp)};
    CHECK_THROWS_WITH_AS(eng.add_collective(Collective::all_reduce, gid, S, streams, {}, Algorithm::ring),
                         "collective: a rail-0 group (CommGroup::rail0_part) needs a network with folded rails",
                         std::logic_error);
  }
  // A whole family that misses rotations is refused on folded rails.
  {
    CommGroup half{iota(0, 4, 8), {}};
    half.mirrors.push_back(iota(1, 4, 8));
    Network net(topo);
    net.fold_rails();
    Engine eng(net);
    const GroupId gid = eng.add_group(half);
    const StreamId streams[1] = {eng.add_stream(0, StreamKind::dp)};
    CHECK_THROWS_WITH_AS(eng.add_collective(Collective::all_reduce, gid, S, streams, {}, Algorithm::ring),
                         "Network: a folded route list is not closed under the rail rotation", std::logic_error);
  }
  CommGroup wrong{iota(1, 4, 8), {}};
  wrong.rail0_part = true;
  Network net(topo);
  net.fold_rails();
  Engine eng(net);
  const GroupId gid = eng.add_group(wrong);
  const StreamId streams[1] = {eng.add_stream(1, StreamKind::dp)};
  CHECK_THROWS_AS(eng.add_collective(Collective::all_reduce, gid, S, streams, {}, Algorithm::ring), std::invalid_argument);
}

TEST_CASE("uncontended collectives reproduce the alpha-beta closed forms") {
  const double S = 256.0 * (1 << 20);
  SUBCASE("one DGX node, 8 GPUs") {
    const Topology topo(dgx(1));
    const CommGroup g{iota(0, 8), {}};
    for (Collective op : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                          Collective::broadcast}) {
      CAPTURE(to_string(op));
      CHECK(rel(sim_collective(topo, op, g, S), closed_form(topo, op, g.ranks, S)) < 0.01);
    }
    const CommGroup p2p{{2, 5}, {}};
    CHECK(rel(sim_collective(topo, Collective::send_recv, p2p, S), closed_form(topo, Collective::send_recv, p2p.ranks, S)) <
          0.01);
  }
  SUBCASE("2 and 4 nodes: full-node groups and one-GPU-per-node (DP-like) groups") {
    for (int nodes : {2, 4}) {
      const Topology topo(dgx(nodes));
      for (const auto& ranks : {iota(0, nodes * 8), iota(3, nodes, 8)}) {
        const CommGroup g{ranks, {}};
        for (Collective op : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
          CAPTURE(nodes);
          CAPTURE(ranks.size());
          CAPTURE(to_string(op));
          CHECK(rel(sim_collective(topo, op, g, S), closed_form(topo, op, ranks, S)) < 0.01);
        }
      }
      const CommGroup p2p{{0, 8}, {}};
      CHECK(rel(sim_collective(topo, Collective::send_recv, p2p, S),
                closed_form(topo, Collective::send_recv, p2p.ranks, S)) < 0.01);
    }
  }
}

TEST_CASE("hierarchical all-reduce: its three phases, against the flat ring") {
  const Topology topo(dgx(2));
  const CommGroup g{iota(0, 16), {}};
  const double S = 1e9;
  const TimeNs ring = sim_collective(topo, Collective::all_reduce, g, S, Algorithm::ring);
  const TimeNs hier = sim_collective(topo, Collective::all_reduce, g, S, Algorithm::hierarchical);
  // Intra reduce-scatter and all-gather at 220 GB/s, then S/8 per rail over 2 nodes at 24 GB/s.
  const double expect_s = 2 * (7.0 / 8.0 * S / 220e9) + 2 * (1.0 / 2.0) * (S / 8) / 24e9;
  const double expect_ns = expect_s * 1e9 + 2 * 7 * 1000 + 2 * 3000;
  CHECK(static_cast<double>(hier) == doctest::Approx(expect_ns).epsilon(0.001));
  // Unpipelined phases: slower than NCCL's flat ring (which is NIC-bound at 192 GB/s).
  CHECK(hier > ring);
  // One GPU per node: the hierarchy is the flat ring.
  const CommGroup dp{iota(0, 2, 8), {}};
  CHECK(sim_collective(topo, Collective::all_reduce, dp, S, Algorithm::hierarchical) ==
        sim_collective(topo, Collective::all_reduce, dp, S, Algorithm::ring));
}

TEST_CASE("tree all-reduce: lower latency for small messages, chosen automatically") {
  const Topology topo(dgx(16));
  const CommGroup dp{iota(0, 16, 8), {}};  // GPU 0 of 16 nodes
  const double small = 64 * 1024;
  const double large = 1e9;
  CHECK(sim_collective(topo, Collective::all_reduce, dp, small, Algorithm::tree) <
        sim_collective(topo, Collective::all_reduce, dp, small, Algorithm::ring));
  CHECK(sim_collective(topo, Collective::all_reduce, dp, large, Algorithm::ring) <
        sim_collective(topo, Collective::all_reduce, dp, large, Algorithm::tree));
  Network net(topo);
  CHECK(choose_algorithm(net, Collective::all_reduce, dp, small) == Algorithm::tree);
  CHECK(choose_algorithm(net, Collective::all_reduce, dp, large) == Algorithm::ring);
  CHECK(choose_algorithm(net, Collective::all_gather, dp, small) == Algorithm::ring);
  const CommGroup node{iota(0, 8), {}};
  CHECK(choose_algorithm(net, Collective::all_reduce, node, small) == Algorithm::ring);
}

TEST_CASE("contention: two DP groups whose rings share NICs take twice as long") {
  // 4 NICs for 8 GPUs: GPUs 0 and 1 of a node share NIC 0.
  const Topology topo(dgx(4, 32, 1.0, true, 4));
  const double S = 1e9;
  const CommGroup a{iota(0, 4, 8), {}};
  const CommGroup b{iota(1, 4, 8), {}};
  Network net(topo);
  Engine e(net);
  const TaskId ta = e.add_collective(Collective::all_reduce, e.add_group(a), S, {}, {}, Algorithm::ring);
  const TaskId tb = e.add_collective(Collective::all_reduce, e.add_group(b), S, {}, {}, Algorithm::ring);
  e.run();
  const TimeNs alone = sim_collective(topo, Collective::all_reduce, a, S);
  CHECK(static_cast<double>(e.end_ns(ta)) / static_cast<double>(alone) == doctest::Approx(2.0).epsilon(0.01));
  CHECK(e.end_ns(tb) == e.end_ns(ta));
  // Groups on different NICs do not interfere.
  const CommGroup c{iota(2, 4, 8), {}};
  Network net2(topo);
  Engine e2(net2);
  const TaskId tc = e2.add_collective(Collective::all_reduce, e2.add_group(a), S, {}, {}, Algorithm::ring);
  e2.add_collective(Collective::all_reduce, e2.add_group(c), S, {}, {}, Algorithm::ring);
  e2.run();
  CHECK(e2.end_ns(tc) == alone);
}

TEST_CASE("contention: an oversubscribed spine slows cross-leaf DP rings") {
  // 4 nodes, 2 per leaf: every rank-i ring pairs node 0 with node 2 and node 1
  // with node 3, so all traffic crosses the spine. Simulated once (GPU 0 of
  // nodes 0 and 2), the other 15 rings as mirrors.
  auto run = [](double oversub) {
    const Topology topo(dgx(4, 2, oversub));
    CommGroup g{{0, 16}, {}};
    for (int i = 0; i < 8; ++i) {
      if (i > 0) g.mirrors.push_back({i, 16 + i});
      g.mirrors.push_back({8 + i, 24 + i});
    }
    return sim_collective(topo, Collective::all_reduce, g, 1e9);
  };
  const TimeNs full = run(1.0);
  const TimeNs over = run(4.0);
  // Leaf uplink per rail: 2 nodes x 24 GB/s / 4 = 12 GB/s for two rings: 6 GB/s each.
  CHECK(static_cast<double>(over) / static_cast<double>(full) == doctest::Approx(4.0).epsilon(0.01));
}

TEST_CASE("rail-optimised vs non-rail fat tree on a cross-rail pattern") {
  // GPU i of node 0 sends to GPU (i+1) % 8 of node 1 under one leaf group.
  // Rail-optimised: NIC i and NIC i+1 sit on different leaves, so the message
  // crosses the (4:1 oversubscribed) spine; non-rail: one leaf for the node pair.
  auto run = [](bool rail) {
    const Topology topo(dgx(2, 2, 4.0, rail));
    Network net(topo);
    Engine e(net);
    std::vector<Route> mirrors;
    for (int i = 1; i < 8; ++i) mirrors.push_back({i, 8 + (i + 1) % 8, 1.0});
    e.add_send_recv(0, 9, 1e9, {}, {}, mirrors);
    return e.run().end_ns;
  };
  const TimeNs rail = run(true);
  const TimeNs flat = run(false);
  CHECK(rail > flat);
  // Leaf uplink: 2 nodes x 25 GB/s / 4 x 0.96 = 12 GB/s against the NIC's 24 GB/s.
  CHECK(static_cast<double>(rail - 4000) / static_cast<double>(flat - 3000) == doctest::Approx(2.0).epsilon(0.01));
  // Same-rail traffic is indifferent to the tree's wiring.
  auto same_rail = [](bool rail_opt) {
    const Topology topo(dgx(2, 2, 4.0, rail_opt));
    Network net(topo);
    Engine e(net);
    e.add_send_recv(0, 8, 1e9, {});
    return e.run().end_ns;
  };
  CHECK(same_rail(true) == same_rail(false));
}

TEST_CASE("symmetry: mirrors load the real links, the representative pays for it") {
  // 4 NICs per node: GPUs 0 and 1 share NIC 0.
  const Topology topo(dgx(2, 32, 1.0, true, 4));
  auto run = [&topo](std::vector<Route> mirrors) {
    Network net(topo);
    Engine e(net);
    e.add_send_recv(0, 8, 1e9, {}, {}, mirrors);
    const TimeNs t = e.run().end_ns;
    // The mirror GPU 1's own link to the NIC carried the mirrored bytes.
    const double mirrored = net.link_stats(net.route_links(1, 9)[0]).bytes;
    return std::make_pair(t - 3000, mirrored);
  };
  const auto [alone, b0] = run({});
  const auto [with_mirror, b1] = run({{1, 9, 1.0}});
  const auto [with_three, b3] = run({{1, 9, 3.0}});
  CHECK(b0 == 0.0);
  CHECK(b1 == doctest::Approx(1e9));
  CHECK(b3 == doctest::Approx(3e9));
  CHECK(static_cast<double>(with_mirror) / static_cast<double>(alone) == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(static_cast<double>(with_three) / static_cast<double>(alone) == doctest::Approx(4.0).epsilon(1e-6));
  // A mirror on disjoint links costs nothing.
  const auto [disjoint, b2] = run({{2, 10, 1.0}});
  CHECK(disjoint == alone);
  CHECK(b2 == 0.0);  // GPU 1's link is not on the 2 -> 10 route
}

TEST_CASE("a collective starts when its last member arrives") {
  const Topology topo(dgx(1));
  Network net(topo);
  Engine e(net);
  std::vector<StreamId> comp, tp;
  for (int i = 0; i < 8; ++i) {
    comp.push_back(e.add_stream(i, StreamKind::compute));
    tp.push_back(e.add_stream(i, StreamKind::tp));
  }
  std::vector<TaskId> gemms;
  for (int i = 0; i < 8; ++i) gemms.push_back(e.add_compute(comp[static_cast<std::size_t>(i)], 1000 * (i + 1)));
  const GroupId g = e.add_group(CommGroup{iota(0, 8), {}});
  const TaskId ar = e.add_collective(Collective::all_reduce, g, 1e6, tp, gemms);
  // A later op on rank 0's compute stream overlaps with the collective.
  const TaskId next = e.add_compute(comp[0], 10);
  e.run();
  CHECK(e.start_ns(ar) == 8000);
  CHECK(e.start_ns(next) == 1000);
  CHECK(e.stream(tp[0]).busy_ns == e.end_ns(ar) - 8000);
  CHECK(e.algorithm(ar) == Algorithm::ring);
}

TEST_CASE("a simulated subset of members: the group's links are still loaded") {
  // Only TP rank 0 is simulated; the all-reduce still runs over all 8 GPUs.
  const Topology topo(dgx(1));
  Network net(topo);
  Engine e(net);
  const StreamId tp0 = e.add_stream(0, StreamKind::tp);
  const StreamId only[] = {tp0};
  const TaskId ar = e.add_collective(Collective::all_reduce, e.add_group(CommGroup{iota(0, 8), {}}), 1e9, only);
  e.run();
  CHECK(rel(e.end_ns(ar), closed_form(topo, Collective::all_reduce, iota(0, 8), 1e9)) < 0.01);
  CHECK(net.link_stats(net.route_links(5, 6)[0]).bytes > 0);
}

// All-to-all (MoE token dispatch): every member sends size / n to every other.
// Hand-computed on the fixture's DGX A100 nodes (NVSwitch busbw 220 GB/s,
// 8 NICs at 24 GB/s, latency 1 us inside a node and 3 us across a leaf).
TEST_CASE("all-to-all: hand-computed times, closed form and simulation, on an uncontended topology") {
  const double S = 256.0 * (1 << 20);  // 268,435,456 bytes per rank
  SUBCASE("one node, 8 GPUs: 7/8 of the size over NVLink") {
    const Topology topo(dgx(1));
    const CommGroup g{iota(0, 8), {}};
    // 7/8 x 268,435,456 B / 220 GB/s = 1,067,641 ns, plus one latency.
    CHECK(closed_form(topo, Collective::all_to_all, g.ranks, S) == 1'067'641 + 1'000);
    CHECK(rel(sim_collective(topo, Collective::all_to_all, g, S), 1'068'641) < 0.01);
  }
  SUBCASE("two nodes, 16 GPUs: half of the size leaves through the NICs, PXN keeps it on the rails") {
    const Topology topo(dgx(2));
    const CommGroup g{iota(0, 16), {}};
    // NICs: 8/16 x S / 24 GB/s = 5,592,405 ns; NVLink (7/8 x S with PXN's
    // forwarding) / 220 GB/s = 1,067,641 ns: the NICs set the time.
    CHECK(closed_form(topo, Collective::all_to_all, g.ranks, S) == 5'592'405 + 3'000);
    CHECK(rel(sim_collective(topo, Collective::all_to_all, g, S), 5'595'405) < 0.01);
  }
  SUBCASE("one GPU per node on 4 nodes: 3/4 of the size over each NIC") {
    const Topology topo(dgx(4));
    const CommGroup g{iota(3, 4, 8), {}};
    // 3/4 x S / 24 GB/s = 8,388,608 ns.
    CHECK(closed_form(topo, Collective::all_to_all, g.ranks, S) == 8'388'608 + 3'000);
    CHECK(rel(sim_collective(topo, Collective::all_to_all, g, S), 8'391'608) < 0.01);
  }
  SUBCASE("nccl-tests' bus factor for alltoall is (n - 1) / n") {
    CHECK(bus_factor(Collective::all_to_all, 8) == doctest::Approx(7.0 / 8.0));
    CHECK(bus_factor(Collective::all_to_all, 1) == 0.0);
  }
}

TEST_CASE("all-to-all: two groups whose members share NICs take twice as long; disjoint ones do not meet") {
  // 4 NICs for 8 GPUs: GPUs 0 and 1 of a node share NIC 0.
  const Topology topo(dgx(4, 32, 1.0, true, 4));
  const double S = 1e9;
  const CommGroup a{iota(0, 4, 8), {}};
  const CommGroup b{iota(1, 4, 8), {}};
  const TimeNs alone = sim_collective(topo, Collective::all_to_all, a, S);
  Network net(topo);
  Engine e(net);
  const TaskId ta = e.add_collective(Collective::all_to_all, e.add_group(a), S, {}, {}, Algorithm::ring);
  e.add_collective(Collective::all_to_all, e.add_group(b), S, {}, {}, Algorithm::ring);
  e.run();
  CHECK(static_cast<double>(e.end_ns(ta)) / static_cast<double>(alone) == doctest::Approx(2.0).epsilon(0.01));
  // A mirror loads the links like a second group.
  Network net2(topo);
  Engine e2(net2);
  CommGroup mirrored = a;
  mirrored.mirrors.push_back(b.ranks);
  const TaskId tm = e2.add_collective(Collective::all_to_all, e2.add_group(mirrored), S, {}, {}, Algorithm::ring);
  e2.run();
  CHECK(e2.end_ns(tm) == e.end_ns(ta));
  // The closed form prices one group alone at its share of the node's NICs
  // (4 x 24 GB/s / 8 GPUs = 12 GB/s): 3/4 x 1e9 / 12e9 s.
  CHECK(closed_form(topo, Collective::all_to_all, a.ranks, S) == 62'500'000 + 3'000);
}
