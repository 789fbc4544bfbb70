// Megatron-Core's pipeline layouts (Megatron-LM d98e8a64): the embedding and
// the loss counted as layers (--account-for-*-in-pipeline-split), and the
// layout string (--pipeline-model-parallel-layout). Which chunk holds which
// decoder layers, the refusals, the memory and time of the stages that hold
// fewer, the plan file and the command line.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/pipeline_layout.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/sim/simulator.hpp"
#include "export_options.hpp"
#include "fixtures.hpp"
#include "plan_flags.hpp"

using namespace cuboid;

namespace {

// 94 decoder layers with the embedding and the loss counted: 96 on PP 8 x v 4,
// 3 per virtual stage (the held-out layout).
ParallelPlan counted_94() {
  ParallelPlan p;
  p.pp = 8;
  p.virtual_stages = 4;
  p.schedule = Schedule::interleaved;
  p.embedding_in_split = true;
  p.loss_in_split = true;
  return p;
}

std::string parse_error(const std::string& text) {
  try {
    (void)parse_pipeline_layout(text, "command line", "--pipeline-model-parallel-layout");
  } catch (const InputError& e) {
    return e.problem();
  }
  return "no error";
}

// Every layer held by exactly one chunk, in virtual-stage order.
void check_every_layer_once(const ParallelPlan& p, std::int64_t layers) {
  std::vector<int> held(static_cast<std::size_t>(layers), 0);
  int next = 0;
  for (int vs = 0; vs < p.pp * chunks_per_stage(p); ++vs) {
    const int s = vs % p.pp, c = vs / p.pp;
    CHECK(first_layer_of_chunk(p, layers, s, c) == next);
    for (int l = 0; l < layers_in_chunk(p, layers, s, c); ++l) ++held[static_cast<std::size_t>(next + l)];
    next += layers_in_chunk(p, layers, s, c);
  }
  CHECK(next == layers);
  CHECK(std::all_of(held.begin(), held.end(), [](int n) { return n == 1; }));
}

}  // namespace

TEST_CASE("94 layers with the embedding and the loss counted on PP 8 x v 4: 3 per virtual stage, E and L take one") {
  const ParallelPlan p = counted_94();
  CHECK(split_layers(p, 94) == 96);
  // transformer_block.py get_num_layers_to_build: 96 / 8 / 4 = 3, less the
  // embedding on (stage 0, chunk 0) and the loss on (stage 7, chunk 3).
  CHECK(layers_in_chunk(p, 94, 0, 0) == 2);
  CHECK(layers_in_chunk(p, 94, 0, 1) == 3);
  CHECK(layers_in_chunk(p, 94, 7, 0) == 3);
  CHECK(layers_in_chunk(p, 94, 7, 3) == 2);
  CHECK(layers_in_chunk(p, 94, 4, 2) == 3);
  CHECK(layers_on_stage(p, 94, 0) == 11);
  CHECK(layers_on_stage(p, 94, 3) == 12);
  CHECK(layers_on_stage(p, 94, 7) == 11);
  // transformer_layer.py get_transformer_layer_offset: vp_stage x 96 / 4 +
  // pp_rank x 3, less 1 for the embedding everywhere but (0, 0).
  CHECK(first_layer_of_chunk(p, 94, 0, 0) == 0);
  CHECK(first_layer_of_chunk(p, 94, 1, 0) == 2);   // 0 + 3 - 1
  CHECK(first_layer_of_chunk(p, 94, 0, 1) == 23);  // 24 - 1
  CHECK(first_layer_of_chunk(p, 94, 7, 3) == 92);  // 72 + 21 - 1
  check_every_layer_once(p, 94);
  // The embedding alone: 95 on PP 5 without interleaving, 19 per stage.
  ParallelPlan e;
  e.pp = 5;
  e.embedding_in_split = true;
  CHECK(layers_on_stage(e, 94, 0) == 18);
  CHECK(layers_on_stage(e, 94, 4) == 19);
  check_every_layer_once(e, 94);
}

