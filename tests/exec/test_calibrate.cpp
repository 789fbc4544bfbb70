// cuboid calibrate's pure parts: what it measures for a plan (GEMM shapes,
// grid, kernel scales, size ladder, group shapes), the nccl-tests row format,
// and the cross-rank combination of results.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuboid/calibrate/calibrate.hpp"
#include "cuboid/calibrate/collective_sweep.hpp"
#include "cuboid/calibrate/core_share.hpp"
#include "cuboid/calibrate/gemm_sweep.hpp"
#include "cuboid/calibrate/kernel_sweep.hpp"
#include "cuboid/calibrate/nccl_table.hpp"
#include "cuboid/calibrate/results.hpp"
#include "cuboid/calibrate/sweep_plan.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/exec/mpi_comm.hpp"
#include "small_gpt.hpp"

using namespace cuboid;
using namespace cuboid::calibrate;

namespace {

ModelSpec tiny() {
  ModelSpec m;
  m.name = "tiny";
  m.num_layers = 4;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.num_kv_heads = 8;
  m.head_dim = 32;
  m.ffn_hidden_size = 1024;
  m.vocab_size = 1024;
  m.seq_length = 128;
  return m;
}

ParallelPlan tp2() {
  ParallelPlan p;
  p.tp = 2;
  p.micro_batch = 1;
  p.global_batch = 4;
  p.seq_length = 128;
  p.sequence_parallel = true;
  p.flash_attention = false;
  return p;
}

bool has(const std::vector<GemmProblem>& v, GemmProblem p) { return std::find(v.begin(), v.end(), p) != v.end(); }

}  // namespace

TEST_CASE("the GEMM shapes of a TP 2 plan are the executor's, forward and backward, deduplicated") {
  const std::vector<GemmProblem> s = plan_gemm_problems(tiny(), tp2());
  // T = 128 tokens, h = 256, QKV columns 3 * 256 / 2, FFN 1024 / 2, heads 8 / 2.
  CHECK(has(s, {128, 384, 256, 1}));   // qkv
  CHECK(has(s, {128, 256, 384, 1}));   // qkv_dgrad
  CHECK(has(s, {256, 384, 128, 1}));   // qkv_wgrad
  CHECK(has(s, {128, 512, 256, 1}));   // fc1
  CHECK(has(s, {512, 256, 128, 1}));   // fc2_wgrad
  CHECK(has(s, {128, 128, 32, 4}));    // attn_qk (the plan's unfused core, as the executor runs it)
  CHECK(has(s, {128, 512, 256, 1}));   // logits: vocab 1024 / 2 (same shape as fc1)
  CHECK(std::is_sorted(s.begin(), s.end()));
  CHECK(std::adjacent_find(s.begin(), s.end()) == s.end());
  // With the fused core the attention GEMMs are not swept apart: the kernel
  // sweep times the attention blocks inside the layer.
  ParallelPlan flash = tp2();
  flash.flash_attention = true;
  const std::vector<GemmProblem> f = plan_gemm_problems(tiny(), flash);
  CHECK_FALSE(has(f, {128, 128, 32, 4}));
  CHECK(has(f, {128, 384, 256, 1}));
}

