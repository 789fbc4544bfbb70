// Megatron-Core's CUDA graphs, Transformer Engine's userbuffers TP overlap
// and the distributed optimizer's parameter gather in the next forward
// (TrainerSettings::cuda_graphs, tp_comm_overlap, overlap_param_gather):
// which kernels launch from a graph, which SP collectives TE overlaps with
// which GEMM and the recurrence that prices a pair (numbers by hand), what
// the estimator and the simulator make of each, and the refusals Megatron
// asserts. A Llama-3-8B layer on the A100 fixture (DGX A100 nodes).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/tp_overlap.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/cost/step.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

// The GPU profiles' launch figure (topologies/gpus/*.json kernel_launch_us 4.9).
constexpr double kLaunchNs = 4900;

ParallelPlan plan_of(int tp, int dp, int zero = 1) {
  ParallelPlan p;
  p.tp = tp;
  p.dp = dp;
  p.zero_stage = zero;
  p.seq_length = 8192;
  p.micro_batch = 1;
  p.global_batch = 4 * dp;
  p.sequence_parallel = tp > 1;
  p.recompute = Recompute::none;
  return p;
}

// The gather cases' plan (Llama-3-8B on 4 DGX A100): TP 1 x PP 2 x DP 16 interleaved over `v` virtual
// stages, 4 micro-batches, the parameter gather in the next forward.
ParallelPlan interleaved_pp2(int v) {
  ParallelPlan p = plan_of(1, 16);
  p.pp = 2;
  p.virtual_stages = v;
  p.schedule = Schedule::interleaved;
  p.global_batch = 64;
  p.trainer.overlap_param_gather = true;
  return p;
}

Cluster node_with_launch() {
  Cluster c = test::dgx_a100(1);
  c.gpu.kernel_launch_ns = kLaunchNs;
  return c;
}

double compute_ns(const GpuProfile& gpu, const std::vector<Op>& ops) {
  double t = 0;
  for (const Op& op : ops) t += static_cast<double>(op_time_ns(gpu, op));
  return t;
}

// Kernels that cost anything (a memory-bound op of no bytes launches nothing).
int kernels(const GpuProfile& gpu, const std::vector<Op>& ops) {
  int n = 0;
  for (const Op& op : ops) n += op_time_ns(gpu, op) > 0 ? 1 : 0;
  return n;
}

std::size_t index_of(const std::vector<Op>& ops, const std::string& name) {
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].name == name) return i;
  return ops.size();
}

}  // namespace

TEST_CASE("--cuda-graphs parses Megatron-Core's implementations and modules, and refuses the rest") {
  CHECK(CudaGraphs::parse("none", "t", "f") == CudaGraphs{});
  CHECK(CudaGraphs::parse("transformer_engine:mlp,attn", "t", "f").str() == "transformer_engine:attn,mlp");
  CHECK(CudaGraphs::parse("local", "t", "f").modules == 0);
  CHECK(test::input_error_message([] { (void)CudaGraphs::parse("cudagraphs", "command line", "--cuda-graphs"); }) ==
        "command line: --cuda-graphs: unknown CUDA graph implementation \"cudagraphs\" (fix: use none, full_iteration, "
        "local or transformer_engine, the last two optionally with :MODULES, a comma-separated list of attn, mlp, moe, "
        "moe_router, moe_preprocess and mamba (Megatron-Core's --cuda-graph-impl and --cuda-graph-modules))");
  CHECK(test::input_error_message([] { (void)CudaGraphs::parse("local:router", "command line", "--cuda-graphs"); }) ==
        "command line: --cuda-graphs: unknown CUDA graph module \"router\" in \"local:router\" (fix: name attn, mlp, "
        "moe, moe_router, moe_preprocess or mamba (Megatron-Core's CudaGraphModule))");
  // Megatron-Core's six modules (enums.py CudaGraphModule at d98e8a64), written in its order.
  CHECK(CudaGraphs::parse("transformer_engine:mamba,moe_preprocess,moe_router,attn", "t", "f").str() ==
        "transformer_engine:attn,moe_router,moe_preprocess,mamba");
}

