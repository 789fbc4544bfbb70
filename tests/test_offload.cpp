// CPU activation offloading (--offload-activations, cost/offload.hpp) and
// Megatron-Core's fine-grained activation offloading (--offload-modules, at
// the end): the
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
#include "cuboid/core/precision.hpp"
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

const ActivationOffload kFour{4, 2, {}};  // L 4, K 2

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
  const ActivationOffload off{80, 20, {}};
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
    const ActivationOffload off{4, 3, {}};
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

// Megatron-Core's fine-grained activation offloading (--offload-modules,
// offload.hpp): each module's offload group by hand, on Llama-3-8B at 8192
// tokens, TP 1, bf16, fused attention, no recompute (Q 8192 x 4096 =
// 33,554,432 elements, K and V 8192 x 1024 = 8,388,608 each, O as Q).
namespace {

ParallelPlan fine_plan(const char* modules) {
  ParallelPlan p = offload_plan(0);
  p.offload_modules = parse_offload_modules(modules, "test", "offload_modules");
  return p;
}

}  // namespace

TEST_CASE("fine-grained offloading: each module's bytes on a dense layer") {
  const ModelSpec m = test::llama3_8b();
  SUBCASE("core_attn copies Q, K, V and O; frees Q, K, V") {
    const ModuleOffload core = module_offload(m, fine_plan("core_attn"), OffloadModule::core_attn, false);
    CHECK(core.copied == 2.0 * (33'554'432 + 8'388'608 + 8'388'608 + 33'554'432));  // 167,772,160
    CHECK(core.freed == 2.0 * (33'554'432 + 8'388'608 + 8'388'608));                 // 100,663,296
  }
  SUBCASE("attn_proj: the projection's saved input, which is core_attn's output") {
    const ModuleOffload proj = module_offload(m, fine_plan("core_attn,attn_proj"), OffloadModule::attn_proj, false);
    CHECK(proj.copied == 67'108'864);
    CHECK(proj.freed == 67'108'864);
    // Together they free what memory.cpp counts for attention: 2 s (q + 2 kv + q).
    const ModuleOffload layer = layer_module_offload(m, fine_plan("core_attn,attn_proj"), false);
    CHECK(layer.freed == 167'772'160);
    CHECK(layer.copied == 234'881'024);
  }
  SUBCASE("qkv_linear: the fused norm's input and the GEMM's input; the norms are fused (IdentityOp)") {
    CHECK(module_offload(m, fine_plan("qkv_linear"), OffloadModule::qkv_linear, false).freed == 2 * 67'108'864);
    CHECK(module_offload(m, fine_plan("attn_norm"), OffloadModule::attn_norm, false).copied == 0);
    CHECK(module_offload(m, fine_plan("mlp_norm"), OffloadModule::mlp_norm, false).copied == 0);
    // FP8: the GEMM's input quantized (1 byte).
    ParallelPlan fp8 = fine_plan("qkv_linear");
    fp8.precision = Precision::fp8_current;
    CHECK(module_offload(m, fp8, OffloadModule::qkv_linear, false).copied == 67'108'864 + 33'554'432);
  }
  SUBCASE("FP8: attn_proj's input is the core's bf16 output, or under delayed scaling a 1 B copy of it") {
    ParallelPlan current = fine_plan("core_attn,attn_proj");
    current.precision = Precision::fp8_current;
    CHECK(module_offload(m, current, OffloadModule::attn_proj, false).freed == 67'108'864);
    CHECK(layer_module_offload(m, current, false).freed == 167'772'160);
    ParallelPlan delayed = current;
    delayed.precision = Precision::fp8_delayed;
    CHECK(module_offload(m, delayed, OffloadModule::attn_proj, false).freed == 33'554'432);
    // core_attn frees the output too: 2 s (q + 2 kv + q) + s q, what memory.cpp counts.
    CHECK(module_offload(m, delayed, OffloadModule::core_attn, false).freed == 167'772'160);
    CHECK(layer_module_offload(m, delayed, false).freed == 167'772'160 + 33'554'432);
    // The core recomputed: linear_proj's copy is all that is kept, and all that leaves.
    delayed.recompute = Recompute::selective;
    CHECK(module_offload(m, delayed, OffloadModule::attn_proj, false).freed == 33'554'432);
  }
  SUBCASE("a recomputed core offloads nothing (its checkpoint bypasses the group); full recompute neither") {
    ParallelPlan selective = fine_plan("core_attn");
    selective.recompute = Recompute::selective;
    CHECK(module_offload(m, selective, OffloadModule::core_attn, false).copied == 0);
    ParallelPlan full = fine_plan("core_attn,attn_proj");
    full.recompute = Recompute::full;
    CHECK(layer_module_offload(m, full, false).copied == 0);
  }
  SUBCASE("tensors under 1 Mi elements stay on the GPU") {
    ParallelPlan shorter = fine_plan("core_attn");
    shorter.seq_length = 128;  // Q 128 x 4096 = 524,288 elements, K 131,072
    CHECK(module_offload(m, shorter, OffloadModule::core_attn, false).copied == 0);
    shorter.seq_length = 256;  // Q and O 1,048,576 elements (offloaded), K and V 262,144 (kept)
    CHECK(module_offload(m, shorter, OffloadModule::core_attn, false).copied == 2.0 * 2 * 1'048'576);
  }
}

