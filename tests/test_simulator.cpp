// The discrete-event simulator: determinism, bounds, the direction of each
// effect (schedule, interleaving, straggler, DP overlap), the breakdown, the
// trace of a real plan, and a printed comparison with Korthikanti et al. 2022
// (tests/data/reference/korthikanti2022.csv).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/schedule.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "fixtures.hpp"
#include "reference_data.hpp"
#include "busiest.hpp"

using namespace cuboid;
using namespace cuboid::sim;

namespace {

std::filesystem::path root() { return test::source_root(); }

ModelSpec model(const std::string& name) { return load_model(root() / "models" / (name + ".json")); }
Topology cluster(const std::string& card, int nodes) { return Topology(load_cluster(root() / "topologies" / card, nodes)); }

ParallelPlan plan_of(const ModelSpec& m, int tp, int pp, int dp, std::int64_t batch, int mb = 1) {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = mb;
  p.global_batch = batch;
  p.seq_length = m.seq_length;
  p.recompute = Recompute::selective;
  p.sequence_parallel = tp > 1;
  p.schedule = Schedule::one_f_one_b;
  return p;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("cuboid-sim-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("uneven stages in interleaved chunks: the same layers, a bubble cut by the chunks") {
  // Llama 3.1 405B's 126 layers on PP 16 with 64 micro-batches: 1F1B as
  // 7 + 14 x 8 + 7, interleaved as 8 + 14 x 8 + 6 in 2 chunks per stage.
  const ModelSpec m = model("llama3.1-405b");
  const Topology topo = cluster("h100-roce-24k.json", 64);
  ParallelPlan one = plan_of(m, 8, 16, 4, 256);
  one.recompute = Recompute::full;
  one.first_stage_layers = 7;
  one.last_stage_layers = 7;
  ParallelPlan two = one;
  two.schedule = Schedule::interleaved;
  two.virtual_stages = 2;
  two.first_stage_layers = 8;
  two.last_stage_layers = 6;
  const Estimate a = simulate(m, topo, one);
  const Estimate b = simulate(m, topo, two);
  // The critical stage holds 8 layers in both (which stage it is, and so its
  // slowest GPU's pace, may differ); interleaving halves the (PP - 1) / m
  // bubble and adds a p2p exchange per chunk.
  CHECK(b.breakdown.compute_s == doctest::Approx(a.breakdown.compute_s).epsilon(0.02));
  CHECK(b.breakdown.bubble_s < 0.6 * a.breakdown.bubble_s);
  CHECK(b.breakdown.bubble_s > 0.4 * a.breakdown.bubble_s);
  CHECK(b.iteration_time_s < a.iteration_time_s);
  // The analytical estimate agrees on the bubble's halving.
  const Estimate ea = estimate(m, topo, one);
  const Estimate eb = estimate(m, topo, two);
  CHECK(eb.breakdown.bubble_s == doctest::Approx(ea.breakdown.bubble_s / 2).epsilon(0.02));
}

TEST_CASE("two runs give identical results and byte-identical traces") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 4);
  ParallelPlan p = plan_of(m, 8, 4, 1, 16);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 2;
  const auto dir = temp_dir();
  SimOptions o;
  o.trace_path = dir / "a.json";
  const SimResult a = run_simulation(m, topo, p, o);
  o.trace_path = dir / "b.json";
  const SimResult b = run_simulation(m, topo, p, o);
  CHECK(a.estimate.iteration_time_s == b.estimate.iteration_time_s);
  CHECK(a.estimate.breakdown.bubble_s == b.estimate.breakdown.bubble_s);
  CHECK(a.events == b.events);
  CHECK(slurp(dir / "a.json") == slurp(dir / "b.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the breakdown sums to the iteration time and the estimate is marked simulated") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 8);
  ParallelPlan p = plan_of(m, 8, 4, 2, 32);
  p.zero_stage = 1;
  const Estimate e = simulate(m, topo, p);
  CHECK(e.simulated);
  CHECK(e.iteration_time_s > 0);
  CHECK(e.breakdown.total() == doctest::Approx(e.iteration_time_s).epsilon(1e-9));
  CHECK(e.breakdown.compute_s > 0);
  CHECK(e.breakdown.tp_comm_s > 0);
  CHECK(e.breakdown.bubble_s > 0);
  CHECK(e.breakdown.optimizer_s > 0);
  CHECK(e.mfu > 0.2);
  CHECK(e.mfu < 1.0);
  CHECK(e.memory.total_bytes > 0);
}

