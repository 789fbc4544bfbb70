// Exports to Megatron-LM, DeepSpeed, torchtitan and NeMo: exact golden text for
// the plans each target can run, exact refusals for the ones it cannot.
//
// The goldens live in tests/golden/export/<plan>.<target>.<ext> and are compared
// byte for byte (they are generated configs, not logs). After an intended
// change of an export, regenerate them and review the diff:
//   CUBOID_UPDATE_GOLDEN=1 meson test -C build export
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "cuboid/core/error.hpp"
#include "cuboid/io/export.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;
using cuboid::test::Fixture;

namespace {

const Fixture& fixture(const std::string& name) {
  static const std::vector<Fixture> all = cuboid::test::fixtures();
  for (const auto& f : all)
    if (f.name == name) return f;
  FAIL("no fixture " << name);
  return all.front();
}

PlanFile plan_file(const std::string& name) { return cuboid::test::fixture_plan_file(fixture(name)); }

std::string extension(const std::string& target) {
  static const std::map<std::string, std::string> ext = {
      {"megatron", "sh"}, {"deepspeed", "json"}, {"torchtitan", "txt"}, {"nemo", "yaml"}};
  return ext.at(target);
}

void check_golden(const std::string& plan, const std::string& target) {
  const std::string text = export_plan(plan_file(plan), target);
  const auto path = cuboid::test::source_root() / "tests/golden/export" / (plan + "." + target + "." + extension(target));
  const char* update = std::getenv("CUBOID_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << text;
    MESSAGE("updated " << path.string());
    return;
  }
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "missing golden " << path.string() << " (run with CUBOID_UPDATE_GOLDEN=1)");
  std::stringstream golden;
  golden << in.rdbuf();
  CHECK_MESSAGE(text == golden.str(), "export differs from " << path.string()
                                                            << " (if intended: CUBOID_UPDATE_GOLDEN=1)\n"
                                                            << text);
}

std::string refusal(const std::string& plan, const std::string& target) {
  try {
    export_plan(plan_file(plan), target);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no refusal)";
}

}  // namespace

TEST_CASE("golden exports of the seed plan (Llama-3-70B TP4 PP4 DP2, ZeRO 1, full recompute, SP, 1F1B)") {
  check_golden("seed", "megatron");
  check_golden("seed", "nemo");
}

TEST_CASE("golden exports of the interleaved GPT-3 175B plan") {
  check_golden("gpt3-interleaved", "megatron");
  check_golden("gpt3-interleaved", "nemo");
  check_golden("gpt3-interleaved", "torchtitan");
}

TEST_CASE("golden exports of the seed plan with ZeRO-3 (Megatron FSDP, torchtitan FSDP)") {
  check_golden("seed-zero3", "megatron");
  check_golden("seed-zero3", "torchtitan");
}

TEST_CASE("golden DeepSpeed export of a pipeline without TP (Llama-3-8B PP4 DP8, ZeRO 1)") {
  check_golden("llama8b-pp4", "deepspeed");
  check_golden("llama8b-pp4", "megatron");
}

TEST_CASE("the Megatron export carries the flags that make the plan") {
  const std::string seed = export_plan(plan_file("seed"), "megatron");
  for (const char* flag : {"--tensor-model-parallel-size 4\n", "--pipeline-model-parallel-size 4\n", "--sequence-parallel\n",
                           "--micro-batch-size 1\n", "--global-batch-size 64\n", "--recompute-granularity full\n",
                           "--recompute-method uniform\n", "--recompute-num-layers 1\n", "--use-distributed-optimizer\n",
                           "--overlap-grad-reduce\n", "--overlap-param-gather\n", "--swiglu\n", "--group-query-attention\n",
                           "--num-query-groups 8\n", "--untie-embeddings-and-output-weights\n", "--normalization RMSNorm\n",
                           "--disable-bias-linear\n", "--position-embedding-type rope\n",
                           "torchrun --nnodes 4 --nproc_per_node 8", "srun --nodes 4 --ntasks-per-node 1"})
    CHECK_MESSAGE(seed.find(flag) != std::string::npos, flag);
  CHECK(seed.find("--num-layers-per-virtual-pipeline-stage") == std::string::npos);
  const std::string gpt3 = export_plan(plan_file("gpt3-interleaved"), "megatron");
  // 96 layers / (PP 4 x 3 virtual stages) = 8 layers per virtual stage.
  CHECK(gpt3.find("--num-layers-per-virtual-pipeline-stage 8\n") != std::string::npos);
  CHECK(gpt3.find("--recompute-granularity selective\n") != std::string::npos);
  CHECK(gpt3.find("--untie-embeddings-and-output-weights") == std::string::npos);
  // Gradient-accumulation fusion is Megatron's default: only a plan priced
  // without it turns it off.
  CHECK(seed.find("gradient-accumulation-fusion") == std::string::npos);
  PlanFile unfused = plan_file("seed");
  unfused.plan.grad_accum_fusion = false;
  CHECK(export_plan(unfused, "megatron").find("--no-gradient-accumulation-fusion\n") != std::string::npos);
  CHECK(export_plan(unfused, "nemo").find("  gradient_accumulation_fusion: false\n") != std::string::npos);
}