TEST_CASE("fine-grained offloading: an MoE layer's expert_fc1, moe_act and mlp_norm") {
  // Small Mixtral, EP 1: s 2048 x top-2 = 4,096 routed rows, h 1024, expert FFN 2048 (gated: 4096 wide).
  const ModelSpec m = test::small_mixtral_model();
  ParallelPlan p = fine_plan("mlp_norm,expert_fc1,moe_act");
  p.seq_length = 2048;
  p.global_batch = 8;
  CHECK(module_offload(m, p, OffloadModule::expert_fc1, true).copied == 2.0 * 4096 * 1024);  // 8,388,608
  CHECK(module_offload(m, p, OffloadModule::moe_act, true).copied == 2.0 * 4096 * 4096);     // 33,554,432
  CHECK(module_offload(m, p, OffloadModule::mlp_norm, true).copied == 2.0 * 2048 * 1024);    // 4,194,304
  CHECK(module_offload(m, p, OffloadModule::expert_fc1, false).copied == 0);
  // MXFP8: FC1 saves its quantized input (no set_save_original_input), 1 byte
  // each plus a scale per 32, and that is what leaves.
  ParallelPlan mx = p;
  mx.precision = Precision::mxfp8;
  const ModuleOffload fc1 = module_offload(m, mx, OffloadModule::expert_fc1, true);
  CHECK(fc1.copied == doctest::Approx(4096.0 * 1024 * 1.03125));
  CHECK(fc1.freed == fc1.copied);
  // Per-tensor FP8: FC1 keeps the bf16 original when offloaded (experts.py:278-284).
  ParallelPlan current = p;
  current.precision = Precision::fp8_current;
  CHECK(module_offload(m, current, OffloadModule::expert_fc1, true).freed == 2.0 * 4096 * 1024);
  // An attn or moe_router graph turns mlp_norm's offload off on an MoE layer.
  p.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:moe_router", "test", "cuda_graphs");
  CHECK(module_offload(m, p, OffloadModule::mlp_norm, true).copied == 0);
  // A whole-layer graph names no module: Megatron-Core tests the list's
  // members (transformer_layer.py:1563-1590@d98e8a64), so the norm still leaves.
  p.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine", "test", "cuda_graphs");
  CHECK(module_offload(m, p, OffloadModule::mlp_norm, true).copied == 2.0 * 2048 * 1024);
}

TEST_CASE("fine-grained offloading: every layer but a chunk's last, reloads one layer ahead") {
  const ActivationOffload off = fine_offload_chunk(4);
  CHECK(off.offloads(0));
  CHECK(off.offloads(2));
  CHECK_FALSE(off.offloads(3));
  CHECK(off.due_before(3) == -1);  // the forward never waits
  CHECK(off.reload_issued_at(3) == 2);
  CHECK(off.reload_issued_at(1) == 0);
  CHECK(off.reload_issued_at(0) == -1);
  // Over a model: PP 2 x 2 virtual stages of 8 layers, 2 layers a chunk: layers 1, 3, 5, 7 kept.
  ModelSpec m = test::llama3_8b();
  m.num_layers = 8;
  ParallelPlan p = fine_plan("core_attn");
  p.pp = 2;
  p.dp = 4;
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 2;
  const ActivationOffload model = activation_offload(m, p);
  for (int layer = 0; layer < 8; ++layer) CHECK(model.offloads(layer) == (layer % 2 == 0));
  CHECK(model.reload_issued_at(2) == -1);  // layer 1 is chunk 0's last: kept
  CHECK(model.reload_issued_at(1) == 0);
}

TEST_CASE("fine-grained offloading: the waits by hand on 4 layers (forward 10, backward 20)") {
  const ActivationOffload off = fine_offload_chunk(4);
  const std::vector<TimeNs> fwd(4, 10), bwd(4, 20);
  SUBCASE("copies of 5: hidden") {
    const std::vector<TimeNs> copy{5, 5, 5, 0};
    const OffloadExposure e = offload_exposure(off, fwd, bwd, copy, copy);
    CHECK(e.total() == 0);
  }
  SUBCASE("copies of 25") {
    // Forward, no waits: copies 10-35, 35-60, 60-85; the forward ends at 40,
    // the stream 45 later. Backward: layer 3 issues reload 2 (45-70), ends at
    // 20; layer 2 issues reload 1 (70-95), waits 50 for reload 2, ends at 90;
    // layer 1 issues reload 0 (95-120), waits 5, ends at 115; layer 0 waits 5.
    const std::vector<TimeNs> copy{25, 25, 25, 0};
    const OffloadExposure e = offload_exposure(off, fwd, bwd, copy, copy);
    CHECK(e.forward_ns == 0);
    CHECK(e.backward_ns == 60);
  }
}

