// The analytical estimator: consistency of the breakdown, the direction of
// each effect, and an informative comparison with Korthikanti et al. 2022
// (tests/data/reference/korthikanti2022*.csv).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/core/workload.hpp"
#include "fixtures.hpp"
#include "reference_data.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

// Selene-like DGX A100 nodes (hardware.md): NVSwitch all-reduce busbw
// 230 GB/s, 8 HDR NICs of ~24 GB/s, 3-level fat tree, rail-optimised. The
// A100 launch cost (2 us) and the latencies are test assumptions, not fitted
// to the paper.
Cluster selene(int nodes) {
  Cluster c = dgx_a100(nodes, /*nodes_per_leaf=*/20);
  c.name = "test-selene";
  c.gpu.kernel_launch_ns = 2000;
  c.intra.busbw_GBps = 230;
  c.inter.levels = 3;
  return c;
}

// GPT models of Korthikanti et al. Table 3 (vocab 51200, s 2048): gpt() of fixtures.hpp.

ParallelPlan make_plan(int tp, int pp, int dp, int micro_batch, std::int64_t global_batch) {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  p.seq_length = 2048;
  p.recompute = Recompute::selective;
  p.sequence_parallel = tp > 1;
  p.flash_attention = true;
  return p;
}

// Forward and backward (with recompute) milliseconds of one layer on the TP
// group of GPUs 0..tp-1: compute ops plus TP collectives.
struct LayerMs {
  double forward = 0;
  double backward = 0;
};

LayerMs layer_ms(const ModelSpec& m, const Topology& topo, const ParallelPlan& p) {
  std::vector<int> group;
  for (int r = 0; r < p.tp; ++r) group.push_back(r);
  const LayerOps ops = transformer_layer_ops(m, p);
  auto time_ms = [&](const std::vector<Op>& list) {
    double ns = 0;
    for (const Op& op : list) {
      if (op.kind == OpKind::collective) {
        ns += static_cast<double>(collective_time_ns(op.collective, op.comm_bytes, p.tp,
                                                     group_link_params(topo, op.collective, group)));
      } else {
        ns += static_cast<double>(op_time_ns(topo.cluster().gpu, op));
      }
    }
    return ns * 1e-6;
  };
  return LayerMs{time_ms(ops.forward), time_ms(ops.backward) + time_ms(ops.recompute)};
}

}  // namespace

TEST_CASE("the breakdown sums to the iteration time and the derived figures agree") {
  const Topology topo(selene(4));
  const ModelSpec m = gpt(24, 2048, 16);
  for (int zero : {0, 1, 2, 3}) {
    ParallelPlan p = make_plan(8, 2, 2, 1, 32);
    p.zero_stage = zero;
    const Estimate e = estimate(m, topo, p);
    CAPTURE(zero);
    CHECK(e.iteration_time_s > 0);
    CHECK(e.iteration_time_s == doctest::Approx(e.breakdown.total()));
    CHECK(e.tokens_per_s == doctest::Approx(32.0 * 2048 / e.iteration_time_s));
    CHECK(e.model_tflops_per_gpu == doctest::Approx(e.model_flops / e.iteration_time_s / 32 / 1e12));
    CHECK(e.mfu > 0);
    CHECK(e.mfu < 1);
    CHECK(e.hfu >= e.mfu);
    CHECK(e.breakdown.compute_s > 0);
    CHECK(e.breakdown.tp_comm_s > 0);
    CHECK(e.breakdown.pp_comm_s > 0);
    CHECK(e.breakdown.bubble_s > 0);
    CHECK(e.breakdown.optimizer_s > 0);
    CHECK(e.memory.total_bytes > 0);
  }
}

TEST_CASE("more micro-batches shrink the bubble's share; interleaving shrinks the bubble") {
  const Topology topo(selene(4));
  const ModelSpec m = gpt(48, 6144, 64);
  const Estimate few = estimate(m, topo, make_plan(8, 4, 1, 1, 8));
  const Estimate many = estimate(m, topo, make_plan(8, 4, 1, 1, 16));
  CHECK(few.breakdown.bubble_s == doctest::Approx(many.breakdown.bubble_s));
  CHECK(many.breakdown.bubble_s / many.iteration_time_s < few.breakdown.bubble_s / few.iteration_time_s);

  ParallelPlan inter = make_plan(8, 4, 1, 1, 16);
  inter.schedule = Schedule::interleaved;
  inter.virtual_stages = 3;
  const Estimate il = estimate(m, topo, inter);
  CHECK(il.breakdown.bubble_s == doctest::Approx(many.breakdown.bubble_s / 3));
  CHECK(il.breakdown.pp_comm_s > many.breakdown.pp_comm_s);
  // No pipeline, no bubble and no p2p.
  const Estimate flat = estimate(m, topo, make_plan(8, 1, 1, 1, 16));
  CHECK(flat.breakdown.bubble_s == 0);
  CHECK(flat.breakdown.pp_comm_s == 0);
}

