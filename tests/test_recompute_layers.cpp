// Megatron-Core's partial full recomputation (--recompute-method uniform |
// block, --recompute-num-layers N; megatron/core/recompute.py
// checkpointed_forward at Megatron-LM d98e8a64): which layers of a model
// chunk re-run, the memory a stage keeps, the time and hardware FLOPs the
// recompute adds (estimator and simulator against the hand figure), and
// what is refused. Hand numbers for Llama-3-8B (h 4096, 32 heads, 8 KV
// heads, SwiGLU f 14336, hidden dropout 0.1) at 4096 tokens, micro-batch 1,
// TP 1, bf16, fused attention.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

using Groups = std::vector<std::array<int, 2>>;

ParallelPlan full(RecomputeMethod method, int n) {
  ParallelPlan p;
  p.recompute = Recompute::full;
  p.recompute_method = method;
  p.recompute_num_layers = n;
  return p;
}

// Llama-3-8B on 8 GPUs of one node, 4096 tokens, micro-batch 1, TP 1.
ParallelPlan llama_plan(int pp, int dp, int v, std::int64_t global_batch) {
  ParallelPlan p;
  p.pp = pp;
  p.dp = dp;
  p.virtual_stages = v;
  p.schedule = v > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
  p.seq_length = 4096;
  p.global_batch = global_batch;
  p.recompute = Recompute::none;
  return p;
}

ParallelPlan with(ParallelPlan p, RecomputeMethod method, int n) {
  p.recompute = Recompute::full;
  p.recompute_method = method;
  p.recompute_num_layers = n;
  return p;
}

GpuProfile memory_only() {
  GpuProfile g;
  g.memory_bytes = 81920LL * 1024 * 1024;
  g.memory_reserve_bytes = 0;
  return g;
}

// Per micro-batch: a checkpoint's input 2 s h; a stored layer (Korthikanti's
// 10 s h + 2 s (q + 2 kv + q) + 6 s f with flash attention); the first
// stage's embedding (8 s ids + s h dropout mask); the last stage's LM head
// input and fp32 logits (4 s h + 4 s V).
constexpr double kInput = 2.0 * 4096 * 4096;                                       // 33,554,432
constexpr double kStored = 10.0 * 4096 * 4096 + 2.0 * 4096 * 10240 + 6.0 * 4096 * 14336;  // 603,979,776
constexpr double kEmbedding = 8.0 * 4096 + 4096.0 * 4096;                          // 16,809,984
constexpr double kOutput = 4.0 * 4096 * 4096 + 4.0 * 4096 * 128256;                // 2,168,455,168

}  // namespace