TEST_CASE("a layout string in Megatron's grammar: unrolled, counted per virtual stage, written back") {
  const PipelineLayout l = parse_pipeline_layout("Et*2|(t*3|)*30,t*2L", "command line", "--pipeline-layout");
  REQUIRE(l.decoders.size() == 32);
  CHECK(l.decoders.front() == 2);
  CHECK(l.decoders.back() == 2);
  CHECK(std::count(l.decoders.begin(), l.decoders.end(), 3) == 30);
  CHECK(l.mtp == 0);
  CHECK(pipeline_layout_string(l) == "Et*2|(t*3|)*30,t*2L");
  // It is the layout of the counted split above, chunk for chunk.
  ParallelPlan p = counted_94();
  ParallelPlan q = p;
  q.embedding_in_split = q.loss_in_split = false;
  q.pipeline_layout = l;
  for (int s = 0; s < 8; ++s)
    for (int c = 0; c < 4; ++c) CHECK(layers_in_chunk(q, 94, s, c) == layers_in_chunk(p, 94, s, c));
  // TransformerConfig's docstring example on PP 4 x v 2: "E|(tt|)*2,(t|)*4,mL".
  const PipelineLayout d = parse_pipeline_layout("E|(tt|)*2,(t|)*4,mL", "f", "k");
  CHECK(d.decoders == std::vector<int>{0, 2, 2, 1, 1, 1, 1, 0});
  CHECK(d.mtp == 1);
  CHECK(parse_pipeline_layout(pipeline_layout_string(d), "f", "k") == d);
  // Empty virtual stages are stages (pretty_repr's "(empty stage)").
  CHECK(parse_pipeline_layout("E|t*4||t*4L", "f", "k").decoders == std::vector<int>{0, 4, 0, 4});
  CHECK(parse_pipeline_layout("Ettt|tttL", "f", "k").decoders == std::vector<int>{3, 3});
}

TEST_CASE("the layout grammar's refusals, as Megatron's validate_layer_layout words them") {
  CHECK(parse_error("Ex|L").find("invalid layer character \"x\"") != std::string::npos);
  CHECK(parse_error("tE|tL") == "the layout's first layer must be the embedding E");
  CHECK(parse_error("t|tL") == "the layout's first layer must be the embedding E");
  CHECK(parse_error("Et|tt") == "the layout's last layer must be the loss L");
  CHECK(parse_error("EtL|t") == "the layout's last layer must be the loss L");
  CHECK(parse_error("EEt|tL") == "the layout names the embedding E more than once");
  CHECK(parse_error("Et|tLL") == "the layout names the loss L more than once");
  CHECK(parse_error("Et|mtL") ==
        "a decoder layer t after an MTP module m (Megatron places every decoder layer first)");
  // Megatron's own docstring layout with the MTP module on a stage of its
  // own: cuboid prices the modules on the last stage.
  CHECK(parse_error("Ettt|(tt|)*29,m|L") == "MTP modules m outside the last virtual stage");
  CHECK(parse_error("t*99999999").find("repetition over 65536") != std::string::npos);
}

TEST_CASE("check_plan: Megatron-Core's refusals of the layouts") {
  ModelSpec m = test::gpt(94, 1024, 16);
  const Cluster c = test::dgx_a100(4);  // 32 GPUs: PP 8 x DP 4
  ParallelPlan p = counted_94();
  p.dp = 4;
  p.global_batch = 64;
  p.seq_length = 2048;
  CHECK_FALSE(check_plan(p, m, c));
  auto kind = [&](const ParallelPlan& q) { return check_plan(q, m, c).value_or(PlanRejection{}).kind; };
  ParallelPlan bad = p;
  bad.virtual_stages = 5;
  bad.global_batch = 80;
  REQUIRE(check_plan(bad, m, c));
  CHECK(check_plan(bad, m, c)->kind == PlanCheck::counted_split);
  CHECK(describe(*check_plan(bad, m, c), m, c) ==
        "the 94 layers of gpt-test with the embedding / loss counted as layers are 96, which PP 8 x virtual stages 5 = "
        "40 does not divide");
  bad = p;
  bad.loss_in_split = false;  // 95 on 32 virtual stages
  CHECK(kind(bad) == PlanCheck::counted_split);
  bad = p;
  bad.first_stage_layers = 8;
  CHECK(kind(bad) == PlanCheck::layout_with_uneven);
  bad = p;
  bad.pipeline_layout = parse_pipeline_layout("Et*2|(t*3|)*30,t*2L", "f", "k");
  CHECK(kind(bad) == PlanCheck::layout_with_counted);
  ParallelPlan laid = p;
  laid.embedding_in_split = laid.loss_in_split = false;
  laid.pipeline_layout = bad.pipeline_layout;
  CHECK_FALSE(check_plan(laid, m, c));
  bad = laid;
  bad.virtual_stages = 2;  // 32 entries on PP 8 x v 2
  CHECK(kind(bad) == PlanCheck::layout_stages);
  bad = laid;
  bad.pipeline_layout.decoders[5] = 4;
  CHECK(kind(bad) == PlanCheck::layout_layers);
  CHECK(describe(*check_plan(bad, m, c), m, c) == "the pipeline layout has 95 decoder layers t, but gpt-test has 94");
  bad = laid;
  bad.pipeline_layout.mtp = 1;
  CHECK(kind(bad) == PlanCheck::layout_mtp);
  // Only Megatron-Core of 2025 on has them.
  bad = p;
  bad.trainer.preset = "megatron-2022";
  bad.flash_attention = false;
  bad.grad_accum_fusion = false;
  CHECK(kind(bad) == PlanCheck::trainer_no_layout);
}

