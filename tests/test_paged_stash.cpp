// HybridEP's rank capacity factor and the MoE paged stash (Megatron-Core
// d98e8a64 --moe-expert-rank-capacity-factor, --moe-paged-stash): the static
// budget's rows, the expert activations, the receive buffer and the stash's
// bytes, the host synchronisation it removes, and the refusals, by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "cuboid/core/model.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/report/report.hpp"
#include "fixtures.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

// small_mixtral (h 1024, 8 experts of FFN 2048, top-2, SwiGLU, 4 MoE
// layers) at EP 8 x DP 32 (the seed's 4 DGX A100), PP 1, micro-batch 1 x 2,048 tokens, forced
// balance (load 1): each rank routes 2,048 tokens, 4,096 copies.
ModelSpec stash_model() {
  ModelSpec m = small_mixtral_model();
  m.moe.router_load_imbalance = 1.0;
  return m;
}

ParallelPlan stash_plan(double factor, bool stash, double buffer = 1.10) {
  ParallelPlan p;
  p.dp = 32;
  p.ep = 8;
  p.etp = 1;
  p.moe_dispatcher = MoeDispatcher::flex;
  p.moe_flex = FlexSetting{FlexBackend::hybridep, 0, factor, stash, buffer};
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_length = 2048;
  p.recompute = Recompute::none;
  p.zero_stage = 1;
  return p;
}

bool has_op(const std::vector<Op>& ops, std::string_view name) {
  return std::any_of(ops.begin(), ops.end(), [&](const Op& o) { return o.name == name; });
}

}  // namespace

TEST_CASE("the rank capacity budget: int(tokens x top-k x factor) rounded up to 256 rows") {
  const ModelSpec m = stash_model();
  CHECK(rank_budget_rows(m, stash_plan(0, false)) == 0);
  // 2048 x 2 x 1.5 = 6144, a multiple of 256.
  CHECK(rank_budget_rows(m, stash_plan(1.5, false)) == 6144);
  // 2048 x 2 x 1.3 = 5324.8 -> int 5324 -> 21 x 256 = 5376.
  CHECK(rank_budget_rows(m, stash_plan(1.3, false)) == 5376);
  // With SP over TP 2 a rank routes 1,024 tokens: 1024 x 2 x 1.3 = 2662.4 -> 2662 -> 2816.
  ParallelPlan sp = stash_plan(1.3, false);
  sp.tp = 2;
  sp.dp = 16;
  sp.sequence_parallel = true;
  CHECK(rank_budget_rows(m, sp) == 2816);
}

TEST_CASE("the experts' saved rows and bytes: dropless, the padded budget, the paged stash") {
  const ModelSpec m = stash_model();
  // Bytes per expert row: the input 2h = 2048 + FC1's output and the
  // activation's output 6 x 2048 = 12288: 14336.
  constexpr double kRow = 14336;
  CHECK(saved_expert_rows(m, stash_plan(0, false)) == 4096);
  CHECK(saved_expert_rows(m, stash_plan(1.3, false)) == 5376);
  // Stash: the average int(5376 / 1.3) = 4135 rows x 1.10 = 4548.5.
  CHECK(saved_expert_rows(m, stash_plan(1.3, true)) == doctest::Approx(4548.5));
  // Negative factor: of the real rows, 1.0 x 4096.
  CHECK(saved_expert_rows(m, stash_plan(1.3, true, -1.0)) == 4096);
  const double dropless = layer_activation_bytes(m, stash_plan(0, false), true);
  CHECK(layer_activation_bytes(m, stash_plan(1.3, false), true) - dropless == doctest::Approx(1280 * kRow));
  CHECK(layer_activation_bytes(m, stash_plan(1.3, true), true) - dropless == doctest::Approx(452.5 * kRow));
  // One layer at the padded size beside the pages: 5376 x 14336 = 77,070,336.
  CHECK(paged_stash_padded_layer_bytes(m, stash_plan(1.3, true)) == 77070336.0);
  CHECK(paged_stash_padded_layer_bytes(m, stash_plan(1.3, false)) == 0);
  // --recompute-modules moe keeps only the MLP's input: nothing stashed.
  ParallelPlan moe_rc = stash_plan(1.3, true);
  moe_rc.recompute = Recompute::selective;
  moe_rc.recompute_modules = static_cast<std::uint8_t>(RecomputeModule::moe);
  CHECK(paged_stash_padded_layer_bytes(m, moe_rc) == 0);
  // The receive buffer: 4096 sent + 4096 received rows x 2 KiB = 16 MiB;
  // with the budget 4096 + 5376 rows: 19,398,656 bytes.
  CHECK(moe_dispatch_buffer_bytes(m, stash_plan(0, false)) == 16777216.0);
  CHECK(moe_dispatch_buffer_bytes(m, stash_plan(1.3, false)) == 19398656.0);
  // Per GPU (PP 1: one micro-batch in flight, 4 MoE layers), against dropless:
  // the budget 4 x 1280 x 14336 + 2,621,440 = 76,021,760 bytes more; the
  // stash 4 x 452.5 x 14336 + 77,070,336 + 2,621,440 = 105,639,936.
  const GpuProfile gpu = four_dgx_a100().gpu;
  const double base = memory_per_gpu(m, stash_plan(0, false), gpu).activation_bytes;
  CHECK(memory_per_gpu(m, stash_plan(1.3, false), gpu).activation_bytes - base == doctest::Approx(76021760.0));
  CHECK(memory_per_gpu(m, stash_plan(1.3, true), gpu).activation_bytes - base == doctest::Approx(105639936.0));
}