TEST_CASE("the busiest links: highest peaks first, ties in link order, as a stable sort of all") {
  // Peaks from a handful of values, so most links tie with others.
  std::vector<LinkStats> links(1000);
  std::uint64_t x = 12345;
  for (LinkStats& st : links) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    st.peak_utilisation = static_cast<double>((x >> 33) % 7) / 6.0;
    st.bytes = static_cast<double>(x >> 40);
  }
  for (std::size_t n : {0, 3, 8, 1000}) {
    CAPTURE(n);
    detail::BusiestLinks<8> top;
    std::vector<LinkId> all;
    for (LinkId l = 0; l < n; ++l) {
      top.offer(l, links[l]);
      all.push_back(l);
    }
    std::stable_sort(all.begin(), all.end(), [&](LinkId a, LinkId b) {
      return links[a].peak_utilisation > links[b].peak_utilisation;
    });
    REQUIRE(top.size() == std::min<std::size_t>(n, 8));
    for (std::size_t i = 0; i < top.size(); ++i) {
      CHECK(top[i].link == all[i]);
      CHECK(top[i].stats.bytes == links[all[i]].bytes);
    }
    // Offered in another order (reversed, then strided, as folded rails offer
    // them per rail-0 image): the same eight.
    for (int order = 0; order < 2; ++order) {
      detail::BusiestLinks<8> other;
      if (order == 0) {
        for (std::size_t l = n; l-- > 0;) other.offer(static_cast<LinkId>(l), links[l]);
      } else {
        for (std::size_t first = 0; first < 7; ++first) {
          for (std::size_t l = first; l < n; l += 7) {
            if (other.could_take(links[l].peak_utilisation, static_cast<LinkId>(l))) other.offer(static_cast<LinkId>(l), links[l]);
          }
        }
      }
      REQUIRE(other.size() == top.size());
      for (std::size_t i = 0; i < top.size(); ++i) CHECK(other[i].link == top[i].link);
    }
  }
}

TEST_CASE("the report's busiest links each stay within their kind's peak") {
  // PP and DP across 8 nodes: InfiniBand, GPU-NIC and (TP) NVLink traffic.
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 8);
  ParallelPlan p = plan_of(m, 8, 4, 2, 32);
  p.zero_stage = 1;
  const SimResult r = run_simulation(m, topo, p);
  REQUIRE(r.busiest_links.size() == 8);
  CHECK(r.peak_ib_utilisation > 0);
  CHECK(r.peak_pcie_utilisation > 0);
  CHECK(r.busiest_links.front().peak_utilisation >= std::max(r.peak_ib_utilisation, r.peak_pcie_utilisation));
  for (const LinkUtilisation& u : r.busiest_links) {
    CAPTURE(u.name);
    CHECK(u.bytes > 0);
    CHECK(u.capacity_Bps > 0);
    const double kind_peak = u.kind == "nvlink" ? r.peak_nvlink_utilisation
                             : u.kind == "pcie" ? r.peak_pcie_utilisation
                                                : r.peak_ib_utilisation;
    CHECK(u.peak_utilisation <= kind_peak);
  }
}

