// The planner's search: every candidate valid, ranked, fixed dimensions
// respected, memory pruning honest, and the default batch divisible.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/core/topology.hpp"
#include "plan_words.hpp"

using namespace cuboid;

TEST_CASE("default global batch: ~4M tokens, at most 16 sequences per GPU, divisible by the DP sizes of the cluster") {
  CHECK(default_global_batch(8192, 32) == 512);     // 4Mi / 8192 = 512, 32 is a power of two
  CHECK(default_global_batch(2048, 64) == 1024);    // 4Mi / 2048 = 2048, capped at 16 per GPU = 1024
  CHECK(default_global_batch(2048, 1024) == 2048);  // GPT-3-like: 2048 x 2048 tokens
  CHECK(default_global_batch(8192, 8) == 128);      // Megatron's Llama 3 8B recipe on one node: 128
  CHECK(default_global_batch(4096, 24) == 384);     // odd part 3: cap 384 = 3 x 128, 4Mi / 4096 = 1024 -> 3 x 2^7
  CHECK(default_global_batch(2048, 3072) == 1536);  // 3072 = 3 x 2^10: 3 x 2^round(log2(682.7)) = 3 x 512
  CHECK(default_global_batch(2048, 3360) == 1680);  // odd part 105: 105 x 2^round(log2(19.5)) = 105 x 16
  CHECK(default_global_batch(128, 2) == 32);        // a two-core CPU "cluster": 16 per core, not 32768
  CHECK(default_global_batch(128, 3) == 48);        // odd: 3 x 2^4
  CHECK(default_global_batch(1 << 24, 8) == 1);     // never below one sequence
  for (int dp : {1, 2, 3, 4, 6, 8, 12, 24})         // every DP of 3072 GPUs with up to 2^9 divides 1536
    CHECK(default_global_batch(2048, 3072) % dp == 0);
}

TEST_CASE("Llama-3-70B on 4 x 8 A100: every candidate is a valid factorisation, best first") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;  // analytical ranking only: the simulator re-rank is tested below
  o.global_batch = 64;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(!r.fitting.empty());
  CHECK(r.candidates >= static_cast<std::int64_t>(r.fitting.size() + r.not_fitting.size()));
  CHECK(r.not_fitting.size() <= 16);
  std::set<std::pair<int, int>> shapes;
  for (std::size_t i = 0; i < r.fitting.size(); ++i) {
    const Estimate& e = r.fitting[i];
    CHECK(e.plan.world_size() == 32);
    CHECK(e.plan.tp <= 8);  // TP stays inside a node unless asked
    CHECK(m.num_attention_heads % e.plan.tp == 0);
    CHECK(m.num_kv_heads % e.plan.tp == 0);
    CHECK(m.num_layers % (e.plan.pp * e.plan.virtual_stages) == 0);
    CHECK(e.plan.global_batch % (e.plan.micro_batch * e.plan.dp) == 0);
    CHECK(e.memory.fits());
    CHECK(e.iteration_time_s > 0);
    if (i > 0) CHECK(r.fitting[i - 1].iteration_time_s <= e.iteration_time_s * 1.001);  // near-ties: default order first
    shapes.insert({e.plan.tp, e.plan.pp});
  }
  CHECK(shapes.count({4, 4}) == 1);  // the seed's TP 4 x PP 4 x DP 2 fits
  for (const Estimate& e : r.not_fitting) CHECK_FALSE(e.memory.fits());
}

TEST_CASE("fixed dimensions are respected and invalid ones are rejected with the validator's message") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;  // analytical ranking only: the simulator re-rank is tested below
  o.global_batch = 64;
  o.tp = 4;
  o.pp = 4;
  o.zero_stage = 1;
  o.recompute = Recompute::full;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(!r.fitting.empty());
  for (const Estimate& e : r.fitting) {
    CHECK(e.plan.tp == 4);
    CHECK(e.plan.pp == 4);
    CHECK(e.plan.dp * e.plan.cp == 2);  // DP 2, or CP 2 (searched too)
    CHECK(e.plan.zero_stage == 1);
    CHECK(e.plan.recompute == Recompute::full);
  }
  o.tp = 3;
  CHECK_THROWS_AS(search_plans(m, topo, o), InputError);
  o.tp = 4;
  o.pp = 3;
  CHECK_THROWS_WITH(search_plans(m, topo, o),
                    doctest::Contains("PP 3 x virtual stages 1 = 3 does not divide the 80 layers"));
}