TEST_CASE("TP 8 inside a node communicates less than TP 16 across two nodes") {
  const ModelSpec m = gpt(48, 6144, 64);
  const Estimate in_node = estimate(m, Topology(selene(1)), make_plan(8, 1, 1, 1, 8));
  const Estimate across = estimate(m, Topology(selene(2)), make_plan(16, 1, 1, 1, 8));
  CHECK(in_node.breakdown.tp_comm_s > 0);
  CHECK(across.breakdown.tp_comm_s > in_node.breakdown.tp_comm_s);
  // TP 1 has no TP traffic at all.
  ParallelPlan single = make_plan(1, 1, 8, 1, 8);
  const Estimate dp_only = estimate(gpt(24, 2048, 16), Topology(selene(1)), single);
  CHECK(dp_only.breakdown.tp_comm_s == 0);
}

TEST_CASE("DP rings across a 1:7 core cost what they cost inside a pod while their crossing edges fit the uplinks") {
  // Llama 3.1 405B on 2,048 RoCE nodes (5.3 pods of 384), TP 8 x PP 16 x DP
  // 128: with DP outermost (tp-pp-dp) each DP ring spans every pod, 24 of its
  // 128 members in each; 128 rings leave a pod at 46 GB/s, 5,888 GB/s of its
  // 20,187. With tp-dp-pp each DP ring stays in a pod.
  const ModelSpec m = load_model(test::source_root() / "models/llama3.1-405b.json");
  const Topology topo(load_cluster(test::source_root() / "topologies/h100-roce-24k.json", 2048));
  ParallelPlan p = make_plan(8, 16, 128, 1, 2048);
  p.seq_length = 8192;
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  p.zero_stage = 1;
  p.recompute = Recompute::full;
  const Estimate inside = estimate(m, topo, p);
  p.order = RankOrder::parse("tp-pp-dp", "test", "order");
  const Estimate across = estimate(m, topo, p);
  CHECK(across.breakdown.dp_comm_s == doctest::Approx(inside.breakdown.dp_comm_s).epsilon(0.01));
  CHECK(across.breakdown.dp_comm_s < 0.05 * across.iteration_time_s);
}

TEST_CASE("ZeRO-3 adds data-parallel traffic") {
  const Topology topo(selene(4));
  const ModelSpec m = gpt(24, 2048, 16);
  auto dp_time = [&](int zero) {
    ParallelPlan p = make_plan(8, 1, 4, 1, 16);
    p.zero_stage = zero;
    return estimate(m, topo, p).breakdown.dp_comm_s;
  };
  const double z0 = dp_time(0);
  const double z3 = dp_time(3);
  CHECK(z0 > 0);  // 4 nodes, one GPU of each DP group per node: 24 GB/s per GPU
  CHECK(z3 > z0);
  // DP 1: nothing to reduce but, across stages, the tied embedding's gradient.
  CHECK(estimate(m, topo, make_plan(8, 4, 1, 1, 16)).breakdown.dp_comm_s > 0);
  ModelSpec untied = m;
  untied.tied_embeddings = false;
  CHECK(estimate(untied, topo, make_plan(8, 4, 1, 1, 16)).breakdown.dp_comm_s == 0);
}