TEST_CASE("rail folding gives exactly the results of walking every route") {
  struct Case {
    const char* model;
    const char* card;
    int nodes, tp, pp, dp;
    std::int64_t batch;
    bool folds;
  };
  const Case cases[] = {
      // TP 8 fills each node: every DP, pipeline and embedding group folds.
      {"llama3.1-405b", "h100-roce-24k.json", 32, 8, 4, 8, 64, true},
      {"gpt-22b", "dgx-a100-superpod.json", 8, 8, 4, 2, 32, true},
      {"gpt-22b", "dgx-a100-superpod.json", 16, 8, 2, 8, 64, true},  // with a straggler (rank 13)
      // TP 4 leaves half a node to another replica: not folded, same answer.
      {"gpt-22b", "dgx-a100-superpod.json", 4, 4, 4, 2, 32, false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.model);
    CAPTURE(c.nodes);
    CAPTURE(c.tp);
    const ModelSpec m = model(c.model);
    const Topology topo = cluster(c.card, c.nodes);
    ParallelPlan base = plan_of(m, c.tp, c.pp, c.dp, c.batch);
    base.seq_length = std::min<std::int64_t>(base.seq_length, 4096);
    base.zero_stage = 1;
    base.recompute = Recompute::full;
    for (int variant = 0; variant < 4; ++variant) {
      CAPTURE(variant);
      SimOptions o;
      if (c.nodes == 16) o.straggler = Straggler{13, 1.3};
      ParallelPlan p = base;
      if (variant == 1) {  // interleaved: the pipeline's wrap-around hop
        p.schedule = Schedule::interleaved;
        p.virtual_stages = 2;
      } else if (variant == 2) {  // ZeRO-3 gathers, DP reduction after backward
        p.zero_stage = 3;
        p.trainer.dp_overlap = false;
      } else if (variant == 3) {  // DP innermost: TP groups span two nodes, their traffic on the network: not folded
        p.order = RankOrder::parse("dp-tp-pp", "test", "rank_order");
      }
      const SimResult folded = run_simulation(m, topo, p, o);
      o.fold_rails = false;
      const SimResult full = run_simulation(m, topo, p, o);
      CHECK(folded.rails_folded == (c.folds && variant != 3));
      CHECK_FALSE(full.rails_folded);
      CHECK(folded.estimate.iteration_time_s == full.estimate.iteration_time_s);
      CHECK(folded.estimate.breakdown.dp_comm_s == full.estimate.breakdown.dp_comm_s);
      CHECK(folded.estimate.breakdown.pp_comm_s == full.estimate.breakdown.pp_comm_s);
      CHECK(folded.estimate.breakdown.bubble_s == full.estimate.breakdown.bubble_s);
      CHECK(folded.events == full.events);
      CHECK(folded.flows == full.flows);
      CHECK(folded.solves == full.solves);
      CHECK(folded.peak_ib_utilisation == full.peak_ib_utilisation);
      CHECK(folded.peak_pcie_utilisation == full.peak_pcie_utilisation);
      CHECK(folded.peak_nvlink_utilisation == full.peak_nvlink_utilisation);
      REQUIRE(folded.busiest_links.size() == full.busiest_links.size());
      for (std::size_t i = 0; i < full.busiest_links.size(); ++i) {
        CHECK(folded.busiest_links[i].name == full.busiest_links[i].name);
        CHECK(folded.busiest_links[i].bytes == full.busiest_links[i].bytes);
        CHECK(folded.busiest_links[i].peak_utilisation == full.busiest_links[i].peak_utilisation);
      }
      for (std::size_t s = 0; s < full.stages.size(); ++s) {
        CHECK(folded.stages[s].end_s == full.stages[s].end_s);
        CHECK(folded.stages[s].dp_busy_s == full.stages[s].dp_busy_s);
        CHECK(folded.stages[s].pp_busy_s == full.stages[s].pp_busy_s);
      }
    }
  }
}

TEST_CASE("the optimizer step moves 50 bytes per parameter in the estimate and the simulation") {
  // The 22B model on one DGX A100 (TP 8): Megatron's step over the GPU's
  // parameters, fp32 grad buffer scaled (8 B) and zeroed (4), grad norm (4),
  // Adam (28), master -> bf16 copy (6), at 2039 GB/s x 0.89 plus one 4.9 us
  // launch per kernel (topologies/gpus/a100-sxm4-80gb.json), on the slowest
  // of the 8 GPUs (the profile's speed_spread, speed_spread.hpp).
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 1);
  ParallelPlan p = plan_of(m, 8, 1, 1, 4, 4);
  p.flash_attention = false;
  const double params = parameters_on_stage(m, p, 0);
  const double slowest = spread_slowdown(topo.cluster().gpu.speed_spread, 8);
  CHECK(slowest == doctest::Approx(1 + 0.0115 * 1.4342002).epsilon(1e-8));
  const double expected_s = (50.0 * params / (2039e9 * 0.89) + 5 * 4.9e-6) * slowest;
  CHECK(estimate(m, topo, p).breakdown.optimizer_s == doctest::Approx(expected_s).epsilon(1e-6));
  CHECK(simulate(m, topo, p).breakdown.optimizer_s == doctest::Approx(expected_s).epsilon(1e-6));
}

TEST_CASE("simulated time is never below the compute-at-peak bound") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 8);
  for (const ParallelPlan& p : {plan_of(m, 8, 1, 1, 4, 4), plan_of(m, 8, 4, 2, 32), plan_of(m, 4, 2, 8, 64),
                                plan_of(m, 2, 8, 4, 64)}) {
    const Estimate e = simulate(m, topo, p);
    const double bound = hardware_flops_per_iteration(m, p) / (p.world_size() * topo.cluster().gpu.peak_bf16_flops);
    CAPTURE(p.tp);
    CAPTURE(p.pp);
    CHECK(e.iteration_time_s >= bound);
  }
}

