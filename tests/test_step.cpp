// One description of the training step (cost/step.hpp), two readers: for
// plans covering ZeRO 0-3, 1F1B and interleaved schedules, the overlapped and
// the unoverlapped reduction, a tied embedding, mixture-of-experts with EP
// and context parallelism, the simulator plays exactly the DP-side
// collectives the description lists for each stage, and the estimator folds
// exactly those of its critical stage. The description's bytes are pinned to
// hand-computed numbers first.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <tuple>

#include "builder.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/step.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

using Key = std::tuple<StepGroup, Collective>;
using Bytes = std::map<Key, double>;

ParallelPlan plan_of(int tp, int pp, int dp, int zero, std::int64_t batch) {
  return test::recompute_plan(tp, pp, dp, batch, zero);
}

Bytes sum_by_kind(std::span<const StepCollective> cs) {
  Bytes out;
  for (const StepCollective& c : cs) out[{c.group, c.collective}] += c.iteration_bytes();
  return out;
}

void check_same_bytes(const Bytes& expected, const Bytes& seen) {
  for (const auto& [key, bytes] : expected) {
    CAPTURE(to_string(std::get<0>(key)));
    CAPTURE(static_cast<int>(std::get<1>(key)));
    REQUIRE(seen.count(key) == 1);
    CHECK(seen.at(key) == doctest::Approx(bytes).epsilon(1e-9));
  }
  CHECK(seen.size() == expected.size());
}

// The simulator's and the estimator's collectives against the description.
void check_readers(const std::string& model, const std::string& card, int nodes, ParallelPlan plan) {
  CAPTURE(model);
  CAPTURE(plan.zero_stage);
  const std::filesystem::path root = test::source_root();
  const ModelSpec m = load_model(root / "models" / (model + ".json"));
  const Topology topo(load_cluster(root / "topologies" / card, nodes));
  plan.seq_length = m.seq_length;
  const StepDescription step(m, plan, nullptr);

  const sim::SimOptions options;  // the builder keeps a reference
  sim::detail::Builder b(m, topo, plan, options);
  b.build();
  for (int s = 0; s < std::max(1, plan.pp); ++s) {
    CAPTURE(s);
    const StageStep described = step.stage(s);
    Bytes played;
    for (const StepGroup g : {StepGroup::dp, StepGroup::expert_dp, StepGroup::embedding})
      for (int c = 0; c < 6; ++c)
        if (const double bytes = b.played_bytes(s, g, static_cast<Collective>(c)); bytes > 0)
          played[{g, static_cast<Collective>(c)}] = bytes;
    check_same_bytes(sum_by_kind(described.collectives()), played);
  }

  const FoldedStep folded = folded_step(m, topo, plan);
  std::vector<StepCollective> expected;
  const StageStep critical = step.stage(folded.critical_stage);
  for (const StepCollective& c : critical.collectives())
    if (c.when != StepWhen::after_all_backward) expected.push_back(c);
  if (step.tied_embedding_bytes() > 0) expected.push_back(step.tied_embedding());
  check_same_bytes(sum_by_kind(expected), sum_by_kind(folded.collectives));
}

}  // namespace

TEST_CASE("the step's bytes by hand: Llama-3-70B, TP 4, PP 2, DP 4") {
  const ModelSpec m = test::llama3_70b();
  ParallelPlan p = plan_of(4, 2, 4, 1, 32);
  p.seq_length = 8192;
  const StepDescription step(m, p, nullptr);
  const StageParameters sp = stage_parameters(m, p, 1);
  CHECK(step.grad_collective() == Collective::reduce_scatter);
  CHECK(step.grad_when() == StepWhen::last_backward_buckets);
  CHECK(step.grad_bytes_per_param() == 4.0);   // Megatron's fp32 main_grad
  CHECK(step.param_bytes_per_param() == 2.0);  // bf16 parameters
  // max(40M, 1M x 4) on the first stage's first chunk; the whole chunk elsewhere.
  CHECK(step.bucket_params(0, 0) == 40e6);
  CHECK(step.bucket_params(1, 0) == std::numeric_limits<double>::infinity());
  // One hidden-size activation of one micro-batch in bf16: 8192 x 8192 x 2 / TP (SP).
  CHECK(step.pipeline_message_bytes() == doctest::Approx(8192.0 * 8192 * 2 / 4));
  // Untied: no embedding all-reduce.
  CHECK(step.tied_embedding_bytes() == 0);
  const StageStep last = step.stage(1);
  REQUIRE(last.size == 2);
  CHECK(last.items[0].name == "grad reduce");
  CHECK(last.items[0].collective == Collective::reduce_scatter);
  CHECK(last.items[0].ranks == 4);
  CHECK(last.items[0].bytes == doctest::Approx(sp.dense * 4));
  CHECK(last.items[1].name == "param all-gather");
  CHECK(last.items[1].collective == Collective::all_gather);
  CHECK(last.items[1].bytes == doctest::Approx(sp.dense * 2));
  CHECK(last.items[1].when == StepWhen::after_optimizer);
  {
    // --grad-reduce-dtype bf16 (Megatron's --grad-reduce-in-bf16): the
    // reduce-scatter moves half the bytes; the parameter gather is unchanged.
    ParallelPlan bf16 = p;
    bf16.trainer.dp_grad_bytes = 2;
    const StageStep half = StepDescription(m, bf16, nullptr).stage(1);
    CHECK(half.items[0].bytes == doctest::Approx(sp.dense * 2));
    CHECK(half.items[1].bytes == doctest::Approx(sp.dense * 2));
  }

  p.zero_stage = 2;  // every micro-batch reduce-scatters its gradients: 32 / 4 = 8 of them
  const StageStep z2 = StepDescription(m, p, nullptr).stage(1);
  CHECK(z2.items[0].issues == 8);
  CHECK(z2.items[0].iteration_bytes() == doctest::Approx(sp.dense * 4 * 8));
  p.zero_stage = 0;
  p.trainer.dp_overlap = false;
  const StepDescription z0(m, p, nullptr);
  CHECK(z0.grad_collective() == Collective::all_reduce);
  CHECK(z0.grad_when() == StepWhen::after_backward);
  CHECK(z0.stage(1).size == 1);
}

