// What each trainer runs when started with cuboid's export (io/export_resolve):
// the start-up model reads the exported text back and must arrive at the
// priced plan, for every fixture plan each target exports, and for the best
// plan `plan --for TARGET` finds on the README's Llama-3-70B example, on
// Mixtral 8x7B and on a 128K-token context-parallel plan. Edited exports show
// that each rule catches the run it exists for.
#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>

#include "cuboid/core/error.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/export_resolve.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;

namespace {

PlanFile fixture_file(const std::string& name) {
  for (const auto& f : cuboid::test::fixtures())
    if (f.name == name) return cuboid::test::fixture_plan_file(f);
  FAIL("no fixture " << name);
  return {};
}

// A fixture as a target's own preset prices it: torchtitan's keeps its
// pipeline's FSDP gradients unsharded (pp_fsdp_no_sync), which its export
// requires of a PP plan with FSDP (test_export's titan()).
PlanFile priced_for(PlanFile pf, const std::string& target) {
  if (target == "torchtitan") pf.plan.trainer = find_trainer("torchtitan")->settings;
  return pf;
}

// "" when the export of `pf` to `target` runs as priced; else what differs.
std::string mismatches(const PlanFile& pf, const std::string& target) {
  const ExportResult r = export_plan(pf, target);
  return describe(compare_with_plan(resolve_export(target, r), pf));
}

// The mismatches after replacing `from` by `to` in the export's text (or its notes).
std::string after_edit(const PlanFile& pf, const std::string& target, const std::string& from, const std::string& to,
                       bool notes = false) {
  ExportResult r = export_plan(pf, target);
  std::string& text = notes ? r.notes : r.text;
  const auto at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "\"" << from << "\" not in the export:\n" << text);
  text.replace(at, from.size(), to);
  return describe(compare_with_plan(resolve_export(target, r), pf));
}

const ResolvedSetting& setting(const ResolvedRun& run, const std::string& name) {
  const ResolvedSetting* s = run.find(name);
  REQUIRE_MESSAGE(s != nullptr, "no resolved " << name);
  return *s;
}

// What `plan --for TARGET` picks (src/cli/plan_flags.cpp restrict_to_target),
// analytically: the best plan the target exports; nullopt when it exports none.
std::optional<PlanFile> plan_for(const std::string& target, const ModelSpec& model, const Cluster& cluster,
                                 std::optional<std::int64_t> seq_length, int max_micro_batch) {
  PlanFile pf = cuboid::test::plan_file_on(model, cluster, "for-" + target + ".plan.json");
  PlannerOptions o;
  o.trainer = cuboid::test::for_target_trainer(target);
  o.simulate_top = 0;
  o.threads = 1;
  o.seq_length = seq_length;
  o.max_micro_batch = max_micro_batch;
  o.accept = [&](const ParallelPlan& p) {
    PlanFile c = pf;
    c.plan = p;
    try {
      (void)export_plan(c, target);
      return true;
    } catch (const InputError&) {
      return false;
    }
  };
  const SearchResult r = search_plans(model, Topology(cluster), o);
  if (r.fitting.empty()) return std::nullopt;
  pf.plan = r.fitting.front().plan;
  return pf;
}

}  // namespace

TEST_CASE("every fixture plan runs as priced on every target that exports it") {
  int resolved = 0;
  for (const auto& f : cuboid::test::fixtures()) {
    for (const std::string& target : export_targets()) {
      const PlanFile pf = priced_for(cuboid::test::fixture_plan_file(f), target);
      CAPTURE(f.name);
      CAPTURE(target);
      ExportResult r;
      try {
        r = export_plan(pf, target);
      } catch (const InputError&) {
        continue;  // refused with the reason (test_export pins the refusals)
      }
      const ResolvedRun run = resolve_export(target, r);
      CHECK_MESSAGE(describe(compare_with_plan(run, pf)) == "", r.text << r.notes);
      ++resolved;
    }
  }
  // Every golden pair of test_export, and Mixtral on Megatron-LM and Megatron-Bridge (torchtitan main
  // refuses every plan: its attention is FlexAttention over packed documents).
  CHECK(resolved >= 11);
}

