// The EP all-to-all overlap (--moe-ep-overlap, core/ep_overlap.hpp):
// Megatron-Core's combined 1F1B schedule, a layer pair worked by hand, the
// refusals Megatron-Core asserts, and the estimate and the simulation of a
// small Mixtral agreeing on what it hides.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cuboid/core/ep_overlap.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/schedule.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

EpSegment seg(double ns, double held = 0, double blocking = 0) { return EpSegment{ns, held > 0 ? held : ns, blocking}; }

// The small Mixtral on 2 DGX A100 nodes: TP 2 (SP) x PP 1 x DP 8, EP 8 x
// ETP 1 (one expert per rank), micro-batch 1, global batch 64: 8
// micro-batches, 7 of them paired.
ParallelPlan overlap_plan(bool on) {
  ParallelPlan p = ep4_plan();
  p.pp = 1;
  p.dp = 8;
  p.ep = 8;
  p.moe_ep_overlap = on;
  return p;
}

ModelSpec balanced_mixtral() {
  ModelSpec m = small_mixtral_model();
  m.moe.router_load_imbalance = 1.0;
  return m;
}

}  // namespace

TEST_CASE("a layer pair on two streams, worked by hand") {
  // The forward (micro-batch i + 1): attention 100 ns, dispatch 50, experts
  // 200, combine 50. The backward (micro-batch i): combine's gradient 50,
  // experts 400, dispatch's gradient 50, attention 200.
  EpPassTimes f, b;
  f.seg = {seg(100), seg(200), seg(0)};
  f.ex = {50, 50};
  b.seg = {seg(0), seg(400), seg(200)};
  b.ex = {50, 50};
  // comm: b.ex0 0-50, f.ex0 100-150 (after f's attention), b.ex1 500-550
  //       (after b's experts), f.ex1 700-750 (after f's experts);
  // comp: f.seg0 0-100, b.seg1 100-500, f.seg1 500-700, b.seg2 700-900
  //       (b.ex1 done at 550), f.seg2 900.
  const EpPairTime t = ep_pair_time(f, b);
  CHECK(t.serial_ns == 1100);  // 400 + 700
  CHECK(t.paired_ns == 900);
  CHECK(t.exchange_ns == 200);
  CHECK(t.exposed_ns == 0);
  CHECK(t.hidden_ns() == 200);
  CHECK(t.sm_cost_ns == 0);
  CHECK(t.saved_ns() == 200);

  // The backward's attention shorter than the forward's combine: b.seg2
  // 700-720, then f.seg2 (10 ns) waits for f.ex1 (700-750): 750-760. The
  // compute stream idles 720-750: 30 ns of the combine exposed.
  b.seg[2] = seg(20);
  f.seg[2] = seg(10);
  const EpPairTime u = ep_pair_time(f, b);
  CHECK(u.serial_ns == 930);
  CHECK(u.paired_ns == 760);
  CHECK(u.exposed_ns == 30);
  CHECK(u.hidden_ns() == 170);
  CHECK(u.saved_ns() == 170);
}