TEST_CASE("the step's bytes by hand: GPT-3 175B's tied embedding, TP 8, PP 8") {
  const ModelSpec m = test::gpt3_175b();
  ParallelPlan p = plan_of(8, 8, 2, 1, 64);
  p.seq_length = 2048;
  const StepDescription step(m, p, nullptr);
  // The word embedding's gradient, vocabulary padded to 128 x TP, in fp32.
  const double vocab = static_cast<double>(padded_vocab_size(m.vocab_size, 8));
  CHECK(vocab == 51200);
  CHECK(step.tied_embedding_bytes() == doctest::Approx(51200.0 / 8 * 12288 * 4));
  const StageStep first = step.stage(0), middle = step.stage(3);
  CHECK(first.collectives().back().name == "param all-gather");
  bool tied_first = false, tied_middle = false;
  for (const StepCollective& c : first.collectives()) tied_first |= c.group == StepGroup::embedding;
  for (const StepCollective& c : middle.collectives()) tied_middle |= c.group == StepGroup::embedding;
  CHECK(tied_first);
  CHECK_FALSE(tied_middle);
  // A calibrated CPU card moves f32 activations and parameters.
  Calibration cal;
  cal.activation_bytes_per_element = 4;
  CHECK(StepDescription(m, p, &cal).param_bytes_per_param() == 4.0);
}

TEST_CASE("simulator and estimator read one description: ZeRO 0-3, 1F1B") {
  for (int zero : {0, 1, 2, 3}) check_readers("llama3-70b", "dgx-a100-4node.json", 4, plan_of(4, 2, 4, zero, 32));
}

TEST_CASE("simulator and estimator read one description: interleaved, no overlap, the pipeline engine's all-reduce") {
  ParallelPlan p = plan_of(4, 4, 2, 1, 32);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 5;
  check_readers("llama3-70b", "dgx-a100-4node.json", 4, p);
  p.trainer.dp_overlap = false;
  check_readers("llama3-70b", "dgx-a100-4node.json", 4, p);
  ParallelPlan ds = plan_of(4, 4, 2, 1, 32);
  ds.trainer = find_trainer("megatron-deepspeed")->settings;
  ds.grad_accum_fusion = false;
  REQUIRE(ds.trainer.zero1_grad_all_reduce);
  check_readers("llama3-70b", "dgx-a100-4node.json", 4, ds);
}

TEST_CASE("simulator and estimator read one description: a tied embedding across stages") {
  check_readers("gpt3-175b", "dgx-a100-superpod.json", 16, plan_of(8, 8, 2, 1, 64));
}

TEST_CASE("simulator and estimator read one description: mixture-of-experts with EP, context parallelism") {
  ParallelPlan moe = plan_of(2, 2, 16, 1, 256);
  moe.ep = 8;
  check_readers("mixtral-8x7b", "dgx-h100.json", 8, moe);
  moe.zero_stage = 2;
  check_readers("mixtral-8x7b", "dgx-h100.json", 8, moe);
  // Megatron-FSDP: each block's dense part gathered over DP, its experts over expert-DP.
  moe.zero_stage = 3;
  check_readers("mixtral-8x7b", "dgx-h100.json", 8, moe);
  ParallelPlan etp = plan_of(2, 2, 16, 0, 256);  // EP 1, ETP = TP: the experts reduce over the DP group
  check_readers("mixtral-8x7b", "dgx-h100.json", 8, etp);
  ParallelPlan cp = plan_of(4, 4, 1, 1, 32);
  cp.cp = 2;
  check_readers("llama3-70b", "dgx-a100-4node.json", 4, cp);
}

TEST_CASE("simulator and estimator read one description: the parameter gather in the next forward") {
  // ZeRO 1 and 2, 1F1B and interleaved, dense and MoE (the experts' gather over expert-DP).
  for (int zero : {1, 2}) {
    ParallelPlan p = plan_of(4, 2, 4, zero, 32);
    p.trainer.overlap_param_gather = true;
    check_readers("llama3-70b", "dgx-a100-4node.json", 4, p);
    const ModelSpec m = load_model(test::source_root() / "models/llama3-70b.json");
    const StepDescription step(m, p, nullptr);
    const StageStep stage = step.stage(0);
    for (const StepCollective& c : stage.collectives())
      if (c.collective == Collective::all_gather) CHECK(c.when == StepWhen::next_forward_buckets);
  }
  ParallelPlan p = plan_of(4, 4, 2, 1, 32);
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 5;
  p.trainer.overlap_param_gather = true;
  check_readers("llama3-70b", "dgx-a100-4node.json", 4, p);
  ParallelPlan moe = plan_of(2, 2, 16, 1, 256);
  moe.ep = 8;
  moe.trainer.overlap_param_gather = true;
  check_readers("mixtral-8x7b", "dgx-h100.json", 8, moe);
}