TEST_CASE("GPU speed spread: compute and optimizer at the pace of the slowest of N GPUs") {
  const ModelSpec m = gpt(24, 2048, 16);
  Cluster even = selene(16);
  Cluster spread = even;
  spread.gpu.speed_spread = 0.0115;
  const Topology t0(even), t1(spread);
  // TP 8 x PP 4 x DP 2 = 64 GPUs: 1 + 0.0115 x inv_cdf(63.625 / 64.25) = 1 + 0.0115 x 2.3366911.
  const double factor = 1 + 0.0115 * 2.3366911;
  ParallelPlan p = make_plan(8, 4, 2, 1, 64);
  p.zero_stage = 1;
  const Estimate a = estimate(m, t0, p);
  const Estimate b = estimate(m, t1, p);
  CHECK(a.gpu_spread == 0);
  CHECK(a.gpu_spread_slowdown == 1.0);
  CHECK(b.gpu_spread == 0.0115);
  CHECK(b.gpu_spread_slowdown == doctest::Approx(factor).epsilon(1e-8));
  CHECK(b.breakdown.compute_s == doctest::Approx(a.breakdown.compute_s * b.gpu_spread_slowdown).epsilon(1e-12));
  CHECK(b.breakdown.optimizer_s == doctest::Approx(a.breakdown.optimizer_s * b.gpu_spread_slowdown).epsilon(1e-12));
  // Communication is not slowed: the same TP and PP times.
  CHECK(b.breakdown.tp_comm_s == a.breakdown.tp_comm_s);
  CHECK(b.breakdown.pp_comm_s == a.breakdown.pp_comm_s);
  CHECK(b.breakdown.bubble_s > a.breakdown.bubble_s);
  CHECK(b.iteration_time_s > a.iteration_time_s);
  CHECK(b.iteration_time_s < a.iteration_time_s * factor);
  // One GPU: the median GPU the constants describe, no penalty.
  const Estimate one0 = estimate(m, t0, make_plan(1, 1, 1, 1, 4));
  const Estimate one1 = estimate(m, t1, make_plan(1, 1, 1, 1, 4));
  CHECK(one1.iteration_time_s == one0.iteration_time_s);
  CHECK(one1.gpu_spread_slowdown == 1.0);
  // The factor follows the plan's world size, and the Estimator's caches
  // (layer costs shared by plans of the same TP and micro-batch) keep it so.
  Estimator cached(m, t1);
  for (int dp : {1, 2, 4, 2, 1}) {
    CAPTURE(dp);
    const ParallelPlan q = make_plan(8, 4, dp, 1, 64);
    const Estimate c = cached(q);
    const Estimate u = estimate(m, t1, q);
    CHECK(c.iteration_time_s == u.iteration_time_s);
    CHECK(c.breakdown.compute_s == u.breakdown.compute_s);
    CHECK(c.gpu_spread_slowdown == 1 + 0.0115 * expected_max_normal(32 * dp));
  }
}

TEST_CASE("Korthikanti et al. 2022 Table 4: one 22B layer on 8 A100s (informative)") {
  const Topology topo(selene(1));
  const ModelSpec m = gpt(48, 6144, 64);
  struct Row {
    std::string name;
    Recompute recompute;
    bool sp;
    double paper_fwd_ms;
    double paper_bwd_ms;
  };
  // The paper's times from tests/data/reference/korthikanti2022_table4_layer_times.csv,
  // by its experiment names; the configurations are those the names describe.
  const std::vector<CsvRow> table4 = reference_csv("korthikanti2022_table4_layer_times.csv");
  const auto paper = [&](std::string name, const char* experiment, Recompute recompute, bool sp) {
    const CsvRow& r = row_where(table4, "experiment", experiment);
    return Row{std::move(name), recompute, sp, r.number("forward_ms"), r.number("backward_ms")};
  };
  const Row rows[] = {
      paper("baseline no recompute", "Baseline no recompute", Recompute::none, false),
      paper("sequence parallelism", "Sequence Parallelism", Recompute::none, true),
      paper("baseline full recompute", "Baseline with recompute", Recompute::full, false),
      paper("selective recompute", "Selective Recompute", Recompute::selective, false),
      paper("selective + sequence", "Selective + Sequence", Recompute::selective, true),
  };
  for (const Row& row : rows) {
    ParallelPlan p = make_plan(8, 1, 1, 4, 4);
    p.flash_attention = false;  // the paper's Megatron used the unfused softmax kernels
    p.recompute = row.recompute;
    p.sequence_parallel = row.sp;
    const LayerMs t = layer_ms(m, topo, p);
    MESSAGE(row.name << ": forward " << t.forward << " ms (paper " << row.paper_fwd_ms << "), backward "
                     << t.backward << " ms (paper " << row.paper_bwd_ms << ")");
    if (row.recompute == Recompute::none && !row.sp) {
      CHECK(t.forward > 0.65 * row.paper_fwd_ms);
      CHECK(t.forward < 1.35 * row.paper_fwd_ms);
    }
  }
}

