// Cluster cards, GPU profiles, the topology graph and its routing.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include <boost/graph/breadth_first_search.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/core/topology.hpp"
#include "fixtures.hpp"

using cuboid::Cluster;
using cuboid::InputError;
using cuboid::Tier;
using cuboid::Topology;
using cuboid::test::input_error_message;
using nlohmann::json;

namespace {

const std::filesystem::path kRoot = CUBOID_SOURCE_ROOT_DIR;
const std::filesystem::path kTopologies = kRoot / "topologies";
const std::filesystem::path kBad = kRoot / "tests" / "data" / "clusters";

// A small inline card: 4 GPUs and 2 NICs per node, 2 nodes per leaf, 2 levels.
json small_card() {
  return json::parse(R"({
    "name": "small",
    "nodes": 4,
    "gpus_per_node": 4,
    "gpu": {
      "name": "G", "peak_bf16_tflops": 100, "hbm_bandwidth_GBps": 1000, "memory_GB": 16,
      "sm_count": 10, "gemm_max_efficiency": 0.8, "memory_bound_efficiency": 0.9,
      "kernel_launch_us": 5, "memory_reserve_GiB": 1
    },
    "intra_node": {"kind": "nvswitch", "link_bandwidth_GBps": 100, "allreduce_busbw_GBps": 80,
                   "busbw_GBps": 70, "latency_us": 2},
    "inter_node": {"kind": "infiniband-hdr", "nics_per_node": 2, "nic_bandwidth_Gbps": 200,
                   "nic_busbw_GBps": 24, "latency_us": 4, "switch_latency_us": 0.5, "levels": 2,
                   "nodes_per_leaf": 2, "oversubscription": 2, "rail_optimized": true}
  })");
}

Cluster small(const json& j, std::optional<int> nodes = std::nullopt) {
  return cuboid::cluster_from_json(j, "small.json", kTopologies, nodes);
}

// Hop count of a shortest path between two GPUs by breadth-first search.
int bfs_hops(const Topology& t, int a, int b) {
  const auto& g = t.graph();
  std::vector<int> dist(boost::num_vertices(g), -1);
  const auto src = t.gpu_vertex(a);
  dist[src] = 0;
  struct Recorder : boost::default_bfs_visitor {
    std::vector<int>* d;
    void tree_edge(Topology::Edge e, const Topology::Graph& gr) const {
      (*d)[boost::target(e, gr)] = (*d)[boost::source(e, gr)] + 1;
    }
  };
  Recorder vis;
  vis.d = &dist;
  boost::breadth_first_search(g, src, boost::visitor(vis));
  return dist[t.gpu_vertex(b)];
}

// The route's edges form a walk from gpu a to gpu b.
bool route_connects(const Topology& t, int a, int b, const std::vector<Topology::Edge>& path) {
  const auto& g = t.graph();
  auto at = t.gpu_vertex(a);
  for (const auto& e : path) {
    const auto s = boost::source(e, g);
    const auto d = boost::target(e, g);
    if (s == at) at = d;
    else if (d == at) at = s;
    else return false;
  }
  return at == t.gpu_vertex(b);
}

void check_routes_against_bfs(const Topology& t) {
  for (int a = 0; a < t.num_gpus(); ++a) {
    for (int b = 0; b < t.num_gpus(); ++b) {
      const auto path = t.route(a, b);
      CAPTURE(a);
      CAPTURE(b);
      CHECK(route_connects(t, a, b, path));
      CHECK(static_cast<int>(path.size()) == (a == b ? 0 : bfs_hops(t, a, b)));
      // The latency from the per-GPU sums is the route's, hop by hop.
      CHECK(t.route_latency_ns(a, b) == t.latency_ns(path));
    }
  }
}

}  // namespace

TEST_CASE("every shipped card loads") {
  const char* cards[] = {"dgx-a100.json",         "dgx-h100.json",         "hgx-h200.json",    "dgx-a100-4node.json",
                         "dgx-a100-superpod.json", "localhost-cpu.json",    "dgx-b200.json",    "gb200-nvl72.json",
                         "gb300-nvl72.json"};
  for (const char* name : cards) {
    CAPTURE(name);
    const Cluster c = cuboid::load_cluster(kTopologies / name);
    CHECK(c.total_gpus() > 0);
    CHECK(c.gpu.peak_bf16_flops > 0);
    CHECK(c.gpu.memory_bytes > c.gpu.memory_reserve_bytes);
    // Every constant of a shipped card names its source.
    for (const char* f : {"peak_bf16_flops", "hbm_bandwidth_Bps", "memory_bytes", "sm_count", "gemm_max_efficiency",
                          "memory_bound_efficiency", "kernel_launch_ns", "memory_reserve_bytes"}) {
      CAPTURE(f);
      CHECK(!c.gpu.sources.at(f).empty());
    }
    // The four constants, and the busbw curve where a card has one (DGX A100).
    for (const char* f : {"link_bandwidth_GBps", "allreduce_busbw_GBps", "busbw_GBps", "latency_ns"}) {
      CAPTURE(f);
      CHECK(!c.intra.sources.at(f).empty());
    }
    // ... and NCCL's channel count where a card gives it (DGX A100).
    CHECK(c.intra.sources.size() == 4U + (c.intra.allreduce_busbw_curve ? 1U : 0U) + (c.intra.nccl_channels > 0 ? 1U : 0U));
    if (c.intra.allreduce_busbw_curve) CHECK(!c.intra.sources.at("allreduce_busbw_curve").empty());
    if (c.intra.nccl_channels > 0) CHECK(!c.intra.sources.at("nccl_channels").empty());
    const Topology t(c);
    CHECK(t.num_gpus() == c.total_gpus());
  }
  for (const char* name : {"a100-sxm4-80gb.json", "h100-sxm5-80gb.json", "h200-sxm-141gb.json", "b200.json",
                           "gb200.json", "gb300.json", "h800-sxm5-80gb.json"}) {
    CAPTURE(name);
    const auto p = kTopologies / "gpus" / name;
    const cuboid::GpuProfile g = cuboid::gpu_profile_from_json(cuboid::read_json_file(p), p.string());
    CHECK(g.sm_count >= 108);
    // Low-precision rates, where a profile gives them, are sourced and above BF16's.
    if (g.peak_fp8_flops > 0) CHECK(!g.sources.at("peak_fp8_flops").empty());
    if (g.peak_fp4_flops > 0) CHECK(!g.sources.at("peak_fp4_flops").empty());
    if (g.peak_fp8_flops > 0) CHECK(g.peak_fp8_flops == doctest::Approx(2 * g.peak_bf16_flops).epsilon(0.001));
    if (g.peak_fp4_flops > 0) CHECK(g.peak_fp4_flops > g.peak_fp8_flops);
    // The efficiencies are all sourced, each attention kernel's and the default kernel among them.
    if (name != std::string("a100-sxm4-80gb.json")) CHECK(!g.sources.at("speed_spread").empty());
    CHECK(g.attention_kernel != cuboid::AttentionKernel::auto_);
    CHECK(g.attention_rates.count(g.attention_kernel) == 1);
    CHECK(!g.sources.at("attention_kernel").empty());
    for (const auto& entry : g.attention_rates) {
      const std::string key = "attention_kernels." + std::string(cuboid::to_string(entry.first));
      CAPTURE(key);
      CHECK(g.sources.at(key).size() > 40);
      CHECK(entry.second.fwd.size() == entry.second.head_dims.size());
    }
  }
}

