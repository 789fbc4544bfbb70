// Size-dependent busbw curves (busbw_curve.hpp): interpolation and clamping
// against hand-computed numbers, the cost model's max(alpha-beta, curve), the
// simulator's uncontended collective against that closed form, the loader's
// errors, and the curve shipped with the DGX A100 cards.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuboid/core/busbw_curve.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/sim/engine.hpp"
#include "cuboid/core/topology.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using nlohmann::json;

namespace {

const std::filesystem::path kTopologies = test::source_root() / "topologies";

// Two points on 8 GPUs: 1 MB at 50 GB/s, 4 MB at 100 GB/s. The stored
// all-reduce times are 1.75 x 1e6 / 50 = 35,000 ns and 1.75 x 4e6 / 100 =
// 70,000 ns; a power law between them is busbw(S) = 50 x (S / 1e6)^0.5 GB/s.
BusbwCurve two_points() {
  const json j = json::parse(R"({"ranks": 8, "source": "test",
    "points": [{"size_bytes": 1e6, "busbw_GBps": 50}, {"size_bytes": 4e6, "busbw_GBps": 100}]})");
  return busbw_curve_from_json(j, "test.json", "curve");
}

std::vector<int> iota(int first, int count) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i);
  return v;
}

// One collective alone on the network, as tests/test_network.cpp runs it.
sim::TimeNs sim_collective(const Topology& topo, Collective op, const std::vector<int>& ranks, double bytes) {
  sim::Network net(topo);
  sim::Engine e(net);
  const sim::GroupId gid = e.add_group(sim::CommGroup{ranks, {}});
  e.add_collective(op, gid, bytes, {}, {}, sim::Algorithm::ring);
  const sim::RunStats st = e.run();
  REQUIRE(st.tasks_unfinished == 0);
  return st.end_ns;
}

}  // namespace

TEST_CASE("busbw between two points follows a power law in size; outside them it is clamped") {
  const BusbwCurve c = two_points();
  CHECK(c.samples.size() == 2);
  CHECK(c.samples[0].time_ns == doctest::Approx(35000.0));
  CHECK(c.samples[1].time_ns == doctest::Approx(70000.0));
  CHECK(curve_busbw_GBps(c, 1e6) == doctest::Approx(50.0));
  CHECK(curve_busbw_GBps(c, 4e6) == doctest::Approx(100.0));
  // 2 MB is the geometric middle: 50 x sqrt(2).
  CHECK(curve_busbw_GBps(c, 2e6) == doctest::Approx(70.710678));
  // 3 MB: 50 x sqrt(3).
  CHECK(curve_busbw_GBps(c, 3e6) == doctest::Approx(86.602540));
  // Below the first point the first busbw, above the last the last.
  CHECK(curve_busbw_GBps(c, 1000.0) == doctest::Approx(50.0));
  CHECK(curve_busbw_GBps(c, 1e9) == doctest::Approx(100.0));
}

TEST_CASE("a curve prices all-reduce, reduce-scatter and all-gather at the same per-step chunk") {
  const BusbwCurve c = two_points();
  // 8 GPUs, 2 MB: 1.75 x 2e6 / 70.710678 = 49,497.47 ns; half of it for RS / AG.
  CHECK(*curve_time_ns(c, Collective::all_reduce, 8, 2e6) == doctest::Approx(49497.47));
  CHECK(*curve_time_ns(c, Collective::reduce_scatter, 8, 2e6) == doctest::Approx(24748.74));
  CHECK(*curve_time_ns(c, Collective::all_gather, 8, 2e6) == doctest::Approx(24748.74));
  // 4 GPUs, 1 MB: chunks of 250 kB, as the 8-GPU curve's 2 MB: busbw 70.71,
  // time 2 x 3/4 x 1e6 / 70.710678 = 21,213.20 ns.
  CHECK(*curve_time_ns(c, Collective::all_reduce, 4, 1e6) == doctest::Approx(21213.20));
  // No sourced curve for broadcast or p2p; nothing for one GPU or no bytes.
  CHECK_FALSE(curve_time_ns(c, Collective::broadcast, 8, 2e6).has_value());
  CHECK_FALSE(curve_time_ns(c, Collective::send_recv, 2, 2e6).has_value());
  CHECK_FALSE(curve_time_ns(c, Collective::all_reduce, 1, 2e6).has_value());
  CHECK_FALSE(curve_time_ns(c, Collective::all_reduce, 8, 0.0).has_value());
}

TEST_CASE("collective_time_ns takes the larger of alpha-beta and the curve") {
  const BusbwCurve c = two_points();
  LinkParams link{100e9, 1000.0};
  // Without the curve: 1.75 x 2e6 / 100 GB/s = 35,000 ns + 14 x 1,000 ns.
  CHECK(collective_time_ns(Collective::all_reduce, 2e6, 8, link) == 49000);
  link.curve = &c;
  // Inside the curve it is slower: 49,497 ns.
  CHECK(collective_time_ns(Collective::all_reduce, 2e6, 8, link) == 49497);
  // Above the last point busbw is the tier's 100 GB/s, so alpha-beta wins:
  // 1.75 x 8e6 / 100 = 140,000 + 14,000 ns.
  CHECK(collective_time_ns(Collective::all_reduce, 8e6, 8, link) == 154000);
  // A tiny message keeps its per-step latency: 17.5 + 14,000 ns.
  CHECK(collective_time_ns(Collective::all_reduce, 1000.0, 8, link) == 14018);
  // Send/recv ignores the curve: 2e6 / 100 GB/s + 1,000 ns.
  CHECK(collective_time_ns(Collective::send_recv, 2e6, 2, link) == 21000);
}