TEST_CASE("the search counts its skips as values; the command line words them") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  PlannerOptions o;
  o.global_batch = 48;  // 3 x 16: DP 32 and micro-batches 32 do not divide it
  SearchResult r;
  (void)enumerate_plans(m, topo, o, r);
  std::int64_t counted = 0;
  for (const auto& [why, count] : r.skips) counted += count;
  CHECK(counted == r.skipped);
  CHECK(r.skips.count(Rejection{Rejection::Kind::batch_not_divisible, PlanField::world_size, {}, {}}) == 1);
  const auto lines = cli::skip_reasons(r, m, c, o, std::nullopt);
  CHECK(lines.count("global batch not divisible by micro-batch x DP") == 1);
  for (const auto& [line, count] : lines) CHECK(count > 0);
}

TEST_CASE("a model that cannot fit reports the smallest plans instead of nothing") {
  const ModelSpec m = load_model("models/llama3.1-405b.json");
  const Cluster c = load_cluster("topologies/dgx-a100.json", 1);
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;
  const SearchResult r = search_plans(m, topo, o);
  CHECK(r.fitting.empty());
  REQUIRE(!r.not_fitting.empty());
  for (std::size_t i = 1; i < r.not_fitting.size(); ++i)
    CHECK(r.not_fitting[i - 1].memory.total_bytes <= r.not_fitting[i].memory.total_bytes);
  // 405B parameters at >= 2 bytes each cannot fit 8 x 80 GB even fully sharded.
  CHECK(r.not_fitting.front().memory.total_bytes > r.not_fitting.front().memory.capacity_bytes);
}

TEST_CASE("plan_from_options fills Megatron-like defaults and validates") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  PlannerOptions o;
  o.simulate_top = 0;  // analytical ranking only: the simulator re-rank is tested below
  o.tp = 4;
  o.pp = 4;
  const ParallelPlan p = plan_from_options(m, c, o);
  CHECK(p.dp == 2);
  CHECK(p.micro_batch == 1);
  CHECK(p.sequence_parallel);
  CHECK(p.recompute == Recompute::selective);
  CHECK(p.schedule == Schedule::one_f_one_b);
  CHECK(p.global_batch == 512);
  o.virtual_stages = 5;
  CHECK(plan_from_options(m, c, o).schedule == Schedule::interleaved);
  o.virtual_stages = 3;
  CHECK_THROWS_AS(plan_from_options(m, c, o), InputError);
}

TEST_CASE("--attention-kernel: the preset's kernel, then the GPU's; unfused is --flash-attention off") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster a100 = load_cluster("topologies/dgx-a100-4node.json");
  const Cluster h100 = load_cluster("topologies/dgx-h100.json", 4);
  PlannerOptions o;
  o.tp = 8;
  o.pp = 4;
  // megatron-core: auto, the GPU profile's kernel at pricing time.
  CHECK(plan_from_options(m, a100, o).attention_kernel == AttentionKernel::auto_);
  CHECK(plan_from_options(m, a100, o).flash_attention);
  // unfused on megatron-core is --flash-attention off: the same plan, the same estimate.
  PlannerOptions off = o;
  off.flash_attention = false;
  PlannerOptions unfused = o;
  unfused.attention_kernel = AttentionKernel::unfused;
  for (const Cluster* c : {&a100, &h100}) {
    const ParallelPlan p_off = plan_from_options(m, *c, off);
    const ParallelPlan p_unfused = plan_from_options(m, *c, unfused);
    CHECK(p_off == p_unfused);
    CHECK(!p_unfused.flash_attention);
    const Topology topo(*c);
    CHECK(estimate(m, topo, p_off).iteration_time_s == estimate(m, topo, p_unfused).iteration_time_s);
  }
  // A named kernel is the plan's; one the GPU has no rates for is refused.
  PlannerOptions f3 = o;
  f3.attention_kernel = AttentionKernel::flash3;
  CHECK(plan_from_options(m, h100, f3).attention_kernel == AttentionKernel::flash3);
  CHECK_THROWS_WITH_AS(plan_from_options(m, a100, f3),
                       doctest::Contains("has no published rates for the flash3 attention kernel (it has rates for "
                                         "flash1, flash2)"),
                       InputError);
  // megatron-lm-2023 runs the unfused core; --flash-attention on takes FlashAttention 1, the one its code calls.
  PlannerOptions lm = o;
  lm.trainer = "megatron-lm-2023";
  CHECK(!plan_from_options(m, a100, lm).flash_attention);
  lm.flash_attention = true;
  CHECK(plan_from_options(m, a100, lm).attention_kernel == AttentionKernel::flash1);
  lm.attention_kernel = AttentionKernel::flash2;
  CHECK_THROWS_WITH_AS(plan_from_options(m, a100, lm), doctest::Contains("cannot call the flash2 attention kernel"),
                       InputError);
}

