// ZeRO-3 as the trainers run it (TrainerSettings::zero3_*): the gather
// schedule of a pass, the cost of one gather unit under each setting, the
// simulator's per-tensor gathers and host waits, its agreement with the
// analytical estimate, and the ranking against TP x PP that measurements of
// 2021 trainers show (docs/cost-model.md, "ZeRO-3 and FSDP as the trainers
// run them").
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/core/zero3.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/step.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/sim/simulator.hpp"
#include "builder.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::sim;

namespace {

const TrainerSettings& preset(const char* name) { return find_trainer(name)->settings; }

std::vector<std::uint32_t> issued(const Zero3PassPlan& p, std::size_t u) {
  const auto s = p.issued_at(u);
  return {s.begin(), s.end()};
}

// The test cluster of fixtures.hpp (4 DGX A100 under one leaf) with the
// A100 card's kernel launch (4.9 us) and a 2-layer GPT of h 4096: its FC1 is
// 4096 x 16384 = 67,108,864 weights, 134,217,728 bytes in 16 bits.
constexpr double kFc1Bytes = 4096.0 * 16384.0 * 2.0;

Cluster small_cluster() {
  Cluster c = test::dgx_a100(4);
  c.gpu.kernel_launch_ns = 4900;
  return c;
}

ParallelPlan zero3_plan(int dp, const TrainerSettings& t, std::int64_t batch = 0) {
  ParallelPlan p;
  p.tp = 1;
  p.pp = 1;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = batch > 0 ? batch : dp;
  p.seq_length = 2048;
  p.zero_stage = 3;
  p.recompute = Recompute::full;
  p.flash_attention = false;
  p.grad_accum_fusion = false;
  p.trainer = t;
  return p;
}

struct Task {
  std::string name;
  TimeNs start = 0, end = 0;
  int category = 0;  // detail::Category
};

// Every labelled task of one build (labels exist for traced stages only,
// so the options ask for a trace that is never written).
std::vector<Task> tasks_of(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan, TimeNs* end = nullptr) {
  SimOptions o;
  o.trace_path = "unused.json";
  detail::Builder b(m, topo, plan, o);
  b.build();
  Engine& eng = b.engine();
  const TimeNs e = eng.run().end_ns;
  if (end != nullptr) *end = e;
  std::vector<Task> out;
  for (const auto& [t, label] : b.labels()) {
    out.push_back(Task{label.name, eng.start_ns(t), eng.end_ns(t), static_cast<int>(b.meta()[t].category)});
  }
  return out;
}

std::vector<Task> named(const std::vector<Task>& tasks, const std::string& prefix) {
  std::vector<Task> out;
  for (const Task& t : tasks)
    if (t.name.rfind(prefix, 0) == 0) out.push_back(t);
  return out;
}

}  // namespace

TEST_CASE("the gather schedule: FSDP2 issues one block ahead and never waits") {
  const std::vector<Zero3Use> uses(4, Zero3Use{100, -1});
  const Zero3PassPlan p = plan_zero3_pass(uses, preset("torchtitan"));
  CHECK(issued(p, 0) == std::vector<std::uint32_t>{0, 1});  // the first on demand, the next prefetched
  CHECK(issued(p, 1) == std::vector<std::uint32_t>{2});
  CHECK(issued(p, 2) == std::vector<std::uint32_t>{3});
  CHECK(issued(p, 3).empty());
  for (std::size_t u = 0; u < uses.size(); ++u) {
    CHECK(p.gathered[u] == 1);
    CHECK(p.waits[u] == 0);
  }
}