TEST_CASE("the step's footprint per rank: weights and fp32 gradients, activations, then Adam's moments") {
  // Tiny on TP 2 with SP: per rank the 4 layers' 4h^2 + 2h*ffn weights / 2
  // and their norms (4h each, whole), the vocabulary-parallel embedding and
  // head (vocab * h / 2 each): memory_per_gpu's count, pinned by hand.
  const ModelSpec m = tiny();
  const ParallelPlan p = tp2();
  const GpuProfile gpu;
  const MemoryReport mem = memory_per_gpu(m, p, gpu);
  const double layer = (4.0 * 256 * 256 + 2.0 * 256 * 1024) / 2;
  CHECK(mem.parameters == doctest::Approx(4 * layer + 2 * 1024 * 256 / 2.0).epsilon(0.01));
  // f32 (the CPU backend): 4-byte weights + 4-byte gradients per parameter,
  // the activations (counted in 2-byte elements) doubled.
  CHECK(step_working_set_bytes(m, p, gpu, 4) == doctest::Approx(mem.parameters * 8 + mem.activation_bytes * 2));
  // bf16 (CUDA): 2-byte weights, fp32 gradients, activations as counted.
  CHECK(step_working_set_bytes(m, p, gpu, 2) == doctest::Approx(mem.parameters * 6 + mem.activation_bytes));
  CHECK(step_memory_bytes(m, p, gpu, 4) == doctest::Approx(step_working_set_bytes(m, p, gpu, 4) + mem.parameters * 8));
  // The sweep's pools: the largest job's, between 1 MiB and 512 MiB (64 MiB --quick).
  const std::vector<CalibrationJob> jobs{{m, p, "tp2"}};
  const StepFootprint f = step_footprint(jobs, gpu, 4, 1, false);
  CHECK(f.working_set == static_cast<std::size_t>(std::ceil(step_working_set_bytes(m, p, gpu, 4))));
  CHECK(f.whole_step == static_cast<std::size_t>(std::ceil(step_memory_bytes(m, p, gpu, 4))));
  ParallelPlan dp1 = p;
  dp1.tp = 1;
  const std::vector<CalibrationJob> both{{m, p, "tp2"}, {m, dp1, "tp1"}};
  CHECK(step_footprint(both, gpu, 4, 1, false).working_set ==
        static_cast<std::size_t>(std::ceil(step_working_set_bytes(m, dp1, gpu, 4))));
  ModelSpec big = m;
  big.num_layers = 4096;
  big.hidden_size = 4096;
  big.ffn_hidden_size = 16384;
  big.num_attention_heads = 32;
  big.num_kv_heads = 32;
  big.head_dim = 128;
  const std::vector<CalibrationJob> large{{big, p, "big"}};
  CHECK(step_footprint(large, gpu, 4, 1, false).working_set == std::size_t{512} << 20);
  CHECK(step_footprint(large, gpu, 4, 1, true).whole_step == std::size_t{64} << 20);
  // Two ranks per core: the core's caches hold both ranks' working sets.
  CHECK(step_footprint(jobs, gpu, 4, 2, false).working_set ==
        static_cast<std::size_t>(std::ceil(2 * step_working_set_bytes(m, p, gpu, 4))));
  ParallelPlan short_seq = p;
  short_seq.seq_length = 8;
  const std::vector<CalibrationJob> tiny_job{{exec::model::small_gpt(1), short_seq, "small"}};
  CHECK(step_footprint(tiny_job, gpu, 4, 1, false).working_set == std::size_t{1} << 20);
}

TEST_CASE("each plan's own footprint: plans of different working sets get their own operand pools") {
  const ModelSpec m = tiny();
  const ParallelPlan p = tp2();
  ParallelPlan dp2 = p;
  dp2.tp = 1;
  dp2.dp = 2;
  const GpuProfile gpu;
  const std::vector<CalibrationJob> both{{m, p, "tp2"}, {m, dp2, "dp2"}};
  const std::vector<StepFootprint> own = job_footprints(both, gpu, 4, 1, false);
  REQUIRE(own.size() == 2);
  CHECK(own[0].working_set == operand_pool_bytes(step_working_set_bytes(m, p, gpu, 4), 1));
  CHECK(own[1].working_set == operand_pool_bytes(step_working_set_bytes(m, dp2, gpu, 4), 1));
  // TP 2 holds half the layers' weights: its pool is the smaller one, and
  // the set's footprint (the collectives' cold state) is the larger.
  CHECK(own[0].working_set < own[1].working_set);
  CHECK(step_footprint(both, gpu, 4, 1, false).working_set == own[1].working_set);
  CHECK(own[1].whole_step == operand_pool_bytes(step_memory_bytes(m, dp2, gpu, 4), 1));
  // The clamp: 1 MiB to 512 MiB (64 MiB quick), times the ranks per core.
  CHECK(operand_pool_bytes(10, 1) == std::size_t{1} << 20);
  CHECK(operand_pool_bytes(1e12, 1) == std::size_t{512} << 20);
  CHECK(operand_pool_bytes(1e12, 1, true) == std::size_t{64} << 20);
  CHECK(operand_pool_bytes(3e6, 2) == 6000000);
}