TEST_CASE("the planner's cached Estimator gives exactly the uncached estimate") {
  const ModelSpec m = load_model("models/gpt-512b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-superpod.json", 64);
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;  // analytical ranking only: the simulator re-rank is tested below
  o.global_batch = 512;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(r.fitting.size() > 10);
  Estimator cached(m, topo);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < r.fitting.size(); i += 7) {
    const ParallelPlan& p = r.fitting[i].plan;
    const Estimate a = estimate(m, topo, p);
    const Estimate b = cached(p);
    CHECK(a.iteration_time_s == b.iteration_time_s);
    CHECK(a.breakdown.dp_comm_s == b.breakdown.dp_comm_s);
    CHECK(a.memory.total_bytes == b.memory.total_bytes);
    CHECK(r.fitting[i].iteration_time_s == a.iteration_time_s);
    ++checked;
  }
  CHECK(checked > 1);
}

// The Estimator prices the TP collectives and the pipeline hop once per
// (layer cost, placement) pair; every breakdown part must still be exactly
// what the uncached estimate gives, whichever plan filled the entry first.
TEST_CASE("the Estimator's per-(layer, placement) communication times equal the uncached ones") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;
  o.global_batch = 64;
  o.threads = 1;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(r.fitting.size() > 100);
  Estimator cached(m, topo);
  std::size_t pp_sg = 0;    // plans with pipeline hops that gather TP shards (SP off)
  std::size_t with_cp = 0;  // plans with context parallelism (their own cache keys)
  // About 300 plans spread over the ranking: the uncached estimate of every
  // one of the thousands that fit takes minutes under the sanitizers.
  const std::size_t stride = std::max<std::size_t>(1, r.fitting.size() / 300);
  for (int pass = 0; pass < 2; ++pass) {  // reversed order, then forward: entries first filled by other plans
    for (std::size_t k = 0; k < r.fitting.size(); k += stride) {
      const std::size_t i = pass == 0 ? r.fitting.size() - 1 - k : k;
      const ParallelPlan& p = r.fitting[i].plan;
      const Estimate a = estimate(m, topo, p);
      const Estimate b = cached(p);
      CHECK(a.iteration_time_s == b.iteration_time_s);
      CHECK(a.breakdown.compute_s == b.breakdown.compute_s);
      CHECK(a.breakdown.tp_comm_s == b.breakdown.tp_comm_s);
      CHECK(a.breakdown.cp_comm_s == b.breakdown.cp_comm_s);
      CHECK(a.breakdown.pp_comm_s == b.breakdown.pp_comm_s);
      CHECK(a.breakdown.dp_comm_s == b.breakdown.dp_comm_s);
      CHECK(a.breakdown.bubble_s == b.breakdown.bubble_s);
      CHECK(a.breakdown.optimizer_s == b.breakdown.optimizer_s);
      if (pass == 0 && p.pp > 1 && p.tp > 1 && !p.sequence_parallel && a.breakdown.pp_comm_s > 0) ++pp_sg;
      if (pass == 0 && p.cp > 1) ++with_cp;
    }
  }
  CHECK(pp_sg > 0);
  CHECK(with_cp > 0);
}

TEST_CASE("the search gives the same ranking with one thread and with several") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;  // analytical ranking only: the simulator re-rank is tested below
  o.global_batch = 64;
  o.pp = 4;  // a slice of the space (CP and rank orders included): two searches stay quick under the sanitizers
  o.threads = 1;
  const SearchResult one = search_plans(m, topo, o);
  o.threads = 3;
  const SearchResult three = search_plans(m, topo, o);
  REQUIRE(one.fitting.size() == three.fitting.size());
  for (std::size_t i = 0; i < one.fitting.size(); ++i) {
    CHECK(one.fitting[i].iteration_time_s == three.fitting[i].iteration_time_s);
    CHECK(one.fitting[i].plan.order == three.fitting[i].plan.order);
    CHECK(one.fitting[i].plan.tp == three.fitting[i].plan.tp);
  }
}