TEST_CASE("group_link_params carries the curve inside a node only") {
  Cluster cl = test::dgx_a100(2);
  cl.intra.allreduce_busbw_curve = std::make_shared<const BusbwCurve>(two_points());
  const Topology topo(cl);
  CHECK(group_link_params(topo, Collective::all_reduce, iota(0, 8)).curve == cl.intra.allreduce_busbw_curve.get());
  CHECK(group_link_params(topo, Collective::all_reduce, {0, 8}).curve == nullptr);
  // A card without a curve prices as before (tests/test_cost.cpp pins those numbers).
  const Topology plain(test::dgx_a100(1));
  CHECK(group_link_params(plain, Collective::all_reduce, iota(0, 8)).curve == nullptr);
}

TEST_CASE("simulator: an uncontended intra-node collective with a curve takes the closed form's time") {
  Cluster cl = test::dgx_a100(1);
  cl.intra.allreduce_busbw_curve = std::make_shared<const BusbwCurve>(two_points());
  const Topology topo(cl);
  const Topology plain(test::dgx_a100(1));
  for (Collective op : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
    for (int n : {4, 8}) {
      for (double bytes : {1000.0, 2e6, 3e6, 8e6}) {
        CAPTURE(to_string(op));
        CAPTURE(n);
        CAPTURE(bytes);
        const std::vector<int> ranks = iota(0, n);
        const auto closed = static_cast<double>(
            collective_time_ns(op, bytes, n, group_link_params(topo, op, ranks)));
        const auto simulated = static_cast<double>(sim_collective(topo, op, ranks, bytes));
        CHECK(std::abs(simulated - closed) <= 0.001 * closed + 2.0);
      }
    }
  }
  // The 2 MB all-reduce on 8 GPUs: 49,497 ns with the curve; without it the
  // fixture's 230 GB/s all-reduce busbw: 1.75 x 2e6 / 230 + 14 x 1,000 ns.
  CHECK(sim_collective(topo, Collective::all_reduce, iota(0, 8), 2e6) == doctest::Approx(49497.0).epsilon(1e-4));
  CHECK(sim_collective(plain, Collective::all_reduce, iota(0, 8), 2e6) == doctest::Approx(29217.0).epsilon(1e-4));
}

TEST_CASE("simulator: curved collectives still share their links max-min") {
  Cluster cl = test::dgx_a100(1);
  cl.intra.allreduce_busbw_curve = std::make_shared<const BusbwCurve>(two_points());
  const Topology topo(cl);
  // Two 2 MB all-reduces over the same 8 GPUs at once: each ring's flow is
  // stretched to 49,497 - 14,000 = 35,497 ns at the 220 GB/s links; sharing
  // them they drain together in 2 x 35,497 ns, then wait their 14 x 1,000 ns.
  sim::Network net(topo);
  sim::Engine e(net);
  const sim::GroupId a = e.add_group(sim::CommGroup{iota(0, 8), {}});
  const sim::GroupId b = e.add_group(sim::CommGroup{iota(0, 8), {}});
  e.add_collective(Collective::all_reduce, a, 2e6, {}, {}, sim::Algorithm::ring);
  e.add_collective(Collective::all_reduce, b, 2e6, {}, {}, sim::Algorithm::ring);
  const sim::RunStats st = e.run();
  REQUIRE(st.tasks_unfinished == 0);
  CHECK(static_cast<double>(st.end_ns) == doctest::Approx(2 * 35497.47 + 14000).epsilon(1e-3));
}