TEST_CASE("FP8 and FP4 experts keep their GEMM inputs quantized: columnwise only, NVFP4's fused MLP both copies") {
  // Transformer Engine's fused grouped MLP (the op fuser the factor runs
  // with) drops the rowwise MXFP8 copies of FC1's and FC2's inputs
  // (grouped_mlp.py:1765-1771@d0067d0d): the input h x (1 + 1/32) = 1056,
  // FC1's output 2 x 2048 x 2 = 8192 in bf16, the activation's output
  // 2048 x 1.03125 = 2112: 11,360 bytes a row against bf16's 14,336.
  const ModelSpec m = stash_model();
  ParallelPlan bf16 = stash_plan(1.3, false), mx = stash_plan(1.3, false), dropless = stash_plan(0, false);
  mx.precision = dropless.precision = Precision::mxfp8;
  const double rows = 5376;
  CHECK(paged_stash_padded_layer_bytes(m, stash_plan(1.3, true)) == rows * 14336);
  mx.moe_flex.paged_stash = true;
  CHECK(paged_stash_padded_layer_bytes(m, mx) == doctest::Approx(rows * 11360));
  mx.moe_flex.paged_stash = false;
  // The layer's MoE part: 1280 more rows than dropless, at each one's bytes;
  // dropless MXFP8 runs the unfused grouped linear layers, which keep their
  // inputs columnwise only as well (grouped_linear.py:905-914): 11,360.
  const double base = layer_activation_bytes(m, dropless, true) - 4096 * 11360.0;
  CHECK(layer_activation_bytes(m, mx, true) - base == doctest::Approx(rows * 11360));
  CHECK(layer_activation_bytes(m, bf16, true) - layer_activation_bytes(m, stash_plan(0, false), true) ==
        doctest::Approx(1280 * 14336.0));
  // moe_act recomputed: the activation's output not kept, 1056 + 8192 (dropless the same).
  mx.recompute = Recompute::selective;
  mx.recompute_modules = static_cast<std::uint8_t>(RecomputeModule::moe_act);
  ParallelPlan mx_dropless_rc = dropless;
  mx_dropless_rc.recompute = Recompute::selective;
  mx_dropless_rc.recompute_modules = mx.recompute_modules;
  CHECK(layer_activation_bytes(m, mx, true) - (layer_activation_bytes(m, mx_dropless_rc, true) - 4096 * 9248.0) ==
        doctest::Approx(rows * 9248));
  // NVFP4: the fused MLP keeps both copies of each input (1 + 1/16 nibbles
  // and scales: 0.5625 B, twice), 1024 x 1.125 + 8192 + 2048 x 1.125 =
  // 11,648 a row; the unfused layers the columnwise copy alone,
  // 576 + 8192 + 1152 = 9,920.
  ParallelPlan fp4 = stash_plan(1.3, true), fp4_dropless = stash_plan(0, false);
  fp4.precision = fp4_dropless.precision = Precision::nvfp4;
  CHECK(paged_stash_padded_layer_bytes(m, fp4) == doctest::Approx(rows * 11648));
  fp4.moe_flex.paged_stash = false;
  CHECK(layer_activation_bytes(m, fp4, true) - (layer_activation_bytes(m, fp4_dropless, true) - 4096 * 9920.0) ==
        doctest::Approx(rows * 11648));
}

