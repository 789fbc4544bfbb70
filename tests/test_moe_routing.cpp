// Mixture of experts, per micro-batch: the busiest EP rank's load
// (ep_rank_load) and what it does to the dispatch, the grouped GEMMs and the
// step; the balancing's router kernels and the dropless dispatcher's host
// synchronisation. Numbers by hand in the comments.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "cuboid/core/model.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

// The small Mixtral of fixtures.hpp (test_expert_parallel.cpp's), the
// router's load from the card's default.
ModelSpec small_moe() { return small_mixtral_model(); }

// TP 2 (SP) x PP 2 x DP 4 on 16 GPUs, the experts as EP 4 x ETP 1: each rank
// routes 2,048 / 2 = 1,024 tokens, 2,048 copies; 2 local experts.
ParallelPlan plan_ep4() { return ep4_plan(); }

const Op* find(const std::vector<Op>& ops, std::string_view name) {
  for (const Op& op : ops)
    if (op.name == name) return &op;
  return nullptr;
}

}  // namespace

TEST_CASE("the busiest EP rank's load: given, or the measured expert excess over the rank's experts") {
  ModelSpec m = small_moe();
  ParallelPlan p = plan_ep4();
  // Auxiliary loss: the busiest expert at 1.52 x the mean (Wang et al. 2024,
  // Table 2, 3B), the other expert of its rank at the mean: (1.52 + 1) / 2.
  CHECK(expert_max_violation(RouterBalancing::aux_loss) == 0.52);
  CHECK(ep_rank_load(m, p) == doctest::Approx(1.26));
  p.ep = 8;  // one expert per rank: the expert's excess whole
  CHECK(ep_rank_load(m, p) == doctest::Approx(1.52));
  p.ep = 2;  // four: 1 + 0.52 / 4
  CHECK(ep_rank_load(m, p) == doctest::Approx(1.13));
  p.ep = 1;  // every expert local: nobody waits for anybody
  CHECK(ep_rank_load(m, p) == 1.0);
  p.ep = 8;
  m.moe.balancing = RouterBalancing::aux_loss_free;  // loss-free: 0.04
  CHECK(ep_rank_load(m, p) == doctest::Approx(1.04));
  m.moe.router_load_imbalance = 1.3;  // given (the card, --moe-imbalance): as given, at any EP
  CHECK(ep_rank_load(m, p) == 1.3);
  p.ep = 2;
  CHECK(ep_rank_load(m, p) == 1.3);
  m.moe.capacity_factor = 1.1;  // dropped beyond 1.1 x the balanced share
  CHECK(ep_rank_load(m, p) == doctest::Approx(1.1));
  m.moe.router_load_imbalance = 1.0;  // balanced, as --moe-router-force-load-balancing runs
  CHECK(ep_rank_load(m, p) == 1.0);
}