TEST_CASE("an MoE plan with Megatron-FSDP (ZeRO-3, experts over expert-DP) runs as priced") {
  // Megatron-LM and Megatron-Bridge write Megatron-FSDP for an MoE plan as for a dense one
  // (--use-megatron-fsdp, optim_grads_params); the experts' group is Megatron-Core's own.
  PlanFile pf = fixture_file("mixtral-ep8");
  pf.plan.zero_stage = 3;
  pf.plan.trainer = find_trainer("megatron-core")->settings;
  for (const std::string target : {"megatron", "megatron-bridge"}) {
    CAPTURE(target);
    const ExportResult r = export_plan(pf, target);
    CHECK(r.text.find("optim_grads_params") != std::string::npos);
    const ResolvedRun run = resolve_export(target, r);
    CHECK(setting(run, "zero_stage").value == "3");
    CHECK_MESSAGE(describe(compare_with_plan(run, pf)) == "", r.text << r.notes);
  }
}

TEST_CASE("plan --for TARGET runs as priced: the README's Llama-3-70B, Mixtral 8x7B, a 128K-token CP plan" *
          doctest::timeout(120)) {
  const Cluster cluster = cuboid::test::four_dgx_a100();
  struct Case {
    const char* card;
    std::optional<std::int64_t> seq;
    int max_micro_batch;
  };
  const Case cases[] = {
      {"models/llama3-70b.json", std::nullopt, 4},  // the README's Quick start: 4 x 8 A100, its batch and sequence
      {"models/mixtral-8x7b.json", std::nullopt, 2},
      {"models/llama3-8b.json", 131072, 1},  // 128K tokens a sequence: context parallelism
  };
  for (const Case& c : cases) {
    ModelSpec model = load_model(cuboid::test::source_root() / c.card);
    // Llama 3.1 8B's 128K context: Llama 3 8B's shape, 131072 positions.
    if (c.seq) model.max_position_embeddings = *c.seq;
    const std::string card = c.card;
    for (const std::string& target : export_targets()) {
      CAPTURE(card);
      CAPTURE(target);
      const std::optional<PlanFile> pf = plan_for(target, model, cluster, c.seq, c.max_micro_batch);
      if (!pf) {
        // Refused with the reason: the target exports no plan of this model.
        ParallelPlan p = cuboid::test::make_plan(1, 1, 32, 1, 1, Recompute::full, false, Schedule::one_f_one_b,
                                                 c.seq.value_or(model.seq_length));
        PlanFile any;
        any.source = "any.plan.json";
        any.model = model;
        any.plan = p;
        any.nodes = 4;
        any.gpus_per_node = 8;
        CHECK_THROWS_AS(export_plan(any, target), InputError);
        continue;
      }
      // The targets with context parallelism split the 128K tokens over CP ranks.
      if (c.seq && (target == "megatron" || target == "megatron-bridge" || target == "nemo")) CHECK(pf->plan.cp > 1);
      const ExportResult r = export_plan(*pf, target);
      CHECK_MESSAGE(describe(compare_with_plan(resolve_export(target, r), *pf)) == "", r.text << r.notes);
    }
  }
}