TEST_CASE("GPipe and 1F1B take the same time but 1F1B holds fewer activations") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 4);
  ParallelPlan p = plan_of(m, 8, 4, 1, 16);
  const SimResult f1b = run_simulation(m, topo, p);
  p.schedule = Schedule::gpipe;
  const SimResult gp = run_simulation(m, topo, p);
  CHECK(gp.estimate.iteration_time_s == doctest::Approx(f1b.estimate.iteration_time_s).epsilon(0.02));
  CHECK(gp.estimate.memory.activation_bytes > f1b.estimate.memory.activation_bytes);
}

TEST_CASE("interleaving cuts the bubble") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 4);
  ParallelPlan p = plan_of(m, 8, 4, 1, 16);
  const Estimate plain = simulate(m, topo, p);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 3;
  const Estimate inter = simulate(m, topo, p);
  CHECK(inter.breakdown.bubble_s < 0.6 * plain.breakdown.bubble_s);
  CHECK(inter.iteration_time_s < plain.iteration_time_s);
}

TEST_CASE("the simulated bubble follows (p - 1) / (v m) on uniform stages") {
  // 1F1B on 4 stages: the bubble fraction of the ideal time is about
  // (p - 1) / m; the remainder is the p2p and embedding / LM head imbalance.
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 4);
  for (int v : {1, 2}) {
    ParallelPlan p = plan_of(m, 8, 4, 1, 32);
    if (v > 1) {
      p.schedule = Schedule::interleaved;
      p.virtual_stages = v;
    }
    const Estimate e = simulate(m, topo, p);
    const double work = e.breakdown.compute_s + e.breakdown.tp_comm_s;
    const double fraction = e.breakdown.bubble_s / work;
    const double expected = 3.0 / (v * 32.0);
    CAPTURE(v);
    CHECK(fraction == doctest::Approx(expected).epsilon(0.35));
  }
}

TEST_CASE("a straggler slows the iteration") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 8);
  const ParallelPlan p = plan_of(m, 8, 4, 2, 32);
  const Estimate base = simulate(m, topo, p);
  SimOptions o;
  o.straggler = Straggler{8 * 4 + 3, 1.3};  // a GPU of the second DP replica
  const Estimate slow = simulate(m, topo, p, o);
  CHECK(slow.iteration_time_s > 1.1 * base.iteration_time_s);
  CHECK(slow.iteration_time_s < 1.35 * base.iteration_time_s);
}

TEST_CASE("GPU speed spread, PP 1: compute at exactly 1 + sigma x E[max of tp x dp]") {
  const ModelSpec m = test::gpt(24, 4096, 32);
  Cluster c = test::dgx_a100(2);
  const Topology even(c);
  c.gpu.speed_spread = 0.0115;
  const Topology spread(c);
  const ParallelPlan p = plan_of(m, 8, 1, 2, 16);
  // No async TP collective under the GEMMs: their overlap formula mixes
  // compute with communication time, which the spread does not scale.
  SimOptions o;
  o.tp_backward_overlap = false;
  const SimResult a = run_simulation(m, even, p, o);
  const SimResult b = run_simulation(m, spread, p, o);
  // 16 GPUs: 1 + 0.0115 x inv_cdf(15.625 / 16.25 = 0.961538) = 1 + 0.0115 x 1.7688250.
  const double factor = 1 + 0.0115 * 1.7688250;
  REQUIRE(b.stages.size() == 1);
  CHECK(a.stages[0].compute_factor == 1.0);
  CHECK(b.stages[0].compute_factor == doctest::Approx(factor).epsilon(1e-8));
  CHECK(b.estimate.gpu_spread_slowdown == b.stages[0].compute_factor);  // PP 1: the estimator's factor
  // Every op's time is rounded to the nanosecond after scaling: 1e-6 is ample.
  CHECK(b.estimate.breakdown.compute_s == doctest::Approx(a.estimate.breakdown.compute_s * factor).epsilon(1e-6));
  CHECK(b.estimate.breakdown.optimizer_s == doctest::Approx(a.estimate.breakdown.optimizer_s * factor).epsilon(1e-6));
  CHECK(b.stages[0].compute_busy_s == doctest::Approx(a.stages[0].compute_busy_s * factor).epsilon(1e-6));
  CHECK(b.estimate.breakdown.tp_comm_s == doctest::Approx(a.estimate.breakdown.tp_comm_s).epsilon(1e-9));
  CHECK(b.estimate.iteration_time_s > a.estimate.iteration_time_s);
}