TEST_CASE("memory: the stages that hold the embedding and the loss hold a layer fewer (hand-computed)") {
  // 6 layers + E + L = 8 on PP 4: 1 + E, 2, 2, 1 + L. GPT with h 1024: a
  // layer holds 12 h^2 + 13 h = 12,596,224 parameters; the embedding 51,200 x
  // 1024 = 52,428,800, the positions 2048 x 1024 = 2,097,152, the final norm 2h.
  const ModelSpec m = test::gpt(6, 1024, 16);
  ParallelPlan p;
  p.pp = 4;
  p.micro_batch = 1;
  p.global_batch = 8;
  p.seq_length = 2048;
  p.embedding_in_split = p.loss_in_split = true;
  CHECK(parameters_on_stage(m, p, 0) == 12596224.0 + 52428800 + 2097152);
  CHECK(parameters_on_stage(m, p, 1) == 2 * 12596224.0);
  CHECK(parameters_on_stage(m, p, 2) == 2 * 12596224.0);
  CHECK(parameters_on_stage(m, p, 3) == 12596224.0 + 2048 + 52428800);
  // Without the layouts nothing changes: 8 layers of the even split, 2 a stage.
  const ModelSpec m8 = test::gpt(8, 1024, 16);
  ParallelPlan even = p;
  even.embedding_in_split = even.loss_in_split = false;
  CHECK(parameters_on_stage(m8, even, 0) == 2 * 12596224.0 + 52428800 + 2097152);
  CHECK(parameters_on_stage(m8, even, 1) == parameters_on_stage(m, p, 1));
}

TEST_CASE("time: the simulator's stages run their chunks' layers, the embedding and the LM head where they sit") {
  // The middle stages of 6 + E + L on PP 4 hold 2 layers, as those of 8 layers
  // evenly split do: the same work to the nanosecond; the first stage holds
  // one layer fewer than the even split's.
  const ModelSpec m6 = test::gpt(6, 1024, 16), m8 = test::gpt(8, 1024, 16);
  const Topology topo(test::dgx_a100(1));
  ParallelPlan p = test::recompute_plan(1, 4, 2, 16);
  p.seq_length = 2048;
  ParallelPlan counted = p;
  counted.embedding_in_split = counted.loss_in_split = true;
  REQUIRE_FALSE(check_plan(counted, m6, topo.cluster()));
  const sim::SimResult a = sim::run_simulation(m6, topo, counted);
  const sim::SimResult b = sim::run_simulation(m8, topo, p);
  REQUIRE(a.stages.size() == 4);
  CHECK(a.stages[1].compute_busy_s == doctest::Approx(b.stages[1].compute_busy_s).epsilon(1e-9));
  CHECK(a.stages[2].compute_busy_s == doctest::Approx(b.stages[2].compute_busy_s).epsilon(1e-9));
  CHECK(a.stages[0].compute_busy_s < b.stages[0].compute_busy_s);
  CHECK(a.stages[3].compute_busy_s < b.stages[3].compute_busy_s);
  // The analytical estimate prices the same stages, its memory the peak one's.
  const Estimate e = estimate(m6, topo, counted);
  CHECK(e.iteration_time_s > 0);
  CHECK(e.memory.parameters == doctest::Approx(parameters_on_stage(m6, counted, e.memory.peak_stage)));
}