TEST_CASE("Megatron-LM: the settings it derives, and the defaults of what the export leaves out") {
  const PlanFile seed = fixture_file("seed");
  const ResolvedRun run = resolve_export("megatron", export_plan(seed, "megatron"));
  CHECK(run.failures.empty());
  CHECK(setting(run, "world").value == "32");
  CHECK(setting(run, "dp").value == "2");
  CHECK(setting(run, "dp").source.find("arguments.py:448@d98e8a64") != std::string::npos);
  CHECK(setting(run, "num_micro_batches").value == "32");
  CHECK(setting(run, "zero_stage").value == "1");
  CHECK(setting(run, "dp_grad_bytes").value == "4");
  CHECK(setting(run, "optimizer").value == "adam");
  // Llama trains without dropout: the export says so, Megatron's default is 0.1.
  CHECK(setting(run, "hidden_dropout").value == "0");
  CHECK(after_edit(seed, "megatron", "    --hidden-dropout 0\n", "") ==
        "hidden_dropout: priced 0, runs 0.1 (megatron/core/transformer/transformer_config.py:188@d98e8a64: "
        "--hidden-dropout, default 0.1)\n");
  // GPT-3 trains with 0.1: nothing written, Megatron's default.
  const PlanFile gpt3 = fixture_file("gpt3-interleaved");
  CHECK(export_plan(gpt3, "megatron").text.find("dropout") == std::string::npos);
  CHECK(setting(resolve_export("megatron", export_plan(gpt3, "megatron")), "virtual_stages").value == "3");
  // Without the distributed optimizer flag ZeRO-1 runs as ZeRO-0.
  CHECK(after_edit(seed, "megatron", "    --use-distributed-optimizer\n", "").find("zero_stage: priced 1, runs 0") == 0);
  // --overlap-param-gather without --overlap-grad-reduce: validate_args asserts.
  const std::string fails =
      after_edit(fixture_file("seed-zero3"), "megatron", "    --overlap-grad-reduce\n", "");
  CHECK(fails.find("start-up fails: --overlap-param-gather without --overlap-grad-reduce") != std::string::npos);
  // ZeRO-1 priced as DeepSpeed's all-reduce: Megatron-Core reduce-scatters, so the Megatron-Core targets refuse it.
  for (const char* target : {"megatron", "megatron-bridge", "nemo"})
    CHECK_THROWS_WITH_AS(export_plan(fixture_file("llama8b-pp4"), target),
                         doctest::Contains("trainer.zero1_grad_all_reduce: "), InputError);
  // A ZeRO-3 plan priced with the reduction after the backward is refused (it was exported that way).
  PlanFile late = fixture_file("seed-zero3");
  late.plan.trainer.dp_overlap = false;
  CHECK_THROWS_WITH_AS(export_plan(late, "megatron"),
                       doctest::Contains("seed-zero3.plan.json: trainer.dp_overlap: Megatron FSDP prefetches"), InputError);
  // Interleaving with PP 2 and unoverlapped p2p: refused by validate_args.
  PlanFile pp2 = gpt3;
  pp2.plan.pp = 2;
  pp2.plan.dp = 2;
  pp2.plan.virtual_stages = 2;
  CHECK(mismatches(pp2, "megatron") == "");
  CHECK(after_edit(pp2, "megatron", "    --num-layers-per-virtual-pipeline-stage 24\n",
                   "    --num-layers-per-virtual-pipeline-stage 24\n    --no-overlap-p2p-communication\n")
            .find("start-up fails: the interleaved schedule with PP 2 and batched, unoverlapped p2p") == 0);
}

TEST_CASE("Megatron-Bridge: the recipe's settings, validation's syncs and the mixed-precision overwrite") {
  PlanFile pf = fixture_file("seed");
  pf.plan.zero_stage = 0;
  CHECK(mismatches(pf, "megatron-bridge") == "");
  // Validation syncs the DDP and optimizer flags to on when either is: ZeRO-0 would run as ZeRO-1.
  CHECK(after_edit(pf, "megatron-bridge", "    cfg.optimizer.use_distributed_optimizer = False\n", "")
            .find("zero_stage: priced 0, runs 1 (Megatron-Bridge training/config.py:1953@v0.6.0") == 0);
  // The recipe's grad_reduce_in_fp32 overwrites the DDP config's.
  pf = fixture_file("seed");
  pf.plan.trainer.dp_grad_bytes = 2;
  CHECK(mismatches(pf, "megatron-bridge") == "");
  CHECK(after_edit(pf, "megatron-bridge", "    cfg.mixed_precision.grad_reduce_in_fp32 = False\n", "")
            .find("dp_grad_bytes: priced 2, runs 4") == 0);
  // Interleaved with PP 2: the recipe's batched p2p is what Megatron-LM refuses.
  PlanFile pp2 = fixture_file("gpt3-interleaved");
  pp2.plan.pp = 2;
  pp2.plan.dp = 2;
  pp2.plan.virtual_stages = 2;
  CHECK(mismatches(pp2, "megatron-bridge") == "");
  CHECK(after_edit(pp2, "megatron-bridge", "        overlap_p2p_comm=True,\n        batch_p2p_comm=False,\n", "")
            .find("start-up fails: the interleaved schedule with PP 2") == 0);
  // Without the base recipe's micro-batch override, _pretrain_common's 2 runs.
  CHECK(after_edit(fixture_file("seed"), "megatron-bridge", "    cfg.train.micro_batch_size = 1\n", "")
            .find("micro_batch: priced 1, runs 2 (Megatron-Bridge recipes/common.py:67@v0.6.0") == 0);
  // The model's dropout reaches GPTModelProvider.
  CHECK(after_edit(fixture_file("seed"), "megatron-bridge", "        attention_dropout=0.0,\n", "") ==
        "attention_dropout: priced 0, runs 0.1 (megatron/core/transformer/transformer_config.py:184@cd4afffa: "
        "attention_dropout, default 0.1)\n");
}

