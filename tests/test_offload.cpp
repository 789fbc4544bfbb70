// CPU activation offloading (--offload-activations, cost/offload.hpp): the
// bytes a layer sends to host memory, the copies' time over the card's host
// link, what of them the compute stream waits for (Transformer Engine's
// synchronizer walked by hand), the memory saved, the simulator against the
// estimate, Megatron-Core's refusals and the cards' host links. Hand numbers
// for a Llama-3-8B layer (h 4096, 32 heads of 128, 8 KV heads, SwiGLU f
// 14336) at 8192 tokens, TP 1, bf16, fused attention, no recompute.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/offload.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

// One DGX-A100-like node of 8 with a PCIe Gen5 host link of 64 GB/s each way.
Cluster node_with_link(double d2h_GBps, double h2d_GBps) {
  Cluster c = test::dgx_a100(1);
  c.host_link.kind = "pcie-gen5";
  c.host_link.d2h_GBps = d2h_GBps;
  c.host_link.h2d_GBps = h2d_GBps;
  return c;
}

ParallelPlan offload_plan(int layers) {
  ParallelPlan p;
  p.dp = 8;
  p.micro_batch = 1;
  p.global_batch = 16;
  p.seq_length = 8192;
  p.zero_stage = 1;
  p.recompute = Recompute::none;
  p.offload_layers = layers;
  return p;
}

// Llama-3-8B's stored activations per layer at s 8192, b 1, TP 1:
// 10 sbh (norm inputs, QKV and MLP inputs, masks) = 335,544,320
// + 2 s (q + 2 kv + q) = 2 x 8192 x 10240 = 167,772,160
// + 6 s f (FC1's 2f output, SwiGLU's f output) = 704,643,072.
constexpr double kLayerBytes = 1'207'959'552;

const ActivationOffload kFour{4, 2};  // L 4, K 2

}  // namespace

TEST_CASE("an offloaded layer's bytes and its copies over the host link") {
  const ModelSpec m = test::llama3_8b();
  const ParallelPlan p = offload_plan(10);
  CHECK(offloaded_layer_bytes(m, p, 0) == kLayerBytes);
  CHECK(offloaded_host_bytes(m, p) == 10 * kLayerBytes);
  const Cluster c = node_with_link(64, 64);
  // 1,207,959,552 B / 64 GB/s = 18,874,368 ns each way.
  CHECK(host_copy_ns(c.host_link, kLayerBytes, true) == 18'874'368);
  CHECK(host_copy_ns(c.host_link, kLayerBytes, false) == 18'874'368);
  // GB200's NVLink-C2C as the card states it: 297 GB/s out, 375 back.
  const Cluster gb200 = load_cluster(test::source_root() / "topologies/gb200-nvl72.json");
  CHECK(gb200.host_link.kind == "nvlink-c2c");
  CHECK(host_copy_ns(gb200.host_link, kLayerBytes, true) == 4'067'204);   // 1,207,959,552 / 297 = 4,067,203.9
  CHECK(host_copy_ns(gb200.host_link, kLayerBytes, false) == 3'221'225);  // 1,207,959,552 / 375 = 3,221,225.47
}

TEST_CASE("the memory model: K layers' activations leave the GPU for pinned host memory") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = test::a100();
  const MemoryReport none = memory_per_gpu(m, offload_plan(0), gpu);
  const MemoryReport ten = memory_per_gpu(m, offload_plan(10), gpu);
  CHECK(none.activation_bytes - ten.activation_bytes == doctest::Approx(10 * kLayerBytes));
  CHECK(ten.host_activation_bytes == 10 * kLayerBytes);  // 11.25 GiB
  CHECK(none.host_activation_bytes == 0);
  CHECK(ten.weight_and_optimizer_bytes == none.weight_and_optimizer_bytes);
}

TEST_CASE("Transformer Engine's synchronizer: which copy each layer waits for and issues") {
  // L 80, K 20 (the GB300 70B row): layer 0's copies are due before layer
  // 60's forward; layer 0's reload is issued as layer 59's backward starts.
  const ActivationOffload off{80, 20};
  CHECK(off.due_before(60) == 0);
  CHECK(off.due_before(79) == 19);
  CHECK(off.due_before(59) == -1);
  CHECK(off.reload_issued_at(59) == 0);
  CHECK(off.reload_issued_at(78) == 19);
  CHECK(off.reload_issued_at(79) == -1);
  CHECK(off.offloads(19));
  CHECK_FALSE(off.offloads(20));
}

TEST_CASE("what the compute stream waits for, by hand on 4 layers (forward 10, backward 20)") {
  const std::vector<TimeNs> fwd(4, 10), bwd(4, 20);
  SUBCASE("copies of 5: hidden") {
    const std::vector<TimeNs> copy(2, 5);
    const OffloadExposure e = offload_exposure(kFour, fwd, bwd, copy, copy);
    CHECK(e.forward_ns == 0);
    CHECK(e.backward_ns == 0);
  }
  SUBCASE("copies of 25: the link is slower than the layers") {
    // Forward: layer 0 ends at 10, its copy at 35; layer 1 ends at 20, its
    // copy at 60. Layer 2 waits for copy 0 (35 - 20 = 15), ends at 45;
    // layer 3 waits for copy 1 (60 - 45 = 15). Backward: layer 3 ends at
    // 20; layer 2 issues reload 1 (done 45), ends at 40; layer 1 issues
    // reload 0 (done 70) and waits for reload 1 (5), ends at 65; layer 0
    // waits for reload 0 (5).
    const std::vector<TimeNs> copy(2, 25);
    const OffloadExposure e = offload_exposure(kFour, fwd, bwd, copy, copy);
    CHECK(e.forward_ns == 30);
    CHECK(e.backward_ns == 10);
    CHECK(e.total() == 40);
  }
  SUBCASE("K = L - 1 leaves no layer to overlap with (Transformer Engine warns)") {
    const ActivationOffload off{4, 3};
    const std::vector<TimeNs> copy(3, 5);
    const OffloadExposure e = offload_exposure(off, fwd, bwd, copy, copy);
    CHECK(e.forward_ns == 15);   // layers 1, 2, 3 each wait for the previous layer's copy
    CHECK(e.backward_ns == 15);  // layers 2, 1, 0 each issue their own reload as they start
  }
}