TEST_CASE("a plan file keeps the layout; plans without one are written as before") {
  const ModelSpec m = test::gpt(94, 1024, 16);
  const Cluster c = test::dgx_a100(4);
  ParallelPlan p = counted_94();
  p.dp = 4;
  p.global_batch = 64;
  p.seq_length = 2048;
  const Topology topo(c);
  Estimate e = estimate(m, topo, p);
  nlohmann::json j = plan_to_json(m, c, e);
  CHECK(j["parallel"]["embedding_in_pipeline_split"] == true);
  CHECK(j["parallel"]["loss_in_pipeline_split"] == true);
  CHECK_FALSE(j["parallel"].contains("pipeline_layout"));
  CHECK(plan_file_from_json(j, "p.json").plan == p);
  ParallelPlan laid = p;
  laid.embedding_in_split = laid.loss_in_split = false;
  laid.pipeline_layout = parse_pipeline_layout("Et*2|(t*3|)*30,t*2L", "f", "k");
  e = estimate(m, topo, laid);
  j = plan_to_json(m, c, e);
  CHECK(j["parallel"]["pipeline_layout"] == "Et*2|(t*3|)*30,t*2L");
  CHECK_FALSE(j["parallel"].contains("embedding_in_pipeline_split"));
  CHECK(plan_file_from_json(j, "p.json").plan == laid);
  // A layout the model does not match is refused at the key.
  j["parallel"]["pipeline_layout"] = "Et*2|(t*3|)*30,t*3L";
  try {
    (void)plan_file_from_json(j, "p.json");
    FAIL("a 95-layer layout read for 94 layers");
  } catch (const InputError& err) {
    CHECK(err.field() == "parallel.pipeline_layout");
    CHECK(err.problem() == "the pipeline layout has 95 decoder layers t, but gpt-test has 94");
  }
  // Without the layouts the keys are absent, as before.
  ParallelPlan plain = p;
  plain.embedding_in_split = plain.loss_in_split = false;
  plain.virtual_stages = 1;
  plain.schedule = Schedule::one_f_one_b;
  plain.pp = 2;
  plain.dp = 16;
  j = plan_to_json(m, c, estimate(m, topo, plain));
  for (const char* key : {"embedding_in_pipeline_split", "loss_in_pipeline_split", "pipeline_layout"})
    CHECK_FALSE(j["parallel"].contains(key));
}

TEST_CASE("cuboid export --to megatron writes Megatron's flags back; other targets refuse the layout") {
  PlanFile pf;
  pf.source = "p.json";
  pf.model = test::gpt(94, 1024, 16);
  pf.cluster_name = "dgx";
  pf.gpu_name = "A100";
  pf.nodes = 4;
  pf.gpus_per_node = 8;
  pf.plan = counted_94();
  pf.plan.dp = 4;
  pf.plan.global_batch = 64;
  pf.plan.seq_length = 2048;
  // Every flag written is one of Megatron-LM's at the pinned commit.
  const test::OptionSet options = test::load_options("megatron-d98e8a64.json");
  auto check_options = [&](const std::string& text) {
    for (const auto& [name, value] : test::read_megatron(text)) CHECK(test::check_option(options, name, value) == "");
  };
  std::string out = export_plan(pf, "megatron").text;
  check_options(out);
  CHECK(out.find("--account-for-embedding-in-pipeline-split") != std::string::npos);
  CHECK(out.find("--account-for-loss-in-pipeline-split") != std::string::npos);
  CHECK(out.find("--num-virtual-stages-per-pipeline-rank 4") != std::string::npos);
  CHECK(out.find("--num-layers-per-virtual-pipeline-stage") == std::string::npos);
  pf.plan.embedding_in_split = pf.plan.loss_in_split = false;
  pf.plan.pipeline_layout = parse_pipeline_layout("Et*2|(t*3|)*30,t*2L", "f", "k");
  out = export_plan(pf, "megatron").text;
  check_options(out);
  CHECK(out.find("--pipeline-model-parallel-layout \"Et*2|(t*3|)*30,t*2L\"") != std::string::npos);
  CHECK(out.find("--num-virtual-stages-per-pipeline-rank") == std::string::npos);
  CHECK(out.find("--account-for") == std::string::npos);
  for (const char* target : {"megatron-bridge", "nemo", "deepspeed", "torchtitan"}) {
    CAPTURE(target);
    try {
      (void)export_plan(pf, target);
      FAIL_CHECK("no refusal");
    } catch (const InputError& e) {
      CHECK(e.field() == "parallel.pipeline_layout");
      CHECK(e.fix() == "export with --to megatron, or plan without the layout");
    }
  }
}