// The figures of the Blackwell profiles and cards, read off their JSON by hand.
TEST_CASE("Blackwell profiles: dense rates, memory, SMs") {
  auto profile = [](const char* name) {
    const auto p = kTopologies / "gpus" / name;
    return cuboid::gpu_profile_from_json(cuboid::read_json_file(p), p.string());
  };
  const cuboid::GpuProfile b200 = profile("b200.json");
  CHECK(b200.peak_bf16_flops == doctest::Approx(2250e12));  // 4.5 PFLOPS sparse / 2
  CHECK(b200.peak_fp8_flops == doctest::Approx(4500e12));
  CHECK(b200.peak_fp4_flops == doctest::Approx(9000e12));
  CHECK(b200.hbm_bandwidth_Bps == doctest::Approx(7.672e12));
  CHECK(b200.memory_bytes == 183359LL * 1024 * 1024);
  CHECK(b200.sm_count == 148);
  CHECK(b200.gemm_max_efficiency == doctest::Approx(1745.0 / 2250).epsilon(0.001));
  const cuboid::GpuProfile gb200 = profile("gb200.json");
  CHECK(gb200.peak_bf16_flops == doctest::Approx(2500e12));
  CHECK(gb200.peak_fp8_flops == doctest::Approx(5000e12));
  CHECK(gb200.peak_fp4_flops == doctest::Approx(10000e12));
  CHECK(gb200.memory_bytes == 186LL * 1024 * 1024 * 1024);
  CHECK(gb200.gemm_max_efficiency == doctest::Approx(1822.0 / 2500).epsilon(0.001));  // its own MAMF row
  const cuboid::GpuProfile gb300 = profile("gb300.json");
  CHECK(gb300.peak_bf16_flops == doctest::Approx(2500e12));
  CHECK(gb300.peak_fp4_flops == doctest::Approx(15000e12));  // 1,080 PFLOPS dense / 72
  CHECK(gb300.sm_count == 152);  // as the device reports (facebookexperimental/triton PR #2768); the full die has 160
  // Sustained against burst: Azure's cuBLASLt FP8 after 10,000 warm-up calls
  // over the card's burst FP8 rate, GB200 2906.9 / 3615.6, GB300 3308.5 / 3725.
  CHECK(gb200.gemm_sustained_fraction == doctest::Approx(2906.9 / 3615.6).epsilon(0.001));
  CHECK(gb300.gemm_sustained_fraction == doctest::Approx(3308.5 / (0.745 * 5000)).epsilon(0.001));
  CHECK(b200.gemm_sustained_fraction == 0.853);
  // GB300 NVFP4: the FP8 burst rate x TE's kernels-only NVFP4 / FP8 (6.812 / 3.764 ms).
  CHECK(gb300.gemm_max_efficiency_fp4 == doctest::Approx(0.745 * 5000 * (6.812 / 3.764) / 15000).epsilon(0.001));
  // MXFP8 against per-tensor FP8, per pass (TE's kernels-only profile on a B300).
  for (const cuboid::GpuProfile* g : {&b200, &gb200, &gb300}) {
    CHECK(g->mxfp8_gemm_fprop == doctest::Approx(2.158 / 2.365).epsilon(0.001));
    CHECK(g->mxfp8_gemm_dgrad == doctest::Approx(2.329 / 2.397).epsilon(0.001));
    CHECK(g->mxfp8_gemm_wgrad == doctest::Approx(2.325 / 2.400).epsilon(0.001));
  }
  // B200 HBM: cub::DeviceTransform's add, 6.721 of 7.672 TB/s (NVIDIA/cccl PR #7391).
  CHECK(b200.memory_bound_efficiency == doctest::Approx(6.721 / 7.672).epsilon(0.001));
  const cuboid::GpuProfile h800 = profile("h800-sxm5-80gb.json");
  CHECK(h800.peak_bf16_flops == doctest::Approx(989e12));
  CHECK(h800.peak_fp8_flops == doctest::Approx(1979e12));
  CHECK(h800.peak_fp4_flops == 0);  // Hopper has no FP4 tensor cores
  // The A100 has neither: absent keys read 0.
  CHECK(profile("a100-sxm4-80gb.json").peak_fp8_flops == 0);
  CHECK(profile("h100-sxm5-80gb.json").peak_fp8_flops == doctest::Approx(1979e12));
}