TEST_CASE("the GEMM grid brackets every shape by x1/2 and x2 in each dimension") {
  const std::vector<GemmProblem> g = gemm_grid({{128, 384, 256, 1}, {128, 128, 32, 4}}, false);
  CHECK(has(g, {64, 192, 128, 1}));
  CHECK(has(g, {256, 768, 512, 1}));
  CHECK(has(g, {128, 768, 256, 1}));
  CHECK(has(g, {64, 128, 32, 2}));
  CHECK(has(g, {128, 128, 32, 8}));
  CHECK_FALSE(has(g, {128, 384, 256, 2}));  // batch 1 stays 1
  CHECK(g.size() == 27 + 81);
  const std::vector<GemmProblem> q = gemm_grid({{1, 4, 4, 1}}, false);
  CHECK(std::all_of(q.begin(), q.end(), [](const GemmProblem& p) { return p.m >= 1; }));
  CHECK(gemm_grid({{128, 384, 256, 1}}, true).size() == 2);
}

TEST_CASE("the collective size ladder runs from 1 KiB to the cap and ends on it") {
  const auto l = size_ladder(1024, std::int64_t{256} << 20, 2, "--max-size");
  CHECK(l.size() == 19);
  CHECK(l.front() == 1024);
  CHECK(l.back() == std::int64_t{256} << 20);
  CHECK(size_ladder(1024, 5000, 4, "--max-size") == std::vector<std::int64_t>{1024, 4096, 5000});
  CHECK_THROWS_WITH_AS(size_ladder(1024, 512, 2, "--max-size"),
                       "command line: --max-size: 512 bytes is below the smallest size measured (1024 bytes) "
                       "(fix: give at least 1024)",
                       InputError);
}

TEST_CASE("kernel sizes scale the tokens x1/4 .. x4, keeping SP's sequence a multiple of TP") {
  const auto k = kernel_scales(tp2(), 128, false);
  REQUIRE(k.size() == 5);
  CHECK(k[0].seq_length == 32);
  CHECK(k[2].seq_length == 128);
  CHECK(k[4].micro_batch == 4);
  ParallelPlan odd = tp2();
  odd.tp = 4;
  const auto q = kernel_scales(odd, 6, true);  // 6/2 = 3 -> 0 -> clamped to 4
  CHECK(q.front().seq_length == 4);
  CHECK(std::all_of(q.begin(), q.end(), [](const KernelScale& s) { return s.seq_length % 4 == 0; }));
}

TEST_CASE("group shapes come from the rank mapping: TP inside a node, PP across nodes") {
  ParallelPlan p = tp2();
  p.pp = 2;
  const auto g = plan_group_shapes(p, 2);  // 2 ranks per node: TP fills a node, the stages are on two nodes
  REQUIRE(g.size() == 2);
  CHECK(g[0] == GroupShape{Group::tp, 2, "intra_node"});
  CHECK(g[1] == GroupShape{Group::pp, 2, "inter_node"});
  CHECK(plan_group_shapes(p, 4)[1].tier == "intra_node");
  // An MoE plan's EP group (ETP 1 folds TP 2 x DP 2 into EP 4 across the two nodes).
  ParallelPlan e;
  e.tp = 2;
  e.dp = 2;
  e.ep = 4;
  e.etp = 1;
  const auto ge = plan_group_shapes(e, 2);
  REQUIRE(ge.size() == 3);
  CHECK(ge[2] == GroupShape{Group::ep, 4, "inter_node"});
  // flex: the EP group's legs too, 2 ranks on each of 2 nodes (both legs of 2).
  ParallelPlan fe = e;
  fe.moe_dispatcher = MoeDispatcher::flex;
  const auto gf = plan_group_shapes(fe, 2);
  REQUIRE(gf.size() == ge.size() + 2);
  CHECK(gf[ge.size()] == GroupShape{Group::ep, 2, "intra_node", FlexLeg::intra});
  CHECK(gf[ge.size() + 1] == GroupShape{Group::ep, 2, "inter_node", FlexLeg::rail});
  // On one node the exchange has no inter-node leg: nothing more to measure.
  CHECK(plan_group_shapes(fe, 4).size() == plan_group_shapes(e, 4).size());
}