TEST_CASE("uneven stages: Llama 3.1 405B's 126 layers on PP 16 as 7 + 14 x 8 + 7") {
  int first = 0, last = 0;
  REQUIRE(propose_uneven_stages(126, 16, first, last));
  CHECK(first == 7);
  CHECK(last == 7);
  CHECK_FALSE(propose_uneven_stages(128, 16, first, last));  // divides: no uneven split needed
  ParallelPlan p;
  p.pp = 16;
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  int total = 0;
  for (int s = 0; s < 16; ++s) total += layers_on_stage(p, 126, s);
  CHECK(total == 126);
  CHECK(layers_on_stage(p, 126, 5) == 8);
  const ModelSpec m = load_model("models/llama3.1-405b.json");
  const Cluster c = load_cluster("topologies/h100-roce-24k.json", 2048);
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;  // analytical ranking only: the simulator re-rank is tested below
  o.tp = 8;
  o.pp = 16;
  o.cp = 1;
  o.global_batch = 2048;
  try {
    (void)search_plans(m, topo, o);
    FAIL("PP 16 of 126 layers searched without uneven stages");
  } catch (const PlanRejected& e) {  // a value; the command line words it
    CHECK(e.rejection().kind == Rejection::Kind::plan);
    CHECK(e.rejection().plan.kind == PlanCheck::layers_split);
    CHECK(std::string(cli::worded(e).what()).find("or add --uneven-stages") != std::string::npos);
  }
  o.uneven_stages = true;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(!r.fitting.empty());
  CHECK(r.fitting.front().plan.dp == 128);
  // The search holds both splits: 7 + 14 x 8 + 7 for 1F1B and, in 2 chunks
  // per stage, 8 + 14 x 8 + 6; 16 micro-batches on PP 16 make interleaving win.
  bool one_f_one_b = false;
  for (const auto& pr : r.fitting) {
    const ParallelPlan& p = pr.plan;
    if (p.virtual_stages == 1) {
      one_f_one_b = true;
      CHECK(p.first_stage_layers == 7);
      CHECK(p.last_stage_layers == 7);
    } else {
      CHECK(p.virtual_stages == 2);
      CHECK(p.first_stage_layers == 8);
      CHECK(p.last_stage_layers == 6);
    }
  }
  CHECK(one_f_one_b);
  CHECK(r.fitting.front().plan.virtual_stages == 2);
  // A split given by hand is the one searched, interleaved where it divides.
  o.first_stage_layers = 6;
  o.last_stage_layers = 8;
  const SearchResult h = search_plans(m, topo, o);
  REQUIRE(!h.fitting.empty());
  std::set<int> vs;
  for (const auto& pr : h.fitting) {
    CHECK(pr.plan.first_stage_layers == 6);
    CHECK(pr.plan.last_stage_layers == 8);
    vs.insert(pr.plan.virtual_stages);
  }
  CHECK(vs == std::set<int>{1, 2});
}

TEST_CASE("uneven stages with interleaving: every stage's layers in v equal chunks, as Megatron-Core builds them") {
  int first = 0, last = 0;
  REQUIRE(propose_uneven_stages(126, 16, first, last, 2));
  CHECK(first == 8);  // in 2-layer units: 4 + 14 x 4 + 3
  CHECK(last == 6);
  CHECK_FALSE(propose_uneven_stages(126, 16, first, last, 4));  // 126 is no multiple of 4
  CHECK_FALSE(propose_uneven_stages(126, 16, first, last, 3));  // 14 middle stages of 9 leave nothing for the ends
  REQUIRE(propose_uneven_stages(80, 4, first, last, 8));         // 16 + 24 + 24 + 16
  CHECK(first == 16);
  CHECK(last == 16);
  REQUIRE(propose_uneven_stages(6, 2, first, last, 2));  // PP 2: the LM head's stage gets the smaller share
  CHECK(first == 4);
  CHECK(last == 2);
  CHECK_FALSE(propose_uneven_stages(8, 2, first, last, 2));  // 2 x 2 chunks divide 8: no uneven split needed

  // Layers in virtual-stage order: chunk c of stage s is virtual stage c x 16 + s.
  ParallelPlan p;
  p.pp = 16;
  p.virtual_stages = 2;
  p.schedule = Schedule::interleaved;
  p.first_stage_layers = 8;
  p.last_stage_layers = 6;
  CHECK(first_layer_of_chunk(p, 126, 0, 0) == 0);
  CHECK(first_layer_of_chunk(p, 126, 1, 0) == 4);
  CHECK(first_layer_of_chunk(p, 126, 15, 0) == 60);  // 4 + 14 x 4
  CHECK(first_layer_of_chunk(p, 126, 0, 1) == 63);   // half of the model
  CHECK(first_layer_of_chunk(p, 126, 15, 1) == 123);  // its 3 layers end the model
  std::vector<int> held(126, 0);
  for (int s = 0; s < 16; ++s)
    for (int c = 0; c < 2; ++c)
      for (int l = 0; l < layers_on_stage(p, 126, s) / 2; ++l) ++held[static_cast<std::size_t>(first_layer_of_chunk(p, 126, s, c) + l)];
  CHECK(std::all_of(held.begin(), held.end(), [](int n) { return n == 1; }));

  // check_plan: 7 + 14 x 8 + 7 does not split into 2 chunks per stage.
  const ModelSpec m = load_model("models/llama3.1-405b.json");
  const Cluster c = load_cluster("topologies/h100-roce-24k.json", 2048);
  p.tp = 8;
  p.dp = 128;
  p.micro_batch = 1;
  p.global_batch = 2048;
  p.seq_length = 8192;
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  const auto problem = check_plan(p, m, c);
  REQUIRE(problem);
  CHECK(problem->field == PlanField::uneven_stages);
  CHECK(describe(*problem, m, c) == "first stage's 7 layers do not split into 2 virtual stages (every stage holds its layers as 2 "
                         "equal chunks)");
  p.first_stage_layers = 8;
  p.last_stage_layers = 6;
  CHECK_FALSE(check_plan(p, m, c));

  // Only Megatron-Core builds uneven chunks; the 2021-2022 Megatron-LMs no uneven stages at all.
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;
  o.tp = 8;
  o.pp = 16;
  o.virtual_stages = 2;
  o.global_batch = 2048;
  o.uneven_stages = true;
  const ParallelPlan built = plan_from_options(m, c, o);
  CHECK(built.first_stage_layers == 8);
  CHECK(built.last_stage_layers == 6);
  CHECK(built.schedule == Schedule::interleaved);
  o.trainer = "torchtitan";
  CHECK_THROWS_WITH(plan_from_options(m, c, o),
                    doctest::Contains("torchtitan has no uneven stages with the interleaved schedule"));
  CHECK_THROWS_WITH(search_plans(m, topo, o),  // the fixed flags are refused up front, not as "no valid plan"
                    doctest::Contains("torchtitan has no uneven stages with the interleaved schedule"));
  o.virtual_stages.reset();
  o.trainer = "megatron-2022";
  CHECK_THROWS_WITH(plan_from_options(m, c, o),
                    doctest::Contains("megatron-2022 gives every pipeline stage the same number of layers"));
  CHECK_THROWS_WITH(search_plans(m, topo, o),
                    doctest::Contains("megatron-2022 gives every pipeline stage the same number of layers"));
}