TEST_CASE("CUDA graphs: a captured kernel pays no launch; a per-layer graph keeps one launch, the full iteration none") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = node_with_launch().gpu;
  ParallelPlan p = plan_of(1, 8);
  const LayerOps eager = transformer_layer_ops(m, p);
  const int fwd_kernels = kernels(gpu, eager.forward), bwd_kernels = kernels(gpu, eager.backward);

  SUBCASE("full_iteration: every kernel of the layer, the embedding and the LM head") {
    p.trainer.cuda_graphs = CudaGraphs::parse("full_iteration", "t", "f");
    const LayerOps graphed = transformer_layer_ops(m, p);
    REQUIRE(graphed.forward.size() == eager.forward.size());
    for (std::size_t i = 0; i < graphed.forward.size(); ++i) {
      CAPTURE(graphed.forward[i].name);
      CHECK(graphed.forward[i].graphed);
      const auto before = op_time_ns(gpu, eager.forward[i]);
      CHECK(op_time_ns(gpu, graphed.forward[i]) == (before > 0 ? before - 4900 : 0));
    }
    CHECK(compute_ns(gpu, eager.forward) - compute_ns(gpu, graphed.forward) == doctest::Approx(fwd_kernels * kLaunchNs));
    CHECK(compute_ns(gpu, eager.backward) - compute_ns(gpu, graphed.backward) == doctest::Approx(bwd_kernels * kLaunchNs));
    for (const Op& op : lm_head_ops(m, p).forward) CHECK(op.graphed);
    for (const Op& op : embedding_ops(m, p).backward) CHECK(op.graphed);
  }

  SUBCASE("transformer_engine:mlp: the MLP's kernels, its first one launching the graph") {
    p.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:mlp", "t", "f");
    const LayerOps graphed = transformer_layer_ops(m, p);
    const std::size_t norm = index_of(graphed.forward, op::norm_mlp);
    REQUIRE(norm < graphed.forward.size());
    for (std::size_t i = 0; i < graphed.forward.size(); ++i) {
      CAPTURE(graphed.forward[i].name);
      CHECK(graphed.forward[i].graphed == (i > norm));
    }
    const int mlp_kernels =
        kernels(gpu, std::vector<Op>(eager.forward.begin() + static_cast<std::ptrdiff_t>(norm), eager.forward.end()));
    CHECK(compute_ns(gpu, eager.forward) - compute_ns(gpu, graphed.forward) ==
          doctest::Approx((mlp_kernels - 1) * kLaunchNs));
    // The embedding and the LM head run eagerly.
    for (const Op& op : lm_head_ops(m, p).forward) CHECK_FALSE(op.graphed);
    // Backward: the MLP part runs first, up to its norm's backward.
    const std::size_t bwd_norm = index_of(graphed.backward, op::norm_mlp_bwd);
    REQUIRE(bwd_norm < graphed.backward.size());
    CHECK_FALSE(graphed.backward.front().graphed);
    CHECK(graphed.backward[bwd_norm].graphed);
    CHECK_FALSE(graphed.backward[bwd_norm + 1].graphed);
  }

  SUBCASE("the estimate and the simulation both drop the launches") {
    const Topology topo(node_with_launch());
    p.trainer.cuda_graphs = CudaGraphs::parse("full_iteration", "t", "f");
    const ParallelPlan eager_plan = plan_of(1, 8);
    const Estimate a = estimate(m, topo, eager_plan), b = estimate(m, topo, p);
    // 32 layers x 4 micro-batches x every kernel of a forward and a backward.
    const double kernels_per_mb = 32.0 * (fwd_kernels + bwd_kernels);
    CHECK(a.breakdown.compute_s - b.breakdown.compute_s ==
          doctest::Approx(4 * kernels_per_mb * kLaunchNs * 1e-9).epsilon(0.02));
    CHECK(simulate(m, topo, p).iteration_time_s < simulate(m, topo, eager_plan).iteration_time_s);
  }
}