TEST_CASE("the weight gradients delayed: the dispatch's gradient runs under the experts' weight gradient") {
  // The forward as above. The backward: combine's gradient 50, the experts'
  // data gradient 200 and weight gradient 200, the dispatch's gradient 300,
  // the attention's data gradient 100 and weight gradient 100.
  EpPassTimes f, b;
  f.seg = {seg(100), seg(200), seg(0)};
  f.ex = {50, 50};
  b.seg = {seg(0), seg(200), seg(100), seg(200), seg(100)};  // seg0, seg1, seg2, seg1w, seg2w
  b.ex = {50, 300};
  CHECK(ep_seg_index(EpNode::seg1w) == 3);
  CHECK(ep_seg_index(EpNode::seg2w) == 4);
  CHECK(ep_waits_for(EpNode::ex1) == EpNode::seg1);
  CHECK(ep_waits_for(EpNode::seg2w) == EpNode::seg2);
  // Delayed: comp f.seg0 0-100, b.seg1 100-300, b.seg1w 300-500, f.seg1
  // 500-700, b.seg2 700-800 (b.ex1 300-600, issued after the experts' data
  // gradient), b.seg2w 800-900, f.seg2 at 900 (f.ex1 700-750).
  const EpPairTime d = ep_pair_time(f, b, true);
  CHECK(d.serial_ns == 1350);  // 400 + 950
  CHECK(d.paired_ns == 900);
  CHECK(d.exposed_ns == 0);
  CHECK(d.hidden_ns() == 450);
  // Not delayed (each weight gradient inside its backward: b.seg1 400,
  // b.seg2 200): b.ex1 waits for all of b.seg1, 500-800; f.seg1 500-700;
  // b.seg2 waits 700-800, then 800-1000: 100 ns of the dispatch's gradient
  // exposed.
  EpPassTimes merged = b;
  merged.seg = {seg(0), seg(400), seg(200)};
  const EpPairTime u = ep_pair_time(f, merged, false);
  CHECK(u.serial_ns == 1350);
  CHECK(u.paired_ns == 1000);
  CHECK(u.exposed_ns == 100);
  CHECK(u.hidden_ns() == 350);
}

TEST_CASE("the exchange's SMs slow the compute under it") {
  // The forward's attention, 100 ns alone, takes 200 ns while an exchange
  // holds its SMs; the backward's combine gradient (60 ns) runs beside it:
  // 0-60 at half pace (30 ns of its work), the other 70 ns alone: ends at 130.
  EpPassTimes f, b;
  f.seg = {seg(100, 200), seg(0), seg(0)};
  b.ex = {60, 0};
  const EpPairTime t = ep_pair_time(f, b);
  CHECK(t.paired_ns == doctest::Approx(130));
  CHECK(t.serial_ns == 160);
  CHECK(t.hidden_ns() == doctest::Approx(60));
  CHECK(t.sm_cost_ns == doctest::Approx(30));
  CHECK(t.saved_ns() == doctest::Approx(30));
  // TP collectives between the kernels are not slowed: 20 ns more of them
  // start after the kernels, when the exchange is over.
  f.seg[0].blocking_ns = 20;
  CHECK(ep_pair_time(f, b).paired_ns == doctest::Approx(150));
}

TEST_CASE("a pass cut at its EP exchanges") {
  // Forward: attention, the counts' exchange, the host sync, the tokens',
  // the probabilities', the experts, the combine, the residual.
  const std::vector<bool> fwd{false, true, false, true, true, false, true, false};
  const EpSplit f = ep_split(fwd.size(), true, [&](std::size_t i) { return fwd[i]; });
  CHECK(f.has_exchanges);
  CHECK(f.ex0_begin == 1);
  CHECK(f.ex0_end == 5);
  CHECK(f.ex1_begin == 6);
  CHECK(f.ex1_end == 7);
  CHECK(ep_node(f, 0) == EpNode::seg0);
  CHECK(ep_node(f, 2) == EpNode::ex0);  // the host sync between the dispatch's exchanges
  CHECK(ep_node(f, 5) == EpNode::seg1);
  CHECK(ep_node(f, 7) == EpNode::seg2);
  // Backward: the combine's gradient first alone, then the dispatch's two.
  const std::vector<bool> bwd{false, true, false, true, true, false};
  const EpSplit b = ep_split(bwd.size(), false, [&](std::size_t i) { return bwd[i]; });
  CHECK(b.ex0_begin == 1);
  CHECK(b.ex0_end == 2);
  CHECK(b.ex1_begin == 3);
  CHECK(b.ex1_end == 5);
  // A dense layer: all of it seg0.
  const EpSplit d = ep_split(3, true, [](std::size_t) { return false; });
  CHECK_FALSE(d.has_exchanges);
  CHECK(ep_node(d, 2) == EpNode::seg0);
  CHECK(ep_overlap_pairs(8) == 7);
  CHECK(ep_overlap_pairs(1) == 0);
}