TEST_CASE("with the static budget HybridEP does not synchronise with the host") {
  const ModelSpec m = stash_model();
  const LayerOps dropless = transformer_layer_ops(m, stash_plan(0, false), true);
  const LayerOps budget = transformer_layer_ops(m, stash_plan(1.5, false), true);
  CHECK(has_op(dropless.forward, op::moe_host_sync));
  CHECK_FALSE(has_op(budget.forward, op::moe_host_sync));
  CHECK(budget.forward.size() + 1 == dropless.forward.size());
}

TEST_CASE("Megatron-Core's refusals, and a budget the busiest rank overflows") {
  const ModelSpec m = stash_model();
  const Cluster c = four_dgx_a100();
  auto why = [&](const ParallelPlan& p) {
    const auto r = check_plan(p, m, c);
    REQUIRE(r.has_value());
    CHECK(r->kind == PlanCheck::moe_static_refused);
    return describe(*r, m, c);
  };
  CHECK_FALSE(check_plan(stash_plan(1.5, true), m, c).has_value());
  ParallelPlan deepep = stash_plan(1.5, false);
  deepep.moe_flex.backend = FlexBackend::deepep;
  CHECK(why(deepep).find("requires the flex token dispatcher with the hybridep backend") != std::string::npos);
  CHECK(why(stash_plan(0, true)).find("moe_paged_stash requires moe_expert_rank_capacity_factor") !=
        std::string::npos);
  ParallelPlan offloaded = stash_plan(1.5, true);
  offloaded.offload_modules = static_cast<std::uint8_t>(OffloadModule::moe_act);
  CHECK(why(offloaded).find("offload_modules must not include expert_fc1 or moe_act") != std::string::npos);
  offloaded.offload_modules = static_cast<std::uint8_t>(OffloadModule::expert_fc1);
  CHECK(why(offloaded).find("2218-2226@d98e8a64") != std::string::npos);
  offloaded.moe_flex.paged_stash = false;  // the factor alone takes them
  const auto alone = check_plan(offloaded, m, c);
  CHECK_FALSE((alone.has_value() && alone->kind == PlanCheck::moe_static_refused));
  // A load of 1.6 sends 2048 x 2 x 1.6 = 6553.6 copies to the busiest rank, above 6144.
  ModelSpec skewed = m;
  skewed.moe.router_load_imbalance = 1.6;
  const auto r = check_plan(stash_plan(1.5, true), skewed, c);
  REQUIRE(r.has_value());
  CHECK(r->field == PlanField::moe_rank_capacity_factor);
  CHECK(describe(*r, skewed, c).find("the busiest EP rank receives 6554 token copies per MoE layer, above its static "
                                     "budget of 6144") == 0);
}

TEST_CASE("a plan file carries the factor, the stash and its buffer factor") {
  const ModelSpec m = stash_model();
  const Cluster c = four_dgx_a100();
  const Topology topo(c);
  nlohmann::json j = plan_to_json(m, c, estimate(m, topo, stash_plan(0, false)));
  CHECK_FALSE(j["parallel"].contains("moe_rank_capacity_factor"));
  CHECK_FALSE(j["parallel"].contains("moe_paged_stash"));
  const ParallelPlan p = stash_plan(1.5, true, 1.2);
  j = plan_to_json(m, c, estimate(m, topo, p));
  CHECK(j["parallel"]["moe_rank_capacity_factor"] == 1.5);
  CHECK(j["parallel"]["moe_paged_stash"] == true);
  CHECK(j["parallel"]["moe_paged_stash_buffer_factor"] == 1.2);
  CHECK(plan_file_from_json(j, "test").plan.moe_flex == p.moe_flex);
  j["parallel"]["moe_paged_stash_buffer_factor"] = 0;
  CHECK(input_error_message([&] { (void)plan_file_from_json(j, "plan.json"); }).find(
            "plan.json: parallel.moe_paged_stash_buffer_factor: 0 allocates no stash on the GPU") == 0);
}

TEST_CASE("the report names the budget and the stash") {
  const ModelSpec m = stash_model();
  const Cluster c = four_dgx_a100();
  const std::string text = format_estimate(m, c, estimate(m, Topology(c), stash_plan(1.5, true)));
  // 6144 rows; the stash int(6144 / 1.5) = 4096 x 1.1 = 4505.6 rows a layer.
  CHECK(text.find("static budget: 6144 token copies per EP rank (--moe-rank-capacity-factor 1.5), no host sync; the "
                  "experts' activations paged at 4506 rows a layer, one layer at the budget") != std::string::npos);
  CHECK(format_estimate(m, c, estimate(m, Topology(c), stash_plan(0, false))).find("static budget") ==
        std::string::npos);
}
