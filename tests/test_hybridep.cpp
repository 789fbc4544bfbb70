// The flex dispatcher's HybridEP backend on GB200 NVL72 racks, and the CUDA
// graphs of an MoE layer's router and preprocessing (Megatron-Core's
// --moe-flex-dispatcher-backend hybridep, --cuda-graph-modules moe_router
// moe_preprocess): bytes per link, seconds, SMs and launches by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "cuboid/core/dispatch.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/report/report.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

// GB200 NVL72 racks of 64 GPUs (16 of the 18 trays, as NVIDIA's recipes
// place them): NVLink priced at 722 GB/s, one 400 Gb/s NIC per GPU at 46.
Cluster gb200(int racks) { return load_cluster(source_root() / "topologies/gb200-nvl72.json", racks, 64); }

// A Qwen3-30B-A3B-sized MoE layer: 128 experts, top-8, no groups.
MoeSpec qwen_moe() {
  MoeSpec moe;
  moe.num_experts = 128;
  moe.experts_per_token = 8;
  return moe;
}

// small_mixtral with one rank per expert group of a GB200 rack.
ParallelPlan flex_plan(int ep, FlexSetting flex) {
  ParallelPlan p;
  p.dp = ep;
  p.ep = ep;
  p.etp = 1;
  p.moe_dispatcher = MoeDispatcher::flex;
  p.moe_flex = flex;
  p.micro_batch = 1;
  p.global_batch = 4 * ep;
  p.seq_length = 2048;
  p.recompute = Recompute::none;
  p.zero_stage = 1;
  return p;
}

ModelSpec flex_model() {
  ModelSpec m = small_mixtral_model();
  m.moe.num_experts = 128;
  m.moe.experts_per_token = 8;
  m.moe.router_load_imbalance = 1.0;
  return m;
}

// Why check_plan refuses `p` under the CUDA graphs `spec`, if for its graphs.
std::optional<CudaGraphRefusal> graph_refusal(ParallelPlan& p, const ModelSpec& m, const Cluster& c,
                                              const std::string& spec) {
  p.trainer.cuda_graphs = CudaGraphs::parse(spec, "test", "cuda_graphs");
  const auto r = check_plan(p, m, c);
  if (!r || r->kind != PlanCheck::cuda_graph_module_refused) return std::nullopt;
  return static_cast<CudaGraphRefusal>(r->values[0]);
}

}  // namespace

TEST_CASE("HybridEP's links and SMs: the README's measured rates, its defaults, the configured SMs") {
  // DeepEP as before: 153/160 of NVLink, 43/50 of RDMA, 20 SMs.
  FlexKernels k = flex_kernels(FlexSetting{}, 2);
  CHECK(k.nvlink_efficiency == doctest::Approx(153.0 / 160.0));
  CHECK(k.rdma_efficiency == doctest::Approx(43.0 / 50.0));
  CHECK(k.sms == 20);
  CHECK(flex_kernels(FlexSetting{FlexBackend::deepep, 32}, 1).sms == 32);
  // HybridEP in one NVLink domain: 24 SMs (config.cuh), NVLink halfway
  // between the 16- and 32-SM rows: (418.27 + 447.89) / 2 = 433.08 GB/s
  // received, x 35/36 = 421.05 on the wire, / 722 = 0.58317.
  const FlexSetting hybrid{FlexBackend::hybridep, 0};
  k = flex_kernels(hybrid, 1);
  CHECK(k.sms == 24);
  CHECK(k.nvlink_efficiency == doctest::Approx(433.08 * 35.0 / 36.0 / 722.0));
  CHECK(k.nvlink_efficiency == doctest::Approx(0.58317).epsilon(1e-4));
  // Across domains: 8 SMs, the 16-SM row (the nearest measured), 418.27 x
  // 35/36 / 722 = 0.56323; RDMA 41.46 / 50 = 0.8292.
  k = flex_kernels(hybrid, 2);
  CHECK(k.sms == 8);
  CHECK(k.nvlink_efficiency == doctest::Approx(0.56323).epsilon(1e-4));
  CHECK(k.rdma_efficiency == doctest::Approx(0.8292));
  // 32 SMs configured (the recipes' moe_hybridep_num_sms): the 32-SM row, 447.89 x 35/36 / 722.
  k = flex_kernels(FlexSetting{FlexBackend::hybridep, 32}, 2);
  CHECK(k.sms == 32);
  CHECK(k.nvlink_efficiency == doctest::Approx(447.89 * 35.0 / 36.0 / 722.0));
  // The SMs an exchange holds beside the EP overlap's compute.
  const Cluster one = gb200(1), two = gb200(2);
  std::vector<int> rack, racks;
  for (int r = 0; r < 64; ++r) rack.push_back(r);
  for (int r = 0; r < 128; ++r) racks.push_back(r);
  CHECK(ep_exchange_sms(one, MoeDispatcher::flex, hybrid, rack) == 24);
  CHECK(ep_exchange_sms(two, MoeDispatcher::flex, hybrid, racks) == 8);
  CHECK(ep_exchange_sms(two, MoeDispatcher::flex, FlexSetting{}, racks) == 20);
}