TEST_CASE("the best K plans are re-ranked by the discrete-event simulator and say so") {
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  PlannerOptions o;
  o.global_batch = 64;
  o.pp = 4;  // a slice of the space: the re-rank is the subject, not the search
  o.simulate_top = 4;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(r.fitting.size() > 4);
  CHECK(r.simulated == 4);
  // Four plans simulated; rank-order ties among them are one row each.
  std::size_t sim_rows = 0;
  while (sim_rows < r.fitting.size() && r.fitting[sim_rows].simulated) ++sim_rows;
  std::size_t folded = 0;
  for (std::size_t i = 0; i < sim_rows; ++i) folded += r.fitting[i].tied_orders.size();
  CHECK(sim_rows + folded == 4);
  for (std::size_t i = 0; i < r.fitting.size(); ++i) {
    CHECK(r.fitting[i].simulated == (i < sim_rows));
    // Fastest first, except that a row of tied orders shows the default order,
    // which may be up to 0.1 % slower than the tie's fastest.
    if (i > 0 && i != sim_rows) CHECK(r.fitting[i - 1].iteration_time_s <= r.fitting[i].iteration_time_s * 1.001);
  }
}

TEST_CASE("fixing an interleaved schedule does not trip the up-front check of fixed flags") {
  const ModelSpec m = load_model("models/tiny.json");
  const Cluster c = load_cluster("topologies/localhost-cpu.json");
  Cluster four = c;
  four.gpus_per_node = 4;
  const Topology topo(four);
  PlannerOptions o;
  o.simulate_top = 0;
  o.tp = 2;
  o.pp = 2;
  o.dp = 1;
  o.schedule = Schedule::interleaved;
  o.virtual_stages = 2;
  o.micro_batch = 1;
  o.global_batch = 4;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(!r.fitting.empty());
  CHECK(r.fitting.front().plan.virtual_stages == 2);
  CHECK(r.fitting.front().plan.num_micro_batches() == 4);
}

TEST_CASE("rank orders that tie are one row, in Megatron's default order; the plan file lists the others") {
  const ModelSpec m = load_model("models/gpt-512b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-superpod.json");
  const Topology topo(c);
  PlannerOptions o;
  o.tp = 8;
  o.pp = 16;
  o.simulate_top = 0;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(r.fitting.size() > 2);
  // tp-pp-dp and tp-dp-pp place this plan's groups on equal links: the winner is the portable one.
  const Estimate& best = r.fitting.front();
  CHECK(best.plan.order == RankOrder{});
  // ... and the tie is one row: the other order is folded into it, not a row of its own.
  const RankOrder tp_pp_dp = RankOrder::parse("tp-pp-dp", "test", "order");
  CHECK(std::find(best.tied_orders.begin(), best.tied_orders.end(), tp_pp_dp) != best.tied_orders.end());
  for (const Estimate& e : r.fitting) {
    ParallelPlan p = e.plan;
    p.order = best.plan.order;
    if (&e != &best && p == best.plan) CHECK(e.iteration_time_s > best.iteration_time_s * (1 + kRankOrderTie));
  }
  // The plan a command writes lists every other order of it, fastest first, the tie at the row's time.
  Estimate written = best;
  attach_other_orders(written, r);
  REQUIRE(!written.other_orders.empty());
  bool tie_listed = false;
  for (std::size_t i = 0; i < written.other_orders.size(); ++i) {
    const Estimate::OtherOrder& o = written.other_orders[i];
    CHECK(o.order != best.plan.order);
    if (i > 0) CHECK(written.other_orders[i - 1].iteration_time_s <= o.iteration_time_s);
    if (o.order == tp_pp_dp) tie_listed = o.iteration_time_s == best.iteration_time_s;
  }
  CHECK(tie_listed);
}