TEST_CASE("the busiest rank's load sizes the exchange and the grouped GEMMs at their real rows") {
  ModelSpec m = small_moe();
  const ParallelPlan p = plan_ep4();
  ModelSpec balanced = m;
  balanced.moe.router_load_imbalance = 1.0;
  const LayerOps skew = transformer_layer_ops(m, p);
  const LayerOps even = transformer_layer_ops(balanced, p);
  // 2,048 copies x 1,024 x 2 B = 4 MiB balanced, x 1.26 for the busiest rank.
  CHECK(find(even.forward, op::ep_a2a_dispatch)->comm_bytes == 4'194'304.0);
  CHECK(find(skew.forward, op::ep_a2a_dispatch)->comm_bytes == doctest::Approx(1.26 * 4'194'304.0));
  CHECK(find(skew.forward, op::ep_a2a_combine)->comm_bytes == doctest::Approx(1.26 * 4'194'304.0));
  // 2 local experts: 1,024 rows each balanced, 2,580.48 / 2 = 1,290 on the busiest rank.
  const Op* fc1_even = find(even.forward, op::expert_fc1);
  const Op* fc1_skew = find(skew.forward, op::expert_fc1);
  CHECK(fc1_even->m == 1024);
  CHECK(fc1_skew->m == 1290);
  CHECK(fc1_skew->flops == doctest::Approx(1.26 * fc1_even->flops));
  // The roofline at the real m (A100: 312 TFLOP/s x 0.869, 108 SMs, 128 x
  // 128 tiles). FC1 [m, 4,096, 1,024] x 2 experts: 1,024 rows are 8 x 32 x 2
  // = 512 tiles, 5 waves, 94.8 % of them useful: 2 x 1,024 x 4,096 x 1,024 x
  // 2 / (271.1 T x 0.948) = 66,830 ns; 1,290 rows are 11 x 32 x 2 = 704
  // tiles, 7 waves, 85.3 % useful: 93,562 ns (+40 % for +26 % rows). FC2
  // [m, 1,024, 2,048]: 128 and 176 tiles, both 2 waves: 53,464 ns either way.
  const GpuProfile gpu = a100();
  CHECK(op_time_ns(gpu, *fc1_even) == 66'830);
  CHECK(op_time_ns(gpu, *fc1_skew) == 93'562);
  CHECK(op_time_ns(gpu, *find(even.forward, op::expert_fc2)) == 53'464);
  CHECK(op_time_ns(gpu, *find(skew.forward, op::expert_fc2)) == 53'464);
}

TEST_CASE("the slowest EP rank sets the step's pace in the estimate and the simulation") {
  const Topology topo(dgx_a100(2));
  ModelSpec m = small_moe();
  const ParallelPlan p = plan_ep4();
  ModelSpec balanced = m;
  balanced.moe.router_load_imbalance = 1.0;
  const Estimate est = estimate(m, topo, p), est_even = estimate(balanced, topo, p);
  const Estimate sim = simulate(m, topo, p), sim_even = simulate(balanced, topo, p);
  // The forward's FC1 alone: (93,562 - 66,830) ns x 2 layers on the stage x
  // 16 micro-batches = 0.855 ms more compute; its dgrad and wgrad and the
  // activation add more. The all-to-alls grow with their bytes.
  CHECK(est.breakdown.compute_s - est_even.breakdown.compute_s > (93'562 - 66'830) * 2 * 16 * 1e-9);
  CHECK(est.breakdown.ep_comm_s > 1.2 * est_even.breakdown.ep_comm_s);
  CHECK(est.breakdown.ep_comm_s < 1.26 * est_even.breakdown.ep_comm_s);  // the latency does not grow
  // The simulator plays the same ops: the same slowdown within 10 %.
  const double est_cost = est.iteration_time_s - est_even.iteration_time_s;
  const double sim_cost = sim.iteration_time_s - sim_even.iteration_time_s;
  CHECK(sim_cost > 0.0);
  CHECK(sim_cost == doctest::Approx(est_cost).epsilon(0.10));
}

TEST_CASE("per micro-batch: the balancing's router kernels and the host's wait for the token counts") {
  ModelSpec m = small_moe();
  const ParallelPlan p = plan_ep4();
  // 1,024 tokens x 8 experts = 8,192 logits per rank and micro-batch.
  const LayerOps aux = transformer_layer_ops(m, p);
  CHECK(find(aux.forward, op::router_aux_scores)->bytes == 90'112.0);  // 11 B per logit, as router_topk
  CHECK(find(aux.forward, op::router_aux_loss)->bytes == 40'960.0);    // map 1 + fp32 score 4
  const Op* ar = find(aux.forward, op::tp_ar_aux_counts);
  REQUIRE(ar);
  CHECK(ar->group == Group::tp);
  CHECK(ar->comm_bytes == 64.0);  // 8 int64 counts
  CHECK(find(aux.backward, op::router_aux_loss_bwd)->bytes == 131'072.0);  // 16 B per logit
  CHECK(find(aux.forward, op::router_bias_counts) == nullptr);
  // One host sync per layer and forward, before the EP all-to-all: the
  // counts of 2 local experts, 4 EP ranks sent and received, 1 ETP rank and
  // the total, 12 int64 = 96 B; none in the backward.
  const Op* sync = find(aux.forward, op::moe_host_sync);
  REQUIRE(sync);
  CHECK(sync->bytes == 96.0);
  CHECK(find(aux.backward, op::moe_host_sync) == nullptr);
  std::size_t at_sync = 0, at_dispatch = 0;
  for (std::size_t i = 0; i < aux.forward.size(); ++i) {
    if (aux.forward[i].name == op::moe_host_sync) at_sync = i;
    if (aux.forward[i].name == op::ep_a2a_dispatch) at_dispatch = i;
  }
  CHECK(at_sync < at_dispatch);
  // Priced as one launch: 96 B at 2,039 GB/s x 0.8 is 0.06 ns, + 4.9 us.
  GpuProfile gpu = a100();
  gpu.kernel_launch_ns = 4900;
  CHECK(op_time_ns(gpu, *sync) == 4900);
  // The loss-free bias also counts the tokens (1 B per logit); DeepSeek-V3
  // keeps a small sequence-wise auxiliary loss beside it.
  m.moe.balancing = RouterBalancing::aux_loss_free;
  const LayerOps free = transformer_layer_ops(m, p);
  CHECK(find(free.forward, op::router_bias_counts)->bytes == 8'192.0);
  CHECK(find(free.forward, op::router_aux_scores) != nullptr);
  CHECK(find(free.backward, op::router_aux_loss_bwd) != nullptr);
  CHECK(find(free.forward, op::moe_host_sync) != nullptr);
}

TEST_CASE("per micro-batch costs add up over the micro-batches of the step") {
  // Launches at 4.9 us: per layer and micro-batch the loss-free bias runs one
  // kernel more than the auxiliary loss alone (8,192 B at 2,039 GB/s x 0.8 =
  // 5 ns + 4,900 ns): x 2 layers x 16 micro-batches = 156,960 ns more compute
  // on the critical stage.
  Cluster c = dgx_a100(2);
  c.gpu.kernel_launch_ns = 4900;
  const Topology topo(c);
  ModelSpec aux = small_moe();
  aux.moe.router_load_imbalance = 1.0;
  ModelSpec free = aux;
  free.moe.balancing = RouterBalancing::aux_loss_free;
  const ParallelPlan p = plan_ep4();
  const Estimate e_aux = estimate(aux, topo, p), e_free = estimate(free, topo, p);
  CHECK(e_free.breakdown.compute_s - e_aux.breakdown.compute_s == doctest::Approx(156'960e-9).epsilon(1e-3));
  // Twice the micro-batches (global batch 128): twice the difference.
  ParallelPlan twice = p;
  twice.global_batch = 128;
  const Estimate t_aux = estimate(aux, topo, twice), t_free = estimate(free, topo, twice);
  CHECK(t_free.breakdown.compute_s - t_aux.breakdown.compute_s == doctest::Approx(2 * 156'960e-9).epsilon(1e-3));
  // The simulator plays the same kernels.
  const Estimate s_aux = simulate(aux, topo, p), s_free = simulate(free, topo, p);
  CHECK(s_free.iteration_time_s - s_aux.iteration_time_s == doctest::Approx(156'960e-9).epsilon(0.05));
}

TEST_CASE("the balancing: a card's key, DeepSeek-V3's noaux_tc, the card round trip") {
  ModelSpec m = small_moe();
  m.moe.balancing = RouterBalancing::aux_loss_free;
  m.moe.router_load_imbalance = 1.2;
  const ModelSpec back = model_from_json(model_to_json(m), "round trip");
  CHECK(back.moe.balancing == RouterBalancing::aux_loss_free);
  CHECK(back.moe.router_load_imbalance == 1.2);
  // Not given: 0 (derived), and not written.
  ModelSpec d = small_moe();
  CHECK(d.moe.router_load_imbalance == 0.0);
  CHECK_FALSE(model_to_json(d)["moe"].contains("router_load_imbalance"));
  CHECK_FALSE(model_to_json(d)["moe"].contains("balancing"));
  CHECK(load_model(source_root() / "tests/data/hf/deepseek-v3-config.json").moe.balancing ==
        RouterBalancing::aux_loss_free);
  CHECK(load_model(source_root() / "models/deepseek-v3.json").moe.balancing == RouterBalancing::aux_loss_free);
  CHECK(load_model(source_root() / "models/mixtral-8x7b.json").moe.balancing == RouterBalancing::aux_loss);
  nlohmann::json bad = model_to_json(small_moe());
  bad["moe"]["router_load_imbalance"] = 0.9;
  CHECK(input_error_message([&] { model_from_json(bad, "card.json"); }) ==
        "card.json: moe.router_load_imbalance: must be >= 1 (the busiest EP rank's tokens over the mean; 1: "
        "balanced) (fix: give e.g. 1.2, 1 for a balanced router, or drop it for the measured load of its "
        "balancing)");
}