TEST_CASE("HybridEP on GB200 NVL72 by hand: EP 64 inside one rack, EP 128 over two") {
  const MoeSpec moe = qwen_moe();
  // hidden 2048: a token is 4,096 B with 8 x (8 + 4) = 96 B of indices and
  // weights: 4,192 B; 4096 tokens a rank.
  const double bytes = 2048 * 2 + 8 * 12;
  // EP 64 in one rack (one NVLink domain): 2 experts a rank, p_rank = 1 -
  // C(126,8)/C(128,8) = 1 - (120 x 119) / (128 x 127) = 0.12155512; to 63
  // peers, nothing through the NICs.
  const double p64 = 1 - 120.0 * 119 / (128.0 * 127);
  CHECK(p64 == doctest::Approx(0.12155512));
  DispatchTraffic t = dispatch_traffic(MoeDispatcher::flex, moe, 2048, 4096, EpSpread{64, 1});
  CHECK(t.nic_bytes == 0);
  CHECK(t.nvlink_copies == doctest::Approx(63 * p64));  // 7.658
  CHECK(t.nvlink_bytes == doctest::Approx(4096 * bytes * 63 * p64));  // 131,488,727
  // Its seconds: the NVLink port at 722 GB/s x 0.58317 = 421.05 GB/s:
  // 131,488,727 / 421.05e9 = 312.3 us (DeepEP's 153/160: 190.5 us).
  const double hybrid_s = t.nvlink_bytes / (722e9 * flex_kernels(FlexSetting{FlexBackend::hybridep, 0}, 1).nvlink_efficiency);
  CHECK(hybrid_s == doctest::Approx(312.29e-6).epsilon(1e-3));
  CHECK(t.nvlink_bytes / (722e9 * 153.0 / 160.0) == doctest::Approx(190.45e-6).epsilon(1e-3));

  // EP 128 over 2 racks of 64: 1 expert a rank, p_rank = 8/128; a rack 64,
  // p_node = 1 - C(64,8)/C(128,8) = 1 - 0.0030957 = 0.99690; a token once to the other rack
  // (to the GPU of the sender's rail), then to 2 x 63 x 1/16 = 7.875 ranks.
  double c64_c128 = 1;
  for (int i = 0; i < 8; ++i) c64_c128 *= (64.0 - i) / (128.0 - i);
  const double p_node = 1 - c64_c128;
  CHECK(p_node == doctest::Approx(0.99690).epsilon(1e-4));
  t = dispatch_traffic(MoeDispatcher::flex, moe, 2048, 4096, EpSpread{128, 2});
  CHECK(t.node_copies == doctest::Approx(p_node));
  CHECK(t.nvlink_copies == doctest::Approx(7.875));
  CHECK(t.nic_bytes == doctest::Approx(4096 * bytes * p_node));  // 17,117,204
  CHECK(t.nvlink_bytes == doctest::Approx(4096 * bytes * 7.875));  // 135,217,152
  // The NIC at 46 GB/s x 0.8292 = 38.14 GB/s: 448.8 us; NVLink at 722 x
  // 0.56323 = 406.65 GB/s (8 SMs): 332.5 us; the NIC sets the pace.
  const FlexKernels k = flex_kernels(FlexSetting{FlexBackend::hybridep, 0}, 2);
  CHECK(t.nic_bytes / (46e9 * k.rdma_efficiency) == doctest::Approx(448.8e-6).epsilon(1e-3));
  CHECK(t.nvlink_bytes / (722e9 * k.nvlink_efficiency) == doctest::Approx(332.5e-6).epsilon(1e-3));
}