TEST_CASE("TP overlap: Transformer Engine's pairs and methods on an SP layer") {
  const ModelSpec m = test::llama3_8b();
  const LayerOps ops = transformer_layer_ops(m, plan_of(4, 2));
  const std::vector<UbOverlap> fwd = ub_overlaps(ops.forward, 4);
  REQUIRE(fwd.size() == 4);
  const char* gemms[] = {op::qkv, op::proj, op::fc1, op::fc2};
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(gemms[i]);
    CHECK(ops.forward[fwd[i].gemm].name == gemms[i]);
    const bool gather = i % 2 == 0;  // qkv, fc1: ring exchange; proj, fc2: pipelined reduce-scatter
    CHECK(fwd[i].method == (gather ? UbMethod::ring_exchange : UbMethod::pipeline));
    CHECK(fwd[i].chunks == (gather ? 4 : 4));
    CHECK(fwd[i].comm_sms == (gather ? 0 : 16));
    CHECK(ops.forward[fwd[i].comm].collective == (gather ? Collective::all_gather : Collective::reduce_scatter));
  }
  const std::vector<UbOverlap> bwd = ub_overlaps(ops.backward, 4);
  REQUIRE(bwd.size() == 2);
  CHECK(ops.backward[bwd[0].gemm].name == op::fc2_dgrad);
  CHECK(ops.backward[bwd[1].gemm].name == op::proj_dgrad);
  CHECK(ub_overlaps(transformer_layer_ops(m, plan_of(1, 8)).forward, 1).empty());
  // A chunk: a quarter of the rows, FLOPs and extra bytes.
  const Op chunk = ub_chunk_gemm(ops.forward[fwd[0].gemm], 4);
  CHECK(chunk.m == 8192 / 4);
  CHECK(chunk.flops == doctest::Approx(ops.forward[fwd[0].gemm].flops / 4));
}

TEST_CASE("TP overlap: the recurrence, worked by hand") {
  // Ring exchange over TP 4: chunk GEMMs of 100 us, shards arriving in 30 us:
  // the first chunk is local, then 3 steps of max(100, 30): 400 us, the 90 us
  // of the all-gather hidden whole. With 150 us steps: 100 + 3 x 150 = 550 us.
  UbOverlap ring{0, 1, UbMethod::ring_exchange, 4, 0};
  CHECK(ub_overlapped_ns(ring, 100e3, 30e3) == doctest::Approx(400e3));
  CHECK(ub_overlapped_ns(ring, 100e3, 150e3) == doctest::Approx(550e3));
  CHECK(ub_chunk_bytes(ring, 64e6) == doctest::Approx(16e6));
  // Pipelined GEMM + reduce-scatter, 4 splits: 50 us chunks, 20 us quarters:
  // 50 + 3 x 50 + the last quarter's 20 = 220 us, 60 of the 80 us hidden.
  UbOverlap pipe{1, 0, UbMethod::pipeline, 4, 16};
  CHECK(ub_overlapped_ns(pipe, 50e3, 20e3) == doctest::Approx(220e3));
  CHECK(ub_overlapped_ns(pipe, 50e3, 80e3) == doctest::Approx(50e3 + 3 * 80e3 + 80e3));
}

TEST_CASE("TP overlap: the estimate's hidden time is the recurrence's, and the simulation agrees") {
  // Llama-3-70B's layer at TP 8 with SP on one DGX A100 node.
  const ModelSpec m = test::llama3_70b();
  const Cluster cluster = test::dgx_a100(1);
  const Topology topo(cluster);
  ParallelPlan off = plan_of(8, 1, 0);
  off.global_batch = 4;
  ParallelPlan on = off;
  on.trainer.tp_comm_overlap = true;
  REQUIRE_FALSE(check_plan(on, m, cluster));
  // A layer by hand: each pair's GEMM and collective replaced by the
  // recurrence over its chunks, in the forward and the backward.
  const GpuProfile& gpu = cluster.gpu;
  const LayerOps ops = transformer_layer_ops(m, off);
  const std::vector<int> tp_group{0, 1, 2, 3, 4, 5, 6, 7};
  double hidden = 0, whole_comm = 0;
  for (const std::vector<Op>* list : {&ops.forward, &ops.backward}) {
    for (const UbOverlap& u : ub_overlaps(*list, 8)) {
      const Op& gemm = (*list)[u.gemm];
      const Op& comm = (*list)[u.comm];
      const Op chunk = ub_chunk_gemm(gemm, u.chunks);
      const double g = static_cast<double>(u.comm_sms > 0 ? SmsTakenPricer(gpu, 16)(chunk) : op_time_ns(gpu, chunk));
      const double c = static_cast<double>(collective_time_ns(
          u.chunk_collective(), ub_chunk_bytes(u, comm.comm_bytes), 8, group_link_params(topo, u.chunk_collective(), tp_group)));
      const double whole = static_cast<double>(collective_time_ns(
          comm.collective, comm.comm_bytes, 8, group_link_params(topo, comm.collective, tp_group)));
      hidden += static_cast<double>(op_time_ns(gpu, gemm)) + whole - ub_overlapped_ns(u, g, c);
      whole_comm += whole;
    }
  }
  const Estimate a = estimate(m, topo, off), b = estimate(m, topo, on);
  // 80 layers x 4 micro-batches; nothing else changes.
  CHECK(a.breakdown.tp_comm_s - b.breakdown.tp_comm_s == doctest::Approx(80 * 4 * hidden * 1e-9).epsilon(1e-6));
  CHECK(a.breakdown.compute_s == b.breakdown.compute_s);
  CHECK(hidden > 0);
  CHECK(hidden < whole_comm);
  // The simulator plays the same pairs (and the backward's bulk pairs on
  // TE's 16 SMs, which the estimate keeps blocking): it saves time too.
  CHECK(simulate(m, topo, on).iteration_time_s < simulate(m, topo, off).iteration_time_s);
}