TEST_CASE("GPU speed spread, PP > 1: each stage its own slowest-of-M, the slowest stage paces") {
  // Embedding and LM head small beside 12 layers a stage, so the stages' work is
  // nearly even and the spread decides which stage is the bottleneck.
  const ModelSpec m = test::gpt(48, 8192, 64);
  Cluster c = test::dgx_a100(4);
  const Topology even(c);
  c.gpu.speed_spread = 0.1;  // large, so the stages' order is plain
  const Topology spread(c);
  const ParallelPlan p = plan_of(m, 8, 4, 1, 64);
  SimOptions o;
  o.tp_backward_overlap = false;  // compute alone on the compute stream, as above
  const SimResult a = run_simulation(m, even, p, o);
  const SimResult b = run_simulation(m, spread, p, o);
  // Strata 0 3 2 1 (k = 3): q = 0.125, 0.875, 0.625, 0.375 of the max of 8 GPUs.
  const std::vector<double> expected = stage_spread_factors(0.1, 8, 4, 1);
  REQUIRE(b.stages.size() == 4);
  int slowest = 0;
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    const auto i = static_cast<std::size_t>(s);
    CHECK(b.stages[i].compute_factor == expected[i]);
    CHECK(b.stages[i].compute_busy_s == doctest::Approx(a.stages[i].compute_busy_s * expected[i]).epsilon(1e-6));
    if (expected[i] > expected[static_cast<std::size_t>(slowest)]) slowest = s;
  }
  CHECK(slowest == 1);
  CHECK(expected[1] == doctest::Approx(1 + 0.1 * 2.1307980).epsilon(1e-8));
  // The stage with the most work per iteration is the slowest one.
  auto busy = [](const StageStats& st) { return st.compute_busy_s + st.tp_busy_s; };
  int bottleneck = 0;
  for (int s = 1; s < 4; ++s)
    if (busy(b.stages[static_cast<std::size_t>(s)]) > busy(b.stages[static_cast<std::size_t>(bottleneck)])) bottleneck = s;
  CHECK(bottleneck == slowest);
  // The pipeline runs at that stage's pace: the iteration is its work plus a
  // fill and drain about as long as the even run's beyond its own busiest
  // stage (stage 3 there, with the LM head).
  double busiest_even = 0;
  for (const StageStats& st : a.stages) busiest_even = std::max(busiest_even, busy(st));
  const double fill_even = a.estimate.iteration_time_s - busiest_even;
  const double fill_spread = b.estimate.iteration_time_s - busy(b.stages[1]);
  MESSAGE("fill and drain beyond the busiest stage: " << fill_even << " s even, " << fill_spread << " s with the spread");
  CHECK(fill_spread > 0.8 * fill_even);
  CHECK(fill_spread < 1.3 * fill_even);
  CHECK(fill_even < 0.06 * a.estimate.iteration_time_s);

  // A straggler composes: its stage's factor is the spread's times its slowdown.
  o.straggler = Straggler{2 * 8 + 5, 1.3};  // TP rank 5 of stage 2
  const SimResult st = run_simulation(m, spread, p, o);
  CHECK(st.stages[2].compute_factor == doctest::Approx(expected[2] * 1.3).epsilon(1e-12));
  CHECK(st.stages[0].compute_factor == expected[0]);
  CHECK(st.stages[2].compute_busy_s ==
        doctest::Approx(a.stages[2].compute_busy_s * expected[2] * 1.3).epsilon(1e-6));
}

TEST_CASE("overlapping the DP gradient reduction with backward hides it") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 16);
  ParallelPlan p = plan_of(m, 8, 2, 8, 64);
  SimOptions o;
  const Estimate on = simulate(m, topo, p, o);
  p.trainer.dp_overlap = false;
  const Estimate off = simulate(m, topo, p, o);
  CHECK(off.breakdown.dp_comm_s > on.breakdown.dp_comm_s);
  CHECK(off.iteration_time_s > on.iteration_time_s);
}

TEST_CASE("every ZeRO stage runs and ZeRO-3 adds traffic") {
  const ModelSpec m = model("gpt-22b");
  const Topology topo = cluster("dgx-a100-superpod.json", 8);
  ParallelPlan p = plan_of(m, 8, 2, 4, 32);
  std::vector<double> t;
  for (int z = 0; z <= 3; ++z) {
    p.zero_stage = z;
    const Estimate e = simulate(m, topo, p);
    CHECK(e.breakdown.total() == doctest::Approx(e.iteration_time_s).epsilon(1e-9));
    t.push_back(e.iteration_time_s);
  }
  CHECK(t[3] >= t[0]);
}