TEST_CASE("DeepSpeed: the batch assertion, the optimizer wrapper and the pipeline's reduction") {
  const PlanFile pf = fixture_file("llama8b-pp4");
  const ResolvedRun run = resolve_export("deepspeed", export_plan(pf, "deepspeed"));
  CHECK(run.failures.empty());
  CHECK(setting(run, "dp").value == "8");
  CHECK(setting(run, "zero_stage").value == "1");
  CHECK(setting(run, "zero1_grad_all_reduce").value == "true");
  CHECK(setting(run, "dp_overlap").value == "false");
  CHECK(setting(run, "dp_overlap").source.find("pipe/schedule.py:240@v0.16.4") != std::string::npos);
  // bf16 with ZeRO 0 runs BF16_Optimizer, which partitions as ZeRO-1 does.
  const std::string zero0 = after_edit(pf, "deepspeed", "\"stage\": 1", "\"stage\": 0");
  CHECK(zero0.find("zero_stage") == std::string::npos);  // still BF16_Optimizer: ZeRO-1
  // Without fp32 accumulation ZeRO-1 is the ZeRO optimizer: a reduce-scatter in bf16.
  const std::string bf16_accum = after_edit(pf, "deepspeed", "\"grad_accum_dtype\": \"fp32\"", "\"grad_accum_dtype\": \"bf16\"");
  CHECK(bf16_accum.find("zero1_grad_all_reduce: priced true, runs false") != std::string::npos);
  CHECK(bf16_accum.find("dp_grad_bytes: priced 4, runs 2") != std::string::npos);
  // The batch that does not add up.
  CHECK(after_edit(pf, "deepspeed", "\"gradient_accumulation_steps\": 8", "\"gradient_accumulation_steps\": 4")
            .find("start-up fails: deepspeed/runtime/config.py:931@v0.16.4") == 0);
  // Without checkpointable_layers the embedding is checkpointed and gets no gradient.
  CHECK(after_edit(pf, "deepspeed", "checkpointable_layers=[\"DecoderLayer\"]", "", true)
            .find("start-up fails: deepspeed/runtime/pipe/module.py:648@v0.16.4") == 0);
}

TEST_CASE("NeMo 1.x: the base YAML's defaults and the model's start-up overrides") {
  const PlanFile pf = fixture_file("seed");
  const ResolvedRun run = resolve_export("nemo", export_plan(pf, "nemo"));
  CHECK(run.failures.empty());
  CHECK(setting(run, "zero_stage").value == "1");
  CHECK(setting(run, "grad_accum_fusion").value == "true");
  // Without O2, gradient_accumulation_fusion is dropped at start-up.
  CHECK(after_edit(pf, "nemo", "  megatron_amp_O2: true\n", "  megatron_amp_O2: false\n")
            .find("grad_accum_fusion: priced true, runs false") == 0);
  // Without transformer_engine the local spec's unfused attention runs.
  CHECK(after_edit(pf, "nemo", "  transformer_engine: true\n", "").find("attention: priced fused, runs unfused") == 0);
  // megatron_gpt_config.yaml's dropouts are 0.1.
  CHECK(after_edit(pf, "nemo", "  hidden_dropout: 0\n", "").find("hidden_dropout: priced 0, runs 0.1") == 0);
  // mcore_distributed_optim overlaps only with overlap_grad_sync.
  CHECK(after_edit(pf, "nemo", "    overlap_grad_sync: true\n", "").find("dp_overlap: priced true, runs false") == 0);
}

TEST_CASE("torchtitan v0.2.2: what the base TOML turns on when the overrides leave it") {
  const PlanFile pf = priced_for(fixture_file("seed-zero3"), "torchtitan");
  const ResolvedRun run = resolve_export("torchtitan", export_plan(pf, "torchtitan"));
  CHECK(run.failures.empty());
  CHECK(setting(run, "zero_stage").value == "3");
  CHECK(setting(run, "compile").value == "false");
  // The 405B TOML turns on float8, torch.compile and async TP: a bf16 plan would train in FP8.
  const std::string big = after_edit(pf, "torchtitan", "llama3_70b.toml", "llama3_405b.toml");
  CHECK(big.find("precision: priced bf16, runs fp8-current") != std::string::npos);
  // torch.compile and async TP stay off: the export turns both off on its command line.
  CHECK(big.find("compile:") == std::string::npos);
  CHECK(big.find("async_tp:") == std::string::npos);
  // FSDP's default policy with PP does not reshard after forward: ZeRO-2, not 3.
  CHECK(after_edit(pf, "torchtitan", "--parallelism.fsdp_reshard_after_forward=always \\\n", "")
            .find("zero_stage: priced 3, runs 2") == 0);
}