TEST_CASE("the EP overlap is refused where Megatron-Core asserts") {
  const ModelSpec m = small_mixtral_model();
  const Cluster c = dgx_a100(2);
  ParallelPlan p = overlap_plan(true);
  CHECK_FALSE(check_plan(p, m, c).has_value());
  const auto why = [&](const ParallelPlan& q) {
    const auto r = check_plan(q, m, c);
    REQUIRE(r.has_value());
    CHECK(r->field == PlanField::moe_ep_overlap);
    return describe(*r, m, c);
  };
  ParallelPlan q = p;
  q.moe_dispatcher = MoeDispatcher::allgather;
  CHECK(why(q) == "the EP all-to-all overlap (--overlap-moe-expert-parallel-comm) runs with the alltoall or flex "
                  "token dispatcher, not allgather (Megatron-Core asserts it: "
                  "megatron/core/transformer/transformer_config.py:3016@d98e8a64)");
  q = p;
  q.ep = 1;
  q.etp = 1;
  CHECK(why(q).find("needs expert parallelism, EP > 1") != std::string::npos);
  q = p;
  q.recompute = Recompute::full;
  CHECK(why(q).find("full recomputation") != std::string::npos);
  q = p;
  q.recompute = Recompute::selective;
  q.recompute_modules = static_cast<std::uint8_t>(RecomputeModule::moe);
  CHECK(why(q) == "the EP all-to-all overlap (--overlap-moe-expert-parallel-comm) cannot run with the MoE layer recomputed "
                  "(--recompute-modules moe) (Megatron-Core asserts it: "
                  "megatron/core/transformer/transformer_config.py:3030@d98e8a64)");
  q = p;
  q.pp = 2;
  q.dp = 4;
  q.ep = 4;
  CHECK(why(q).find("needs the interleaved schedule (virtual stages)") != std::string::npos);
  CHECK(why(q).find("transformer_config.py:3007@d98e8a64") != std::string::npos);
  // With virtual stages it runs (the interleaved schedule's steady state combined).
  q.schedule = Schedule::interleaved;
  q.virtual_stages = 2;
  CHECK_FALSE(check_plan(q, m, c).has_value());
  ModelSpec dense = m;
  dense.moe = MoeSpec{};
  q = overlap_plan(true);
  q.ep = 1;
  q.etp = 0;
  const auto r = check_plan(q, dense, c);
  REQUIRE(r.has_value());
  CHECK(describe(*r, dense, c).find("needs a mixture-of-experts model") != std::string::npos);
}

TEST_CASE("the combined schedule holds one layer more than the plain one") {
  // combined_1f1b.py at d98e8a64: micro-batch i + 1's forward layer k runs
  // beside micro-batch i's backward of its last remaining layer, which is
  // freed after the pair: 1 micro-batch + 1 layer at the peak.
  const ModelSpec m = small_mixtral_model();
  CHECK(in_flight_micro_batches(overlap_plan(false), 0) == 1);
  CHECK(in_flight_micro_batches(overlap_plan(true), 0) == 1);
  const double layer = layer_activation_bytes(m, overlap_plan(true), true);
  CHECK(layer > 0);
  CHECK(memory_per_gpu(m, overlap_plan(true), a100()).activation_bytes ==
        doctest::Approx(memory_per_gpu(m, overlap_plan(false), a100()).activation_bytes + layer));
  // One micro-batch: its forward and its backward run alone, nothing paired.
  ParallelPlan one = overlap_plan(true), one_off = overlap_plan(false);
  one.global_batch = one_off.global_batch = one.micro_batch * one.dp;
  REQUIRE(one.num_micro_batches() == 1);
  CHECK(memory_per_gpu(m, one, a100()).activation_bytes == memory_per_gpu(m, one_off, a100()).activation_bytes);
}