TEST_CASE("the simulator plays the copy stream as the estimate folds it") {
  const ModelSpec m = test::llama3_8b();
  const ParallelPlan none = offload_plan(0);
  const ParallelPlan ten = offload_plan(10);
  SUBCASE("a link fast enough: nothing shows, the step as without offloading") {
    const Topology topo(node_with_link(64, 64));
    const Estimate base = simulate(m, topo, none);
    const Estimate sim = simulate(m, topo, ten);
    CHECK(sim.breakdown.offload_s == 0);
    CHECK(sim.iteration_time_s == doctest::Approx(base.iteration_time_s).epsilon(1e-9));
    CHECK(estimate(m, topo, ten).breakdown.offload_s == 0);
  }
  SUBCASE("a slow link: the waits the estimate gives, as host-copy time") {
    const Topology topo(node_with_link(2, 2));  // 604 ms a copy: slower than a layer
    const Estimate est = estimate(m, topo, ten);
    const Estimate sim = simulate(m, topo, ten);
    CHECK(est.breakdown.offload_s > 1.0);
    CHECK(sim.breakdown.offload_s == doctest::Approx(est.breakdown.offload_s).epsilon(0.05));
    CHECK(sim.iteration_time_s - simulate(m, topo, none).iteration_time_s ==
          doctest::Approx(sim.breakdown.offload_s).epsilon(0.05));
  }
}

TEST_CASE("Megatron-Core's refusals, and a card without a host link") {
  const ModelSpec m = test::llama3_8b();
  const Cluster c = node_with_link(64, 64);
  auto kind = [&](const ParallelPlan& p, const Cluster& cl) {
    const auto r = check_plan(p, m, cl);
    return r ? r->kind : PlanCheck::not_positive;
  };
  CHECK_FALSE(check_plan(offload_plan(31), m, c).has_value());
  CHECK(kind(offload_plan(32), c) == PlanCheck::offload_layers_range);
  ParallelPlan pp2 = offload_plan(4);
  pp2.pp = 2;
  pp2.dp = 4;
  CHECK(kind(pp2, c) == PlanCheck::offload_needs_one_stage);
  ParallelPlan selective = offload_plan(4);
  selective.recompute = Recompute::selective;
  CHECK(kind(selective, c) == PlanCheck::offload_with_recompute);
  // Per-layer CUDA graphs are refused with it; the full-iteration graph is not.
  ParallelPlan graphs = offload_plan(4);
  graphs.trainer.cuda_graphs = CudaGraphs::parse("local", "test", "cuda_graphs");
  CHECK(kind(graphs, c) == PlanCheck::offload_with_layer_graphs);
  CHECK(describe(*check_plan(graphs, m, c), m, c) ==
        "Megatron-Core refuses per-layer CUDA graphs with CPU offloading (\"CUDA graphs not supported with CPU "
        "offloading\"); only the full-iteration graph runs with it");
  graphs.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:mlp", "test", "cuda_graphs");
  CHECK(kind(graphs, c) == PlanCheck::offload_with_layer_graphs);
  graphs.trainer.cuda_graphs = CudaGraphs::parse("full_iteration", "test", "cuda_graphs");
  CHECK_FALSE(check_plan(graphs, m, c).has_value());
  CHECK(kind(offload_plan(4), test::dgx_a100(1)) == PlanCheck::offload_no_host_link);
  CHECK(describe(*check_plan(offload_plan(4), m, test::dgx_a100(1)), m, test::dgx_a100(1)) ==
        "cluster test-dgx-a100 states no link between a GPU and host memory for the offloaded activations");
  // A preset without the capability: what it can run but the offloading.
  ParallelPlan old = offload_plan(4);
  old.zero_stage = 0;
  old.flash_attention = false;
  old.grad_accum_fusion = false;
  CHECK_FALSE(check_trainer(old, *find_trainer("megatron-2022")) == std::nullopt);
  CHECK(check_trainer(old, *find_trainer("megatron-2022"))->kind == PlanCheck::trainer_no_offload);
  old.offload_layers = 0;
  CHECK(check_trainer(old, *find_trainer("megatron-2022")) == std::nullopt);
}

TEST_CASE("a card's host_link: kind and rates, each sourced") {
  std::ifstream in(test::source_root() / "topologies/dgx-h100.json");
  nlohmann::json j = nlohmann::json::parse(in);
  const Cluster h100 = cluster_from_json(j, "dgx-h100.json", test::source_root() / "topologies");
  CHECK(h100.host_link.kind == "pcie-gen5");
  CHECK(h100.host_link.d2h_GBps == 64);
  CHECK(h100.host_link.sources.count("h2d_GBps") == 1);
  j["host_link"]["kind"] = "cxl";
  CHECK_THROWS_AS(cluster_from_json(j, "dgx-h100.json", test::source_root() / "topologies"), InputError);
  j.erase("host_link");
  CHECK_FALSE(cluster_from_json(j, "dgx-h100.json", test::source_root() / "topologies").host_link.present());
}