TEST_CASE("DeepSpeed batch sizes are consistent with DP") {
  const auto j = nlohmann::json::parse(export_plan(plan_file("llama8b-pp4"), "deepspeed"));
  CHECK(j["train_batch_size"] == 64);
  CHECK(j["train_micro_batch_size_per_gpu"] == 1);
  // train_batch_size = micro x accumulation x DP (8).
  CHECK(j["gradient_accumulation_steps"] == 8);
  CHECK(j["zero_optimization"]["stage"] == 1);
  CHECK(j["bf16"]["enabled"] == true);
  CHECK(j["pipeline"]["stages"] == 4);
  CHECK(j["pipeline"]["activation_checkpoint_interval"] == 1);
}

TEST_CASE("exports a target cannot represent are refused with the reason and the fix") {
  CHECK(refusal("seed", "deepspeed") ==
        "seed.plan.json: parallel.tp: DeepSpeed's config has no tensor-parallel size: Megatron-style TP (and sequence "
        "parallelism) comes from the model code, e.g. Megatron-DeepSpeed's --tensor-model-parallel-size (fix: export "
        "with --to megatron, or plan with --tp 1)");
  CHECK(refusal("seed", "torchtitan") ==
        "seed.plan.json: parallel.zero_stage: ZeRO-1 (sharded optimizer states, replicated weights and gradients) has "
        "no torchtitan equivalent: FSDP2 shards weights, gradients and optimizer states together (fix: plan with "
        "--zero 3 (FSDP), --zero 2 (FSDP without resharding after forward) or --zero 0 (DDP))");
  CHECK(refusal("seed-zero3", "nemo") ==
        "seed-zero3.plan.json: parallel.zero_stage: NeMo's Megatron GPT shards optimizer states (ZeRO-1, optim.name "
        "distributed_fused_adam) but has no ZeRO-3 setting (fix: plan with --zero 0 or 1, or export with --to "
        "megatron (Megatron FSDP))");

  SUBCASE("DeepSpeed: no interleaved schedule, no ZeRO-2/3 with pipelines, no selective recompute") {
    PlanFile pf = plan_file("llama8b-pp4");
    pf.plan.schedule = Schedule::interleaved;
    pf.plan.virtual_stages = 2;
    CHECK_THROWS_WITH_AS(export_plan(pf, "deepspeed"),
                         "llama8b-pp4.plan.json: parallel.schedule: DeepSpeed's pipeline engine has no interleaved "
                         "(virtual-stage) schedule; it runs one 1F1B schedule (TrainSchedule) (fix: plan with "
                         "--schedule 1f1b, or export with --to megatron)",
                         InputError);
    pf = plan_file("llama8b-pp4");
    pf.plan.zero_stage = 3;
    CHECK_THROWS_WITH_AS(export_plan(pf, "deepspeed"),
                         "llama8b-pp4.plan.json: parallel.zero_stage: DeepSpeed's pipeline engine rejects ZeRO-3 "
                         "(\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\", "
                         "deepspeed/runtime/pipe/engine.py) (fix: plan with --zero 0 or 1, or with --pp 1)",
                         InputError);
    pf = plan_file("llama8b-pp4");
    pf.plan.recompute = Recompute::selective;
    CHECK_THROWS_WITH_AS(export_plan(pf, "deepspeed"),
                         "llama8b-pp4.plan.json: parallel.recompute: DeepSpeed has no selective (attention-core) "
                         "recomputation; its activation checkpointing recomputes whole layers (fix: plan with "
                         "--recompute none or full)",
                         InputError);
  }
  SUBCASE("DeepSpeed and torchtitan: no plan priced with Megatron's fused gradient accumulation") {
    PlanFile pf = plan_file("llama8b-pp4");
    pf.plan.grad_accum_fusion = true;
    CHECK_THROWS_WITH_AS(export_plan(pf, "deepspeed"),
                         "llama8b-pp4.plan.json: parallel.grad_accum_fusion: DeepSpeed's engine adds each "
                         "micro-batch's gradients to its accumulation buffers in a separate pass, not inside the "
                         "weight-gradient GEMMs, and the plan was priced with Megatron's fused accumulation (fix: plan "
                         "with --grad-accum-fusion off (plan --for deepspeed does))",
                         InputError);
    pf = plan_file("seed-zero3");
    pf.plan.grad_accum_fusion = true;
    CHECK_THROWS_WITH_AS(export_plan(pf, "torchtitan"),
                         "seed-zero3.plan.json: parallel.grad_accum_fusion: torchtitan (FSDP2 or DDP) adds each "
                         "micro-batch's gradients in a separate pass (autograd's AccumulateGrad, FSDP's sharded add), "
                         "not inside the weight-gradient GEMMs, and the plan was priced with Megatron's fused "
                         "accumulation (fix: plan with --grad-accum-fusion off (plan --for torchtitan does))",
                         InputError);
    // Megatron and NeMo express either.
    CHECK_NOTHROW(export_plan(pf, "megatron"));
  }
  SUBCASE("Megatron: no GPipe, only its two rank orders") {
    PlanFile pf = plan_file("seed");
    pf.plan.schedule = Schedule::gpipe;
    CHECK_THROWS_WITH_AS(export_plan(pf, "megatron"),
                         "seed.plan.json: parallel.schedule: Megatron-LM has no GPipe schedule (its pipeline schedules "
                         "are 1F1B and interleaved 1F1B) (fix: plan with --schedule 1f1b or --schedule interleaved)",
                         InputError);
    pf = plan_file("seed");
    pf.plan.order = RankOrder::parse("dp-tp-pp", "test", "order");
    CHECK_THROWS_WITH_AS(export_plan(pf, "megatron"),
                         "seed.plan.json: parallel.rank_order: Megatron-LM orders ranks tp-dp-pp (default) or tp-pp-dp "
                         "(--use-tp-pp-dp-mapping), not dp-tp-pp (fix: plan with --rank-order tp-dp-pp or tp-pp-dp)",
                         InputError);
    pf.plan.order = RankOrder::parse("tp-pp-dp", "test", "order");
    CHECK(export_plan(pf, "megatron").find("--use-tp-pp-dp-mapping\n") != std::string::npos);
  }
  SUBCASE("torchtitan: DDP only without TP/PP, TP implies sequence parallelism") {
    PlanFile pf = plan_file("seed");
    pf.plan.zero_stage = 0;
    CHECK_THROWS_WITH_AS(export_plan(pf, "torchtitan"),
                         "seed.plan.json: parallel.zero_stage: torchtitan replicates with DDP "
                         "(data_parallel_replicate_degree) only without tensor or pipeline parallelism (\"DDP has not "
                         "supported > 1D parallelism\") (fix: plan with --zero 3 (FSDP), or export with --to megatron)",
                         InputError);
    pf = plan_file("seed-zero3");
    pf.plan.sequence_parallel = false;
    CHECK_THROWS_WITH_AS(export_plan(pf, "torchtitan"),
                         "seed-zero3.plan.json: parallel.sequence_parallel: torchtitan's tensor parallelism always "
                         "shards norms along the sequence (sequence parallelism) (fix: plan with --sequence-parallel "
                         "on)",
                         InputError);
  }
  SUBCASE("torchtitan: ZeRO-2 is FSDP without resharding after forward") {
    PlanFile pf = plan_file("seed-zero3");
    pf.plan.zero_stage = 2;
    const std::string text = export_plan(pf, "torchtitan");
    CHECK(text.find("--parallelism.fsdp_reshard_after_forward=never") != std::string::npos);
    CHECK(text.find("--parallelism.data_parallel_shard_degree=2") != std::string::npos);
  }
}

TEST_CASE("an unknown target names the flag and the choices") {
  CHECK_THROWS_WITH_AS(export_plan(plan_file("seed"), "jax"),
                       "command line: --to: unknown export target \"jax\" (fix: use megatron, deepspeed, torchtitan or "
                       "nemo)",
                       InputError);
  CHECK(export_targets() == std::vector<std::string>{"megatron", "deepspeed", "torchtitan", "nemo"});
}