TEST_CASE("TP overlap and the overlapped parameter gather: Megatron's assertions, in the plan's words") {
  const ModelSpec m = test::llama3_8b();
  const Cluster cluster = test::dgx_a100(1);
  ParallelPlan p = plan_of(1, 8);
  p.trainer.tp_comm_overlap = true;
  auto r = check_plan(p, m, cluster);
  REQUIRE(r);
  CHECK(r->field == PlanField::tp_comm_overlap);
  CHECK(describe(*r, m, cluster) ==
        "TP communication overlap needs sequence parallelism and TP > 1 (here TP 1, SP off; Megatron-LM d98e8a64 "
        "megatron/training/arguments.py:1442 asserts sequence_parallel, which :1433-1439 turns off at TP 1)");
  p = plan_of(2, 4);
  p.sequence_parallel = false;
  p.trainer.tp_comm_overlap = true;
  CHECK(check_plan(p, m, cluster)->kind == PlanCheck::tp_overlap_needs_sp);
  p = plan_of(1, 8, 0);
  p.trainer.overlap_param_gather = true;
  CHECK(describe(*check_plan(p, m, cluster), m, cluster) ==
        "the overlapped parameter all-gather is the distributed optimizer's (ZeRO 1, 2; Megatron-FSDP's ZeRO 3), not "
        "ZeRO 0 (Megatron-LM d98e8a64 megatron/training/arguments.py:1025)");
  p.zero_stage = 1;
  p.trainer.dp_overlap = false;
  CHECK(check_plan(p, m, cluster)->kind == PlanCheck::param_overlap_needs_grad_overlap);
  p = plan_of(2, 4, 0);
  p.flash_attention = false;  // megatron-2022 runs the unfused core, without fused accumulation
  p.grad_accum_fusion = find_trainer("megatron-2022")->default_grad_accum_fusion;
  p.trainer = find_trainer("megatron-2022")->settings;
  p.trainer.cuda_graphs = CudaGraphs::parse("local", "t", "f");
  CHECK(check_plan(p, m, cluster)->kind == PlanCheck::trainer_no_cuda_graphs);
}

TEST_CASE("--overlap-param-gather: the gather leaves the step's end for the next forward's buckets") {
  const ModelSpec m = test::llama3_8b();
  const Cluster cluster = test::dgx_a100(4);
  const Topology topo(cluster);
  ParallelPlan off = plan_of(1, 32);
  ParallelPlan on = off;
  on.trainer.overlap_param_gather = true;
  REQUIRE_FALSE(check_plan(on, m, cluster));
  const StepDescription step(m, on, nullptr);
  bool found = false;
  const StageStep stage = step.stage(0);
  for (const StepCollective& c : stage.collectives())
    if (c.name == "param all-gather") {
      found = true;
      CHECK(c.when == StepWhen::next_forward_buckets);
    }
  CHECK(found);
  // PP 1: the stage's 8.0e9 parameters in 40M-parameter buckets (Megatron-Core's
  // bucket_size max(40M, 1M x DP)): the first bucket's gather shows, the others
  // hide behind the forward of the bucket before them.
  const Estimate a = estimate(m, topo, off), b = estimate(m, topo, on);
  CHECK(b.breakdown.dp_comm_s < a.breakdown.dp_comm_s);
  const double sim_off = simulate(m, topo, off).iteration_time_s, sim_on = simulate(m, topo, on).iteration_time_s;
  CHECK(sim_on < sim_off);
  CHECK(sim_off - sim_on == doctest::Approx(a.iteration_time_s - b.iteration_time_s).epsilon(0.25));
}