TEST_CASE("DGX B200 and NVL72 cards: the NVLink domain is the node") {
  const Cluster b = cuboid::load_cluster(kTopologies / "dgx-b200.json");
  CHECK(b.gpus_per_node == 8);
  CHECK(b.gpu.name == "B200-SXM6-180GB");
  CHECK(b.intra.link_bandwidth_GBps == 900);
  CHECK(b.intra.allreduce_busbw_GBps == 830);  // NVLS
  CHECK(b.intra.busbw_GBps == 722);            // NCCL's 40.1 GB/s x 18 links
  CHECK(b.inter.nics_per_node == 8);
  CHECK(b.inter.nic_bandwidth_Gbps == 400);
  CHECK(b.inter.nodes_per_leaf == 32);

  const Cluster g = cuboid::load_cluster(kTopologies / "gb200-nvl72.json", 4);
  CHECK(g.gpus_per_node == 72);  // 18 compute trays x 4 GPUs in one NVLink domain
  CHECK(g.total_gpus() == 288);
  CHECK(g.gpu.name == "GB200");
  CHECK(g.intra.allreduce_busbw_GBps == 835);  // full-rack NVLS all-reduce
  CHECK(g.inter.kind == "infiniband-ndr");
  CHECK(g.inter.nics_per_node == 72);  // one ConnectX-7 per GPU
  CHECK(g.inter.nic_bandwidth_Gbps == 400);
  CHECK(g.inter.nodes_per_leaf == 8);  // 8 racks per scalable unit
  CHECK(g.inter.rail_optimized);
  const Topology gt(g);
  CHECK(gt.tier(0, 71) == Tier::nvlink);  // trays 1 and 18 of a rack: one NVLink hop apart
  CHECK(gt.tier(0, 72) == Tier::leaf);    // rail 0 of the next rack
  CHECK(gt.rail_symmetric());

  const Cluster u = cuboid::load_cluster(kTopologies / "gb300-nvl72.json");
  CHECK(u.gpus_per_node == 72);
  CHECK(u.inter.kind == "infiniband-xdr");
  CHECK(u.inter.nics_per_node == 72);
  CHECK(u.inter.nic_bandwidth_Gbps == 800);  // ConnectX-8
  CHECK(u.inter.nic_busbw_GBps == 92);
}

TEST_CASE("--gpus-per-node uses part of each node, with its share of the NICs") {
  const auto nvl = kTopologies / "gb200-nvl72.json";
  // 16 of a rack's 18 trays: 256 racks are 16,384 GPUs, each with its own NIC.
  const Cluster c = cuboid::load_cluster(nvl, 256, 64);
  CHECK(c.gpus_per_node == 64);
  CHECK(c.total_gpus() == 16384);
  CHECK(c.inter.nics_per_node == 64);
  CHECK(c.intra.allreduce_busbw_GBps == 835);
  const Topology t(c);
  CHECK(t.tier(0, 63) == Tier::nvlink);
  CHECK(t.tier(0, 64) == Tier::leaf);
  CHECK(t.rail_symmetric());
  // The card's own count is the identity.
  const auto dgx = kTopologies / "dgx-a100.json";
  CHECK(cuboid::load_cluster(dgx, 2, 8).inter.nics_per_node == 8);
  CHECK(cuboid::load_cluster(dgx, 2, 4).inter.nics_per_node == 4);
  CHECK(input_error_message([&] { cuboid::load_cluster(nvl, 1, 73); }) ==
        "command line: --gpus-per-node: 73 GPUs per node, but a node of " + nvl.string() +
            " has 72 (fix: use at most 72 GPUs per node)");
  CHECK(input_error_message([&] { cuboid::load_cluster(nvl, 1, 0); }) ==
        "command line: --gpus-per-node: must be positive, got 0 (fix: give a GPU count >= 1)");
  json j = small_card();  // 4 GPUs, 2 NICs per node
  CHECK(input_error_message([&] { cuboid::cluster_from_json(j, "small.json", kTopologies, std::nullopt, 3); }) ==
        "command line: --gpus-per-node: 3 of 4 GPUs would take a fraction of small.json's 2 NICs per node "
        "(fix: give a multiple of 2 GPUs per node)");
  CHECK(cuboid::cluster_from_json(j, "small.json", kTopologies, std::nullopt, 2).inter.nics_per_node == 1);
}

TEST_CASE("an NVL72 rack is one node of 18 hosts of 4 GPUs; --gpus-per-node takes whole hosts") {
  const auto nvl = kTopologies / "gb200-nvl72.json";
  const Cluster rack = cuboid::load_cluster(nvl, 2);
  CHECK(rack.gpus_per_host == 4);
  CHECK(rack.host_gpus() == 4);
  CHECK(rack.hosts() == 36);
  const Cluster trays = cuboid::load_cluster(nvl, 256, 64);
  CHECK(trays.hosts() == 4096);
  CHECK(cuboid::load_cluster(kTopologies / "gb300-nvl72.json", 1, 32).hosts() == 8);
  // A node that is one host: hosts are nodes.
  const Cluster dgx = cuboid::load_cluster(kTopologies / "dgx-a100.json", 4);
  CHECK(dgx.gpus_per_host == 0);
  CHECK(dgx.hosts() == 4);
  CHECK(input_error_message([&] { cuboid::load_cluster(nvl, 1, 70); }) ==
        "command line: --gpus-per-node: 70 GPUs per node are not whole hosts: a host of " + nvl.string() +
            " has 4 GPUs (fix: give a multiple of 4 GPUs per node)");
  json j = small_card();  // 4 GPUs per node
  j["gpus_per_host"] = 3;
  CHECK(input_error_message([&] { cuboid::cluster_from_json(j, "small.json", kTopologies); }) ==
        "small.json: gpus_per_host: 3 GPUs per host neither divide the node's 4 nor are whole nodes (fix: give the "
        "GPUs of one host (a GB200 NVL72 compute tray: 4), a divisor of gpus_per_node, or a multiple of it where one "
        "host holds several nodes)");
  j["gpus_per_host"] = 2;
  const Cluster halves = cuboid::cluster_from_json(j, "small.json", kTopologies);
  CHECK(halves.hosts() == 2 * halves.nodes);
  // One host of several nodes (tests/data/clusters/localhost-cpu-2x2.json): 4 ranks as 2 nodes of 2.
  const Cluster two_by_two = cuboid::load_cluster("tests/data/clusters/localhost-cpu-2x2.json");
  CHECK(two_by_two.gpus_per_node == 2);
  CHECK(two_by_two.nodes == 2);
  CHECK(two_by_two.hosts() == 1);
}