TEST_CASE("bad curves are InputErrors naming the field") {
  auto load = [](const std::string& text) { busbw_curve_from_json(json::parse(text), "card.json", "curve"); };
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 8, "points": [{"size_bytes": 1, "busbw_GBps": 1}, {"size_bytes": 2, "busbw_GBps": 1}]})");
        }) ==
        "card.json: curve.source: missing: a curve is a measurement and must say where it was read (fix: give the "
        "nccl-tests run it comes from (URL, NCCL version, command))");
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 8, "source": "s", "points": [{"size_bytes": 2e6, "busbw_GBps": 10},
                 {"size_bytes": 2e6, "busbw_GBps": 20}]})");
        }) ==
        "card.json: curve.points[1].size_bytes: sizes must increase, but 2000000 follows 2000000 (fix: list the "
        "points in increasing size, one per size)");
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 8, "source": "s", "points": [{"size_bytes": 4e6, "busbw_GBps": 10},
                 {"size_bytes": 1e6, "busbw_GBps": 20}]})");
        }) ==
        "card.json: curve.points[1].size_bytes: sizes must increase, but 1000000 follows 4000000 (fix: list the "
        "points in increasing size, one per size)");
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 8, "source": "s", "points": [{"size_bytes": 1e6, "busbw_GBps": 10},
                 {"size_bytes": 2e6, "busbw_GBps": 0}]})");
        }) == "card.json: curve.points[1].busbw_GBps: must be positive, got 0 (fix: give a value > 0)");
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 8, "source": "s", "points": [{"size_bytes": 1e6, "busbw_GBps": -5},
                 {"size_bytes": 2e6, "busbw_GBps": 10}]})");
        }) == "card.json: curve.points[0].busbw_GBps: must be positive, got -5 (fix: give a value > 0)");
  CHECK(test::input_error_message([&] { load(R"({"ranks": 8, "source": "s", "points": [{"size_bytes": 1e6, "busbw_GBps": 10}]})"); }) ==
        "card.json: curve.points: needs an array of at least 2 points (fix: give the out-of-place rows of the run as "
        "{\"size_bytes\": ..., \"busbw_GBps\": ...})");
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 1, "source": "s", "points": [{"size_bytes": 1, "busbw_GBps": 1}, {"size_bytes": 2, "busbw_GBps": 1}]})");
        }) ==
        "card.json: curve.ranks: must be between 2 and 1000000, got 1 (fix: give the number of GPUs of the measured "
        "all_reduce_perf run)");
  CHECK(test::input_error_message([&] {
          load(R"({"ranks": 8, "source": "s", "points": [{"size": 1, "busbw_GBps": 1}, {"size_bytes": 2, "busbw_GBps": 1}]})");
        }) == "card.json: curve.points[0].size_bytes: missing required field (fix: add \"size_bytes\")");
}

TEST_CASE("a bad curve in a card names the card and the tier's field") {
  json j = json::parse(R"({
    "name": "small", "nodes": 1, "gpus_per_node": 4,
    "gpu": {"name": "G", "peak_bf16_tflops": 100, "hbm_bandwidth_GBps": 1000, "memory_GB": 16, "sm_count": 10,
            "gemm_max_efficiency": 0.8, "memory_bound_efficiency": 0.9, "kernel_launch_us": 5,
            "memory_reserve_GiB": 1},
    "intra_node": {"kind": "nvswitch", "link_bandwidth_GBps": 100, "allreduce_busbw_GBps": 80,
                   "busbw_GBps": 70, "latency_us": 2,
                   "allreduce_busbw_curve": {"ranks": 4, "source": "s",
                     "points": [{"size_bytes": 1e6, "busbw_GBps": 40}, {"size_bytes": 1e6, "busbw_GBps": 60}]}},
    "inter_node": {"kind": "none"}
  })");
  CHECK(test::input_error_message([&] { cluster_from_json(j, "small.json", kTopologies); }) ==
        "small.json: intra_node.allreduce_busbw_curve.points[1].size_bytes: sizes must increase, but 1000000 "
        "follows 1000000 (fix: list the points in increasing size, one per size)");
  j["intra_node"]["allreduce_busbw_curve"]["points"][1]["size_bytes"] = 4e6;
  const Cluster c = cluster_from_json(j, "small.json", kTopologies);
  REQUIRE(c.intra.allreduce_busbw_curve != nullptr);
  CHECK(c.intra.allreduce_busbw_curve->ranks == 4);
  CHECK(c.intra.sources.at("allreduce_busbw_curve") == "s");
}

TEST_CASE("the DGX A100 cards ship the sourced nccl-tests curve") {
  for (const char* card : {"dgx-a100.json", "dgx-a100-4node.json", "dgx-a100-superpod.json"}) {
    CAPTURE(card);
    const Cluster c = load_cluster(kTopologies / card);
    REQUIRE(c.intra.allreduce_busbw_curve != nullptr);
    const BusbwCurve& curve = *c.intra.allreduce_busbw_curve;
    CHECK(curve.ranks == 8);
    CHECK(curve.samples.size() == 11);
    CHECK(curve.source.find("Hetu-Galvatron") != std::string::npos);
    // Rows of the log: 64 MiB at 178.69 GB/s, 128 MiB at 186.91 GB/s.
    CHECK(curve_busbw_GBps(curve, 67108864.0) == doctest::Approx(178.69));
    CHECK(curve_busbw_GBps(curve, 134217728.0) == doctest::Approx(186.91));
    // The 22B model's TP all-reduce (b 4 x s 2048 x h 6144 x 2 B = 100.7 MB)
    // lies between them: log2(100663296 / 67108864) = 0.585 of the way in
    // log size, power law in time: 183.4 GB/s.
    const double b = curve_busbw_GBps(curve, 100663296.0);
    CHECK(b > 178.69);
    CHECK(b < 186.91);
    const double f = std::log2(1.5);
    const double t0 = 1.75 * 67108864.0 / 178.69;
    const double t1 = 1.75 * 134217728.0 / 186.91;
    CHECK(b == doctest::Approx(1.75 * 100663296.0 / (t0 * std::pow(t1 / t0, f))));
  }
}