TEST_CASE("the command line: Megatron's flags, the layout's virtual stages, and their refusals") {
  cli::PlanFlags f;
  f.pp = 8;
  f.pipeline_layout = "Et*2|(t*3|)*30,t*2L";
  const PlannerOptions o = cli::planner_options(f);
  CHECK(o.virtual_stages == 4);
  CHECK(o.pipeline_layout.decoders.size() == 32);
  auto refusal = [](const cli::PlanFlags& g) {
    try {
      (void)cli::planner_options(g);
    } catch (const InputError& e) {
      return e.field() + ": " + e.problem();
    }
    return std::string("no error");
  };
  cli::PlanFlags g = f;
  g.vpp = 2;
  CHECK(refusal(g) == "--vpp: --vpp 2 conflicts with the layout's 4 virtual stages per PP rank");
  g = f;
  g.pp = 3;
  CHECK(refusal(g) == "--pipeline-model-parallel-layout: the layout's 32 virtual stages do not split over PP 3");
  g = f;
  g.pp.reset();
  CHECK(refusal(g) == "--pipeline-model-parallel-layout: a layout needs --pp to read its virtual stages");
  g = f;
  g.embedding_in_split = true;
  CHECK(refusal(g).rfind("--pipeline-model-parallel-layout: cannot be combined with", 0) == 0);
  g = f;
  g.pipeline_layout.reset();
  g.loss_in_split = true;
  g.first_stage_layers = 10;
  CHECK(refusal(g).rfind("--account-for-loss-in-pipeline-split: cannot be combined with", 0) == 0);
  g = f;
  g.pipeline_layout.reset();
  g.embedding_in_split = g.loss_in_split = true;
  const PlannerOptions counted = cli::planner_options(g);
  CHECK(counted.embedding_in_split);
  CHECK(counted.loss_in_split);
}

TEST_CASE("the planner searches the counted split where it is asked for: PP x v dividing the 96") {
  const ModelSpec m = test::gpt(94, 1024, 16);
  const Topology topo(test::dgx_a100(4));
  PlannerOptions o;
  o.simulate_top = 0;
  o.global_batch = 64;
  o.tp = 1;
  o.cp = 1;
  o.embedding_in_split = o.loss_in_split = true;
  const SearchResult r = search_plans(m, topo, o);
  REQUIRE(!r.fitting.empty());
  std::set<std::pair<int, int>> shapes;
  for (const Estimate& e : r.fitting) {
    CHECK(e.plan.embedding_in_split);
    CHECK(e.plan.loss_in_split);
    CHECK(96 % (e.plan.pp * e.plan.virtual_stages) == 0);
    shapes.insert({e.plan.pp, e.plan.virtual_stages});
  }
  CHECK(shapes.count({8, 4}) == 1);  // 96 = 8 x 4 x 3
  CHECK(shapes.count({32, 1}) == 1);
}

TEST_CASE("the counted split without interleaving is the first / last split of the same layers: the same iteration") {
  // 30 layers + E + L on PP 4: 7, 8, 8, 7, which --first-stage-layers 7
  // --last-stage-layers 7 gives too; both priced alike to the nanosecond.
  const ModelSpec m = test::gpt(30, 1024, 16);
  const Topology topo(test::dgx_a100(1));
  ParallelPlan uneven = test::recompute_plan(1, 4, 2, 16);
  uneven.seq_length = 2048;
  ParallelPlan counted = uneven;
  uneven.first_stage_layers = uneven.last_stage_layers = 7;
  counted.embedding_in_split = counted.loss_in_split = true;
  for (int s = 0; s < 4; ++s) CHECK(layers_on_stage(counted, 30, s) == layers_on_stage(uneven, 30, s));
  CHECK(sim::simulate(m, topo, counted).iteration_time_s == sim::simulate(m, topo, uneven).iteration_time_s);
  CHECK(estimate(m, topo, counted).iteration_time_s == estimate(m, topo, uneven).iteration_time_s);
}