TEST_CASE("DGX A100 constants") {
  const Cluster c = cuboid::load_cluster(kTopologies / "dgx-a100.json");
  CHECK(c.name == "DGX A100");
  CHECK(c.source_file == (kTopologies / "dgx-a100.json").string());
  CHECK(c.nodes == 1);
  CHECK(c.gpus_per_node == 8);
  CHECK(c.gpu.name == "A100-SXM4-80GB");
  CHECK(c.gpu.peak_bf16_flops == doctest::Approx(312e12));
  CHECK(c.gpu.hbm_bandwidth_Bps == doctest::Approx(2.039e12));
  CHECK(c.gpu.memory_bytes == 81920LL * 1024 * 1024);
  CHECK(c.gpu.memory_reserve_bytes == 2LL * 1024 * 1024 * 1024);
  CHECK(c.gpu.sm_count == 108);
  CHECK(c.gpu.gemm_max_efficiency == doctest::Approx(271.2 / 312).epsilon(0.001));
  CHECK(c.gpu.kernel_launch_ns == doctest::Approx(4900));
  CHECK(c.intra.kind == "nvswitch");
  CHECK(c.intra.link_bandwidth_GBps == 300);
  CHECK(c.intra.allreduce_busbw_GBps == 230);
  CHECK(c.intra.latency_ns == doctest::Approx(1900));
  CHECK(c.inter.kind == "infiniband-hdr");
  CHECK(c.inter.nics_per_node == 8);
  CHECK(c.inter.nic_bandwidth_Gbps == 200);
  CHECK(c.inter.nic_busbw_GBps == 24);
  CHECK(c.inter.levels == 2);
  CHECK(c.inter.nodes_per_leaf == 20);
  CHECK(c.inter.oversubscription == 1.0);
  CHECK(c.inter.rail_optimized);
  CHECK(c.gpu.sources.at("peak_bf16_flops").find("Narayanan") != std::string::npos);

  const Cluster h = cuboid::load_cluster(kTopologies / "dgx-h100.json");
  CHECK(h.gpu.peak_bf16_flops == doctest::Approx(989e12));
  CHECK(h.gpu.memory_bytes == 81559LL * 1024 * 1024);
  CHECK(h.intra.busbw_GBps == 370);
  CHECK(h.inter.nic_bandwidth_Gbps == 400);
  CHECK(h.inter.nodes_per_leaf == 32);

  const Cluster cpu = cuboid::load_cluster(kTopologies / "localhost-cpu.json");
  CHECK(cpu.inter.kind == "none");
  CHECK(cpu.inter.nics_per_node == 0);
  CHECK(cpu.total_gpus() == 2);
  CHECK(cpu.intra.kind == "shared-memory");
}

TEST_CASE("--nodes overrides the card's node count") {
  const auto card = kTopologies / "dgx-a100.json";
  CHECK(cuboid::load_cluster(card, 16).nodes == 16);
  CHECK(cuboid::load_cluster(card, 16).total_gpus() == 128);
  CHECK(cuboid::load_cluster(kTopologies / "dgx-a100-4node.json").nodes == 4);
  CHECK(cuboid::load_cluster(kTopologies / "dgx-a100-superpod.json").total_gpus() == 4480);
  CHECK(input_error_message([&] { cuboid::load_cluster(card, -2); }) ==
        "command line: --nodes: must be positive, got -2 (fix: give a node count >= 1)");
  CHECK(input_error_message([&] { cuboid::load_cluster(card, 0); }) ==
        "command line: --nodes: must be positive, got 0 (fix: give a node count >= 1)");
  CHECK(input_error_message([&] { cuboid::load_cluster(card, 141); }) ==
        "command line: --nodes: 141 nodes exceed max_nodes 140 of " + card.string() +
            " (fix: use at most 140 nodes, or a card for a larger cluster)");
  const auto cpu = kTopologies / "localhost-cpu.json";
  CHECK(input_error_message([&] { cuboid::load_cluster(cpu, 2); }) ==
        "command line: --nodes: 2 nodes exceed max_nodes 1 of " + cpu.string() +
            " (fix: use at most 1 nodes, or a card for a larger cluster)");
  json j = small_card();
  j["inter_node"]["levels"] = 1;
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: nodes: 4 nodes exceed the single switch of small.json (2 nodes per leaf, levels 1) "
        "(fix: use at most 2 nodes, or a card with levels 2 or 3)");
  CHECK(small(j, 2).nodes == 2);
}

TEST_CASE("graph of 4 DGX A100 nodes, counted by hand") {
  const Topology t(cuboid::load_cluster(kTopologies / "dgx-a100.json", 4));
  const auto& g = t.graph();
  // Per node 8 GPUs + 1 NVSwitch + 8 NICs = 17 (x4 = 68); one leaf group
  // (4 <= 20 nodes) x 8 rails = 8 leaves; one spine vertex: 77.
  CHECK(boost::num_vertices(g) == 77);
  // Per node 8 GPU-NVSwitch + 8 GPU-NIC + 8 NIC-leaf = 24 (x4 = 96); 8 leaf-spine: 104.
  CHECK(boost::num_edges(g) == 104);
  CHECK(g[t.gpu_vertex(13)].name == "n1.gpu5");
  CHECK(g[t.gpu_vertex(13)].kind == cuboid::VertexKind::gpu);

  const auto same_node = t.route(0, 7);
  REQUIRE(same_node.size() == 2);
  CHECK(g[same_node[0]].kind == "nvlink");
  CHECK(t.bottleneck_bandwidth_Bps(same_node) == doctest::Approx(300e9));
  CHECK(t.latency_ns(same_node) == 1900);

  // GPU 3 of node 0 to GPU 3 of node 2: same rail, same leaf.
  const auto rail = t.route(3, 19);
  REQUIRE(rail.size() == 4);
  CHECK(g[rail[1]].kind == "ib");
  CHECK(t.bottleneck_bandwidth_Bps(rail) == doctest::Approx(25e9));
  CHECK(t.latency_ns(rail) == 4000);
  CHECK(t.tier(3, 19) == Tier::leaf);

  // Different rails go up to the spine: two extra switch hops.
  const auto cross = t.route(3, 20);
  REQUIRE(cross.size() == 6);
  CHECK(g[cross[2]].kind == "ib-up");
  CHECK(t.latency_ns(cross) == 4000 + 2 * 130);
  // Leaf uplink: 20 nodes x 25 GB/s / oversubscription 1.
  CHECK(g[cross[2]].bandwidth_Bps == doctest::Approx(500e9));
  CHECK(t.tier(3, 20) == Tier::spine);

  CHECK(t.route(5, 5).empty());
  CHECK(t.tier(5, 5) == Tier::same_gpu);
  CHECK(t.tier(0, 7) == Tier::nvlink);
  CHECK(t.group_tier({0, 1, 2, 3}) == Tier::nvlink);
  CHECK(t.group_tier({0, 8, 16, 24}) == Tier::leaf);
  CHECK(t.group_tier({0, 8, 17}) == Tier::spine);
  CHECK(t.group_tier({4}) == Tier::same_gpu);
}

