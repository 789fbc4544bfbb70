// Muon as Megatron-Core steps it (cost/optimizer_step.hpp): the matrices it
// orthogonalises, their Newton-Schulz FLOPs, the layer-wise optimizer's
// deal over DP ranks, the gradients' all-reduce and the gather after the
// step, one momentum instead of two moments, the refusals and the exports.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/cost/step.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/export_resolve.hpp"
#include "cuboid/io/planfile.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

// The small Mixtral of the fixtures on 16 GPUs: TP 2 x PP 2 x DP 4, EP 4 x
// ETP 1 x expert-DP 2, ZeRO 1, Muon; megatron-core.
ParallelPlan muon_plan() {
  ParallelPlan p = test::ep4_plan();
  p.trainer = find_trainer("megatron-core")->settings;
  p.trainer.overlap_param_gather = false;
  p.optimizer = OptimizerKind::muon;
  return p;
}

}  // namespace

TEST_CASE("Muon's Newton-Schulz FLOPs: 4 r^2 c + 2 r^3 a step on the smaller side r") {
  // 2 x 3: A = X X^T 2 x 2 x 2 x 3 = 24, B = A A 2 x 8 = 16, B X 24: 64 a step, 320 in 5.
  CHECK(muon_newton_schulz_flops({2, 3}) == 320);
  CHECK(muon_newton_schulz_flops({3, 2}) == 320);  // transposed to whiten the smaller side
  CHECK(muon_newton_schulz_flops({4096, 7168}, 1) == doctest::Approx(4.0 * 4096 * 4096 * 7168 + 2.0 * 4096 * 4096 * 4096));
  CHECK(kMuonNewtonSchulzSteps == 5);
  // Per element: decay 8, momentum 12, Nesterov 12, normalise 12, the bf16 round trip 12, scale 16, update 12.
  CHECK(kMuonBytesPerParam == 8 + 12 + 12 + 12 + 12 + 16 + 12);
}

TEST_CASE("Muon's matrices: the QKV weight in its Q, K and V blocks, each local expert's fc1 and fc2") {
  const ModelSpec m = test::small_mixtral_model();  // h 1024, 16 heads (4 KV) of 64, 8 experts of FFN 2048
  const ParallelPlan p = muon_plan();
  const std::vector<MuonMatrix> w = muon_matrices(m, p, 0);
  // Stage 0 holds 2 of the 4 layers. Per layer at TP 2: Q 512 x 1024, K and V
  // 128 x 1024, the projection 1024 x 512, the router 8 x 1024 (dense); 2
  // local experts (EP 4) of fc1 4096 x 1024 (gated) and fc2 1024 x 2048.
  std::int64_t dense = 0, expert = 0;
  for (const MuonMatrix& x : w) (x.expert ? expert : dense) += x.count;
  CHECK(dense == 10);
  CHECK(expert == 8);
  const StageParameters e = muon_elements(m, p, 0);
  CHECK(e.dense == 2 * (512.0 * 1024 + 2 * 128.0 * 1024 + 1024.0 * 512 + 8.0 * 1024));
  CHECK(e.expert == 2 * 2 * (4096.0 * 1024 + 1024.0 * 2048));
  // One entry per shape, in the layer's order: Q, then K and V together.
  REQUIRE(w.size() == 6);
  CHECK((w[0].rows == 512 && w[0].cols == 1024 && w[0].count == 2));
  CHECK((w[1].rows == 128 && w[1].count == 4));
}

TEST_CASE("the layer-wise optimizer deals the matrices ping-pong by size over the DP ranks") {
  const GpuProfile gpu = test::a100();
  // Five matrices of 1 x 1 ... 1 x 5, given out of order: sorted, dealt to
  // ranks 0, 1, 1, 0, 0; rank 0 steps 1 + 4 + 5 = 10 elements, rank 1 5.
  const std::vector<MuonMatrix> w{{1, 4}, {1, 2}, {1, 5}, {1, 1}, {1, 3}};
  const MuonRankWork two = muon_rank_work(gpu, w, 2);
  CHECK(two.elements == 10);
  TimeNs rank0 = 0;
  for (const MuonMatrix& x : {MuonMatrix{1, 1}, MuonMatrix{1, 4}, MuonMatrix{1, 5}}) rank0 += muon_matrix_time_ns(gpu, x);
  CHECK(two.ns == rank0);
  // One rank (ZeRO 0, or DP 1) steps all of them.
  const MuonRankWork one = muon_rank_work(gpu, w, 1);
  CHECK(one.elements == 15);
  CHECK(one.ns > two.ns);
  // Eleven of one shape over 3 ranks, after the five: the five are dealt
  // 0, 1, 2, 2, 1 (rank 0 1 element, rank 1 2 + 5, rank 2 3 + 4); positions
  // 5-15 go 0, 0, 1, 2, 2, 1, 0, 0, 1, 2, 2: ranks 0 and 2 four each, rank 1
  // three. The busiest, rank 2: 3 + 4 + 4 x 16 elements.
  std::vector<MuonMatrix> more = w;
  more.push_back({2, 8, false, 11});
  const MuonRankWork three = muon_rank_work(gpu, more, 3);
  const TimeNs big = muon_matrix_time_ns(gpu, {2, 8});
  CHECK(three.elements == 7 + 4 * 16);
  CHECK(three.ns == muon_matrix_time_ns(gpu, {1, 3}) + muon_matrix_time_ns(gpu, {1, 4}) + 4 * big);
}