TEST_CASE("HybridEP priced and simulated on GB200 NVL72: the estimate follows the simulation") {
  const ModelSpec m = flex_model();
  for (int racks : {1, 2}) {
    const Topology topo(gb200(racks));
    CAPTURE(racks);
    std::vector<double> est, sim;
    for (FlexBackend b : {FlexBackend::deepep, FlexBackend::hybridep}) {
      const ParallelPlan p = flex_plan(64 * racks, FlexSetting{b, 0});
      REQUIRE_FALSE(check_plan(p, m, topo.cluster()).has_value());
      const Estimate e = estimate(m, topo, p);
      const Estimate s = simulate(m, topo, p);
      CHECK(std::abs(s.iteration_time_s / e.iteration_time_s - 1) < 0.08);
      est.push_back(e.breakdown.ep_comm_s);
      sim.push_back(s.iteration_time_s);
    }
    // HybridEP's measured NVLink share on GB200 (0.58) is below the DeepEP
    // figure cuboid carries from H800 (0.96): its exchanges price slower in
    // both models.
    CHECK(est[1] > est[0]);
    CHECK(sim[1] > sim[0]);
  }
  // The report names the backend and its SMs.
  const Cluster c = gb200(2);
  const Estimate e = estimate(m, Topology(c), flex_plan(128, FlexSetting{FlexBackend::hybridep, 0}));
  const std::string text = format_estimate(m, c, e);
  CHECK(text.find("token dispatcher: flex with HybridEP (a token once per NVLink domain over RDMA, then once per rank "
                  "over NVLink; its kernels hold 8 SMs") != std::string::npos);
}

TEST_CASE("a plan file carries the flex backend and its SMs, and writes neither by default") {
  const ModelSpec m = flex_model();
  const Cluster c = gb200(1);
  const Topology topo(c);
  ParallelPlan p = flex_plan(64, FlexSetting{});
  nlohmann::json j = plan_to_json(m, c, estimate(m, topo, p));
  CHECK_FALSE(j["parallel"].contains("moe_flex_backend"));
  CHECK_FALSE(j["parallel"].contains("moe_flex_sms"));
  p.moe_flex = FlexSetting{FlexBackend::hybridep, 32};
  j = plan_to_json(m, c, estimate(m, topo, p));
  CHECK(j["parallel"]["moe_flex_backend"] == "hybridep");
  CHECK(j["parallel"]["moe_flex_sms"] == 32);
  CHECK(plan_file_from_json(j, "test").plan.moe_flex == p.moe_flex);
  // Without the flex dispatcher the keys are refused.
  j["parallel"]["moe_dispatcher"] = "alltoall";
  CHECK(input_error_message([&] { (void)plan_file_from_json(j, "plan.json"); }) ==
        "plan.json: parallel.moe_flex_backend: set with moe_dispatcher alltoall (fix: set moe_dispatcher flex, or "
        "drop it)");
}