TEST_CASE("tiers across scalable units and pods") {
  // 40 nodes of DGX A100: two scalable units of 20.
  const Topology two_su(cuboid::load_cluster(kTopologies / "dgx-a100.json", 40));
  CHECK(two_su.tier(0, 19 * 8) == Tier::leaf);         // node 0 and node 19, rail 0
  CHECK(two_su.tier(0, 20 * 8) == Tier::spine);        // node 20 is in the next SU
  CHECK(two_su.route(0, 20 * 8).size() == 6);

  const Topology pod(cuboid::load_cluster(kTopologies / "dgx-a100-superpod.json"));
  const auto& g = pod.graph();
  // 560 nodes x 17 + 224 leaves + 4 spines + 1 core.
  CHECK(boost::num_vertices(g) == 560 * 17 + 224 + 4 + 1);
  CHECK(boost::num_edges(g) == 560 * 24 + 224 + 4);
  CHECK(pod.tier(0, 139 * 8) == Tier::spine);          // same pod of 7 SUs (140 nodes)
  CHECK(pod.tier(0, 140 * 8) == Tier::core);           // next pod
  const auto across = pod.route(0, 419 * 8 + 7);
  REQUIRE(across.size() == 8);
  CHECK(g[across[3]].kind == "ib-up");
  CHECK(pod.latency_ns(across) == 4000 + 4 * 130);
  // A 16-way PP x 8-way TP x DP plan's DP group spans pods.
  std::vector<int> dp_group;
  for (int r = 0; r < 26; ++r) dp_group.push_back(r * 128);
  CHECK(pod.group_tier(dp_group) == Tier::core);
}

TEST_CASE("routes equal BFS shortest paths and connect") {
  SUBCASE("rail-optimised, 2 levels") {
    const Topology t(small(small_card()));
    CHECK(boost::num_vertices(t.graph()) == 4 * (4 + 1 + 2) + 2 * 2 + 1);
    check_routes_against_bfs(t);
  }
  SUBCASE("not rail-optimised, 2 levels") {
    json j = small_card();
    j["inter_node"]["rail_optimized"] = false;
    const Topology t(small(j));
    CHECK(boost::num_vertices(t.graph()) == 4 * (4 + 1 + 2) + 2 + 1);
    check_routes_against_bfs(t);
  }
  SUBCASE("3 levels, rail-optimised, 2 pods") {
    json j = small_card();
    j["nodes"] = 8;
    j["inter_node"]["levels"] = 3;
    j["inter_node"]["leaves_per_pod"] = 4;
    const Topology t(small(j));
    CHECK(t.tier(0, 7 * 4) == Tier::core);
    CHECK(t.tier(0, 3 * 4 + 2) == Tier::spine);
    check_routes_against_bfs(t);
  }
  SUBCASE("3 levels, non-rail, fewer NICs than GPUs") {
    json j = small_card();
    j["nodes"] = 6;
    j["inter_node"]["nics_per_node"] = 1;
    j["inter_node"]["levels"] = 3;
    j["inter_node"]["leaves_per_pod"] = 2;
    j["inter_node"]["rail_optimized"] = false;
    check_routes_against_bfs(Topology(small(j)));
  }
  SUBCASE("1 level: one switch") {
    json j = small_card();
    j["nodes"] = 2;
    j["inter_node"]["levels"] = 1;
    const Topology t(small(j));
    CHECK(boost::num_vertices(t.graph()) == 2 * 7 + 1);
    CHECK(t.tier(0, 7) == Tier::leaf);
    check_routes_against_bfs(t);
  }
  SUBCASE("single machine without network") {
    const Topology t(cuboid::load_cluster(kTopologies / "localhost-cpu.json"));
    CHECK(boost::num_vertices(t.graph()) == 3);
    CHECK(t.graph()[t.route(0, 1)[0]].kind == "shm");
    check_routes_against_bfs(t);
  }
}

// Rotating every node's GPUs by one: GPU (n, i) -> (n, i + 1 mod g).
int rotate(const Topology& t, int gpu) {
  const int g = t.cluster().gpus_per_node;
  return gpu - gpu % g + (gpu % g + 1) % g;
}