TEST_CASE("fine-grained offloading: the memory saved, the host's bytes, the copies' time") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = test::a100();
  const MemoryReport none = memory_per_gpu(m, offload_plan(0), gpu);
  const MemoryReport fine = memory_per_gpu(m, fine_plan("core_attn,attn_proj"), gpu);
  // PP 1, one micro-batch in flight: 31 of 32 layers' 167,772,160 bytes
  // leave, less one layer's in copy: 30 x 167,772,160.
  CHECK(none.activation_bytes - fine.activation_bytes == doctest::Approx(5'033'164'800.0));
  CHECK(fine.host_activation_bytes == doctest::Approx(31 * 234'881'024.0));  // 7,281,311,744
  CHECK(fine.weight_and_optimizer_bytes == none.weight_and_optimizer_bytes);
  // A layer's copies, 234,881,024 bytes: PCIe Gen5 x16 on DGX H100 (64 GB/s
  // each way) and NVLink-C2C on GB300 (297 GB/s to host, 375 back).
  CHECK(offloaded_layer_bytes(m, fine_plan("core_attn,attn_proj"), 0) == 234'881'024);
  const Cluster h100 = load_cluster(test::source_root() / "topologies/dgx-h100.json");
  CHECK(host_copy_ns(h100.host_link, 234'881'024, true) == 3'670'016);
  CHECK(host_copy_ns(h100.host_link, 234'881'024, false) == 3'670'016);
  const Cluster gb300 = load_cluster(test::source_root() / "topologies/gb300-nvl72.json");
  CHECK(host_copy_ns(gb300.host_link, 234'881'024, true) == 790'845);
  CHECK(host_copy_ns(gb300.host_link, 234'881'024, false) == 626'349);
}

TEST_CASE("fine-grained offloading: the simulator plays the copies as the estimate folds them") {
  const ModelSpec m = test::llama3_8b();
  const ParallelPlan none = offload_plan(0);
  const ParallelPlan fine = fine_plan("core_attn,attn_proj");
  SUBCASE("a link fast enough: nothing shows") {
    const Topology topo(node_with_link(64, 64));
    CHECK(simulate(m, topo, fine).breakdown.offload_s == 0);
    CHECK(estimate(m, topo, fine).breakdown.offload_s == 0);
    CHECK(simulate(m, topo, fine).iteration_time_s ==
          doctest::Approx(simulate(m, topo, none).iteration_time_s).epsilon(1e-9));
  }
  SUBCASE("a slow link: the reloads' waits") {
    const Topology topo(node_with_link(0.5, 0.5));  // 470 ms a layer's copies
    const Estimate est = estimate(m, topo, fine);
    const Estimate sim = simulate(m, topo, fine);
    CHECK(est.breakdown.offload_s > 1.0);
    CHECK(sim.breakdown.offload_s == doctest::Approx(est.breakdown.offload_s).epsilon(0.05));
  }
}

TEST_CASE("fine-grained offloading: Megatron-Core's refusals") {
  const ModelSpec m = test::llama3_8b();
  const Cluster c = node_with_link(64, 64);
  auto kind = [&](const ParallelPlan& p, const Cluster& cl) {
    const auto r = check_plan(p, m, cl);
    return r ? r->kind : PlanCheck::not_positive;
  };
  CHECK_FALSE(check_plan(fine_plan("core_attn,attn_proj"), m, c).has_value());
  CHECK(kind(fine_plan("attn_proj"), c) == PlanCheck::offload_proj_without_core);
  CHECK(describe(*check_plan(fine_plan("attn_proj"), m, c), m, c) ==
        "Megatron-Core offloads attn_proj only with core_attn: attn_proj's input is core_attn's output, which "
        "core_attn's backward needs (transformer_config.py:2148-2153 at d98e8a64)");
  ParallelPlan both = fine_plan("core_attn");
  both.offload_layers = 4;
  CHECK(kind(both, c) == PlanCheck::offload_modules_with_layers);
  ParallelPlan moe = fine_plan("expert_fc1");
  moe.recompute = Recompute::selective;
  moe.recompute_modules = static_cast<std::uint8_t>(RecomputeModule::moe);
  CHECK(kind(moe, c) == PlanCheck::offload_in_recomputed_moe);
  ParallelPlan graphs = fine_plan("core_attn");
  graphs.trainer.cuda_graphs = CudaGraphs::parse("local:attn", "test", "cuda_graphs");
  CHECK(kind(graphs, c) == PlanCheck::offload_modules_graphs);
  graphs.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:attn", "test", "cuda_graphs");
  CHECK_FALSE(check_plan(graphs, m, c).has_value());
  CHECK(kind(fine_plan("core_attn"), test::dgx_a100(1)) == PlanCheck::offload_no_host_link);
  CHECK_THROWS_AS(parse_offload_modules("fused_group_mlp", "test", "offload_modules"), InputError);
  CHECK_THROWS_AS(parse_offload_modules("core_attn,mlp", "test", "offload_modules"), InputError);
  CHECK(offload_modules_string(parse_offload_modules("attn_proj,core_attn", "t", "f")) == "core_attn,attn_proj");
}