TEST_CASE("CUDA graphs of the MoE router and preprocessing: the launches they remove, by hand") {
  // small_mixtral (aux-loss balancing, no shared experts), EP 4 x TP 2 with
  // SP. A forward of its MoE layer's MLP part runs norm_mlp, router,
  // router_topk, router_aux_scores, router_aux_loss, tp_ar_aux_counts,
  // moe_permute, moe_host_sync, ...: the moe_router graph holds the first
  // six (norm_mlp keeps the graph's launch: 4 kernels lose theirs; the
  // all-reduce is NCCL's), moe_preprocess adds moe_permute (1 more). The
  // backward: moe_permute_bwd (preprocess), router_aux_loss_bwd,
  // router_topk_bwd, router_dgrad, router_wgrad, router_grad_accum,
  // norm_mlp_bwd (router; the router's weight gradient fused into
  // main_grad, no router_grad_accum): the first of the graph keeps a launch.
  const ModelSpec m = small_mixtral_model();
  ParallelPlan p = ep4_plan();
  const auto graphed = [&](const std::string& spec, const std::vector<Op>& (*list)(const LayerOps&)) {
    p.trainer.cuda_graphs = CudaGraphs::parse(spec, "test", "cuda_graphs");
    const LayerOps ops = transformer_layer_ops(m, p);
    std::vector<std::string> names;
    for (const Op& op : list(ops))
      if (op.graphed) names.push_back(op.name);
    return names;
  };
  const auto fwd = [](const LayerOps& o) -> const std::vector<Op>& { return o.forward; };
  const auto bwd = [](const LayerOps& o) -> const std::vector<Op>& { return o.backward; };
  const std::vector<std::string> attn = graphed("transformer_engine:attn", fwd);
  std::vector<std::string> router = graphed("transformer_engine:attn,moe_router", fwd);
  std::vector<std::string> both = graphed("transformer_engine:attn,moe_router,moe_preprocess", fwd);
  router.erase(router.begin(), router.begin() + static_cast<std::ptrdiff_t>(attn.size()));
  both.erase(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(attn.size()));
  CHECK(router == std::vector<std::string>{op::router, op::router_topk, op::router_aux_scores, op::router_aux_loss,
                                           op::tp_ar_aux_counts});
  CHECK(both == std::vector<std::string>{op::router, op::router_topk, op::router_aux_scores, op::router_aux_loss,
                                         op::tp_ar_aux_counts, op::moe_permute});
  const std::vector<std::string> attn_b = graphed("transformer_engine:attn", bwd);
  std::vector<std::string> both_b = graphed("transformer_engine:attn,moe_router,moe_preprocess", bwd);
  for (const std::string& n : attn_b) both_b.erase(std::find(both_b.begin(), both_b.end(), n));
  CHECK(both_b == std::vector<std::string>{op::router_aux_loss_bwd, op::router_topk_bwd, op::router_dgrad,
                                           op::router_wgrad, op::norm_mlp_bwd});
  // local names both (Megatron-Core's local graphs do not tell them apart).
  CHECK(CudaGraphs::parse("local:moe_router", "t", "f").str() == "local:moe_router,moe_preprocess");
  // Priced: each kernel that replays from the graphs loses the GPU's
  // launch time.
  Cluster c = dgx_a100(2);
  c.gpu.kernel_launch_ns = 4900;  // the A100 card's kernel_launch_us (the fixture has 0)
  const auto compute = [&](const std::string& spec) {
    p.trainer.cuda_graphs = CudaGraphs::parse(spec, "test", "cuda_graphs");
    const LayerOps ops = transformer_layer_ops(m, p);
    double ns = 0;
    int launches = 0;
    for (const std::vector<Op>* l : {&ops.forward, &ops.backward})
      for (const Op& op : *l)
        if (op.kind != OpKind::collective && op.kind != OpKind::p2p) {
          ns += static_cast<double>(op_time_ns(c.gpu, op));
          launches += op.graphed ? 0 : 1;
        }
    return std::pair<double, int>{ns, launches};
  };
  const auto [eager_ns, eager_launches] = compute("transformer_engine:attn");
  const auto [graph_ns, graph_launches] = compute("transformer_engine:attn,moe_router,moe_preprocess");
  // Forward: router, router_topk, router_aux_scores, router_aux_loss,
  // moe_permute (5); backward: router_aux_loss_bwd, router_topk_bwd,
  // router_dgrad, router_wgrad, norm_mlp_bwd (5): 10 launches of 4.9 us,
  // 49 us a layer.
  CHECK(eager_launches - graph_launches == 10);
  CHECK(eager_ns - graph_ns == doctest::Approx(49000.0).epsilon(1e-6));
}