TEST_CASE("the plan file carries the three settings where they differ from the preset's") {
  const ModelSpec m = test::llama3_8b();
  const Cluster cluster = test::dgx_a100(1);
  const Topology topo(cluster);
  ParallelPlan p = plan_of(8, 1, 0);
  p.global_batch = 4;
  const nlohmann::json plain = plan_to_json(m, cluster, estimate(m, topo, p));
  CHECK_FALSE(plain["parallel"]["trainer"].contains("tp_comm_overlap"));
  CHECK_FALSE(plain["parallel"]["trainer"].contains("cuda_graphs"));
  p.trainer.tp_comm_overlap = true;
  p.trainer.cuda_graphs = CudaGraphs::parse("local:attn", "t", "f");
  const nlohmann::json j = plan_to_json(m, cluster, estimate(m, topo, p));
  CHECK(j["parallel"]["trainer"]["tp_comm_overlap"] == true);
  CHECK(j["parallel"]["trainer"]["cuda_graphs"] == "local:attn");
  const PlanFile back = plan_file_from_json(j, "t.plan.json");
  CHECK(back.plan.trainer == p.trainer);
}

TEST_CASE("plan: the overlaps apply to the candidates that can run them, the searched TP and ZeRO stage meet them") {
  const ModelSpec m = test::llama3_8b();
  const Topology topo(test::dgx_a100(1));
  PlannerOptions o;
  o.global_batch = 64;
  o.simulate_top = 0;
  o.tp_comm_overlap = true;
  o.overlap_param_gather = true;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE_FALSE(r.fitting.empty());
  for (const Estimate& e : r.fitting) {
    CHECK(e.plan.tp > 1);
    CHECK(e.plan.sequence_parallel);
    CHECK(e.plan.zero_stage >= 1);
    CHECK(e.plan.trainer.tp_comm_overlap);
    CHECK(e.plan.trainer.overlap_param_gather);
  }
  // Fixed where Megatron refuses them: said before any search.
  o.tp = 1;
  CHECK_THROWS_AS((void)search_plans(m, topo, o), PlanRejected);
}