TEST_CASE("Muon with ZeRO 1: gradients all-reduced, the parameters gathered after the step, one momentum") {
  const ModelSpec m = test::small_mixtral_model();
  const ParallelPlan muon = muon_plan();
  ParallelPlan adam = muon;
  adam.optimizer = OptimizerKind::adam;
  const StepDescription ms(m, muon, nullptr), as(m, adam, nullptr);
  CHECK(ms.grad_collective() == Collective::all_reduce);
  CHECK(as.grad_collective() == Collective::reduce_scatter);
  CHECK(ms.gathers_after_step());
  // Memory: one fp32 momentum where Adam keeps two moments, over the same
  // shards: 4 B x (2,637,824 dense elements / DP x CP 4 + 25,165,824 expert
  // ones / expert-DP 2) = 52,969,472 B less on stage 0.
  // (Both stages hold two layers: the same matrices.)
  const GpuProfile gpu = test::a100();
  const MemoryReport a = memory_per_gpu(m, adam, gpu), u = memory_per_gpu(m, muon, gpu);
  REQUIRE(a.peak_stage == u.peak_stage);
  CHECK(a.weight_and_optimizer_bytes - u.weight_and_optimizer_bytes == doctest::Approx(4.0 * (2637824.0 / 4 + 25165824.0 / 2)));
  // The step: Adam on the rest, the busiest rank's matrices on top.
  const StageParameters sp = stage_parameters(m, muon, 0);
  CHECK(ms.optimizer_ns(gpu, sp, 0) > as.optimizer_ns(gpu, sp, 0));
}

TEST_CASE("Muon: what Megatron-Core refuses, and the trainers without it") {
  const ModelSpec m = test::small_mixtral_model();
  const Cluster cluster = test::dgx_a100(2);
  ParallelPlan p = muon_plan();
  REQUIRE_FALSE(check_plan(p, m, cluster));
  ParallelPlan zero2 = p;
  zero2.zero_stage = 2;
  REQUIRE(check_plan(zero2, m, cluster));
  CHECK(check_plan(zero2, m, cluster)->kind == PlanCheck::muon_refused);
  CHECK(check_plan(zero2, m, cluster)->values[0] == static_cast<int>(MuonRefusal::zero_stage));
  ParallelPlan fused = p;
  fused.precision_aware_optimizer = true;
  CHECK(check_plan(fused, m, cluster)->values[0] == static_cast<int>(MuonRefusal::precision_aware));
  // A dense plan on a 2023 Megatron-LM, which had no emerging optimizers.
  const ModelSpec dense = test::llama3_8b();
  ParallelPlan old = test::recompute_plan(2, 1, 8, 64);
  old.seq_length = 2048;
  old.trainer = find_trainer("megatron-lm-2023")->settings;
  old.optimizer = OptimizerKind::muon;
  REQUIRE(check_plan(old, dense, cluster));
  CHECK(check_plan(old, dense, cluster)->kind == PlanCheck::trainer_no_muon);
  CHECK(check_plan(old, dense, cluster)->field == PlanField::optimizer);
  old.optimizer = OptimizerKind::adam;
  CHECK_FALSE(check_plan(old, dense, cluster));
}

TEST_CASE("Muon in the plan file and the exports: Megatron-LM, Megatron-Bridge's dist_muon, refused elsewhere") {
  const ModelSpec m = test::small_mixtral_model();
  const Cluster cluster = test::dgx_a100(2);
  const Topology topo(cluster);
  const ParallelPlan p = muon_plan();
  const nlohmann::json j = plan_to_json(m, cluster, estimate(m, topo, p));
  CHECK(j["parallel"]["optimizer"] == "muon");
  const PlanFile pf = plan_file_from_json(j, "t.plan.json");
  CHECK(pf.plan.optimizer == OptimizerKind::muon);
  ParallelPlan adam = p;
  adam.optimizer = OptimizerKind::adam;
  CHECK_FALSE(plan_to_json(m, cluster, estimate(m, topo, adam))["parallel"].contains("optimizer"));

  const ExportResult lm = export_plan(pf, "megatron");
  CHECK(lm.text.find("--optimizer muon") != std::string::npos);
  CHECK(lm.text.find("--use-distributed-optimizer") != std::string::npos);
  const ExportResult bridge = export_plan(pf, "megatron-bridge");
  CHECK(bridge.text.find("cfg.optimizer.optimizer = \"dist_muon\"") != std::string::npos);
  CHECK(bridge.text.find("cfg.ddp.use_distributed_optimizer = False") != std::string::npos);
  for (const std::string target : {"megatron", "megatron-bridge"}) {
    CAPTURE(target);
    const ExportResult r = export_plan(pf, target);
    const ResolvedRun run = resolve_export(target, r);
    CHECK(run.find("optimizer")->value == "muon");
    CHECK(run.find("zero_stage")->value == "1");
    CHECK_MESSAGE(describe(compare_with_plan(run, pf)) == "", r.text << r.notes);
  }
  // DeepSpeed's optimizers are its own: a dense Muon plan is refused for it.
  const ModelSpec dense = test::llama3_8b();
  ParallelPlan d = test::recompute_plan(2, 1, 8, 64);
  d.seq_length = 2048;
  d.trainer = p.trainer;
  d.optimizer = OptimizerKind::muon;
  const PlanFile dpf = plan_file_from_json(plan_to_json(dense, cluster, estimate(dense, topo, d)), "d.plan.json");
  CHECK_THROWS_WITH_AS(export_plan(dpf, "deepspeed"), doctest::Contains("Muon"), std::exception);
}