TEST_CASE("which layers of a chunk re-run: block's first N, uniform's groups of N") {
  CHECK(recompute_groups(full(RecomputeMethod::block, 2), 4) == Groups{{0, 1}, {1, 2}});
  CHECK(recompute_groups(full(RecomputeMethod::uniform, 2), 5) == Groups{{0, 2}, {2, 4}, {4, 5}});
  CHECK(recompute_groups(full(RecomputeMethod::uniform, 1), 3) == Groups{{0, 1}, {1, 2}, {2, 3}});
  // More than the chunk's layers: block recomputes them all, uniform in one group.
  CHECK(recompute_groups(full(RecomputeMethod::block, 6), 4) == Groups{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  CHECK(recompute_groups(full(RecomputeMethod::uniform, 6), 4) == Groups{{0, 4}});
  const ParallelPlan block = full(RecomputeMethod::block, 2);
  CHECK(recomputes_layer(block, 1));
  CHECK_FALSE(recomputes_layer(block, 2));
  CHECK(recomputes_layer(full(RecomputeMethod::uniform, 2), 7));
  ParallelPlan none = block;
  none.recompute = Recompute::none;
  CHECK(recompute_groups(none, 4).empty());
  CHECK_FALSE(recomputes_layer(none, 0));
  CHECK_FALSE(block.recompute_layers_set() == full(RecomputeMethod::uniform, 1).recompute_layers_set());
}

TEST_CASE("memory: a recomputed layer keeps its input, a stored one everything, the group re-run holds its layers once") {
  const ModelSpec m = test::llama3_8b();
  CHECK(layer_activation_bytes(m, llama_plan(8, 1, 1, 8), false) == kStored);
  SUBCASE("block 2 of 4 layers a stage (PP 8, 1F1B: 8 micro-batches in flight on stage 0)") {
    const ParallelPlan p = with(llama_plan(8, 1, 1, 8), RecomputeMethod::block, 2);
    const StageRecompute rc = stage_recompute(m, p, 0);
    CHECK(rc.kept[0] == 2);
    CHECK(rc.stored[0] == 2);
    CHECK(rc.recomputed[0] == 2);
    const MemoryReport r = memory_per_gpu(m, p, memory_only());
    CHECK(r.peak_stage == 0);
    // (2 inputs + 2 stored layers) x 8 + one recomputed layer whole + 8 embeddings:
    // 1,275,068,416 x 8 + 603,979,776 + 134,479,872 = 10,939,006,976.
    CHECK(r.activation_bytes == (2 * kInput + 2 * kStored) * 8 + kStored + 8 * kEmbedding);
    CHECK(r.activation_bytes == 10'939'006'976.0);
  }
  SUBCASE("block 2 of 4 layers a chunk with interleaving (PP 4 x v 2: 5.5 micro-batches in flight on stage 0)") {
    const ParallelPlan p = with(llama_plan(4, 2, 2, 16), RecomputeMethod::block, 2);
    const StageRecompute rc = stage_recompute(m, p, 0);  // each of the two chunks: 2 recomputed, 2 stored
    CHECK(rc.recomputed[0] == 4);
    CHECK(rc.stored[0] == 4);
    const MemoryReport r = memory_per_gpu(m, p, memory_only());
    CHECK(r.peak_stage == 0);
    // 2,550,136,832 x 5.5 + 603,979,776 + 5.5 x 16,809,984 = 14,722,187,264.
    CHECK(r.activation_bytes == (4 * kInput + 4 * kStored) * 5.5 + kStored + 5.5 * kEmbedding);
    CHECK(r.activation_bytes == 14'722'187'264.0);
    // Without interleaving the stage's 8 layers are one chunk: 2 recomputed, 6 stored.
    const StageRecompute one = stage_recompute(m, with(llama_plan(4, 2, 1, 16), RecomputeMethod::block, 2), 0);
    CHECK(one.recomputed[0] == 2);
    CHECK(one.stored[0] == 6);
  }
  SUBCASE("uniform 2 (PP 8): two inputs a micro-batch, a group of two layers re-run at once") {
    const ParallelPlan p = with(llama_plan(8, 1, 1, 8), RecomputeMethod::uniform, 2);
    const MemoryReport r = memory_per_gpu(m, p, memory_only());
    // Stage 0: 2 x 33,554,432 x 8 + 2 x 603,979,776 + 8 x 16,809,984 = 1,879,310,336;
    // the last stage, one micro-batch in flight and the logits, holds more:
    // 2 x 33,554,432 + 2 x 603,979,776 + 2,168,455,168 = 3,443,523,584.
    CHECK(r.peak_stage == 7);
    CHECK(r.activation_bytes == 2 * kInput + 2 * kStored + kOutput);
    CHECK(r.activation_bytes == 3'443'523'584.0);
    // Uniform 1 keeps 4 inputs and re-runs one layer at a time: 4 x 33,554,432 + 603,979,776 + ...
    const MemoryReport one = memory_per_gpu(m, with(llama_plan(8, 1, 1, 8), RecomputeMethod::uniform, 1), memory_only());
    CHECK(one.activation_bytes == 4 * kInput + kStored + kOutput);
  }
}

TEST_CASE("time and FLOPs: block N adds N layers' forward a chunk, estimator and simulator alike") {
  const ModelSpec m = test::llama3_8b();
  Cluster c = test::dgx_a100(1);
  c.gpu.speed_spread = 0;
  const Topology topo(c);
  // DP 8, PP 1: one chunk of 32 layers, 2 micro-batches a rank; the gradient
  // reduction after the backward (not overlapped), the same in every plan.
  ParallelPlan none = llama_plan(1, 8, 1, 16);
  none.trainer.dp_overlap = false;
  const ParallelPlan block = with(none, RecomputeMethod::block, 5);
  const ParallelPlan every = with(none, RecomputeMethod::uniform, 1);
  const ParallelPlan groups = with(none, RecomputeMethod::uniform, 4);
  REQUIRE_FALSE(check_plan(block, m, c));
  // The hand figure: a layer's forward kernels at their op times, 5 layers x 2 micro-batches.
  double forward_ns = 0;
  for (const Op& op : transformer_layer_ops(m, none).forward) forward_ns += static_cast<double>(op_time_ns(c.gpu, op));
  const double five = 2 * 5 * forward_ns * 1e-9;
  const double base = estimate(m, topo, none).iteration_time_s;
  CHECK(estimate(m, topo, block).iteration_time_s - base == doctest::Approx(five).epsilon(1e-9));
  CHECK(estimate(m, topo, every).iteration_time_s - base == doctest::Approx(32.0 / 5 * five).epsilon(1e-9));
  // Uniform groups re-run every layer once, whatever N.
  CHECK(estimate(m, topo, groups).iteration_time_s == doctest::Approx(estimate(m, topo, every).iteration_time_s).epsilon(1e-12));
  const double sim_base = simulate(m, topo, none).iteration_time_s;
  CHECK(simulate(m, topo, block).iteration_time_s - sim_base == doctest::Approx(five).epsilon(1e-6));
  CHECK(simulate(m, topo, every).iteration_time_s - sim_base == doctest::Approx(32.0 / 5 * five).epsilon(1e-6));
  // Hardware FLOPs: 5 of 32 layers' forward again (layer_forward_flops for 16 sequences of 4096).
  const double layer = layer_forward_flops(m, 16, 4096);
  CHECK(hardware_flops_per_iteration(m, block) - model_flops_per_iteration(m, block) == doctest::Approx(5 * layer).epsilon(1e-12));
  CHECK(hardware_flops_per_iteration(m, every) - model_flops_per_iteration(m, every) == doctest::Approx(32 * layer).epsilon(1e-12));
  CHECK(hardware_flops_per_iteration(m, groups) == hardware_flops_per_iteration(m, every));
  const Estimate e = estimate(m, topo, block);
  CHECK(e.hfu == doctest::Approx(e.mfu * e.hardware_flops / e.model_flops).epsilon(1e-12));
}

TEST_CASE("what Megatron-Core refuses, and the trainers that cannot run it") {
  const ModelSpec m = test::llama3_8b();
  const Cluster c = test::dgx_a100(1);
  ParallelPlan p = with(llama_plan(1, 8, 1, 16), RecomputeMethod::block, 2);
  CHECK_FALSE(check_plan(p, m, c));
  p.recompute = Recompute::selective;  // arguments.py:1425-1428: no method with selective granularity
  auto r = check_plan(p, m, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::recompute_layers_need_full);
  CHECK(r->field == PlanField::recompute_method);
  p = with(llama_plan(1, 8, 1, 16), RecomputeMethod::uniform, 0);  // recompute.py's loop would never end
  r = check_plan(p, m, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::not_positive);
  CHECK(r->field == PlanField::recompute_num_layers);
  p = with(llama_plan(1, 8, 1, 16), RecomputeMethod::uniform, 2);
  p.trainer.preset = "megatron-deepspeed";
  p.grad_accum_fusion = false;  // as it runs
  r = check_plan(p, m, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::trainer_no_recompute_layers);
  CHECK(r->field == PlanField::recompute_num_layers);
  CHECK(parse_recompute_method("block", "cl", "--recompute-method") == RecomputeMethod::block);
  CHECK(test::input_error_message([] { (void)parse_recompute_method("blocks", "cl", "--recompute-method"); }) ==
        "cl: --recompute-method: unknown recompute method \"blocks\" (fix: use uniform or block)");
}

TEST_CASE("a plan file carries the method and layer count only when not uniform 1") {
  const ModelSpec m = test::llama3_8b();
  const Cluster c = test::dgx_a100(1);
  const Topology topo(c);
  const ParallelPlan block = with(llama_plan(2, 4, 1, 16), RecomputeMethod::block, 3);
  const nlohmann::json j = plan_to_json(m, c, estimate(m, topo, block));
  CHECK(j["parallel"]["recompute_method"] == "block");
  CHECK(j["parallel"]["recompute_num_layers"] == 3);
  const PlanFile pf = plan_file_from_json(j, "block.plan.json");
  CHECK(pf.plan.recompute_method == RecomputeMethod::block);
  CHECK(pf.plan.recompute_num_layers == 3);
  const nlohmann::json every = plan_to_json(m, c, estimate(m, topo, with(llama_plan(2, 4, 1, 16), RecomputeMethod::uniform, 1)));
  CHECK_FALSE(every["parallel"].contains("recompute_method"));
  CHECK_FALSE(every["parallel"].contains("recompute_num_layers"));
  nlohmann::json bad = j;
  bad["parallel"]["recompute"] = "selective";
  CHECK(test::input_error_message([&] { (void)plan_file_from_json(bad, "bad.plan.json"); }).find(
            "bad.plan.json: parallel.recompute_method: ") == 0);
}