TEST_CASE("estimate and simulation agree on what the overlap saves, the weight gradients delayed or not") {
  const ModelSpec m = balanced_mixtral();
  const Topology topo(dgx_a100(2));
  for (const bool delayed : {true, false})
  for (MoeDispatcher d : {MoeDispatcher::alltoall, MoeDispatcher::flex}) {
    CAPTURE(to_string(d));
    CAPTURE(delayed);
    ParallelPlan off = overlap_plan(false), on = overlap_plan(true);
    off.moe_dispatcher = on.moe_dispatcher = d;
    on.moe_delay_wgrad = delayed;
    const Estimate e_off = estimate(m, topo, off), e_on = estimate(m, topo, on);
    CHECK(e_off.breakdown.ep_hidden_s == 0);
    CHECK(e_on.breakdown.ep_hidden_s > 0);
    // The saving is what the exchanges hide less what their SMs cost.
    CHECK(e_off.iteration_time_s - e_on.iteration_time_s ==
          doctest::Approx(e_on.breakdown.ep_hidden_s - e_on.breakdown.ep_overlap_sm_s));
    // No more than the 7 paired micro-batches' exchanges (and the host sync
    // between the dispatch's exchanges, a few bytes' kernel: the 1 %).
    CHECK(e_on.breakdown.ep_hidden_s <= 7.0 / 8.0 * e_off.breakdown.ep_comm_s * 1.01);
    const Estimate s_off = simulate(m, topo, off), s_on = simulate(m, topo, on);
    const double est_saved = e_off.iteration_time_s - e_on.iteration_time_s;
    const double sim_saved = s_off.iteration_time_s - s_on.iteration_time_s;
    MESSAGE("estimate saves " << est_saved << " s, simulation " << sim_saved << " s");
    CHECK(sim_saved > 0);
    CHECK(sim_saved == doctest::Approx(est_saved).epsilon(0.25));
  }
}

namespace {

// The small Mixtral (4 MoE layers) on 2 DGX A100 nodes: TP 2 (SP) x PP 2 x
// DP 4, EP 4 x ETP 1, interleaved with 2 virtual stages (one layer per model
// chunk), micro-batch 1, global batch 16: 4 micro-batches.
ParallelPlan interleaved_plan(bool on) {
  ParallelPlan p = ep4_plan();
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 2;
  p.global_batch = 16;
  p.moe_ep_overlap = on;
  return p;
}

}  // namespace

TEST_CASE("PP 2 x v 2, 4 micro-batches: the interleaved schedule's combined steps, by hand") {
  // 8 chunk steps per stage. Warm-up: stage 0 (2 - 0 - 1) * 2 + (2 - 1) * 2
  // = 4 steps, stage 1 2; with the overlap one more each (schedules.py:969).
  CHECK(warmup_steps(Schedule::interleaved, 2, 0, 4, 2) == 4);
  CHECK(warmup_steps(Schedule::interleaved, 2, 0, 4, 2, true) == 5);
  CHECK(warmup_steps(Schedule::interleaved, 2, 1, 4, 2, true) == 3);
  CHECK(warmup_steps(Schedule::one_f_one_b, 2, 0, 4, 1, true) == 1);  // only the interleaved schedule's
  CHECK(ep_overlap_steps(2, 0, 4, 2) == 3);
  CHECK(ep_overlap_steps(2, 1, 4, 2) == 5);
  CHECK(ep_overlap_steps(1, 0, 8, 1) == 7);  // PP 1: m - 1
  // Stage 0: F0.0 F1.0 F0.1 F1.1 F2.0, then F3.0 + B0.1, F2.1 + B1.1,
  // F3.1 + B0.0, then B1.0 B2.1 B3.1 B2.0 B3.0.
  const auto order = pipeline_order(Schedule::interleaved, 2, 4, 2, true);
  const StageOrder stage0{{Direction::forward, 0, 0},  {Direction::forward, 1, 0},  {Direction::forward, 0, 1},
                          {Direction::forward, 1, 1},  {Direction::forward, 2, 0},  {Direction::forward, 3, 0},
                          {Direction::backward, 0, 1}, {Direction::forward, 2, 1},  {Direction::backward, 1, 1},
                          {Direction::forward, 3, 1},  {Direction::backward, 0, 0}, {Direction::backward, 1, 0},
                          {Direction::backward, 2, 1}, {Direction::backward, 3, 1}, {Direction::backward, 2, 0},
                          {Direction::backward, 3, 0}};
  CHECK(order[0] == stage0);
  // By the chunks they pair, [forward chunk * 2 + backward chunk]: stage 0
  // (0, 1), (1, 1), (1, 0); stage 1 (forward steps 3..7 on chunks 1 0 0 1 1,
  // backward steps 0..4 on chunks 1 1 0 0 1) (1, 1) twice, the others once.
  CHECK(ep_overlap_chunk_steps(2, 0, 4, 2) == std::vector<int>{0, 1, 1, 1});
  CHECK(ep_overlap_chunk_steps(2, 1, 4, 2) == std::vector<int>{1, 1, 1, 2});
  CHECK(ep_overlap_chunk_steps(1, 0, 8, 1) == std::vector<int>{7});
}