TEST_CASE("--overlap-param-gather-with-optimizer-step: the first chunk's gather runs under the rest of the step") {
  const ModelSpec m = test::llama3_8b();
  const Cluster cluster = test::dgx_a100(4);
  const Topology topo(cluster);
  const ParallelPlan off = interleaved_pp2(2);
  ParallelPlan on = off;
  on.trainer.overlap_param_gather_with_optimizer_step = true;
  REQUIRE_FALSE(check_plan(on, m, cluster));

  // Megatron-LM d98e8a64 arguments.py:1066-1072 and the trainers without it.
  ParallelPlan bad = on;
  bad.trainer.overlap_param_gather = false;
  CHECK(describe(*check_plan(bad, m, cluster), m, cluster) ==
        "the parameter all-gather under the optimizer step needs the overlapped parameter all-gather (Megatron-LM "
        "d98e8a64 megatron/training/arguments.py:1070)");
  bad = on;
  bad.virtual_stages = 1;
  bad.schedule = Schedule::one_f_one_b;
  CHECK(check_plan(bad, m, cluster)->kind == PlanCheck::param_gather_in_step_needs);
  CHECK(check_plan(bad, m, cluster)->field == PlanField::overlap_param_gather_with_optimizer_step);

  // The plan file carries it where it differs from the preset's (off).
  const nlohmann::json j = plan_to_json(m, cluster, estimate(m, topo, on));
  CHECK(j["parallel"]["trainer"]["overlap_param_gather_with_optimizer_step"] == true);
  CHECK(plan_file_from_json(j, "t.plan.json").plan.trainer == on.trainer);
  CHECK_FALSE(plan_to_json(m, cluster, estimate(m, topo, off))["parallel"]["trainer"].contains(
      "overlap_param_gather_with_optimizer_step"));

  // Every chunk one bucket (training.py per_chunk_disable_bucketing).
  CHECK(StepDescription(m, off, nullptr).bucket_params(0, 0) == doctest::Approx(40e6));
  CHECK(std::isinf(StepDescription(m, on, nullptr).bucket_params(0, 0)));

  // The first stage's first chunk: the embedding (128256 x 4096) and layers
  // 0-7 of 218,112,000 parameters each (q, o 4096^2; k, v 4096 x 1024; the
  // SwiGLU MLP 3 x 4096 x 14336; two RMSNorms 4096).
  const double layer = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336 + 2 * 4096;
  CHECK(layer == 218112000.0);
  const double chunk0 = 128256.0 * 4096 + 8 * layer;
  const StepDescription step(m, on, nullptr);
  const TimeNs first_ns = optimizer_step_time_ns(cluster.gpu, chunk0, 16, 1, optimizer_precision(on));
  CHECK(step.first_chunk_step_ns(cluster.gpu, chunk0, 0) == first_ns);

  sim::SimOptions opts;
  opts.timeline = true;
  const sim::SimResult r = sim::run_simulation(m, topo, on, opts);
  const sim::SimResult r_off = sim::run_simulation(m, topo, off, opts);
  const auto find = [](const sim::Timeline& t, int stage, const std::string& name) {
    std::vector<const sim::TimelineBlock*> out;
    for (const sim::TimelineBlock& b : t.blocks)
      if (b.stage == stage && b.name.rfind(name, 0) == 0) out.push_back(&b);
    return out;
  };
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    const auto head = find(r.timeline, s, "optimizer step (first chunk)");
    const auto gather = find(r.timeline, s, "param all-gather (first chunk, under the step)");
    std::vector<const sim::TimelineBlock*> rest;
    for (const auto* b : find(r.timeline, s, "optimizer step"))
      if (b->name == "optimizer step") rest.push_back(b);
    REQUIRE(head.size() == 1);
    REQUIRE(gather.size() == 1);
    REQUIRE(rest.size() == 1);
    // The first chunk's optimizer, then its gather on the DP stream beside
    // the rest of the step, which together take what the whole step took.
    CHECK(gather[0]->row == sim::TimelineRow::dp);
    CHECK(gather[0]->start_ns == head[0]->end_ns);
    CHECK(rest[0]->start_ns == head[0]->end_ns);
    CHECK((head[0]->end_ns - head[0]->start_ns) + (rest[0]->end_ns - rest[0]->start_ns) ==
          step.optimizer_ns(cluster.gpu, stage_parameters(m, on, s), s));
    if (s == 0) CHECK(head[0]->end_ns - head[0]->start_ns == first_ns);
    CHECK(r.timeline.end_ns >= std::max(gather[0]->end_ns, rest[0]->end_ns));
    // The next forward gathers the second chunk only (one bucket); without
    // the flag, both chunks (the first stage's first in 40M buckets).
    const auto in_forward = [&](const sim::Timeline& t) {
      int n = 0;
      for (const auto* b : find(t, s, "param all-gather F")) n += b->row == sim::TimelineRow::dp ? 1 : 0;
      return n;
    };
    CHECK(in_forward(r.timeline) == 1);
    CHECK(in_forward(r_off.timeline) > (s == 0 ? 2 : 1));
  }
  // The first stage's first chunk reduces its gradients in one bucket
  // after its last backward (40M-parameter buckets under it without).
  const auto grad_buckets = [&](const sim::Timeline& t) { return find(t, 0, "grad bucket").size(); };
  CHECK(grad_buckets(r.timeline) == 2);
  CHECK(grad_buckets(r_off.timeline) > 2);
  // The estimate's critical stage is the last: its first chunk's gather
  // hides under the pipeline's fill either way.
  const Estimate a = estimate(m, topo, off), b = estimate(m, topo, on);
  CHECK(b.breakdown.dp_comm_s == doctest::Approx(a.breakdown.dp_comm_s));
}