TEST_CASE("the resolution model reads only what the exporters write") {
  CHECK_THROWS_AS(resolve_export("megatron", ExportResult{"MEGATRON_ARGS=(\n    --micro-batch-size 1\n)\n", ""}),
                  std::invalid_argument);
  CHECK_THROWS_AS(resolve_export("jax", ExportResult{}), InputError);
}

TEST_CASE("the EP overlap with PP > 1: exported with the virtual stages it needs, and run as priced") {
  // Mixtral 8x7B, TP 2 x PP 2 (2 virtual stages) x DP 8, EP 8.
  PlanFile pf = fixture_file("mixtral-ep8");
  pf.plan.schedule = Schedule::interleaved;
  pf.plan.virtual_stages = 2;
  pf.plan.moe_ep_overlap = true;
  for (const char* target : {"megatron", "megatron-bridge"}) {
    CAPTURE(target);
    CHECK(mismatches(pf, target) == "");
    CHECK(setting(resolve_export(target, export_plan(pf, target)), "moe_ep_overlap").value == "true");
  }
  CHECK(export_plan(pf, "megatron").text.find("--overlap-moe-expert-parallel-comm\n") != std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("overlap_moe_expert_parallel_comm=True,") != std::string::npos);
  // Without the flag the run has no overlap (and Megatron-Core asserts it
  // under the delayed weight gradients); without the virtual stages it asserts.
  const std::string no_overlap = after_edit(pf, "megatron", "    --overlap-moe-expert-parallel-comm\n", "");
  CHECK(no_overlap.find("moe_ep_overlap: priced true, runs false") != std::string::npos);
  CHECK(no_overlap.find("start-up fails: megatron/core/transformer/transformer_config.py:3074@d98e8a64: "
                        "delay_wgrad_compute asserts overlap_moe_expert_parallel_comm") != std::string::npos);
  const std::string no_vpp = after_edit(pf, "megatron", "    --num-layers-per-virtual-pipeline-stage 8\n", "");
  CHECK(no_vpp.find("start-up fails: megatron/core/transformer/transformer_config.py:3008@d98e8a64: "
                    "overlap_moe_expert_parallel_comm with PP > 1 asserts virtual_pipeline_model_parallel_size is "
                    "set") != std::string::npos);
}

TEST_CASE("the EP overlap's delayed weight gradients run as priced, on or off") {
  PlanFile pf = fixture_file("mixtral-ep8");
  pf.plan.schedule = Schedule::interleaved;
  pf.plan.virtual_stages = 2;
  pf.plan.moe_ep_overlap = true;
  for (const bool delayed : {true, false}) {
    pf.plan.moe_delay_wgrad = delayed;
    for (const char* target : {"megatron", "megatron-bridge"}) {
      CAPTURE(target);
      CAPTURE(delayed);
      CHECK(mismatches(pf, target) == "");
      CHECK(setting(resolve_export(target, export_plan(pf, target)), "moe_delay_wgrad").value ==
            (delayed ? "true" : "false"));
    }
  }
  CHECK(export_plan(pf, "megatron").text.find("delay-wgrad-compute") == std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("delay_wgrad_compute") == std::string::npos);
  pf.plan.moe_delay_wgrad = true;
  CHECK(after_edit(pf, "megatron", "    --delay-wgrad-compute\n", "")
            .find("moe_delay_wgrad: priced true, runs false") == 0);
  CHECK(after_edit(pf, "megatron-bridge", "        delay_wgrad_compute=True,\n", "")
            .find("moe_delay_wgrad: priced true, runs false") == 0);
  // Not compared without the overlap.
  pf.plan.moe_ep_overlap = false;
  pf.plan.moe_delay_wgrad = false;
  CHECK(mismatches(pf, "megatron") == "");
}