TEST_CASE("a Llama-3-70B TP4 x PP4 x DP2 trace opens and shows 1F1B on every stage") {
  const ModelSpec m = model("llama3-70b");
  const Topology topo = cluster("dgx-a100.json", 4);
  ParallelPlan p = plan_of(m, 4, 4, 2, 16);
  p.seq_length = 4096;
  const auto dir = temp_dir();
  SimOptions o;
  o.trace_path = dir / "llama.json";
  o.trace_ranks = {0, 8, 16, 24, 5};  // rank 5: not simulated, shown as its stage's simulated GPU
  const SimResult r = run_simulation(m, topo, p, o);
  REQUIRE(r.trace_files.size() == 1);
  std::ifstream f(r.trace_files.front());
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::map<int, std::vector<std::pair<double, std::string>>> passes;  // pid -> (ts, name) of F/B spans
  std::map<int, std::string> process_names;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") process_names[e["pid"].get<int>()] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    CHECK(e["dur"].get<double>() >= 0);
    const std::string cat = e["cat"];
    if (cat == "forward" || cat == "backward") passes[e["pid"].get<int>()].emplace_back(e["ts"].get<double>(), e["name"]);
  }
  CHECK(process_names.size() == 5);
  const auto orders = pipeline_order(Schedule::one_f_one_b, 4, 8);
  const RankMapping map(p, 8);
  for (auto& [pid, list] : passes) {
    std::sort(list.begin(), list.end());
    std::string got, want;
    for (const auto& [ts, name] : list) got += name + " ";
    for (const ScheduleStep& s : orders[static_cast<std::size_t>(map.coord(pid).pp)]) {
      want += (s.dir == Direction::forward ? "F" : "B") + std::to_string(s.micro_batch) + " ";
    }
    CAPTURE(pid);
    CHECK(got == want);
  }
  CHECK(passes.size() == 5);
  // Per rank files carry distributedInfo.
  o.trace_per_rank = true;
  o.trace_path = dir / "split.json";
  const SimResult split = run_simulation(m, topo, p, o);
  CHECK(split.trace_files.size() == 5);
  for (const auto& path : split.trace_files) {
    std::ifstream g(path);
    const nlohmann::json d = nlohmann::json::parse(g);
    CHECK(d["distributedInfo"].contains("rank"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the timeline: the same results, every stage's steps in schedule order, the trace's blocks") {
  const ModelSpec m = model("gpt-small");
  const Topology topo = cluster("dgx-a100.json", 1);
  ParallelPlan p = plan_of(m, 2, 2, 2, 16);
  p.zero_stage = 1;
  SimOptions o;
  const SimResult plain = run_simulation(m, topo, p, o);
  CHECK(plain.timeline.blocks.empty());
  o.timeline = true;
  const SimResult r = run_simulation(m, topo, p, o);
  CHECK(r.estimate.iteration_time_s == plain.estimate.iteration_time_s);
  CHECK(r.events == plain.events);
  const Timeline& tl = r.timeline;
  CHECK(tl.end_ns == std::llround(r.estimate.iteration_time_s * 1e9));
  REQUIRE(tl.stage_ranks.size() == 2);
  const auto orders = pipeline_order(Schedule::one_f_one_b, 2, 8);
  for (int stage = 0; stage < 2; ++stage) {
    CAPTURE(stage);
    std::string steps, want;
    std::int64_t compute_end = 0;
    std::map<TimelineRow, int> per_row;
    for (const TimelineBlock& b : tl.blocks) {
      if (b.stage != stage) continue;
      CHECK(b.start_ns <= b.end_ns);
      CHECK(b.end_ns <= tl.end_ns);
      ++per_row[b.row];
      if (b.row != TimelineRow::compute) continue;
      CHECK(b.start_ns >= compute_end);  // one stream: one block after another
      compute_end = b.end_ns;
      if (b.category == "forward" || b.category == "backward") steps += b.name + " ";
    }
    for (const ScheduleStep& s : orders[static_cast<std::size_t>(stage)])
      want += (s.dir == Direction::forward ? "F" : "B") + std::to_string(s.micro_batch) + " ";
    CHECK(steps == want);
    CHECK(per_row[TimelineRow::compute] == 17);  // 16 steps and the optimizer step
    CHECK(per_row[TimelineRow::tp] > 0);
    CHECK(per_row[TimelineRow::pp_forward] == 8);
    CHECK(per_row[TimelineRow::pp_backward] == 8);
    CHECK(per_row[TimelineRow::dp] > 0);
  }
}

TEST_CASE("Korthikanti et al. 2022: simulated vs measured iteration times") {
  struct Row {
    const char* model;
    int nodes, tp, pp, dp;
    std::int64_t batch;
    int micro_batch, v;
    double full_s, selective_s;
  };
  // Korthikanti et al. 2022 Table 3 configurations, Table 5 times (full
  // recompute; sequence parallelism + selective recompute); the DP=8 row from
  // Sec 6.3 (selective only), read from tests/data/reference/korthikanti2022.csv.
  // Its model names map to model cards as in tools/fidelity. Megatron-LM of
  // 2022 reduced gradients after the backward pass, so DP overlap is off here.
  const std::map<std::string, const char*> cards = {
      {"22B", "gpt-22b"}, {"175B (GPT-3)", "gpt3-175b"}, {"530B (MT-NLG)", "mt-nlg-530b"},
      {"1T", "gpt-1t"},   {"530B (MT-NLG) DP=8", "mt-nlg-530b"},
  };
  std::vector<Row> rows;
  for (const test::CsvRow& r : test::reference_csv("korthikanti2022.csv")) {
    REQUIRE_MESSAGE(cards.count(r["model"]) == 1, r["model"]);
    const std::string& v = r["interleave_stages"];
    rows.push_back({cards.at(r["model"]), r.integer("num_gpus") / 8, r.integer("tensor_parallel"),
                    r.integer("pipeline_parallel"), r.integer("data_parallel"), r.integer("global_batch_size"),
                    r.integer("micro_batch_size"), v == "none" ? 1 : std::stoi(v),
                    r.measured("iter_time_full_recompute_s"), r.measured("iter_time_seqpar_plus_selective_s")});
  }
  REQUIRE(!rows.empty());
  double sum_abs = 0;
  int n = 0;
  for (const Row& row : rows) {
    const ModelSpec m = model(row.model);
    const Topology topo = cluster("dgx-a100-superpod.json", row.nodes);
    for (int full = 0; full < 2; ++full) {
      const double measured = full ? row.full_s : row.selective_s;
      if (measured <= 0) continue;
      ParallelPlan p = plan_of(m, row.tp, row.pp, row.dp, row.batch, row.micro_batch);
      p.flash_attention = false;
      p.recompute = full ? Recompute::full : Recompute::selective;
      p.sequence_parallel = !full;
      if (row.v > 1) {
        p.schedule = Schedule::interleaved;
        p.virtual_stages = row.v;
      }
      p.trainer.dp_overlap = false;
      const SimResult r = run_simulation(m, topo, p, SimOptions{});
      const double predicted = r.estimate.iteration_time_s;
      const double err = (predicted - measured) / measured;
      sum_abs += std::fabs(err);
      ++n;
      char line[256];
      std::snprintf(line, sizeof line, "%-12s dp%-2d %-9s measured %6.2f s simulated %6.2f s error %+5.1f%% (%.2f s host, %llu tasks)",
                    row.model, row.dp, full ? "full" : "sel+sp", measured, predicted, 100 * err, r.wall_s,
                    static_cast<unsigned long long>(r.tasks));
      MESSAGE(line);
      CHECK(std::fabs(err) < 0.25);  // informative; tools/fidelity holds the target
    }
  }
  MESSAGE("MAPE " << 100 * sum_abs / n << "%");
}

TEST_CASE("GEMMs under async TP collectives run on the SMs NCCL leaves (closed form)") {
  // 22B at TP 8, one micro-batch of 4, no recompute. Without SP each column-
  // parallel backward is dgrad, then the input-gradient all-reduce (C) under
  // the wgrad GEMM, then a join; with SP also the input's all-gather under
  // dgrad, a join, and a reduce-scatter under wgrad. Each join waits
  // max(C, W_full) without channels and max(C, overlapped_time_ns(C, W_red,
  // W_full)) with 24; everything else is the same in both runs.
  ModelSpec m = model("gpt-22b");
  m.num_layers = 2;
  for (const bool sp : {false, true}) {
    CAPTURE(sp);
    Cluster c = load_cluster(root() / "topologies" / "dgx-a100.json", 1);
    c.intra.allreduce_busbw_curve = nullptr;  // alpha-beta alone: C in closed form
    ParallelPlan p = plan_of(m, 8, 1, 1, 4, 4);
    p.recompute = Recompute::none;
    p.sequence_parallel = sp;
    p.flash_attention = false;
    c.intra.nccl_channels = 0;
    const Topology plain(c);
    const double base_s = simulate(m, plain, p).iteration_time_s;
    c.intra.nccl_channels = 24;
    const Topology with_channels(c);
    const double with_s = simulate(m, with_channels, p).iteration_time_s;

    std::vector<int> group(8);
    for (int r = 0; r < 8; ++r) group[static_cast<std::size_t>(r)] = r;
    auto ends = [](const std::string& s, const std::string& t) {
      return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
    };
    double delta_ns = 0;
    int overlapped = 0;
    auto under = [&](Collective coll, double bytes, const Op& gemm, double times) {
      const double cns =
          static_cast<double>(collective_time_ns(coll, bytes, 8, group_link_params(plain, coll, group)));
      const std::int64_t full = op_time_ns(c.gpu, gemm);
      const std::int64_t reduced = op_time_sms_taken_ns(c.gpu, gemm, 24);
      const double ov = static_cast<double>(overlapped_time_ns(static_cast<std::int64_t>(cns), reduced, full));
      delta_ns += times * (std::max(cns, ov) - std::max(cns, static_cast<double>(full)));
      overlapped += static_cast<int>(times);
    };
    auto add = [&](const std::vector<Op>& ops, double times) {
      for (std::size_t i = 2; i < ops.size(); ++i) {
        const Op& red = ops[i];
        if (red.kind != OpKind::collective || red.group != Group::tp || red.pass != Pass::backward) continue;
        if (!ends(ops[i - 2].name, "_dgrad") || !ends(ops[i - 1].name, "_wgrad")) continue;
        if (sp) under(Collective::all_gather, red.comm_bytes, ops[i - 2], times);
        under(red.collective, red.comm_bytes, ops[i - 1], times);
      }
    };
    add(transformer_layer_ops(m, p).backward, static_cast<double>(m.num_layers));
    add(embedding_ops(m, p).backward, 1);
    add(lm_head_ops(m, p).backward, 1);
    CHECK(overlapped >= (sp ? 4 : 2) * m.num_layers);  // QKV and FC1 of every layer (and their dgrads with SP)
    CHECK(delta_ns > 0);
    // Integer nanoseconds on both sides, but the engine rounds each ring
    // step of a collective and the closed form the whole: 1 ns per collective.
    CHECK(std::abs((with_s - base_s) * 1e9 - delta_ns) <= static_cast<double>(overlapped));
  }
}

TEST_CASE("a DP collective's SMs slow the compute beside it, and only that (nccl_ring_channels)") {
  // GPT 22B on 8 x 8 A100 as Megatron-FSDP: TP 1 x DP 64, the gathers and
  // reduce-scatters run beside every pass; 16 channels (8 members per node)
  // take 16 of 108 SMs from the GEMMs while they run.
  const ModelSpec m = model("gpt-22b");
  Cluster c = load_cluster(root() / "topologies" / "dgx-a100-superpod.json", 8);
  REQUIRE(c.intra.nccl_channels == 24);
  REQUIRE(nccl_ring_channels(c, 8, 8) == 16);
  ParallelPlan p = plan_of(m, 1, 1, 64, 256, 2);
  p.zero_stage = 3;
  p.recompute = Recompute::none;
  const Topology with(c);
  const Estimate sim_with = simulate(m, with, p);
  const Estimate est_with = estimate(m, with, p);
  c.intra.nccl_channels = 0;
  const Topology without(c);
  const Estimate sim_without = simulate(m, without, p);
  const Estimate est_without = estimate(m, without, p);
  const double sim_cost = sim_with.iteration_time_s / sim_without.iteration_time_s - 1;
  const double est_cost = est_with.iteration_time_s / est_without.iteration_time_s - 1;
  // At most the GEMMs' share of the step times 16 / (108 - 16) when they run
  // beside a collective all the time; here the DP stream is busy ~40 %.
  CHECK(sim_cost > 0.02);
  CHECK(sim_cost < 16.0 / 92.0);
  CHECK(est_cost == doctest::Approx(sim_cost).epsilon(0.35));
  CHECK(est_with.iteration_time_s == doctest::Approx(sim_with.iteration_time_s).epsilon(0.03));

  // A reduction after the whole backward (megatron-2022: no overlap), and
  // the parameter gather after the optimizer: nothing computes beside them.
  // (TP's async backward collectives also take SMs: off here, to compare the
  // DP collectives alone.)
  ParallelPlan q = plan_of(m, 8, 2, 4, 64, 1);
  q.zero_stage = 1;
  q.trainer = find_trainer("megatron-2022")->settings;
  REQUIRE_FALSE(q.trainer.dp_overlap);
  q.trainer.tp_backward_overlap = false;
  c.intra.nccl_channels = 24;
  const Topology with2(c);
  c.intra.nccl_channels = 0;
  const Topology without2(c);
  CHECK(simulate(m, with2, q).iteration_time_s == simulate(m, without2, q).iteration_time_s);
  CHECK(estimate(m, with2, q).iteration_time_s == estimate(m, without2, q).iteration_time_s);
}