TEST_CASE("aligned parameter gathers: the interleaved schedule issues each chunk's one chunk ahead, on every stage at once") {
  const ModelSpec m = test::llama3_8b();
  const Cluster cluster = test::dgx_a100(4);
  const Topology topo(cluster);
  ParallelPlan on = interleaved_pp2(4);
  on.trainer.align_param_gather = true;
  REQUIRE_FALSE(check_plan(on, m, cluster));
  REQUIRE(on.aligns_param_gather());
  ParallelPlan off = on;
  off.trainer.align_param_gather = false;
  CHECK_FALSE(off.aligns_param_gather());
  // Megatron-LM's default (--no-align-param-gather is store_false).
  CHECK(find_trainer("megatron-core")->settings.align_param_gather);
  // The plan file carries it where it differs from the preset's (on).
  const nlohmann::json j = plan_to_json(m, cluster, estimate(m, topo, off));
  CHECK(j["parallel"]["trainer"]["align_param_gather"] == false);
  CHECK(plan_file_from_json(j, "t.plan.json").plan.trainer == off.trainer);

  // Forwards in groups of PP = 2 per chunk: F0.0 F1.0 F0.1 F1.1 F0.2 F1.2
  // F0.3 F1.3 F2.0 ... (schedules.py's table). Aligned: chunks 0 and 1 at the
  // start; chunk c before virtual micro-batch k with k + rank = c - 1's first
  // (k = 2 (c - 1) - rank): chunk 2 before F0.1 on stage 0 and before F1.0 on
  // stage 1, chunk 3 before F0.2 and before F1.1. Without: at the chunk's
  // first forward.
  sim::SimOptions opts;
  opts.timeline = true;
  const sim::Timeline a = sim::run_simulation(m, topo, on, opts).timeline;
  const sim::Timeline u = sim::run_simulation(m, topo, off, opts).timeline;
  const auto block = [](const sim::Timeline& t, int stage, const std::string& name) {
    for (const sim::TimelineBlock& b : t.blocks)
      if (b.stage == stage && b.name == name) return b;
    FAIL("no block " << name << " on stage " << stage);
    return sim::TimelineBlock{};
  };
  const std::string before[2][4] = {{"", "", "F1.0", "F1.1"}, {"", "", "F0.0", "F0.1"}};
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    for (int c = 2; c < 4; ++c) {
      CAPTURE(c);
      const std::string g = "param all-gather F0." + std::to_string(c);
      const std::string first = "F0." + std::to_string(c);
      // Issued when the pass before the issuing forward ends (the host's point).
      const std::string& prev = before[s][c];
      const sim::TimelineBlock ga = block(a, s, g);
      if (!prev.empty()) CHECK(ga.start_ns >= block(a, s, prev).end_ns);
      CHECK(ga.end_ns <= block(a, s, first).start_ns);
      // Unaligned: not before the pass before the chunk's first forward ends.
      const std::string last = c == 2 ? "F1.1" : "F1.2";
      CHECK(block(u, s, g).start_ns >= block(u, s, last).end_ns);
    }
    CHECK(block(a, s, "param all-gather F0.1").start_ns < block(a, s, "F0.0").end_ns);
  }
  // Each unaligned gather of chunks 1-3 shows at its chunk's first forward;
  // aligned they hide. The estimate and the simulation agree on the saving.
  const Estimate ea = estimate(m, topo, on), eu = estimate(m, topo, off);
  CHECK(ea.breakdown.dp_comm_s < eu.breakdown.dp_comm_s);
  const double sa = simulate(m, topo, on).iteration_time_s, su = simulate(m, topo, off).iteration_time_s;
  CHECK(sa < su);
  CHECK(su - sa == doctest::Approx(eu.iteration_time_s - ea.iteration_time_s).epsilon(0.25));
}