TEST_CASE("PP 2 x v 2: the estimate hides the critical stage's layer pairs, the simulation agrees") {
  const ModelSpec m = balanced_mixtral();
  const Topology topo(dgx_a100(2));
  const ParallelPlan on = interleaved_plan(true), off = interleaved_plan(false);
  CHECK_FALSE(check_plan(on, m, topo.cluster()).has_value());
  // The same layers' passes with PP 1 (TP 2, EP 4 on the same node's GPUs):
  // 2 micro-batches, one combined step of 4 layer pairs.
  ParallelPlan pp1 = on;
  pp1.pp = 1;
  pp1.dp = 8;
  pp1.schedule = Schedule::one_f_one_b;
  pp1.virtual_stages = 1;
  CHECK(pp1.num_micro_batches() == 2);
  const Estimate e1 = estimate(m, topo, pp1);
  REQUIRE(e1.breakdown.ep_hidden_s > 0);
  const double per_pair = e1.breakdown.ep_hidden_s / 4;
  // The critical stage is the last (the LM head); its 5 combined steps pair
  // one layer each: 5 layer pairs hidden.
  CHECK(folded_step(m, topo, on).critical_stage == 1);
  const Estimate e_on = estimate(m, topo, on), e_off = estimate(m, topo, off);
  CHECK(e_off.breakdown.ep_hidden_s == 0);
  CHECK(e_on.breakdown.ep_hidden_s == doctest::Approx(5 * per_pair));
  CHECK(e_off.iteration_time_s - e_on.iteration_time_s ==
        doctest::Approx(e_on.breakdown.ep_hidden_s - e_on.breakdown.ep_overlap_sm_s));
  // The simulation plays the same schedule, both stages with their PP
  // messages; the last stage's 5 steps set the pace.
  const Estimate s_on = simulate(m, topo, on), s_off = simulate(m, topo, off);
  const double est_saved = e_off.iteration_time_s - e_on.iteration_time_s;
  const double sim_saved = s_off.iteration_time_s - s_on.iteration_time_s;
  MESSAGE("estimate saves " << est_saved << " s, simulation " << sim_saved << " s");
  CHECK(sim_saved > 0);
  CHECK(sim_saved == doctest::Approx(est_saved).epsilon(0.25));
}

TEST_CASE("the interleaved schedule with the overlap holds one layer more") {
  // The extra warm-up forward (schedules.py:966-970) takes the place of the
  // plain schedule's forward before its first backward; the combined step
  // then frees the backward chunk's layers as the forward adds its own:
  // pp + (pp - 1 - 2r) / v chunks as without it (stage 0 2.5, stage 1 1.5),
  // and one layer.
  const ModelSpec m = small_mixtral_model();
  CHECK(in_flight_micro_batches(interleaved_plan(false), 0) == 2.5);
  CHECK(in_flight_micro_batches(interleaved_plan(true), 0) == 2.5);
  CHECK(in_flight_micro_batches(interleaved_plan(false), 1) == 1.5);
  CHECK(in_flight_micro_batches(interleaved_plan(true), 1) == 1.5);
  const double layer = layer_activation_bytes(m, interleaved_plan(true), true);
  CHECK(memory_per_gpu(m, interleaved_plan(true), a100()).activation_bytes ==
        doctest::Approx(memory_per_gpu(m, interleaved_plan(false), a100()).activation_bytes + layer));
}