// On a rail-symmetric fabric the rotation maps routes onto routes: the
// rotated pair's route has the same rail-0 images hop by hop, a hop is
// shared (fixed) exactly when the rotation leaves it where it is, and a link
// and its image have one capacity and latency.
void check_rail_symmetry(const Topology& t) {
  REQUIRE(t.rail_symmetric());
  const auto& img = t.rail0_links();
  REQUIRE(img.size() == 2 * t.edges().size());
  // The images numbered densely in link id order: every link's number is its
  // image's, and the numbers list the images (the links that are their own).
  const auto& slots = t.rail0_slots();
  const auto& slot_links = t.rail0_slot_links();
  REQUIRE(slots.size() == img.size());
  std::vector<std::uint32_t> images;
  for (std::uint32_t l = 0; l < img.size(); ++l) {
    if (img[l] == l) images.push_back(l);
  }
  CHECK(slot_links == images);
  CHECK(images.size() < img.size());
  bool numbered = true;
  for (std::uint32_t l = 0; l < img.size(); ++l) numbered = numbered && slot_links.at(slots[l]) == img[l];
  CHECK(numbered);
  // Each number's links, in id order, are every link of that image; the
  // rotation keeps a link's kinds (GPU to GPU, NIC to NIC, switch to switch).
  std::vector<std::uint32_t> seen;
  bool members_ok = true;
  for (std::uint32_t s = 0; s < slot_links.size(); ++s) {
    const auto members = t.rail0_slot_members(s);
    members_ok = members_ok && !members.empty() && std::is_sorted(members.begin(), members.end());
    for (std::uint32_t l : members) {
      members_ok = members_ok && img[l] == slot_links[s];
      const cuboid::EdgeRecord& e = t.edges()[l / 2];
      const cuboid::EdgeRecord& e0 = t.edges()[slot_links[s] / 2];
      members_ok = members_ok && e.lo_kind == e0.lo_kind && e.hi_kind == e0.hi_kind && l % 2 == slot_links[s] % 2;
      seen.push_back(l);
    }
  }
  CHECK(members_ok);
  std::sort(seen.begin(), seen.end());
  CHECK(seen.size() == img.size());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  std::uint32_t hops[Topology::kMaxRouteLinks], rot[Topology::kMaxRouteLinks], folded[Topology::kMaxRouteLinks];
  std::uint8_t fixed[Topology::kMaxRouteLinks];
  for (int a = 0; a < t.num_gpus(); ++a) {
    for (int b = 0; b < t.num_gpus(); ++b) {
      CAPTURE(a);
      CAPTURE(b);
      const std::size_t n = t.route_ids(a, b, hops);
      REQUIRE(t.route_ids(rotate(t, a), rotate(t, b), rot) == n);
      REQUIRE(t.route_ids_rail0(a, b, folded, fixed) == n);
      for (std::size_t k = 0; k < n; ++k) {
        CHECK(img[hops[k]] == img[rot[k]]);
        CHECK(folded[k] == img[hops[k]]);
        CHECK((fixed[k] != 0) == (hops[k] == rot[k]));
        const cuboid::EdgeRecord& e = t.edges()[hops[k] / 2];
        const cuboid::EdgeRecord& e0 = t.edges()[img[hops[k]] / 2];
        CHECK(e.bandwidth_Bps == e0.bandwidth_Bps);
        CHECK(e.latency_ns == e0.latency_ns);
      }
    }
  }
}

TEST_CASE("rail symmetry: where rotating each node's GPUs maps the fabric onto itself") {
  json j = small_card();
  SUBCASE("fewer NICs than GPUs: two GPUs share a NIC, no symmetry") { CHECK_FALSE(Topology(small(j)).rail_symmetric()); }
  j["inter_node"]["nics_per_node"] = 4;
  SUBCASE("rail-optimised, 2 levels") { check_rail_symmetry(Topology(small(j))); }
  SUBCASE("not rail-optimised: the leaf uplinks are shared") {
    j["inter_node"]["rail_optimized"] = false;
    check_rail_symmetry(Topology(small(j)));
  }
  SUBCASE("3 levels, each pod holds whole rail groups") {
    j["nodes"] = 8;
    j["inter_node"]["levels"] = 3;
    j["inter_node"]["leaves_per_pod"] = 4;
    check_rail_symmetry(Topology(small(j)));
  }
  SUBCASE("3 levels, not rail-optimised, 2 pods") {
    j["nodes"] = 8;
    j["inter_node"]["levels"] = 3;
    j["inter_node"]["leaves_per_pod"] = 2;
    j["inter_node"]["rail_optimized"] = false;
    check_rail_symmetry(Topology(small(j)));
  }
  SUBCASE("1 level: one switch") {
    j["nodes"] = 2;
    j["inter_node"]["levels"] = 1;
    check_rail_symmetry(Topology(small(j)));
  }
  SUBCASE("the shipped superpod card") {
    check_rail_symmetry(Topology(cuboid::load_cluster(kTopologies / "dgx-a100-superpod.json", 4)));
  }
}

TEST_CASE("rail-optimised and non-rail fabrics differ") {
  json j = small_card();
  const Topology rail(small(j));
  j["inter_node"]["rail_optimized"] = false;
  const Topology flat(small(j));
  // GPU 0 (NIC 0) of node 0 to GPU 2 (NIC 1) of node 1: same leaf group.
  CHECK(rail.tier(0, 6) == Tier::spine);
  CHECK(flat.tier(0, 6) == Tier::leaf);
  CHECK(rail.route(0, 6).size() == 6);
  CHECK(flat.route(0, 6).size() == 4);
  // Leaf uplink capacity: rail leaf has 2 nodes x 1 NIC, flat leaf 2 x 2 NICs, over 2:1.
  CHECK(rail.graph()[rail.route(0, 6)[2]].bandwidth_Bps == doctest::Approx(2 * 25e9 / 2));
  const auto far = flat.route(0, 3 * 4);
  REQUIRE(far.size() == 6);
  CHECK(flat.graph()[far[2]].bandwidth_Bps == doctest::Approx(4 * 25e9 / 2));
}

