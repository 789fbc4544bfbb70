// The simulator's task-graph builder: a pass recorded once and stamped out
// for every micro-batch gives the same task graph, and so the same run, as
// playing each pass op by op (which traced stages always do).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/cost/memory.hpp"
#include "fixtures.hpp"
#include "builder.hpp"

using namespace cuboid;
using namespace cuboid::sim;

namespace {

struct Graph {
  std::vector<TaskKind> kind;
  std::vector<TimeNs> start, end;
  std::vector<int> category, stage, stage2;
  std::vector<TimeNs> busy;  // per stream
  TimeNs end_ns = 0;
};

Graph run(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan, const SimOptions& opts, bool stamp) {
  detail::Builder b(m, topo, plan, opts);
  b.stamp_passes(stamp);
  b.build();
  Engine& eng = b.engine();
  Graph g;
  g.end_ns = eng.run().end_ns;
  for (TaskId t = 0; t < eng.num_tasks(); ++t) {
    g.kind.push_back(eng.kind(t));
    g.start.push_back(eng.start_ns(t));
    g.end.push_back(eng.end_ns(t));
    const detail::TaskMeta& mt = b.meta()[t];
    g.category.push_back(static_cast<int>(mt.category));
    g.stage.push_back(mt.stage);
    g.stage2.push_back(mt.stage2);
  }
  for (StreamId s = 0; s < eng.num_streams(); ++s) g.busy.push_back(eng.stream(s).busy_ns);
  return g;
}

void check_same(const std::string& model, const std::string& card, int nodes, ParallelPlan plan, SimOptions opts = {}) {
  const std::filesystem::path root = test::source_root();
  const ModelSpec m = load_model(root / "models" / (model + ".json"));
  const Topology topo(load_cluster(root / "topologies" / card, nodes));
  plan.seq_length = plan.seq_length > 0 ? plan.seq_length : m.seq_length;
  const Graph stamped = run(m, topo, plan, opts, true);
  const Graph played = run(m, topo, plan, opts, false);
  REQUIRE(stamped.kind.size() == played.kind.size());
  CHECK(stamped.kind == played.kind);
  CHECK(stamped.category == played.category);
  CHECK(stamped.stage == played.stage);
  CHECK(stamped.stage2 == played.stage2);
  CHECK(stamped.start == played.start);
  CHECK(stamped.end == played.end);
  CHECK(stamped.busy == played.busy);
  CHECK(stamped.end_ns == played.end_ns);
}

ParallelPlan plan_of(int tp, int pp, int dp, std::int64_t batch) { return test::recompute_plan(tp, pp, dp, batch); }

}  // namespace

TEST_CASE("stamped passes: 1F1B with DP buckets overlapped on the last micro-batch") {
  check_same("llama3-70b", "dgx-a100-4node.json", 4, plan_of(4, 4, 2, 64));
}

TEST_CASE("stamped passes: interleaved, without sequence parallelism (p2p gathers)") {
  ParallelPlan p = plan_of(4, 4, 2, 64);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 2;
  p.sequence_parallel = false;
  check_same("llama3-70b", "dgx-a100-4node.json", 4, p);
}

TEST_CASE("stamped passes: ZeRO-3 gathers, ZeRO-2 reductions on every micro-batch") {
  for (int zero : {2, 3}) {
    CAPTURE(zero);
    ParallelPlan p = plan_of(4, 2, 4, 32);
    p.zero_stage = zero;
    check_same("llama3-70b", "dgx-a100-4node.json", 4, p);
  }
}

TEST_CASE("stamped passes: DeepSpeed-2021's ZeRO-3 (per-tensor gathers, host waits, list-form copies, reduce bucket)") {
  ParallelPlan p = plan_of(2, 1, 16, 64);
  p.zero_stage = 3;
  p.sequence_parallel = false;
  p.flash_attention = false;
  p.grad_accum_fusion = false;
  p.trainer = find_trainer("deepspeed-2021")->settings;
  check_same("gpt-22b", "dgx-a100-superpod.json", 4, p);
  p.pp = 2;  // two stages, as the simulator allows although DeepSpeed's pipeline engine does not
  p.dp = 8;
  check_same("gpt-22b", "dgx-a100-superpod.json", 4, p);
}