TEST_CASE("partial full recomputation runs as priced on Megatron-LM, Megatron-Bridge and NeMo 1.x") {
  PlanFile pf = fixture_file("seed");
  pf.plan.recompute_method = RecomputeMethod::block;
  pf.plan.recompute_num_layers = 5;
  for (const char* target : {"megatron", "megatron-bridge", "nemo"}) {
    CAPTURE(target);
    CHECK(mismatches(pf, target) == "");
    CHECK(setting(resolve_export(target, export_plan(pf, target)), "recompute").value == "full:block:5");
  }
  // Another layer count, or uniform 1 (the seed as it was), is a mismatch.
  CHECK(after_edit(pf, "megatron", "--recompute-num-layers 5", "--recompute-num-layers 4")
            .find("recompute: priced full:block:5, runs full:block:4") == 0);
  CHECK(after_edit(pf, "megatron", "--recompute-method block", "--recompute-method uniform")
            .find("recompute: priced full:block:5, runs full:uniform:5") == 0);
  CHECK(mismatches(fixture_file("seed"), "megatron") == "");
}

TEST_CASE("the precision-aware optimizer and bf16 moments run as priced on Megatron-LM and Megatron-Bridge") {
  PlanFile pf = fixture_file("seed");
  pf.plan.precision_aware_optimizer = true;
  pf.plan.adam_moment_bytes = 2;
  for (const char* target : {"megatron", "megatron-bridge"}) {
    CAPTURE(target);
    CHECK(mismatches(pf, target) == "");
    const ResolvedRun run = resolve_export(target, export_plan(pf, target));
    CHECK(setting(run, "precision_aware_optimizer").value == "true");
    CHECK(setting(run, "adam_moment_bytes").value == "2");
  }
  // The moments back in fp32, or one of them: a mismatch; without the optimizer Megatron-Core refuses bf16 moments.
  CHECK(after_edit(pf, "megatron", "    --exp-avg-dtype bf16\n    --exp-avg-sq-dtype bf16\n", "")
            .find("adam_moment_bytes: priced 2, runs 4") == 0);
  CHECK(after_edit(pf, "megatron", "--exp-avg-sq-dtype bf16", "--exp-avg-sq-dtype fp32")
            .find("Adam's moments in two dtypes") != std::string::npos);
  const std::string plain = after_edit(pf, "megatron", "    --use-precision-aware-optimizer\n", "");
  CHECK(plain.find("without the precision-aware optimizer") != std::string::npos);
  CHECK(plain.find("precision_aware_optimizer: priced true, runs false") != std::string::npos);
  CHECK(mismatches(fixture_file("seed"), "megatron") == "");
}

TEST_CASE("FP8 attention runs as priced on Megatron-Bridge") {
  PlanFile pf = fixture_file("seed");
  pf.plan.precision = Precision::mxfp8;
  pf.plan.fp8_param_gather = true;
  pf.plan.fp8_attention = true;
  CHECK(mismatches(pf, "megatron-bridge") == "");
  const ResolvedRun run = resolve_export("megatron-bridge", export_plan(pf, "megatron-bridge"));
  CHECK(setting(run, "fp8_attention").value == "true");
  CHECK(after_edit(pf, "megatron-bridge", "cfg.mixed_precision.fp8_dot_product_attention = True\n", "")
            .find("fp8_attention: priced true, runs false") == 0);
  // Without it the recipe's default: bf16 attention, as an FP8 plan without it is priced.
  pf.plan.fp8_attention = false;
  CHECK(mismatches(pf, "megatron-bridge") == "");
}

TEST_CASE("the parameter gather under the optimizer step runs as priced on Megatron-LM and Megatron-Bridge") {
  const PlanFile pf = cuboid::test::with_gather_in_step(fixture_file("seed"));
  for (const char* target : {"megatron", "megatron-bridge"}) {
    CAPTURE(target);
    CHECK(mismatches(pf, target) == "");
    CHECK(setting(resolve_export(target, export_plan(pf, target)), "overlap_param_gather_with_optimizer_step").value ==
          "true");
  }
  CHECK(after_edit(pf, "megatron-bridge", "    cfg.optimizer.overlap_param_gather_with_optimizer_step = True\n", "")
            .find("overlap_param_gather_with_optimizer_step: priced true, runs false") == 0);
  // Megatron-LM's validate_args: torch checkpoints, the overlapped gather.
  CHECK(after_edit(pf, "megatron", "    --ckpt-format torch\n", "")
            .find("start-up fails: --overlap-param-gather-with-optimizer-step with a distributed checkpoint format") !=
        std::string::npos);
  CHECK(after_edit(pf, "megatron", "    --overlap-param-gather\n", "")
            .find("start-up fails: --overlap-param-gather-with-optimizer-step without --overlap-param-gather") !=
        std::string::npos);
}