TEST_CASE("the gather schedule: DeepSpeed v0.5.4 waits at every fetch and prefetches only with nothing in flight") {
  TrainerSettings s = preset("deepspeed-2021");
  // A layer as tensor units: the norm (resident), QKV, proj, FC1, FC2, twice.
  const std::vector<Zero3Use> uses{{0, -1}, {3e8, 1}, {1e8, 2}, {4e8, 3}, {4e8, 4},
                                   {0, -1}, {3e8, 5}, {1e8, 6}, {4e8, 7}, {4e8, 8}};
  const Zero3PassPlan p = plan_zero3_pass(uses, s);
  // Each weight is above the 5e7-element prefetch bucket: one ahead.
  // The resident norm waits for nothing; with nothing in flight it prefetches QKV.
  CHECK(p.waits[0] == 0);
  CHECK(issued(p, 0) == std::vector<std::uint32_t>{1});
  // Each weight waits for its own gather, then issues the next one.
  CHECK(issued(p, 1) == std::vector<std::uint32_t>{2});
  CHECK(issued(p, 2) == std::vector<std::uint32_t>{3});
  CHECK(issued(p, 4) == std::vector<std::uint32_t>{6});  // FC2 prefetches the next layer's QKV
  CHECK(issued(p, 5).empty());                           // QKV in flight: the norm prefetches nothing
  for (std::size_t u : {1, 2, 3, 4, 6, 7, 8, 9}) CHECK(p.waits[u] == 1);
  // Small tensors share one prefetch: the bucket takes the next ones until it
  // reaches 5e7 elements, and one wait completes them all.
  const std::vector<Zero3Use> small{{2e7, 1}, {2e7, 2}, {2e7, 3}, {2e7, 4}, {2e7, 5}};
  const Zero3PassPlan q = plan_zero3_pass(small, s);
  CHECK(issued(q, 0) == std::vector<std::uint32_t>{0, 1, 2, 3});  // on demand, then 2e7 + 2e7 + 2e7 >= 5e7
  CHECK(q.waits[0] == 1);
  CHECK(q.waits[1] == 1);  // one wait completes the three in flight
  CHECK(q.waits[2] == 0);
  CHECK(q.waits[3] == 0);
  CHECK(issued(q, 1) == std::vector<std::uint32_t>{4});  // nothing in flight again
  CHECK(q.waits[4] == 1);
  // No bound at all: no prefetch, each unit fetched when reached.
  s.zero3_prefetch_units = 0;
  s.zero3_prefetch_params = 0;
  const Zero3PassPlan r = plan_zero3_pass(small, s);
  for (std::size_t u = 0; u < small.size(); ++u)
    CHECK(issued(r, u) == std::vector<std::uint32_t>{static_cast<std::uint32_t>(u)});
}