TEST_CASE("with CP next to TP, tp-pp-dp is searched only where it places ranks apart from tp-dp-pp") {
  // Megatron-Core's tp-cp-ep-pp-dp and tp-cp-ep-dp-pp are one placement
  // when DP or PP is 1 (cuboid's map once kept CP inside DP, which made
  // tp-pp-dp with DP 1 x CP 2 a placement no trainer builds).
  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  const Topology topo(c);
  auto orders_of = [&](int pp, int dp) {
    PlannerOptions o;
    o.tp = 4;
    o.cp = 2;
    o.pp = pp;
    o.dp = dp;
    o.global_batch = 64;
    o.simulate_top = 0;
    const SearchResult r = search_plans(m, topo, o);
    std::set<std::string> seen;
    for (const Estimate& e : r.fitting) {
      seen.insert(e.plan.order.str());
      for (const RankOrder& t : e.tied_orders) seen.insert(t.str());
    }
    return seen;
  };
  const std::set<std::string> dp1 = orders_of(4, 1);
  CHECK(dp1.count("tp-dp-pp") == 1);
  CHECK(dp1.count("tp-pp-dp") == 0);
  CHECK(orders_of(2, 2).count("tp-pp-dp") == 1);
}

TEST_CASE("a device whose default core is unfused: flash off by default, --flash-attention on when asked") {
  const ModelSpec m = load_model("models/tiny.json");
  const Cluster c = load_cluster("topologies/localhost-cpu.json");
  CHECK(!c.gpu.flash_attention);
  CHECK(c.gpu.sources.count("flash_attention") == 1);
  CHECK(load_cluster("topologies/dgx-a100-4node.json").gpu.flash_attention);  // GPUs: on unless the card says
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;
  o.tp = 2;
  o.micro_batch = 1;
  o.global_batch = 4;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(!r.fitting.empty());
  for (const auto& e : r.fitting) CHECK(!e.plan.flash_attention);
  for (const auto& e : r.fitting) CHECK(e.plan.cp == 1);  // CP is searched with the fused core only
  CHECK(!plan_from_options(m, c, o).flash_attention);
  // Asked for, the fused core is planned (the CPU executor runs its
  // arithmetic), and with it context parallelism.
  o.flash_attention = true;
  const SearchResult f = search_plans(m, topo, o);
  REQUIRE(!f.fitting.empty());
  for (const auto& e : f.fitting) CHECK(e.plan.flash_attention);
  CHECK(plan_from_options(m, c, o).flash_attention);
  o.tp = 1;
  o.cp = 2;
  const ParallelPlan cp = plan_from_options(m, c, o);
  CHECK(cp.cp == 2);
  CHECK(cp.flash_attention);
  o.flash_attention = false;
  std::string what;
  try {
    (void)plan_from_options(m, c, o);
  } catch (const InputError& e) {
    what = e.what();
  }
  CHECK(what.find("context parallelism needs fused (flash) attention") != std::string::npos);
}