TEST_CASE("the aligned parameter gathers run as priced on Megatron-LM and Megatron-Bridge, on or off") {
  PlanFile pf = cuboid::test::with_gather_in_forward(fixture_file("seed"));
  for (const bool align : {true, false}) {
    pf.plan.trainer.align_param_gather = align;
    for (const char* target : {"megatron", "megatron-bridge"}) {
      CAPTURE(target);
      CAPTURE(align);
      CHECK(mismatches(pf, target) == "");
      CHECK(setting(resolve_export(target, export_plan(pf, target)), "align_param_gather").value ==
            (align ? "true" : "false"));
    }
  }
  // Megatron-Bridge's DDP config leaves it off.
  pf.plan.trainer.align_param_gather = true;
  CHECK(after_edit(pf, "megatron-bridge", "    cfg.ddp.align_param_gather = True\n", "")
            .find("align_param_gather: priced true, runs false") == 0);
  // Without virtual stages it changes nothing: not compared.
  pf = fixture_file("seed");
  pf.plan.trainer.overlap_param_gather = true;
  pf.plan.trainer.align_param_gather = false;
  CHECK(mismatches(pf, "megatron-bridge") == "");
}

TEST_CASE("the DDP bucket size runs as priced on Megatron-LM and Megatron-Bridge, given or not") {
  PlanFile pf = fixture_file("seed");
  for (const std::int64_t bucket : {std::int64_t{0}, std::int64_t{134217728}}) {
    pf.plan.trainer.ddp_bucket_params = bucket;
    for (const char* target : {"megatron", "megatron-bridge"}) {
      CAPTURE(target);
      CAPTURE(bucket);
      CHECK(mismatches(pf, target) == "");
      CHECK(setting(resolve_export(target, export_plan(pf, target)), "ddp_bucket_size").value ==
            (bucket > 0 ? "134217728" : "max(40M, 1M x DP x CP)"));
    }
  }
  CHECK(after_edit(pf, "megatron", "    --ddp-bucket-size 134217728\n", "")
            .find("ddp_bucket_size: priced 134217728, runs max(40M, 1M x DP x CP)") == 0);
  CHECK(after_edit(pf, "megatron-bridge", "    cfg.ddp.bucket_size = 134217728\n", "")
            .find("ddp_bucket_size: priced 134217728, runs max(40M, 1M x DP x CP)") == 0);
}

TEST_CASE("HybridEP's rank capacity factor and the paged stash run as priced; the start-up model asserts their needs") {
  // Mixtral 8x7B, TP 2 x PP 2 x DP 8, EP 8 over flex with HybridEP, the budget at 1.5 and the stash.
  PlanFile pf = fixture_file("mixtral-ep8");
  pf.plan.moe_dispatcher = MoeDispatcher::flex;
  pf.plan.moe_flex = FlexSetting{FlexBackend::hybridep, 0, 1.5, true, 1.2};
  for (const char* target : {"megatron", "megatron-bridge"}) {
    CAPTURE(target);
    CHECK(mismatches(pf, target) == "");
    const ResolvedRun run = resolve_export(target, export_plan(pf, target));
    CHECK(setting(run, "moe_rank_capacity_factor").value == "1.5");
    CHECK(setting(run, "moe_paged_stash").value == "true");
  }
  // Without the op fuser Megatron-Core refuses HybridEP's factor; without the factor, the stash.
  CHECK(after_edit(pf, "megatron", "    --use-transformer-engine-op-fuser\n", "")
            .find("start-up fails: megatron/core/transformer/transformer_config.py:1875@d98e8a64: "
                  "moe_expert_rank_capacity_factor with hybridep requires use_transformer_engine_op_fuser") !=
        std::string::npos);
  CHECK(after_edit(pf, "megatron", "    --moe-expert-rank-capacity-factor 1.5\n", "")
            .find("moe_paged_stash requires moe_expert_rank_capacity_factor") != std::string::npos);
}