TEST_CASE("the gather schedule: a tensor reused within the reuse distance stays gathered") {
  // A layer's backward pass: recompute QKV, proj, FC1, FC2, then backward FC2, FC1, proj, QKV.
  const double qkv = 3e8, proj = 1e8, fc = 4e8;
  const std::vector<Zero3Use> uses{{qkv, 0}, {proj, 1}, {fc, 2}, {fc, 3}, {fc, 3}, {fc, 2}, {proj, 1}, {qkv, 0}};
  TrainerSettings s = preset("deepspeed-2021");
  auto gathered = [&](std::int64_t reuse) {
    s.zero3_reuse_params = reuse;
    const Zero3PassPlan p = plan_zero3_pass(uses, s);
    return std::vector<int>(p.gathered.begin(), p.gathered.end());
  };
  // Distances: FC2 0, FC1 2 x 4e8, proj 2 x (4e8 + 4e8), QKV 2 x (1e8 + 4e8 + 4e8).
  CHECK(gathered(0) == std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1});
  CHECK(gathered(1'000'000'000) == std::vector<int>{1, 1, 1, 1, 0, 0, 1, 1});  // DeepSpeed's 1e9
  CHECK(gathered(2'000'000'000) == std::vector<int>{1, 1, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("the copy kernels of a list-form collective: one per rank, each a kernel launch and its bytes") {
  GpuProfile g = test::a100();  // HBM 2039 GB/s at 0.8: 1631.2 GB/s
  g.kernel_launch_ns = 4900;    // the A100 card's kernel_launch_us
  // 32 ranks, 128 MiB: each copies 4 MiB in and out, 8 MiB / 1631.2 GB/s = 5,143 ns, + 4,900 ns launch.
  CHECK(list_collective_copies_ns(g, kFc1Bytes, 32) == 32 * (5143 + 4900));
  // 1,536 ranks of GPT-3's FC1 (1,207,959,552 bytes): 1,573,000 bytes in and out each, 964 ns + 4,900 ns.
  CHECK(list_collective_copies_ns(g, 12288.0 * 49152.0 * 2.0, 1536) == 1536 * (964 + 4900));
  CHECK(list_collective_copies_ns(g, kFc1Bytes, 1) == 0);
}

TEST_CASE("one gather unit under each setting, by hand") {
  const ModelSpec m = test::gpt(2, 4096, 32);
  const Topology topo(small_cluster());
  const GpuProfile& gpu = topo.cluster().gpu;
  // The DP ring of 32 ranks on 4 nodes under one leaf: 8 rails of 24 GB/s,
  // 192 GB/s busbw, 31 steps of 3 us: 31/32 x 128 MiB / 192 GB/s + 93 us = 770.7 us.
  const double ring_fc1_ns = 31.0 / 32.0 * kFc1Bytes / 192e9 * 1e9 + 31 * 3000.0;
  RankMapping map(zero3_plan(32, preset("torchtitan")), 8);
  const LinkParams link = group_link_params(topo, Collective::all_gather, map.dp_group(0, 0));
  CHECK(static_cast<double>(collective_time_ns(Collective::all_gather, kFc1Bytes, 32, link)) ==
        doctest::Approx(ring_fc1_ns).epsilon(1e-6));

  SUBCASE("FSDP2: the layer as one unit, no host work") {
    const std::vector<Task> t = tasks_of(m, topo, zero3_plan(32, preset("torchtitan")));
    const std::vector<Task> g = named(t, "zero3_gather layer 0");
    REQUIRE(g.size() == 2);  // forward, and recompute + backward
    const double bytes = static_cast<double>(m.parameters_per_layer()) * 2.0;
    for (const Task& x : g) {
      CHECK(x.name == "zero3_gather layer 0");
      const auto alone = static_cast<double>(collective_time_ns(Collective::all_gather, bytes, 32, link));
      CHECK(static_cast<double>(x.end - x.start) == doctest::Approx(alone).epsilon(0.01));
    }
    CHECK(named(t, "zero3_zero_fill").empty());
    CHECK(named(t, "zero3_gather_copies").empty());
  }
  SUBCASE("DeepSpeed v0.5.4: FC1 alone, zero-filled, gathered, copied out rank by rank") {
    const std::vector<Task> t = tasks_of(m, topo, zero3_plan(32, preset("deepspeed-2021")));
    const std::vector<Task> g = named(t, "zero3_gather layer 0 fc1");
    REQUIRE(!g.empty());
    // The bias (16,384 elements) is below the 1e5 persistence threshold: the weight alone.
    CHECK(static_cast<double>(g[0].end - g[0].start) == doctest::Approx(ring_fc1_ns).epsilon(0.01));
    // torch.zeros of 128 MiB: 134,217,728 B / 1631.2 GB/s = 82,282 ns, + 4,900 ns launch.
    const std::vector<Task> z = named(t, "zero3_zero_fill layer 0 fc1");
    REQUIRE(!z.empty());
    CHECK(z[0].end - z[0].start == 82282 + 4900);
    CHECK(z[0].end - z[0].start == memory_bound_time_ns(gpu, kFc1Bytes));
    // 32 copy kernels (see the list-form test): 321,376 ns on the compute stream.
    const std::vector<Task> h = named(t, "zero3_gather_copies layer 0 fc1");
    REQUIRE(!h.empty());
    CHECK(h[0].end - h[0].start == 32 * (5143 + 4900));
    // The gather starts when the zero fill ends, the copies with it.
    CHECK(g[0].start == z[0].end);
    CHECK(h[0].start == z[0].end);
    // Each fetch of FC1 (forward, recompute, backward) reads it once more for the debug message's norm.
    const std::vector<Task> n = named(t, "zero3_fetch_norm layer 0 fc1");
    CHECK(n.size() == 3);
    for (const Task& x : n) CHECK(x.end - x.start == 82282 + 4900);
  }
  SUBCASE("per-tensor units without the host's waits: no zero fill, no copies") {
    TrainerSettings s = preset("deepspeed-2021");
    s.zero3_sync = false;
    s.zero3_list_collectives = false;
    const std::vector<Task> t = tasks_of(m, topo, zero3_plan(32, s));
    CHECK(!named(t, "zero3_gather layer 0 fc1").empty());
    CHECK(named(t, "zero3_zero_fill").empty());
    CHECK(named(t, "zero3_gather_copies").empty());
    CHECK(named(t, "grad reduce copies").empty());
  }
}

TEST_CASE("per-tensor units: four gathers per layer, the reuse distance keeps some for the backward") {
  const ModelSpec m = test::gpt(2, 4096, 32);
  const Topology topo(small_cluster());
  auto count = [&](std::int64_t reuse) {
    TrainerSettings s = preset("deepspeed-2021");
    s.zero3_reuse_params = reuse;
    std::map<std::string, int> n;
    for (const Task& t : named(tasks_of(m, topo, zero3_plan(32, s)), "zero3_gather layer 1 ")) ++n[t.name];
    return n;
  };
  // One micro-batch. Forward QKV, proj, FC1, FC2; the backward pass gathers
  // each again for the recompute and, unless kept, for its backward. At h
  // 4096 the distances are FC2 0, FC1 2 x 6.7e7, proj 2.7e8, QKV 3.2e8.
  const std::map<std::string, int> none = count(0);
  CHECK(none.size() == 4);
  for (const char* w : {"qkv", "proj", "fc1", "fc2"}) CHECK(none.at(std::string("zero3_gather layer 1 ") + w) == 3);
  const std::map<std::string, int> fc2_kept = count(100'000'000);
  CHECK(fc2_kept.at("zero3_gather layer 1 fc2") == 2);
  CHECK(fc2_kept.at("zero3_gather layer 1 fc1") == 3);
  const std::map<std::string, int> all_kept = count(1'000'000'000);  // DeepSpeed's default at this size
  for (const auto& [name, n] : all_kept) CHECK(n == 2);
}

TEST_CASE("DeepSpeed v0.5.4 reduce-scatters each parameter tensor on its own; FSDP2 one per block") {
  const ModelSpec m = test::gpt(2, 4096, 32);
  const Topology topo(small_cluster());
  auto reductions = [&](const TrainerSettings& s) {
    return named(tasks_of(m, topo, zero3_plan(32, s)), "grad bucket").size();
  };
  // One micro-batch: per layer 4 weights, 4 biases and 2 LayerNorms' weights
  // and biases, plus the embedding and the LM head.
  CHECK(reductions(preset("deepspeed-2021")) == 2 * 12 + 2);
  TrainerSettings buckets = preset("deepspeed-2021");
  buckets.zero3_reduce_per_tensor = false;  // the 5e8-element buckets, one collective each
  CHECK(reductions(buckets) < 2 * 12 + 2);
  CHECK(reductions(preset("torchtitan")) == 2 + 2);
  // Each list-form reduce-scatter has its per-rank copies before it.
  CHECK(named(tasks_of(m, topo, zero3_plan(32, preset("deepspeed-2021"))), "grad reduce copies").size() == 2 * 12 + 2);
}

TEST_CASE("the host's wait exposes the gathers: none runs beside the compute issued before it") {
  const ModelSpec m = test::gpt(2, 4096, 32);
  const Topology topo(small_cluster());
  auto overlapped = [&](const std::vector<Task>& tasks) {
    int n = 0;
    for (const Task& g : named(tasks, "zero3_gather")) {
      for (const Task& c : tasks) {
        if (c.category == 1 && c.start < g.start && c.end > g.start) ++n;  // compute running when the gather starts
      }
    }
    return n;
  };
  TrainerSettings s = preset("deepspeed-2021");
  s.zero3_list_collectives = false;
  TimeNs with_wait = 0, without = 0;
  const std::vector<Task> synced = tasks_of(m, topo, zero3_plan(32, s, 64), &with_wait);
  s.zero3_sync = false;
  const std::vector<Task> free = tasks_of(m, topo, zero3_plan(32, s, 64), &without);
  CHECK(overlapped(synced) == 0);
  CHECK(overlapped(free) > 0);
  CHECK(with_wait > without);
}

TEST_CASE("the simulator and the analytical estimate agree on ZeRO-3 plans") {
  const ModelSpec m = load_model(test::source_root() / "models" / "gpt3-175b.json");
  const Topology topo(load_cluster(test::source_root() / "topologies" / "dgx-a100-superpod.json", 48));
  struct Case {
    const char* trainer;
    int tp, mb;
  };
  for (const Case c : {Case{"deepspeed-2021", 1, 1}, Case{"deepspeed-2021", 4, 2}, Case{"torchtitan", 1, 1},
                       Case{"megatron-core", 2, 1}}) {
    PlannerOptions o;
    o.trainer = c.trainer;
    o.tp = c.tp;
    o.pp = 1;
    o.micro_batch = c.mb;
    o.zero_stage = 3;
    o.recompute = Recompute::full;
    o.global_batch = 1536;
    const ParallelPlan p = plan_from_options(m, topo.cluster(), o);
    const Estimate sim = simulate(m, topo, p);
    const Estimate est = estimate(m, topo, p);
    INFO(c.trainer << " TP " << c.tp << " mb " << c.mb << ": simulated " << sim.iteration_time_s << " s, estimated "
                   << est.iteration_time_s << " s");
    CHECK(est.iteration_time_s == doctest::Approx(sim.iteration_time_s).epsilon(0.03));
    // The DP collectives' SMs slow the compute beside them: where the DP
    // stream is the longer of the two, the simulator shows that as compute
    // and less exposed DP time, the estimate (which slows a step only while
    // the collectives queued at its start last) a little less so. Their sum
    // agrees closely; the split within 12 %.
    CHECK(est.breakdown.compute_s + est.breakdown.dp_comm_s ==
          doctest::Approx(sim.breakdown.compute_s + sim.breakdown.dp_comm_s).epsilon(0.03));
    CHECK(est.breakdown.dp_comm_s == doctest::Approx(sim.breakdown.dp_comm_s).epsilon(0.12));
  }
}

// GPT-3 175B, batch 1536, micro-batch 1, full recomputation, on a DGX A100
// SuperPOD: DeepSpeed-2021's ZeRO-3 (TP 1, PP 1) against Megatron-LM 2021's
// TP 8 x PP 8 (interleaved, v 3). Measured (held out of the repository):
// ZeRO-3 slower than TP x PP, and more so with scale. No constant here is
// tuned: the figures follow from the mechanisms and the cards.
TEST_CASE("GPT-3 175B: DeepSpeed-2021's ZeRO-3 against Megatron's TP x PP at 384 and 1,536 GPUs") {
  const ModelSpec m = load_model(test::source_root() / "models" / "gpt3-175b.json");
  struct Result {
    Estimate sim, est;
  };
  auto run = [&](int nodes, const char* trainer, int tp, int pp) {
    const Topology topo(load_cluster(test::source_root() / "topologies" / "dgx-a100-superpod.json", nodes));
    PlannerOptions o;
    o.trainer = trainer;
    o.tp = tp;
    o.pp = pp;
    o.micro_batch = 1;
    o.recompute = Recompute::full;
    o.global_batch = 1536;
    if (pp > 1) {
      o.schedule = Schedule::interleaved;
      o.virtual_stages = 3;
    } else {
      o.zero_stage = 3;
    }
    const ParallelPlan p = plan_from_options(m, topo.cluster(), o);
    Estimator score(m, topo);
    return Result{simulate(m, topo, p), score(p)};
  };
  const Result z384 = run(48, "deepspeed-2021", 1, 1), z1536 = run(192, "deepspeed-2021", 1, 1);
  const Result t384 = run(48, "megatron-2021", 8, 8), t1536 = run(192, "megatron-2021", 8, 8);
  const std::vector<std::pair<std::string, const Result*>> all{
      {"ZeRO-3 384", &z384}, {"ZeRO-3 1536", &z1536}, {"TP x PP 384", &t384}, {"TP x PP 1536", &t1536}};
  for (const auto& [name, r] : all) {
    MESSAGE(name << ": simulated " << r->sim.iteration_time_s << " s, " << r->sim.hardware_tflops_per_gpu
                 << " TFLOP/s (hardware), estimated " << r->est.iteration_time_s << " s");
  }
  for (const bool simulated : {true, false}) {
    auto pick = [&](const Result& r) -> const Estimate& { return simulated ? r.sim : r.est; };
    INFO((simulated ? "simulated" : "analytical"));
    // 384 GPUs: ZeRO-3 no faster than TP x PP (within 5 %).
    CHECK(pick(z384).iteration_time_s >= 0.95 * pick(t384).iteration_time_s);
    // 1,536 GPUs: clearly slower.
    CHECK(pick(z1536).iteration_time_s >= 1.2 * pick(t1536).iteration_time_s);
    // Its throughput per GPU falls substantially with the DP size; TP x PP's barely.
    CHECK(pick(z1536).model_tflops_per_gpu <= 0.8 * pick(z384).model_tflops_per_gpu);
    CHECK(pick(t1536).model_tflops_per_gpu >= 0.9 * pick(t384).model_tflops_per_gpu);
  }
  // FSDP2 (torchtitan) on the same plan barely degrades: the mechanisms, not the sharding, cost DeepSpeed-2021.
  const Result f384 = run(48, "torchtitan", 1, 1), f1536 = run(192, "torchtitan", 1, 1);
  CHECK(f1536.sim.model_tflops_per_gpu >= 0.95 * f384.sim.model_tflops_per_gpu);
}

// Megatron-FSDP of a mixture-of-experts model (docs/cost-model.md, "ZeRO-3
// of a mixture-of-experts model"): the small Mixtral of fixtures.hpp (4 MoE
// layers, h 1024, 16 heads of 64 with 4 KV heads, 8 SwiGLU experts of FFN
// 2048, RMSNorm, vocab 32,000 untied) on 4 GPUs, TP 1, EP 2 (ETP 1) over DP
// 4: expert-DP 2. Two micro-batches of 2,048 tokens per rank.
namespace {

ParallelPlan moe_fsdp_plan() {
  ParallelPlan p;
  p.tp = 1;
  p.pp = 1;
  p.dp = 4;
  p.ep = 2;
  p.etp = 1;
  p.micro_batch = 1;
  p.global_batch = 8;
  p.seq_length = 2048;
  p.recompute = Recompute::none;
  p.zero_stage = 3;
  p.trainer = preset("megatron-core");
  return p;
}

// One DGX A100 node of four GPUs.
Cluster four_gpus() {
  Cluster c = test::dgx_a100(1);
  c.gpus_per_node = 4;
  return c;
}

}  // namespace

TEST_CASE("Megatron-FSDP of an MoE model by hand: EP 2 over DP 4, the experts sharded over expert-DP 2") {
  const ModelSpec m = test::small_mixtral_model();
  const ParallelPlan p = moe_fsdp_plan();
  REQUIRE(p.expert_dp() == 2);
  const std::optional<PlanRejection> why = check_plan(p, m, four_gpus());
  INFO((why ? describe(*why, m, four_gpus()) : std::string("valid")));
  CHECK_FALSE(why.has_value());
  // Per layer: attention 1024 x (1024 + 2 x 256) + 1024 x 1024 = 2,621,440,
  // two RMSNorms 2,048, router 8 x 1024 = 8,192: 2,631,680 over DP; the
  // routed experts 8 x 3 x 1024 x 2048 / EP 2 = 25,165,824 over expert-DP.
  const StageParameters layer = layer_parameter_split(m, p, true);
  CHECK(layer.dense == 2'631'680.0);
  CHECK(layer.expert == 25'165'824.0);
  // The stage: 4 layers, the embedding and LM head 2 x 32,000 x 1024, the
  // final norm 1024.
  const StageParameters sp = stage_parameters(m, p, 0);
  CHECK(sp.dense == 4 * 2'631'680.0 + 65'536'000.0 + 1024.0);  // 76,063,744
  CHECK(sp.expert == 100'663'296.0);
  // Weights 2, gradients 2 (Megatron-FSDP's default: the parameters'
  // bf16), optimizer states 12 bytes per parameter, each sharded over its
  // group: dense / 4, experts / 2.
  const double dense_bytes = 76'063'744.0 * (2 + 2 + 12) / 4;   // 38,031,872 + 38,031,872 + 228,191,232
  const double expert_bytes = 100'663'296.0 * (2 + 2 + 12) / 2;  // 100,663,296 + 100,663,296 + 603,979,776
  CHECK(dense_bytes == 304'254'976.0);
  CHECK(expert_bytes == 805'306'368.0);
  // And the gathered units: an MoE block, 2,631,680 + 25,165,824 =
  // 27,797,504 elements, gathered in bf16 with the 3 blocks after it on the
  // stage (Megatron-FSDP prefetches until 5e8 elements: 18 would do), and
  // its bf16 gradients: x (2 x 4 + 2).
  const double units = 27'797'504.0 * 10;  // 277,975,040
  CHECK(zero3_gathered_bytes(m, p, 0) == units);
  CHECK(memory_per_gpu(m, p, four_gpus().gpu).weight_and_optimizer_bytes == dense_bytes + expert_bytes + units);
  // With --fsdp-grad-dtype fp32: 4 bytes per gradient, 2 more per parameter.
  ParallelPlan fp32 = p;
  fp32.trainer.fsdp_grad_bytes = 4;
  CHECK(memory_per_gpu(m, fp32, four_gpus().gpu).weight_and_optimizer_bytes ==
        dense_bytes + expert_bytes + 76'063'744.0 * 2 / 4 + 100'663'296.0 * 2 / 2 + 27'797'504.0 * 12);
  // FP8 with --fp8-param-gather: the quantized weights' shards FP8 (1 byte
  // less), each over its group: the attention's 4 x (1024 x 1536 + 1024 x
  // 1024) = 10,485,760 linear weights over DP, the experts' 4 x 25,165,824
  // over expert-DP (the router and the LM head stay bf16).
  ParallelPlan fp8 = p;
  fp8.precision = Precision::fp8_delayed;
  fp8.fp8_param_gather = true;
  CHECK(memory_per_gpu(m, fp8, four_gpus().gpu).weight_and_optimizer_bytes ==
        dense_bytes + expert_bytes - 10'485'760.0 / 4 - 100'663'296.0 / 2 + units);

  // The step: per micro-batch, each pass gathers every unit's dense part
  // over DP (bf16) and each MoE layer's experts over expert-DP; each
  // backward reduce-scatters the gradients (bf16) on the same groups.
  const StepDescription step(m, p, nullptr);
  std::map<std::string, StepCollective, std::less<>> by_name;
  const StageStep stage = step.stage(0);
  for (const StepCollective& c : stage.collectives()) by_name.emplace(std::string(c.name), c);
  REQUIRE(by_name.count("zero3 gather") == 1);
  REQUIRE(by_name.count("zero3 gather (experts)") == 1);
  const StepCollective& dense_gather = by_name.at("zero3 gather");
  const StepCollective& expert_gather = by_name.at("zero3 gather (experts)");
  CHECK(dense_gather.group == StepGroup::dp);
  CHECK(dense_gather.ranks == 4);
  CHECK(dense_gather.bytes == 2 * 76'063'744.0);
  CHECK(dense_gather.issues == 4.0);  // 2 micro-batches x forward and backward
  CHECK(expert_gather.group == StepGroup::expert_dp);
  CHECK(expert_gather.ranks == 2);
  CHECK(expert_gather.bytes == 2 * 100'663'296.0);
  CHECK(expert_gather.issues == 4.0);
  CHECK(by_name.at("grad reduce").bytes == 2 * 76'063'744.0);
  CHECK(by_name.at("grad reduce (experts)").bytes == 2 * 100'663'296.0);
  CHECK(by_name.at("grad reduce (experts)").ranks == 2);

  // The simulator plays each layer's two gathers, the dense part's
  // 2 x 2,631,680 = 5,263,360 bytes over DP and the experts'
  // 2 x 25,165,824 = 50,331,648 bytes over expert-DP, and each backward's
  // two reduce-scatters: over the iteration what the step describes.
  const Topology topo(four_gpus());
  const SimOptions options;
  detail::Builder b(m, topo, p, options);
  b.build();
  CHECK(b.played_bytes(0, StepGroup::expert_dp, Collective::all_gather) == doctest::Approx(4 * 4 * 50'331'648.0));
  CHECK(b.played_bytes(0, StepGroup::dp, Collective::all_gather) == doctest::Approx(4 * 152'127'488.0));
  CHECK(b.played_bytes(0, StepGroup::expert_dp, Collective::reduce_scatter) ==
        doctest::Approx(2 * 4 * 2 * 25'165'824.0));
  CHECK(b.played_bytes(0, StepGroup::dp, Collective::reduce_scatter) == doctest::Approx(2 * 2 * 76'063'744.0));
  const std::vector<Task> tasks = tasks_of(m, topo, p);
  CHECK(named(tasks, "zero3_gather layer 2 (experts)").size() == 4);
  CHECK(named(tasks, "zero3_gather layer 2").size() == 8);  // with the experts' four

  // The analytical estimate plays the same passes.
  const Estimate sim = simulate(m, topo, p);
  const Estimate est = estimate(m, topo, p);
  INFO("simulated " << sim.iteration_time_s << " s, estimated " << est.iteration_time_s << " s");
  CHECK(std::abs(est.iteration_time_s / sim.iteration_time_s - 1) < 0.03);
}

TEST_CASE("Megatron-FSDP of an MoE model across nodes: expert-DP over InfiniBand, estimate and simulation agree") {
  // Qwen3-30B-A3B on 2 DGX H100, EP 8 inside a node, expert-DP 2 across the
  // two: every MoE layer gathers 16 experts' weights over InfiniBand.
  const ModelSpec m = load_model(test::source_root() / "models" / "qwen3-30b-a3b.json");
  const Topology topo(load_cluster(test::source_root() / "topologies" / "dgx-h100.json", 2));
  PlannerOptions o;
  o.trainer = "megatron-core";
  o.tp = 1;
  o.pp = 1;
  o.ep = 8;
  o.dp = 16;
  o.micro_batch = 1;
  o.zero_stage = 3;
  o.recompute = Recompute::none;
  o.moe_dispatcher = MoeDispatcher::alltoall;
  o.global_batch = 256;
  o.seq_length = 4096;
  const ParallelPlan p = plan_from_options(m, topo.cluster(), o);
  REQUIRE(p.expert_dp() == 2);
  const Estimate sim = simulate(m, topo, p);
  const Estimate est = estimate(m, topo, p);
  INFO("simulated " << sim.iteration_time_s << " s, estimated " << est.iteration_time_s << " s");
  CHECK(std::abs(est.iteration_time_s / sim.iteration_time_s - 1) < 0.05);
  // ZeRO-3 costs more than ZeRO-1 here: the gathers over InfiniBand show.
  o.zero_stage = 1;
  const Estimate zero1 = simulate(m, topo, plan_from_options(m, topo.cluster(), o));
  CHECK(sim.breakdown.dp_comm_s > zero1.breakdown.dp_comm_s);
}

TEST_CASE("ZeRO-3 of an MoE model by weight tensor (DeepSpeed) stays refused") {
  const ModelSpec m = test::small_mixtral_model();
  ParallelPlan p = moe_fsdp_plan();
  p.trainer = preset("deepspeed-2021");
  p.flash_attention = false;  // DeepSpeed-2021 runs neither, nor EP: the experts whole, expert-DP = DP
  p.grad_accum_fusion = false;
  p.ep = 1;
  const std::optional<PlanRejection> why = check_plan(p, m, four_gpus());
  REQUIRE(why.has_value());
  CHECK(why->field == PlanField::zero_stage);
  CHECK(describe(*why, m, four_gpus()).find("ZeRO-3 of a mixture-of-experts model") != std::string::npos);
}