TEST_CASE("trainer presets: what each can run, and settings that contradict it are refused") {
  CHECK(default_trainer().name == "megatron-core");
  CHECK(trainer_presets().size() >= 5);
  for (const TrainerPreset& t : trainer_presets()) {
    CAPTURE(t.name);
    CHECK(find_trainer(t.name) == &t);
    CHECK(t.settings.preset == t.name);
    CHECK(!t.zero_stages.empty());
    CHECK(t.zero_stages.front() == 0);
    // Every preset says where each of its settings comes from.
    for (const char* key : {"dp_overlap", "dp_grad_bytes", "grad_accum_fusion"}) {
      bool found = false;
      for (const TrainerSource& s : t.sources) found = found || s.setting == key;
      CHECK_MESSAGE(found, key);
    }
  }
  CHECK(find_trainer("megatron") == nullptr);

  const ModelSpec m = load_model("models/llama3-70b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-4node.json");
  PlannerOptions o;
  o.trainer = "megatron-2021";
  o.sequence_parallel = true;
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("has no sequence parallelism"), InputError);
  o.sequence_parallel.reset();
  o.recompute = Recompute::selective;
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("whole layers only"), InputError);
  o.recompute.reset();
  o.zero_stage = 1;
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("cannot run ZeRO stage 1"), InputError);
  o.zero_stage.reset();
  o.trainer = "megatron-deepspeed";
  o.virtual_stages = 2;
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("no interleaved schedule"), InputError);
  o.virtual_stages.reset();
  o.grad_accum_fusion = true;
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("no gradient-accumulation fusion"), InputError);
  o.grad_accum_fusion.reset();
  o.trainer = "deepspeed-2021";
  o.pp = 2;
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("has no pipeline parallelism"), InputError);
  o.pp.reset();
  o.trainer = "bogus";
  CHECK_THROWS_WITH_AS(check_trainer_options(m, c, o), doctest::Contains("unknown trainer"), InputError);
}

TEST_CASE("a trainer preset limits the search to what it can run and gives every plan its settings") {
  const ModelSpec m = load_model("models/gpt3-175b.json");
  const Cluster c = load_cluster("topologies/dgx-a100-superpod.json", 16);
  const Topology topo(c);
  PlannerOptions o;
  o.simulate_top = 0;
  o.global_batch = 256;
  o.tp = 8;
  o.trainer = "megatron-2021";
  SearchResult r;
  const std::vector<ParallelPlan> plans = enumerate_plans(m, topo, o, r);
  REQUIRE(!plans.empty());
  bool interleaved = false;
  for (const ParallelPlan& p : plans) {
    CHECK(!p.sequence_parallel);
    CHECK(!p.flash_attention);
    CHECK(!p.grad_accum_fusion);
    CHECK(p.recompute != Recompute::selective);
    CHECK(p.zero_stage == 0);
    CHECK(p.trainer.preset == "megatron-2021");
    CHECK(p.trainer.dp_grad_bytes == 2);
    CHECK(!p.trainer.dp_overlap);
    CHECK(!p.trainer.tp_backward_overlap);
    interleaved = interleaved || p.schedule == Schedule::interleaved;
  }
  CHECK(interleaved);  // SC'21 introduced the interleaved schedule

  o.trainer = "megatron-deepspeed-2022";
  SearchResult r2;
  for (const ParallelPlan& p : enumerate_plans(m, topo, o, r2)) {
    CHECK(p.schedule != Schedule::interleaved);
    CHECK(p.zero_stage <= 1);
    CHECK(p.trainer.zero1_grad_all_reduce);
  }

  // MT-NLG's engine of 2021: the same pipeline engine and ZeRO-1 all-reduce,
  // in fp16 with autograd's in-place accumulation (2 B reduced, 6 B accumulated).
  o.trainer = "megatron-deepspeed-2021";
  SearchResult r21;
  bool pipelined = false;
  for (const ParallelPlan& p : enumerate_plans(m, topo, o, r21)) {
    CHECK(p.schedule != Schedule::interleaved);
    CHECK(p.zero_stage <= 1);
    CHECK(!p.sequence_parallel);
    CHECK(p.trainer.zero1_grad_all_reduce);
    CHECK(p.trainer.dp_grad_bytes == 2);
    CHECK(p.trainer.grad_accum_bytes == 6);
    CHECK(!p.trainer.dp_overlap);
    CHECK(!p.trainer.tp_backward_overlap);
    pipelined = pipelined || p.pp > 1;
  }
  CHECK(pipelined);

  // DeepSpeed-2021 runs ZeRO without its pipeline engine: no PP, and its ZeRO-3 gathers per tensor.
  o.trainer = "deepspeed-2021";
  SearchResult r3;
  bool zero3 = false;
  for (const ParallelPlan& p : enumerate_plans(m, topo, o, r3)) {
    CHECK(p.pp == 1);
    CHECK(!p.flash_attention);
    CHECK(p.trainer.dp_grad_bytes == 2);
    CHECK(p.trainer.zero3_unit == Zero3Unit::tensor);
    CHECK(p.trainer.zero3_sync);
    zero3 = zero3 || p.zero_stage == 3;
  }
  CHECK(zero3);

  // --dp-overlap overrides the preset; the default preset keeps cuboid's defaults.
  o.trainer.reset();
  o.dp_overlap = false;
  o.tp = 8;
  o.pp = 4;
  const ParallelPlan p = plan_from_options(m, c, o);
  CHECK(p.trainer.preset == "megatron-core");
  CHECK(!p.trainer.dp_overlap);
  CHECK(p.trainer.dp_grad_bytes == 4);
  CHECK(p.grad_accum_fusion);
  CHECK(p.sequence_parallel);
}