TEST_CASE("a combined step is one span of the timeline and the trace, its exchanges on their own row") {
  const ModelSpec m = balanced_mixtral();
  const Topology topo(dgx_a100(2));
  sim::SimOptions opts;
  opts.timeline = true;
  const auto path = std::filesystem::temp_directory_path() / "cuboid_test_ep_overlap_trace.json";
  opts.trace_path = path;
  // The trace writer refuses spans that overlap without nesting: the two
  // passes of a pair, or the a2a stream's exchanges beside the TP stream's
  // collectives on one row, would throw.
  for (const ParallelPlan& p : {overlap_plan(true), interleaved_plan(true)}) {
    const sim::SimResult r = sim::run_simulation(m, topo, p, opts);
    int combined = 0, a2a = 0;
    for (const sim::TimelineBlock& b : r.timeline.blocks) {
      if (b.row == sim::TimelineRow::compute && b.name.find('+') != std::string::npos) ++combined;
      if (b.row == sim::TimelineRow::ep_a2a) ++a2a;
    }
    // PP 1: 7 pairs; PP 2 x v 2: 3 + 5 on the two stages.
    CHECK(combined == (p.pp == 1 ? 7 : 8));
    CHECK(a2a > 0);
  }
  CHECK(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

TEST_CASE("Qwen3-235B-A22B as Megatron-Bridge's H100 recipe runs it: PP 8 x v 4 with the overlap") {
  // perf_recipes/qwen/h100/qwen3_moe.py:136-190 at 067f987d: TP 2, PP 8, v 4,
  // EP 32 x ETP 1, alltoall, forced balance, no recomputation, global batch
  // 8192 x 4,096 tokens, micro-batch 1, the embedding and the loss counted in
  // the split (recipes/qwen/h100/qwen3_moe.py:261-262); 256 H100: DP 16.
  ModelSpec m = load_model(source_root() / "tests/data/hf/qwen3-235b-a22b-config.json");
  m.moe.router_load_imbalance = 1.0;
  const Topology topo(load_cluster(source_root() / "topologies/dgx-h100.json", 32));
  ParallelPlan p;
  p.tp = 2;
  p.pp = 8;
  p.dp = 16;
  p.ep = 32;
  p.etp = 1;
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 4;
  p.micro_batch = 1;
  p.global_batch = 8192;
  p.seq_length = 4096;
  p.sequence_parallel = true;
  p.embedding_in_split = true;
  p.loss_in_split = true;
  p.recompute = Recompute::none;
  p.zero_stage = 1;
  p.moe_ep_overlap = true;
  REQUIRE_FALSE(check_plan(p, m, topo.cluster()).has_value());
  // 512 micro-batches, 2,048 chunk steps per stage; warm-up 7 * 2 + 3 * 8 + 1
  // = 39 on stage 0, 3 * 8 + 1 = 25 on the last.
  CHECK(ep_overlap_steps(8, 0, 512, 4) == 2009);
  CHECK(ep_overlap_steps(8, 7, 512, 4) == 2023);
  ParallelPlan off = p;
  off.moe_ep_overlap = false;
  const Estimate e_on = estimate(m, topo, p), e_off = estimate(m, topo, off);
  CHECK(e_on.breakdown.ep_hidden_s > 0);
  CHECK(e_off.iteration_time_s - e_on.iteration_time_s ==
        doctest::Approx(e_on.breakdown.ep_hidden_s - e_on.breakdown.ep_overlap_sm_s));
  const Estimate s_on = simulate(m, topo, p);
  MESSAGE("simulated " << s_on.iteration_time_s << " s, estimated " << e_on.iteration_time_s << " s (off: "
                       << e_off.iteration_time_s << " s)");
  CHECK(s_on.iteration_time_s == doctest::Approx(e_on.iteration_time_s).epsilon(0.05));
  CHECK(s_on.iteration_time_s < e_off.iteration_time_s);
}