TEST_CASE("bad cards are InputErrors naming file, field and fix") {
  SUBCASE("missing gpu") {
    const auto p = kBad / "missing-gpu.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": gpu: missing required field (fix: give an inline GPU profile object or a path such as "
                       "\"gpus/a100-sxm4-80gb.json\")");
  }
  SUBCASE("unknown field (typo)") {
    const auto p = kBad / "typo-field.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": inter_node.nic_bandwith_Gbps: unknown field (fix: remove it or check its spelling "
                       "(did you mean \"nic_bandwidth_Gbps\"?))");
    json j = small_card();
    j["gpu"]["flux_capacitor"] = 1;
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: gpu.flux_capacitor: unknown field (fix: remove it or check its spelling (see the README's "
          "card schema))");
  }
  SUBCASE("zero bandwidth") {
    const auto p = kBad / "zero-bandwidth.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": intra_node.link_bandwidth_GBps.value: must be positive, got 0 (fix: give a value > 0)");
    json j = small_card();
    j["inter_node"]["nic_bandwidth_Gbps"] = -100;
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: inter_node.nic_bandwidth_Gbps: must be positive, got -100 (fix: give a value > 0)");
  }
  SUBCASE("gpu file not found") {
    const auto p = kBad / "gpu-not-found.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": gpu: GPU profile file \"gpus/no-such-gpu.json\" not found (looked for " +
              (kBad / "gpus/no-such-gpu.json").string() +
              ") (fix: give a path relative to the card's folder, e.g. \"gpus/a100-sxm4-80gb.json\")");
  }
  SUBCASE("errors inside a GPU file name that file") {
    const auto p = kBad / "gpu-file-bad.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          (kBad / "gpus/bad-efficiency.json").string() +
              ": gemm_max_efficiency: must be at most 1, got 1.5 (fix: give a fraction in (0, 1])");
  }
  SUBCASE("oversubscription below 1") {
    const auto p = kBad / "oversubscription-below-1.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": inter_node.oversubscription: must be at least 1, got 0.5 (fix: give downlink:uplink "
                       "bandwidth as a ratio >= 1 (1 = full bisection))");
  }
  SUBCASE("no NICs on a real network") {
    const auto p = kBad / "nics-zero.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": inter_node.nics_per_node: must be at least 1 for inter_node kind \"infiniband-hdr\" "
                       "(fix: give the NICs per node, or set kind to \"none\" for a single machine)");
  }
  SUBCASE("levels 4") {
    const auto p = kBad / "levels-4.json";
    CHECK(input_error_message([&] { cuboid::load_cluster(p); }) ==
          p.string() + ": inter_node.levels: must be 1, 2 or 3, got 4 (fix: give 1 (one switch), 2 (leaf/spine) "
                       "or 3 (leaf/spine/core))");
  }
  SUBCASE("memory given twice, or not at all") {
    json j = small_card();
    j["gpu"]["memory_MiB"] = 16384;
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: gpu.memory_GB: given together with memory_MiB (fix: give exactly one of memory_MiB, "
          "memory_GiB, memory_GB)");
    j["gpu"].erase("memory_MiB");
    j["gpu"].erase("memory_GB");
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: gpu.memory_MiB: missing required field (the GPU's memory capacity) (fix: give exactly one "
          "of memory_MiB, memory_GiB, memory_GB)");
  }
  SUBCASE("other checks") {
    json j = small_card();
    j["inter_node"] = json::parse(R"({"kind": "none", "nics_per_node": 2})");
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: inter_node.nics_per_node: must be 0 when kind is \"none\", got 2 (fix: set nics_per_node to "
          "0 or give the network's kind)");
    j["inter_node"] = json::parse(R"({"kind": "none"})");
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: nodes: 4 nodes, but small.json has no inter-node network (inter_node.kind \"none\") "
          "(fix: use 1 node, or a card with an inter-node network)");
    CHECK(small(j, 1).total_gpus() == 4);
    j = small_card();
    j["intra_node"]["kind"] = "nvlnk";
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: intra_node.kind: unknown value \"nvlnk\" (fix: use one of nvswitch|nvlink|pcie|shared-memory)");
    j = small_card();
    j["gpus_per_node"] = 2.5;
    CHECK(input_error_message([&] { small(j); }) == "small.json: gpus_per_node: expected an integer, got 2.5 (fix: give a whole number)");
    j = small_card();
    j["nodes"] = 8;
    j["inter_node"]["levels"] = 3;
    j["inter_node"]["leaves_per_pod"] = 3;
    CHECK(input_error_message([&] { small(j); }) ==
          "small.json: inter_node.leaves_per_pod: must be a multiple of nics_per_node (2) in a rail-optimised tree, "
          "got 3 (fix: count whole scalable units: (leaf groups per pod) x nics_per_node)");
  }
}

TEST_CASE("intra_node.nccl_channels: optional, sourced, fewer than the GPU's SMs") {
  const Cluster dgx = cuboid::load_cluster(kTopologies / "dgx-a100.json");
  CHECK(dgx.intra.nccl_channels == 24);
  CHECK(dgx.intra.sources.at("nccl_channels").find("NVIDIA/nccl-tests#100") != std::string::npos);
  CHECK(small(small_card()).intra.nccl_channels == 0);  // absent: not modelled
  json j = small_card();
  j["intra_node"]["nccl_channels"] = 4;
  CHECK(small(j).intra.nccl_channels == 4);
  j["intra_node"]["nccl_channels"] = 10;  // the small card's GPU has 10 SMs
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: intra_node.nccl_channels: 10 channels (one SM each) leave none of the GPU's 10 SMs for "
        "compute (fix: give fewer channels than sm_count (NCCL_DEBUG=INFO prints \"N coll channels\"))");
  j["intra_node"]["nccl_channels"] = -2;
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: intra_node.nccl_channels: must not be negative, got -2 (fix: give a value >= 0)");
  j["intra_node"]["nccl_channels"] = 2.5;
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: intra_node.nccl_channels: expected an integer, got 2.5 (fix: give a whole number)");
  j["intra_node"]["nccl_channels"] = json{{"value", 3}, {"source", "a test"}};
  CHECK(small(j).intra.nccl_channels == 3);
  CHECK(small(j).intra.sources.at("nccl_channels") == "a test");
}