TEST_CASE("Korthikanti et al. 2022 Table 5: 175B iteration on 64 A100s (informative)") {
  const Topology topo(selene(8));
  const ModelSpec m = gpt(96, 12288, 96);
  ParallelPlan p = make_plan(8, 8, 1, 1, 64);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 3;
  p.flash_attention = false;
  p.recompute = Recompute::selective;
  p.sequence_parallel = true;
  const Estimate e = estimate(m, topo, p);
  const Breakdown& b = e.breakdown;
  // Table 5's 175B row (tests/data/reference/korthikanti2022.csv).
  const CsvRow paper = row_where(reference_csv("korthikanti2022.csv"), "model", "175B (GPT-3)");
  const double paper_s = paper.number("iter_time_seqpar_plus_selective_s");
  MESSAGE("175B tp8 pp8 v3 SP+selective: " << e.iteration_time_s << " s (paper " << paper_s << " s), MFU " << e.mfu
                                           << " (paper " << paper.number("mfu_pct") / 100 << "), HFU " << e.hfu
                                           << " (paper " << paper.number("hfu_pct") / 100 << "); compute "
                                           << b.compute_s << " tp " << b.tp_comm_s << " pp " << b.pp_comm_s
                                           << " dp " << b.dp_comm_s << " bubble " << b.bubble_s << " optimizer "
                                           << b.optimizer_s);
  CHECK(e.iteration_time_s > paper_s / 2);
  CHECK(e.iteration_time_s < paper_s * 2);
}

TEST_CASE("estimate is cheap enough for the planner's inner loop") {
  const Topology topo(selene(8));
  const ModelSpec m = gpt(96, 12288, 96);
  ParallelPlan p = make_plan(8, 8, 1, 1, 64);
  const int reps = 2000;
  double sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) sink += estimate(m, topo, p).iteration_time_s;
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / reps;
  MESSAGE("estimate(): " << us << " us per call (64 GPUs, pp 8)");
  CHECK(sink > 0);
}

TEST_CASE("trainer settings price the DP reduction as the trainer runs it") {
  const ModelSpec m = gpt(40, 6144, 48);
  const Topology topo(selene(16));
  ParallelPlan p = make_plan(8, 2, 8, 1, 64);  // 32 micro-batches, DP 8 across nodes
  p.zero_stage = 0;
  const Estimate overlapped = estimate(m, topo, p);
  p.trainer.dp_overlap = false;
  const Estimate after = estimate(m, topo, p);
  // The all-reduce hides behind the last backward when overlapped; after it,
  // all of it is exposed: fp32 gradients of one stage (20 layers / TP 8) over
  // DP 8 across nodes take tens of milliseconds, more than the overlapped case.
  CHECK(after.breakdown.dp_comm_s > overlapped.breakdown.dp_comm_s + 0.01);
  // Megatron-LM 2021 with --fp16 reduces 16-bit gradients: half the bytes,
  // so (bandwidth-bound) about half the exposed time.
  p.trainer.dp_grad_bytes = 2;
  const Estimate fp16 = estimate(m, topo, p);
  CHECK(fp16.breakdown.dp_comm_s == doctest::Approx(after.breakdown.dp_comm_s / 2).epsilon(0.05));
  // DeepSpeed's pipeline engine all-reduces the full gradients under ZeRO-1:
  // an all-reduce moves twice the bytes of the reduce-scatter Megatron's
  // distributed optimizer uses (the parameter all-gather is the same).
  p.trainer.dp_grad_bytes = 4;
  p.zero_stage = 1;
  const Estimate rs = estimate(m, topo, p);
  p.trainer.zero1_grad_all_reduce = true;
  const Estimate ar = estimate(m, topo, p);
  CHECK(ar.breakdown.dp_comm_s > rs.breakdown.dp_comm_s * 1.3);
  CHECK(ar.breakdown.compute_s == rs.breakdown.compute_s);
  // DeepSpeed v0.5.4 (megatron-deepspeed-2021) all-reduces fp16 gradients:
  // the all-reduce's bandwidth term halves, the bf16 all-gather stays.
  p.trainer = find_trainer("megatron-deepspeed-2021")->settings;
  const Estimate fp16_ar = estimate(m, topo, p);
  CHECK(fp16_ar.breakdown.dp_comm_s < ar.breakdown.dp_comm_s * 0.8);
  CHECK(fp16_ar.breakdown.dp_comm_s > rs.breakdown.dp_comm_s * 0.9);
}