TEST_CASE("stamped passes: TP collectives on the network, a straggler, GPipe") {
  // TP across nodes: TP collectives are played on the network, not priced once.
  ParallelPlan p = plan_of(16, 2, 1, 16);
  p.schedule = Schedule::gpipe;
  SimOptions o;
  o.straggler = Straggler{3, 1.5};
  check_same("llama3-70b", "dgx-a100-4node.json", 4, p, o);
}

TEST_CASE("stamped passes: uneven stages of a big model, DP reduced after backward") {
  ParallelPlan p = plan_of(8, 16, 4, 64);
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  p.trainer.dp_overlap = false;
  check_same("llama3.1-405b", "h100-roce-24k.json", 64, p);
}

TEST_CASE("stamped passes: uneven stages in interleaved chunks (8 + 14 x 8 + 6 in 2 chunks per stage)") {
  ParallelPlan p = plan_of(8, 16, 4, 64);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 2;
  p.first_stage_layers = 8;
  p.last_stage_layers = 6;
  check_same("llama3.1-405b", "h100-roce-24k.json", 64, p);
}

TEST_CASE("the units of each stage hold its parameters: every DP bucket reduces all of them, an MoE model's experts too") {
  const std::filesystem::path root = test::source_root();
  const Topology topo(load_cluster(root / "topologies/dgx-a100.json", 2));
  for (const char* name : {"llama3-8b", "mixtral-8x7b", "mixtral-8x7b with 3 dense layers"}) {
    CAPTURE(name);
    ModelSpec m = load_model(root / "models" / (std::string(name).substr(0, std::string(name).find(' ')) + ".json"));
    if (std::string(name).find("dense") != std::string::npos)
      for (int l = 0; l < 3; ++l) m.moe.moe_layers[static_cast<std::size_t>(l)] = false;
    ParallelPlan plan = plan_of(2, 4, 2, 16);
    plan.seq_length = 2048;
    if (m.moe.enabled()) {
      plan.ep = 2;
      plan.etp = 1;
    }
    const SimOptions opts;  // the builder keeps a reference
    detail::Builder b(m, topo, plan, opts);
    b.build();
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      double params = 0;
      for (const auto& chunk : b.units()[static_cast<std::size_t>(s)])
        for (const auto& u : chunk) params += u.params;
      CHECK(params == doctest::Approx(parameters_on_stage(m, plan, s)).epsilon(1e-12));
    }
  }
}

TEST_CASE("Megatron-Core's counted split: the first chunk holds the embedding and 2 layers, the last 2 layers and the LM head") {
  // 94 layers + the embedding + the loss on PP 8 x v 4: 3 a virtual stage.
  const ModelSpec m = test::gpt(94, 1024, 16);
  const Topology topo(test::dgx_a100(1));
  ParallelPlan plan = plan_of(1, 8, 1, 16);
  plan.seq_length = 2048;
  plan.schedule = Schedule::interleaved;
  plan.virtual_stages = 4;
  plan.embedding_in_split = plan.loss_in_split = true;
  const SimOptions opts;
  detail::Builder b(m, topo, plan, opts);
  b.build();
  auto names = [&](int stage, int chunk) {
    std::vector<std::string> out;
    for (const auto& u : b.units()[static_cast<std::size_t>(stage)][static_cast<std::size_t>(chunk)]) out.push_back(u.name);
    return out;
  };
  CHECK(names(0, 0) == std::vector<std::string>{"embedding", "layer 0", "layer 1"});
  CHECK(names(1, 0) == std::vector<std::string>{"layer 2", "layer 3", "layer 4"});
  CHECK(names(0, 1) == std::vector<std::string>{"layer 23", "layer 24", "layer 25"});
  CHECK(names(7, 3) == std::vector<std::string>{"layer 92", "layer 93", "lm_head"});
  for (int s = 0; s < 8; ++s) {
    double params = 0;
    for (const auto& chunk : b.units()[static_cast<std::size_t>(s)])
      for (const auto& u : chunk) params += u.params;
    CHECK(params == doctest::Approx(parameters_on_stage(m, plan, s)).epsilon(1e-12));
  }
}

TEST_CASE("stamped passes: a layout string's uneven chunks") {
  ParallelPlan p = plan_of(8, 4, 2, 64);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 2;
  // Llama 3 8B's 32 layers: the embedding's and the loss's chunks lighter.
  p.pipeline_layout.decoders = {2, 4, 4, 4, 4, 5, 5, 4};
  check_same("llama3-8b", "dgx-a100.json", 8, p);
}