// An NVL72 rack is one NVLink domain: TP, CP and EP groups of more than 8
// GPUs are searched inside it and priced at its NVLink busbw; on 8-GPU DGX
// B200 nodes the same TP 16 crosses the NICs.
TEST_CASE("GB200 NVL72: TP, CP and EP groups beyond 8 GPUs are searched and priced inside the NVLink domain") {
  const ModelSpec gpt3 = load_model("models/gpt3-175b.json");  // 96 heads: TP 16 divides them
  const Cluster nvl = load_cluster("topologies/gb200-nvl72.json", 2, 64);  // 2 racks x 16 trays
  const Topology topo(nvl);
  PlannerOptions o;
  SearchResult r;
  const std::vector<ParallelPlan> plans = enumerate_plans(gpt3, topo, o, r);
  const auto tp16 = std::find_if(plans.begin(), plans.end(), [](const ParallelPlan& p) { return p.tp == 16; });
  REQUIRE(tp16 != plans.end());
  CHECK(std::any_of(plans.begin(), plans.end(), [](const ParallelPlan& p) { return p.tp == 32; }));
  const RankMapping map(*tp16, nvl.gpus_per_node);
  for (const std::vector<int>& g : map.tp_groups()) CHECK(g.front() / 64 == g.back() / 64);  // one rack each
  const LinkParams tp_link = group_link_params(topo, Collective::all_reduce, map.tp_group(0, 0));
  CHECK(tp_link.busbw_Bps == doctest::Approx(835e9));  // the rack's NVLS all-reduce
  CHECK(tp_link.latency_ns == doctest::Approx(1900));

  // CP 16 of a 32k-token Llama 3.1 405B (8 KV heads keep TP at 8 or less).
  const ModelSpec l405 = load_model("models/llama3.1-405b.json");
  PlannerOptions lo;
  lo.seq_length = 32768;
  SearchResult lr;
  const std::vector<ParallelPlan> lplans = enumerate_plans(l405, topo, lo, lr);
  const auto cp16 = std::find_if(lplans.begin(), lplans.end(),
                                 [](const ParallelPlan& p) { return p.cp == 16 && p.tp == 4; });
  REQUIRE(cp16 != lplans.end());
  const RankMapping lmap(*cp16, nvl.gpus_per_node);
  const std::vector<int> cp_group = lmap.cp_group(0, 0, 0);
  REQUIRE(cp_group.size() == 16);
  CHECK(cp_group.back() / 64 == cp_group.front() / 64);  // TP 4 x CP 16 = one rack
  CHECK(group_link_params(topo, Collective::send_recv, cp_group).busbw_Bps == doctest::Approx(722e9));

  // EP 64 of a 128-expert model: one rack's all-to-all, at NVLink's busbw.
  const ModelSpec qwen = load_model("models/qwen3-30b-a3b.json");
  SearchResult qr;
  const std::vector<ParallelPlan> qplans = enumerate_plans(qwen, topo, PlannerOptions{}, qr);
  const auto ep64 = std::find_if(qplans.begin(), qplans.end(), [](const ParallelPlan& p) { return p.ep == 64; });
  REQUIRE(ep64 != qplans.end());
  const std::vector<int> ep_group = RankMapping(*ep64, nvl.gpus_per_node).ep_group(0, 0, 0);
  REQUIRE(ep_group.size() == 64);
  CHECK(ep_group.back() / 64 == ep_group.front() / 64);
  CHECK(group_link_params(topo, Collective::all_to_all, ep_group).busbw_Bps == doctest::Approx(722e9));

  // DGX B200: 8 GPUs per node, so a fixed TP 16 spans two nodes and is priced
  // at 8 rails of 46 GB/s (368 GB/s, below NVLS's 830).
  const Cluster dgx = load_cluster("topologies/dgx-b200.json", 2);
  const Topology dtopo(dgx);
  PlannerOptions d;
  SearchResult dr;
  const std::vector<ParallelPlan> searched = enumerate_plans(gpt3, dtopo, d, dr);
  CHECK(!searched.empty());
  CHECK(std::none_of(searched.begin(), searched.end(), [](const ParallelPlan& p) { return p.tp > 8; }));  // in a node
  d.tp = 16;
  const std::vector<ParallelPlan> dplans = enumerate_plans(gpt3, dtopo, d, dr);
  REQUIRE(!dplans.empty());
  const RankMapping dmap(dplans.front(), dgx.gpus_per_node);
  const LinkParams cross = group_link_params(dtopo, Collective::all_reduce, dmap.tp_group(0, 0));
  CHECK(cross.busbw_Bps == doctest::Approx(8 * 46e9));
  CHECK(cross.latency_ns == doctest::Approx(4000));
}