TEST_CASE("prediction intervals come from the nearest validated regime, or say there is none") {
  const std::vector<ValidationRegime>& regimes = validation_regimes();
  const ValidationRegime* k = nullptr;
  for (const ValidationRegime& r : regimes)
    if (r.set == "korthikanti") k = &r;
  REQUIRE(k != nullptr);
  CHECK(k->gpu == "A100-SXM4-80GB");
  CHECK(k->trainer == "megatron-2022");
  CHECK(k->min_error <= k->mean_error);
  CHECK(k->mean_error <= k->max_error);
  // A measurement = prediction / (1 + error): the largest error bounds it below.
  const PredictionInterval in = prediction_interval(10.0, "A100-SXM4-80GB", 64, "megatron-2022");
  REQUIRE(in.known);
  CHECK(in.low_s == doctest::Approx(10.0 / (1 + k->max_error)));
  CHECK(in.high_s == doctest::Approx(10.0 / (1 + k->min_error)));
  CHECK(in.basis.find("korthikanti") != std::string::npos);
  // Today's Megatron-Core stands on the 2022 runs, and says so.
  const PredictionInterval core = prediction_interval(10.0, "A100-SXM4-80GB", 64, "megatron-core");
  REQUIRE(core.known);
  CHECK(core.low_s == in.low_s);
  CHECK(core.basis.find("megatron-core itself has no measured runs") != std::string::npos);
  // No runs on that GPU, far beyond the validated scale, or no similar trainer: unknown.
  const PredictionInterval h100 = prediction_interval(10.0, "H100-SXM5-80GB", 64, "megatron-core");
  CHECK_FALSE(h100.known);
  CHECK(h100.basis.find("no measured run on H100-SXM5-80GB") != std::string::npos);
  const PredictionInterval huge = prediction_interval(10.0, "A100-SXM4-80GB", 100000, "megatron-2022");
  CHECK_FALSE(huge.known);
  CHECK(huge.basis.find("no validation data near 100000 GPUs") != std::string::npos);
  CHECK_FALSE(prediction_interval(10.0, "A100-SXM4-80GB", 64, "torchtitan").known);
}

TEST_CASE("a trainer with fewer than three measured runs pools its stand-ins' runs into its interval") {
  const ValidationRegime* bloom = nullptr;
  const ValidationRegime* mtnlg = nullptr;
  for (const ValidationRegime& r : validation_regimes()) {
    if (r.set == "bloom") bloom = &r;
    if (r.set == "mtnlg") mtnlg = &r;
  }
  REQUIRE(bloom != nullptr);
  REQUIRE(mtnlg != nullptr);
  REQUIRE(bloom->rows == 1);
  REQUIRE(bloom->trainer == "megatron-deepspeed-2022");
  REQUIRE(mtnlg->trainer == "megatron-deepspeed-2021");
  // BLOOM's one run alone would give a point; DeepSpeed's pipeline engine of
  // a year earlier (MT-NLG) widens it, and the basis names both.
  const PredictionInterval in = prediction_interval(10.0, "A100-SXM4-80GB", 384, "megatron-deepspeed-2022");
  REQUIRE(in.known);
  CHECK(in.low_s == doctest::Approx(10.0 / (1 + std::max(bloom->max_error, mtnlg->max_error))));
  CHECK(in.high_s == doctest::Approx(10.0 / (1 + std::min(bloom->min_error, mtnlg->min_error))));
  CHECK(in.high_s - in.low_s > 0.1);
  CHECK(in.basis.find("4 megatron-deepspeed-2022 and megatron-deepspeed-2021 runs") != std::string::npos);
  CHECK(in.basis.find("itself has no measured runs") == std::string::npos);
  // Three runs of its own are enough: MT-NLG's preset keeps to them.
  const PredictionInterval own = prediction_interval(10.0, "A100-SXM4-80GB", 2240, "megatron-deepspeed-2021");
  REQUIRE(own.known);
  CHECK(own.low_s == doctest::Approx(10.0 / (1 + mtnlg->max_error)));
  CHECK(own.basis.find("bloom") == std::string::npos);
}