TEST_CASE("nccl-tests rows: algbw = size / time, busbw = algbw x bus factor") {
  NcclRow r{1048576, 262144, "float", "sum", -1, 500.0, 1.0, 0};  // 1 MiB in 500 us
  CHECK(format_nccl_row(r) == "     1048576        262144     float     sum      -1    500.0    2.10    2.10       0\n");
  r.bus_factor = 1.5;
  r.time_us = 12.5;
  r.wrong = 3;
  CHECK(format_nccl_row(r) == "     1048576        262144     float     sum      -1    12.50   83.89  125.83       3\n");
  r.time_us = 123456;
  CHECK(format_nccl_row(r).find("  123456  ") != std::string::npos);
  CHECK(nccl_table_header().rfind("#       size         count      type   redop    root     time   algbw   busbw", 0) == 0);
}

TEST_CASE("collective counts round to the group like nccl-tests") {
  CHECK(collective_count(Collective::all_reduce, 1024, 4, 3).total == 256);
  const CollectiveCount rs = collective_count(Collective::reduce_scatter, 1024, 4, 3);
  CHECK(rs.total == 255);
  CHECK(rs.column == 85);
  CHECK(collective_count(Collective::all_gather, 4, 4, 8).total == 8);  // at least one element per rank
  // alltoall_perf: the whole buffer, a multiple of the group; the count column is all of it.
  const CollectiveCount a2a = collective_count(Collective::all_to_all, 1024, 4, 3);
  CHECK(a2a.total == 255);
  CHECK(a2a.column == 255);
}

TEST_CASE("ranks combine: the slowest rank for GEMMs, kernels and collectives, wrong counts add up") {
  RankResults a, b, c;
  a.rank = 0, b.rank = 1, c.rank = 2;
  a.gemms = {{8, 8, 8, 1, 100}};
  b.gemms = {{8, 8, 8, 1, 300}};
  c.gemms = {{8, 8, 8, 1, 200}};
  a.kernels = {{"act", 1000, 10}, {"act", 2000, 20}};
  b.kernels = {{"act", 1000, 30}};
  const CollectiveKey key{Collective::all_reduce, "intra_node", 3};
  a.collectives = {{key, "tp", {Collective::all_reduce, 1024, 256, 5000, 0}}};
  b.collectives = {{key, "tp", {Collective::all_reduce, 1024, 256, 7000, 2}}};
  c.collectives = {{key, "tp", {Collective::all_reduce, 1024, 256, 6000, 1}}};
  std::vector<RankResults> all;
  for (const RankResults& r : {a, b, c}) all.push_back(rank_results_from_json(to_json(r)));  // JSON round trip
  const Combined m = combine(all);
  REQUIRE(m.gemms.size() == 1);
  CHECK(m.gemms[0].time_ns == 300);
  REQUIRE(m.kernels.at("act").size() == 2);
  CHECK(m.kernels.at("act")[0].time_ns == 30);  // the slower of 10 and 30
  CHECK(m.kernels.at("act")[1].bytes == 2000);
  const CollectiveTable& t = m.collectives.at(key);
  REQUIRE(t.rows.size() == 1);
  CHECK(t.rows[0].time_ns == 7000);
  CHECK(t.rows[0].wrong == 3);
  CHECK(m.wrong == 3);
  CHECK(t.group == "tp");
}