TEST_CASE("CUDA graph modules Megatron-Core refuses, with its reasons") {
  const ModelSpec m = small_mixtral_model();
  const Cluster c = dgx_a100(2);
  ParallelPlan p = ep4_plan();
  const auto why = [&](const std::string& spec) { return graph_refusal(p, m, c, spec); };
  CHECK(why("transformer_engine:attn,mlp") == CudaGraphRefusal::mlp_needs_dense);
  CHECK(why("transformer_engine:moe") == CudaGraphRefusal::moe_needs_drop_pad);
  CHECK_FALSE(why("transformer_engine:attn,moe_router,moe_preprocess").has_value());
  CHECK_FALSE(check_plan(p, m, c).has_value());
  p.recompute = Recompute::selective;
  p.recompute_modules = static_cast<std::uint8_t>(RecomputeModule::moe);
  CHECK(why("transformer_engine:moe_router") == CudaGraphRefusal::router_with_moe_recompute);
  p.recompute = Recompute::none;
  p.recompute_modules = 0;
  ModelSpec dense = small_mixtral_model();
  dense.moe = MoeSpec{};
  ParallelPlan dp = p;
  dp.ep = 1;
  dp.etp = 0;
  dp.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:moe_router", "test", "cuda_graphs");
  const auto r = check_plan(dp, dense, c);
  REQUIRE(r.has_value());
  CHECK(r->kind == PlanCheck::cuda_graph_module_refused);
  CHECK(describe(*r, dense, c) ==
        "moe cuda graph is only supported for MoE (Megatron-Core asserts it: "
        "megatron/core/transformer/transformer_config.py:2829@d98e8a64)");
  CHECK(input_error_message([] { (void)CudaGraphs::parse("transformer_engine:moe_preprocess", "f", "k"); }) ==
        "f: k: \"transformer_engine:moe_preprocess\": moe_preprocess cuda graph is only supported with moe_router "
        "cuda graph (Megatron-Core asserts it: transformer_config.py:2824@d98e8a64) (fix: add moe_router)");
}

TEST_CASE("recomputation under CUDA graphs: full only with the full-iteration graph, no dropout in a graphed one") {
  // transformer_config.py:2854-2899@d98e8a64.
  ModelSpec m = small_mixtral_model();
  m.attention_dropout = 0.1;
  m.hidden_dropout = 0.1;
  const Cluster c = dgx_a100(2);
  ParallelPlan p = ep4_plan();
  const auto why = [&](const std::string& spec) { return graph_refusal(p, m, c, spec); };
  p.recompute = Recompute::full;
  CHECK(why("local") == CudaGraphRefusal::full_recompute);
  CHECK(why("transformer_engine:attn") == CudaGraphRefusal::full_recompute);
  CHECK_FALSE(why("full_iteration").has_value());
  const auto r = check_plan(p, m, c);  // full_iteration: no refusal of this kind
  CHECK((!r || r->kind != PlanCheck::cuda_graph_module_refused));
  p.trainer.cuda_graphs = CudaGraphs::parse("local", "test", "cuda_graphs");
  CHECK(describe(*check_plan(p, m, c), m, c) ==
        "full recompute is only supported with full iteration CUDA graph (Megatron-Core asserts it: "
        "megatron/core/transformer/transformer_config.py:2858@d98e8a64)");
  // Selective: the core recomputed inside a graph that captures it, with attention dropout.
  p.recompute = Recompute::selective;
  p.recompute_modules = 0;  // core_attn
  CHECK(why("transformer_engine") == CudaGraphRefusal::graphed_attn_dropout);  // the whole layer
  CHECK(why("full_iteration") == CudaGraphRefusal::graphed_attn_dropout);
  CHECK(why("transformer_engine:attn") == CudaGraphRefusal::graphed_attn_dropout);
  CHECK_FALSE(why("transformer_engine:moe_router,moe_preprocess").has_value());  // the core outside the graph
  m.attention_dropout = 0;
  CHECK_FALSE(why("transformer_engine:attn").has_value());
  // The MoE MLP recomputed inside a whole-layer graph, with hidden dropout.
  p.recompute_modules = static_cast<std::uint8_t>(RecomputeModule::moe);
  CHECK(why("local") == CudaGraphRefusal::graphed_hidden_dropout);
  CHECK_FALSE(why("transformer_engine:attn").has_value());
  m.hidden_dropout = 0;
  CHECK_FALSE(why("local").has_value());
}