TEST_CASE("gpu.unfused_attention_efficiency: optional, sourced, a fraction") {
  const Cluster dgx = cuboid::load_cluster(kTopologies / "dgx-a100.json");
  CHECK(dgx.gpu.unfused_attention_efficiency == 0.646);
  CHECK(dgx.gpu.sources.at("unfused_attention_efficiency").find("Table 4") != std::string::npos);
  CHECK(small(small_card()).gpu.unfused_attention_efficiency == 0.0);  // absent: memory_bound_efficiency
  CHECK(cuboid::load_cluster(kTopologies / "dgx-h100.json").gpu.unfused_attention_efficiency == 0.0);
  json j = small_card();
  j["gpu"]["unfused_attention_efficiency"] = json{{"value", 0.5}, {"source", "a test"}};
  CHECK(small(j).gpu.unfused_attention_efficiency == 0.5);
  CHECK(small(j).gpu.sources.at("unfused_attention_efficiency") == "a test");
  j["gpu"]["unfused_attention_efficiency"] = 1.5;
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: gpu.unfused_attention_efficiency: must be at most 1, got 1.5 (fix: give a fraction in (0, 1])");
  j["gpu"]["unfused_attention_efficiency"] = 0;
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: gpu.unfused_attention_efficiency: must be positive, got 0 (fix: give a value > 0)");
}

TEST_CASE("gpu.speed_spread: optional, sourced, 0 to 0.5, on the GPU cards only") {
  for (const char* card : {"dgx-a100.json", "dgx-h100.json", "hgx-h200.json"}) {
    CAPTURE(card);
    const Cluster c = cuboid::load_cluster(kTopologies / card);
    CHECK(c.gpu.speed_spread == 0.0115);
    CHECK(c.gpu.sources.at("speed_spread").find("arXiv:2208.11035") != std::string::npos);
    // The paper measured V100 and MI60: each card says so.
    CHECK(c.gpu.sources.at("speed_spread").find("Measured on V100 and MI60") != std::string::npos);
  }
  CHECK(cuboid::load_cluster(kTopologies / "localhost-cpu.json").gpu.speed_spread == 0.0);
  CHECK(small(small_card()).gpu.speed_spread == 0.0);  // absent: every GPU alike
  json j = small_card();
  j["gpu"]["speed_spread"] = 0;
  CHECK(small(j).gpu.speed_spread == 0.0);
  j["gpu"]["speed_spread"] = json{{"value", 0.02}, {"unit", "relative sigma"}, {"source", "a test"}};
  CHECK(small(j).gpu.speed_spread == 0.02);
  CHECK(small(j).gpu.sources.at("speed_spread") == "a test");
  j["gpu"]["speed_spread"] = -0.01;
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: gpu.speed_spread: must not be negative, got -0.01 (fix: give a value >= 0 (0: off))");
  j["gpu"]["speed_spread"] = json{{"value", 0.6}};
  CHECK(input_error_message([&] { small(j); }) ==
        "small.json: gpu.speed_spread: must be at most 0.5, got 0.6 (fix: give a value in [0, 0.5])");
  j["gpu"]["speed_spread"] = "wide";
  CHECK(input_error_message([&] { small(j); }).find("gpu.speed_spread") != std::string::npos);
}

TEST_CASE("bare numbers and sourced constants both load") {
  json j = small_card();
  j["gpu"]["peak_bf16_tflops"] = json::parse(R"({"value": 100, "unit": "TFLOP/s", "source": "spec sheet"})");
  const Cluster c = small(j);
  CHECK(c.gpu.peak_bf16_flops == doctest::Approx(100e12));
  CHECK(c.gpu.sources.at("peak_bf16_flops") == "spec sheet");
  CHECK(c.gpu.sources.count("hbm_bandwidth_Bps") == 0);
  CHECK(c.gpu.memory_bytes == 16'000'000'000LL);
  CHECK(c.inter.oversubscription == 2.0);
}

TEST_CASE("JsonReader::count: an exact integer within its type and bounds, else an error naming the range") {
  const json j = json::parse(R"({"nodes": 4294967298, "gpus": 8, "neg": -3, "zero": 0, "frac": 2.5, "whole": 4.0,
                                  "text": "16", "huge": 18446744073709551615, "big_float": 4294967298.0})");
  auto message = [&](auto f) {
    return input_error_message([&] {
      cuboid::JsonReader r(j, "card.json", "cluster");
      f(r);
    });
  };
  cuboid::JsonReader r(j, "card.json");
  CHECK(r.count<int>("gpus") == 8);
  CHECK(r.count<std::int64_t>("nodes") == 4294967298);
  CHECK(r.count<int>("zero", 0) == 0);
  CHECK(r.count<int>("whole") == 4);
  CHECK(r.count<std::int8_t>("gpus", 1, 1000) == 8);  // hi is capped at the type's largest value
  CHECK(r.optional_count<int>("absent") == std::nullopt);
  CHECK(r.optional_count<int>("gpus") == 8);
  // 2^32 + 2 stored as int would be 2: refused instead.
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("nodes"); }) ==
        "card.json: cluster.nodes: value 4294967298 is above the limit of 2147483647 (fix: give a value from 1 to 2147483647)");
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("big_float"); }).find("above the limit of 2147483647") !=
        std::string::npos);
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("gpus", 1, 4); }) ==
        "card.json: cluster.gpus: value 8 is above the limit of 4 (fix: give a value from 1 to 4)");
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("neg"); }) ==
        "card.json: cluster.neg: must be positive, got -3 (fix: give a value >= 1)");
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("neg", 0); }) ==
        "card.json: cluster.neg: must not be negative, got -3 (fix: give a value >= 0)");
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("gpus", 16, 64); }) ==
        "card.json: cluster.gpus: must be at least 16, got 8 (fix: give a value >= 16)");
  CHECK(message([](cuboid::JsonReader& x) { x.count<std::uint8_t>("zero", 0, 1000); }) == "<no InputError>");
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("frac"); }).find("expected an integer, got 2.5") !=
        std::string::npos);
  CHECK(message([](cuboid::JsonReader& x) { x.count<int>("text"); }).find("expected an integer, got a string") !=
        std::string::npos);
  CHECK(message([](cuboid::JsonReader& x) { x.count<std::int64_t>("huge"); }).find("huge: value") !=
        std::string::npos);
  CHECK(message([](cuboid::JsonReader& x) { x.optional_count<int>("nodes"); }).find("above the limit") !=
        std::string::npos);
}