TEST_CASE("ranks combine each operand pool apart: the slowest rank per pool, the pools in the ranks' order") {
  RankResults a, b;
  a.rank = 0, b.rank = 1;
  a.gemms = {{8, 8, 8, 1, 100}};
  b.gemms = {{8, 8, 8, 1, 150}};
  a.other_pools = {{std::size_t{4} << 20, {{8, 8, 8, 1, 40}}, {{"act", 1000, 5}}}};
  b.other_pools = {{std::size_t{4} << 20, {{8, 8, 8, 1, 60}}, {{"act", 1000, 7}}}};
  std::vector<RankResults> all;
  for (const RankResults& r : {a, b}) all.push_back(rank_results_from_json(to_json(r)));  // JSON round trip
  const Combined m = combine(all);
  REQUIRE(m.gemms.size() == 1);
  CHECK(m.gemms[0].time_ns == 150);
  CHECK(m.kernels.empty());
  REQUIRE(m.other_pools.size() == 1);
  CHECK(m.other_pools[0].pool_bytes == 4 << 20);
  REQUIRE(m.other_pools[0].gemms.size() == 1);
  CHECK(m.other_pools[0].gemms[0].time_ns == 60);
  CHECK(m.other_pools[0].kernels.at("act")[0].time_ns == 7);
  // A rank that measured another pool is a logic error, not a silent mix.
  all[1].other_pools[0].pool_bytes = 8 << 20;
  CHECK_THROWS_AS(combine(all), std::logic_error);
}

TEST_CASE("repeated sweeps keep each sample's median or minimum; different samples are a logic error") {
  const std::vector<std::vector<GemmSample>> gemms = {
      {{8, 8, 8, 1, 100}, {16, 8, 8, 1, 900}}, {{8, 8, 8, 1, 300}, {16, 8, 8, 1, 200}}, {{8, 8, 8, 1, 200}, {16, 8, 8, 1, 250}}};
  const std::vector<GemmSample> g = combine_repeats(gemms, Statistic::median);
  REQUIRE(g.size() == 2);
  CHECK(g[0].time_ns == 200);
  CHECK(g[1].time_ns == 250);  // the 900 of a slow spell is dropped
  CHECK(g[1].m == 16);
  const std::vector<GemmSample> fastest = combine_repeats(gemms, Statistic::min);
  CHECK(fastest[0].time_ns == 100);
  CHECK(fastest[1].time_ns == 200);
  const std::vector<std::vector<KernelMeasurement>> kernels = {{{"act", 1000, 10}}, {{"act", 1000, 14}}};
  CHECK(combine_repeats(kernels, Statistic::median)[0].time_ns == 12);  // two repeats: the mean of the middle pair
  CHECK(combine_repeats(kernels, Statistic::min)[0].time_ns == 10);
  CHECK_THROWS_AS(combine_repeats(std::vector<std::vector<KernelMeasurement>>{{{"act", 1000, 10}}, {{"norm_in", 1000, 10}}},
                                  Statistic::median),
                  std::logic_error);
  CHECK_THROWS_AS(combine_repeats(std::vector<std::vector<GemmSample>>{{{8, 8, 8, 1, 1}}, {}}, Statistic::min),
                  std::logic_error);
  CHECK(combine_repeats(std::vector<std::vector<GemmSample>>{}, Statistic::median).empty());
  CHECK(parse_statistic("min", "--statistic") == Statistic::min);
  CHECK(parse_statistic("median", "--statistic") == Statistic::median);
  try {
    parse_statistic("mean", "--statistic");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == "command line: --statistic: is 'mean' (fix: use median or min)");
  }
}

TEST_CASE("the layer's GEMMs replace the sweep's at their shapes: a shape's mean, the layer's source") {
  std::vector<GemmSample> table = {{128, 512, 256, 1, 1000}, {64, 512, 256, 1, 400}, {128, 512, 256, 1, 900, "", GemmFormat::fp8}};
  // fc1 and fc2_dgrad ran the same shape: one time per shape, their mean.
  merge_layer_gemms(table, {{128, 512, 256, 1, 700, kTimedInLayer}, {128, 512, 256, 1, 900, kTimedInLayer},
                            {256, 512, 256, 1, 1500, kTimedInLayer}});
  REQUIRE(table.size() == 4);
  CHECK(table[0].time_ns == 800);
  CHECK(table[0].source == kTimedInLayer);
  CHECK(table[1].time_ns == 400);  // a shape no layer ran keeps the sweep's
  CHECK(table[1].source.empty());
  CHECK(table[2].time_ns == 900);  // another format is another sample
  CHECK(table[3].m == 256);
  CHECK(table[3].source == kTimedInLayer);
  // A second plan's layer at a shape the first ran: the mean of both.
  merge_layer_gemms(table, {{128, 512, 256, 1, 1000, kTimedInLayer}});
  CHECK(table[0].time_ns == 900);
  // The source travels with the raw samples between ranks.
  RankResults r;
  r.gemms = table;
  const RankResults back = rank_results_from_json(to_json(r));
  REQUIRE(back.gemms.size() == 4);
  CHECK(back.gemms[0].source == kTimedInLayer);
  CHECK(back.gemms[1].source.empty());
  CHECK(back.gemms[2].format == GemmFormat::fp8);
  CHECK(back.gemms[2].source.empty());
  for (const GemmSample& g : combine({back}).gemms)
    CHECK(g.source == (g.m != 64 && g.format == GemmFormat::bf16 ? kTimedInLayer : ""));
}