TEST_CASE("--ddp-bucket-size: the first stage's first chunk reduces in buckets of the size given") {
  const ModelSpec m = test::llama3_8b();
  const Cluster cluster = test::dgx_a100(4);
  const Topology topo(cluster);
  const ParallelPlan rule = plan_of(1, 32);
  ParallelPlan given = rule;
  given.trainer.ddp_bucket_params = 500'000'000;
  REQUIRE_FALSE(check_plan(given, m, cluster));
  // Megatron-Core's rule, max(40M, 1M x 32); the size given; every other
  // chunk one bucket either way.
  CHECK(StepDescription(m, rule, nullptr).bucket_params(0, 0) == 40e6);
  CHECK(StepDescription(m, given, nullptr).bucket_params(0, 0) == 500e6);
  ParallelPlan pp2 = given;
  pp2.pp = 2;
  pp2.dp = 16;
  CHECK(std::isinf(StepDescription(m, pp2, nullptr).bucket_params(1, 0)));
  ParallelPlan in_step = interleaved_pp2(2);
  in_step.trainer.overlap_param_gather_with_optimizer_step = true;
  in_step.trainer.ddp_bucket_params = 500'000'000;
  CHECK(std::isinf(StepDescription(m, in_step, nullptr).bucket_params(0, 0)));

  // Buckets close at the unit that fills them, in backward order: the head
  // (128256 x 4096 + 4096 = 525,340,672 parameters) alone; then the layers
  // (218,112,000 each) three at a time, ten buckets; the last two layers with
  // the embedding (525,336,576). 40M: every unit a bucket of its own, 34.
  sim::SimOptions opts;
  opts.timeline = true;
  const auto grad_buckets = [&](const ParallelPlan& p) {
    std::size_t n = 0;
    for (const sim::TimelineBlock& b : sim::run_simulation(m, topo, p, opts).timeline.blocks)
      n += b.stage == 0 && b.name.rfind("grad bucket", 0) == 0 ? 1 : 0;
    return n;
  };
  CHECK(grad_buckets(given) == 12);
  CHECK(grad_buckets(rule) == 34);

  // Megatron-LM d98e8a64's flag, on megatron-core only; a negative size is refused.
  ParallelPlan other = given;
  other.trainer.preset = "megatron-lm-2023";
  CHECK(check_plan(other, m, cluster)->kind == PlanCheck::trainer_no_ddp_bucket_size);
  CHECK(check_plan(other, m, cluster)->field == PlanField::ddp_bucket_size);
  ParallelPlan negative = rule;
  negative.trainer.ddp_bucket_params = -1;
  CHECK(check_plan(negative, m, cluster)->kind == PlanCheck::not_positive);

  // The plan file carries it when given, and reads it back.
  const nlohmann::json j = plan_to_json(m, cluster, estimate(m, topo, given));
  CHECK(j["parallel"]["trainer"]["ddp_bucket_size"] == 500'000'000);
  CHECK(plan_file_from_json(j, "t.plan.json").plan.trainer == given.trainer);
  CHECK_FALSE(plan_to_json(m, cluster, estimate(m, topo, rule))["parallel"]["trainer"].contains("ddp_bucket_size"));
}

TEST_CASE("the plan file carries the EP overlap's weight gradients where they are not delayed") {
  const ModelSpec m = test::small_mixtral_model();
  const Cluster cluster = test::dgx_a100(2);
  const Topology topo(cluster);
  ParallelPlan p = test::ep4_plan();  // TP 2 x PP 1 x DP 8, EP 8: the combined 1F1B of test_ep_overlap
  p.pp = 1;
  p.dp = 8;
  p.ep = 8;
  p.moe_ep_overlap = true;
  REQUIRE_FALSE(check_plan(p, m, cluster));
  CHECK(p.moe_delay_wgrad);  // the export's --delay-wgrad-compute
  CHECK_FALSE(plan_to_json(m, cluster, estimate(m, topo, p))["parallel"].contains("moe_delay_wgrad"));
  CHECK(plan_file_from_json(plan_to_json(m, cluster, estimate(m, topo, p)), "t.plan.json").plan.moe_delay_wgrad);
  p.moe_delay_wgrad = false;
  const nlohmann::json j = plan_to_json(m, cluster, estimate(m, topo, p));
  CHECK(j["parallel"]["moe_delay_wgrad"] == false);
  CHECK_FALSE(plan_file_from_json(j, "t.plan.json").plan.moe_delay_wgrad);
}