TEST_CASE("a sample's timed calls: their median, whatever --statistic chooses between repeats") {
  // Five calls of one shape, two of them disturbed by a neighbour.
  CHECK(median_of({1018, 1650, 1020, 1019, 1400}) == 1020);
  CHECK(median_of({4, 2}) == 3);
  CHECK(median_of({}) == 0);
}

TEST_CASE("ranks on the same CPUs take turns; ranks_per_core is ranks on the node over its CPUs") {
  // Four ranks, two cores, consecutive ranks on one core (tools/calibrate-local).
  const std::vector<std::string> pairs = {"vm cpus 0", "vm cpus 0", "vm cpus 1", "vm cpus 1"};
  CoreShare s = core_share(pairs, 1, 4, 2, true);
  CHECK(s.turns == 2);
  CHECK(s.turn == 1);
  CHECK(s.ranks_per_core == 2.0);
  CHECK(core_share(pairs, 2, 4, 2, true).turn == 0);
  // Round-robin binding: ranks 0 and 2 share core 0.
  const std::vector<std::string> rr = {"vm cpus 0", "vm cpus 1", "vm cpus 0", "vm cpus 1"};
  CHECK(core_share(rr, 2, 4, 2, true).turn == 1);
  CHECK(core_share(rr, 1, 4, 2, true).turn == 0);
  // One rank per core: no turns, no share.
  s = core_share({"vm cpus 0", "vm cpus 1"}, 1, 2, 2, true);
  CHECK(s.turns == 1);
  CHECK(s.turn == 0);
  CHECK(s.ranks_per_core == 1.0);
  // Unbound ranks (every rank may use every CPU) take turns one by one.
  s = core_share({"vm cpus 0-1", "vm cpus 0-1", "vm cpus 0-1"}, 2, 3, 2, true);
  CHECK(s.turns == 3);
  CHECK(s.turn == 2);
  CHECK(s.ranks_per_core == doctest::Approx(1.5));
  // Two hosts with the same CPU numbers do not share anything.
  CHECK(core_share({"a cpus 0", "b cpus 0"}, 1, 1, 2, true).turns == 1);
  // GPUs: nothing shared.
  s = core_share(pairs, 1, 4, 2, false);
  CHECK(s.turns == 1);
  CHECK(s.ranks_per_core == 1.0);
  CHECK(cpu_place("vm").rfind("vm cpus ", 0) == 0);
}

TEST_CASE("--mpi-wait: auto yields when ranks outnumber CPUs, spins otherwise; other words are refused") {
  using exec::MpiWait;
  CHECK(exec::parse_mpi_wait("auto", 4, 2) == MpiWait::yield);
  CHECK(exec::parse_mpi_wait("auto", 2, 2) == MpiWait::spin);
  CHECK(exec::parse_mpi_wait("auto", 1, 64) == MpiWait::spin);
  CHECK(exec::parse_mpi_wait("spin", 4, 2) == MpiWait::spin);
  CHECK(exec::parse_mpi_wait("yield", 1, 2) == MpiWait::yield);
  CHECK(exec::parse_mpi_wait("sleep", 1, 2) == MpiWait::sleep);
  CHECK(exec::mpi_wait_name(MpiWait::yield) == "yield");
  try {
    exec::parse_mpi_wait("poll", 1, 1);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == "command line: --mpi-wait: is 'poll' (fix: use auto, spin, yield or sleep)");
  }
}
