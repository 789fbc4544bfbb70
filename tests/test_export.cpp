// Exports to Megatron-LM, Megatron-Bridge, DeepSpeed, torchtitan (v0.2.2 and
// main) and NeMo 1.x: exact golden text for the plans each target can run,
// every emitted flag or key checked against the trainer's own definitions
// (tests/data/trainer_options/, facts from the upstream file at a named
// commit) with the cross-field rules the trainer asserts, and exact refusals.
//
// The goldens live in tests/golden/export/<plan>.<target>.<ext> (DeepSpeed's
// stderr notes in <plan>.deepspeed.notes.txt) and are compared byte for byte
// (they are generated configs, not logs). After an intended change of an
// export, regenerate them and review the diff:
//   CUBOID_UPDATE_GOLDEN=1 meson test -C build export
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cuboid/core/error.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/io/export.hpp"
#include "export_options.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;
using cuboid::test::Emitted;
using cuboid::test::Fixture;
using cuboid::test::num;

namespace {

const Fixture& fixture(const std::string& name) {
  static const std::vector<Fixture> all = cuboid::test::fixtures();
  for (const auto& f : all)
    if (f.name == name) return f;
  FAIL("no fixture " << name);
  return all.front();
}

PlanFile plan_file(const std::string& name) { return cuboid::test::fixture_plan_file(fixture(name)); }

// The fixture priced as torchtitan runs it (plan --trainer torchtitan): its
// pipeline keeps FSDP's gradients unsharded (pp_fsdp_no_sync), which the
// torchtitan export requires of a PP plan with FSDP.
PlanFile titan(const std::string& name) {
  PlanFile pf = plan_file(name);
  pf.plan.trainer = find_trainer("torchtitan")->settings;
  return pf;
}
// The file a golden or option test exports: torchtitan's priced as torchtitan.
PlanFile plan_for(const std::string& name, const std::string& target) {
  return target == "torchtitan" ? titan(name) : plan_file(name);
}

std::string text(const std::string& plan, const std::string& target) { return export_plan(plan_for(plan, target), target).text; }

std::string extension(const std::string& target) {
  for (const ExportTarget& t : export_target_list())
    if (t.name == target) return std::string(t.extension);
  FAIL("no target " << target);
  return "";
}



// The plan file of `p` for `model` on the seed's 4 DGX A100, checked and estimated.
PlanFile priced_plan_file(const ModelSpec& model, const ParallelPlan& p, const std::string& name) {
  const Cluster cluster = cuboid::test::four_dgx_a100();
  if (const auto bad = check_plan(p, model, cluster)) throw std::invalid_argument(describe(*bad, model, cluster));
  return plan_file_from_json(plan_to_json(model, cluster, estimate(model, Topology(cluster), p)), name);
}

void compare_golden(const std::string& text, const std::string& file) {
  const auto path = cuboid::test::source_root() / "tests/golden/export" / file;
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

void check_golden(const std::string& plan, const std::string& target) {
  const ExportResult r = export_plan(plan_for(plan, target), target);
  compare_golden(r.text, plan + "." + target + "." + extension(target));
  if (!r.notes.empty()) compare_golden(r.notes, plan + "." + target + ".notes.txt");
}

std::string refusal(const PlanFile& pf, const std::string& target) {
  try {
    export_plan(pf, target);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no refusal)";
}
std::string refusal(const std::string& plan, const std::string& target) { return refusal(plan_file(plan), target); }

// Every target of `targets` refuses `pf`, naming `field` and pointing at Megatron.
void check_refused(const PlanFile& pf, std::initializer_list<const char*> targets, const std::string& field) {
  for (const char* target : targets) {
    CAPTURE(target);
    try {
      (void)export_plan(pf, target);
      FAIL_CHECK("no refusal");
    } catch (const InputError& e) {
      CHECK(e.field() == field);
      CHECK(e.fix().find(field == "model.rope_scaling_type" ? "drop rope_scaling_type" : "--to megatron") !=
            std::string::npos);
    }
  }
}

// The option file of each target and pinned version.
const std::map<std::string, std::string> kOptionFiles = {
    {"megatron", "megatron-d98e8a64.json"},          {"megatron-bridge", "megatron-bridge-v0.6.0.json"},
    {"deepspeed", "deepspeed-v0.16.4.json"},         {"torchtitan", "torchtitan-v0.2.2.json"},
    {"nemo", "nemo-8cfedd72.json"},
};

Emitted read(const std::string& target, const std::string& text) {
  if (target == "megatron") return cuboid::test::read_megatron(text);
  if (target == "deepspeed") return cuboid::test::read_deepspeed(text);
  if (target == "torchtitan") {
    const Emitted flags = cuboid::test::read_torchtitan_flags(text);
    CHECK_MESSAGE(flags == cuboid::test::read_toml(text), "the overrides and the TOML tables differ");
    return flags;
  }
  if (target == "megatron-bridge") return cuboid::test::read_python(text, "cfg", "model.");
  return cuboid::test::read_yaml(text);
}

// The cross-field rules each trainer asserts at start-up.
void check_rules(const std::string& target, const Emitted& e, const PlanFile& pf) {
  const int world = pf.nodes * pf.gpus_per_node;
  const std::int64_t layers = pf.model.num_layers;
  INFO(target << " cross-field rules");
  if (target == "megatron" || target == "megatron-bridge") {
    const bool bridge = target == "megatron-bridge";
    const std::string m = bridge ? "model." : "--";
    auto get = [&](const std::string& megatron, const std::string& b) { return num(e, bridge ? "model." + b : megatron); };
    const std::int64_t tp = get("--tensor-model-parallel-size", "tensor_model_parallel_size");
    const std::int64_t pp = get("--pipeline-model-parallel-size", "pipeline_model_parallel_size");
    REQUIRE(tp > 0);
    REQUIRE(pp > 0);
    // megatron/core/parallel_state.py: world = tp x pp x cp x dp.
    CHECK(world % (tp * pp) == 0);
    const std::int64_t dp = world / (tp * pp);
    const std::int64_t micro = bridge ? num(e, "train.micro_batch_size") : num(e, "--micro-batch-size");
    const std::int64_t global = bridge ? num(e, "train.global_batch_size") : num(e, "--global-batch-size");
    // megatron/core/num_microbatches_calculator.py: global divisible by micro x dp.
    CHECK(global % (micro * dp) == 0);
    CHECK(get("--num-attention-heads", "num_attention_heads") % tp == 0);
    const std::int64_t groups = get("--num-query-groups", "num_query_groups");
    if (groups > 0) CHECK(groups % tp == 0);
    CHECK(get("--num-layers", "num_layers") == layers);
    // arguments.py: num_experts % EP == 0; parallel_state.py: a stage's
    // TP x CP x DP ranks regroup as ETP x EP x expert-DP.
    if (const std::int64_t ep = get("--expert-model-parallel-size", "expert_model_parallel_size"); ep > 0) {
      CHECK(get("--num-experts", "num_moe_experts") % ep == 0);
      CHECK((world / pp) % (ep * get("--expert-tensor-parallel-size", "expert_tensor_parallel_size")) == 0);
    }
    const std::int64_t first = get("--decoder-first-pipeline-num-layers", "num_layers_in_first_pipeline_stage");
    const std::int64_t last = get("--decoder-last-pipeline-num-layers", "num_layers_in_last_pipeline_stage");
    const bool uneven = first > 0 || last > 0;
    if (!uneven) CHECK(layers % pp == 0);
    // transformer_block.py get_num_layers_to_build: the middle stages share the rest evenly.
    const std::int64_t middle_stages = pp - (first > 0) - (last > 0);
    const std::int64_t middle_layers = layers - std::max<std::int64_t>(first, 0) - std::max<std::int64_t>(last, 0);
    if (uneven && middle_stages > 0) CHECK(middle_layers % middle_stages == 0);
    // arguments.py: layers per pipeline stage divisible by layers per virtual
    // stage, and with uneven stages only --num-virtual-stages-per-pipeline-rank.
    if (const std::int64_t lpv = num(e, "--num-layers-per-virtual-pipeline-stage"); lpv > 0) {
      CHECK_FALSE(uneven);
      CHECK((layers / pp) % lpv == 0);
    }
    CHECK_FALSE((num(e, "--num-layers-per-virtual-pipeline-stage") > 0 &&
                 num(e, "--num-virtual-stages-per-pipeline-rank") > 0));
    // TransformerConfig.__post_init__ and get_num_layers_to_build: every
    // stage's layers divisible by the virtual pipeline size.
    std::int64_t vp = num(e, "--num-virtual-stages-per-pipeline-rank");
    if (const auto b = e.find("model.virtual_pipeline_model_parallel_size"); b != e.end() && b->second != "None")
      vp = std::stoll(b->second);
    if (vp > 0) {
      if (!uneven) CHECK((layers / pp) % vp == 0);
      if (first > 0) CHECK(first % vp == 0);
      if (last > 0) CHECK(last % vp == 0);
      if (uneven && middle_stages > 0) CHECK((middle_layers / middle_stages) % vp == 0);
    }
    // arguments.py validate_args: multi-latent attention excludes group-query attention.
    if (e.count("--multi-latent-attention")) CHECK_FALSE(e.count("--group-query-attention"));
    // Quantized GEMMs (Megatron-LM d98e8a64 arguments.py validate_args,
    // TransformerConfig.__post_init__): FP8 and FP4 exclude each other; the
    // parameter gathers need their format and the distributed optimizer or FSDP.
    CHECK_FALSE((e.count("--fp8-format") && e.count("--fp4-format")));
    if (e.count("--fp8-param-gather")) {
      CHECK(e.count("--fp8-format"));
      CHECK((e.count("--use-distributed-optimizer") || e.count("--use-megatron-fsdp")));
    }
    if (e.count("--fp4-param-gather")) CHECK(e.count("--fp4-format"));
    // Megatron-Bridge config.py validate and Megatron-LM cd4afffa
    // distributed_data_parallel_config.py: MXFP8's parameter gather without
    // FSDP needs the gradient buffer's reuse, and the reuse needs the gather.
    if (const auto reuse = e.find("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"); reuse != e.end()) {
      const auto gather = e.find("mixed_precision.fp8_param_gather");
      REQUIRE(gather != e.end());
      if (e.find("ddp.use_megatron_fsdp")->second == "False") CHECK(reuse->second == gather->second);
      if (reuse->second == "True") CHECK(gather->second == "True");
    }
    // Sequence parallelism needs TP > 1 (TransformerConfig.__post_init__ turns it off otherwise).
    if (e.count("--sequence-parallel") || (e.count("model.sequence_parallel") && e.find("model.sequence_parallel")->second == "True"))
      CHECK(tp > 1);
    (void)m;
  } else if (target == "deepspeed") {
    // runtime/config.py _batch_assertion: train_batch = micro x accumulation x DP,
    // DP = world / PipelineModule's num_stages.
    const std::int64_t dp = world / pf.plan.pp;
    CHECK(num(e, "train_batch_size") ==
          num(e, "train_micro_batch_size_per_gpu") * num(e, "gradient_accumulation_steps") * dp);
  } else if (target == "torchtitan") {
    // parallel_dims.py: dp_replicate x dp_shard x cp x tp x pp = world.
    const std::int64_t dp = num(e, "parallelism.data_parallel_replicate_degree") *
                            num(e, "parallelism.data_parallel_shard_degree");
    const std::int64_t pp = num(e, "parallelism.pipeline_parallel_degree");
    CHECK(dp * num(e, "parallelism.context_parallel_degree") * num(e, "parallelism.tensor_parallel_degree") * pp ==
          world);
    // parallel_dims.py: ETP = TP or 1, and efsdp = dp_shard x cp x tp / (ep x etp) whole.
    if (const std::int64_t ep = num(e, "parallelism.expert_parallel_degree"); ep > 1) {
      const std::int64_t tp = num(e, "parallelism.tensor_parallel_degree");
      const std::int64_t etp = num(e, "parallelism.expert_tensor_parallel_degree");
      CHECK((etp == tp || etp == 1));
      CHECK((num(e, "parallelism.data_parallel_shard_degree") * num(e, "parallelism.context_parallel_degree") * tp) %
                (ep * etp) ==
            0);
    }
    if (pp > 1) {
      const std::int64_t stages = layers / num(e, "parallelism.pipeline_parallel_layers_per_stage");
      CHECK(stages * num(e, "parallelism.pipeline_parallel_layers_per_stage") == layers);
      CHECK(stages % pp == 0);
      const bool looped = e.find("parallelism.pipeline_parallel_schedule")->second == "Interleaved1F1B";
      CHECK((stages / pp > 1) == looped);
    }
    // float8.py@v0.2.2: the FP8 all-gather only without a recipe name, and only under FSDP.
    if (const auto gather = e.find("quantize.linear.float8.enable_fsdp_float8_all_gather");
        gather != e.end() && gather->second == "true") {
      CHECK_FALSE(e.count("quantize.linear.float8.recipe_name"));
      CHECK(num(e, "parallelism.data_parallel_shard_degree") > 1);
    }
    // train.py: global batch divisible by local batch x DP; PP splits the local batch.
    CHECK(num(e, "training.global_batch_size") % (num(e, "training.local_batch_size") * dp) == 0);
    if (pp > 1) CHECK(num(e, "training.local_batch_size") % num(e, "parallelism.pipeline_parallel_microbatch_size") == 0);
    // What cuboid priced, whatever the base TOML says: eager kernels (no
    // torch.compile) and no async TP (tensor_parallel.py maybe_enable_async_tp
    // also asserts that async TP comes with compile).
    for (const char* off : {"compile.enable", "parallelism.enable_async_tensor_parallel"}) {
      CAPTURE(off);
      const auto it = e.find(off);
      REQUIRE(it != e.end());
      CHECK(it->second == "false");
    }
  } else if (target == "nemo") {
    CHECK(num(e, "trainer.num_nodes") * num(e, "trainer.devices") == world);
    const std::int64_t tp = num(e, "model.tensor_model_parallel_size");
    const std::int64_t pp = num(e, "model.pipeline_model_parallel_size");
    const std::int64_t cp = std::max<std::int64_t>(num(e, "model.context_parallel_size"), 1);
    CHECK(world % (tp * pp * cp) == 0);
    const std::int64_t dp = world / (tp * pp * cp);
    // parallel_state.py: num_experts % EP == 0; a stage's TP x CP x DP ranks
    // regroup as ETP (= TP here) x EP x expert-DP.
    if (const std::int64_t ep = num(e, "model.expert_model_parallel_size"); ep > 0) {
      CHECK(num(e, "model.num_moe_experts") % ep == 0);
      CHECK((world / pp) % (ep * tp) == 0);
    }
    // Sequence length % (2 x CP) (the chunks of get_batch_on_this_context_parallel_rank).
    CHECK(num(e, "model.encoder_seq_length") % (2 * cp) == 0);
    CHECK(num(e, "model.global_batch_size") % (num(e, "model.micro_batch_size") * dp) == 0);
    CHECK(num(e, "model.num_layers") % pp == 0);
    CHECK(e.find("model.virtual_pipeline_model_parallel_size")->second == "null");
    // megatron_base_model.py: fusion kept only with O2.
    if (e.find("model.gradient_accumulation_fusion")->second == "true")
      CHECK(e.find("model.megatron_amp_O2")->second == "true");
  }
}

// Every emitted option is the trainer's own, with a valid value, and the
// trainer's cross-field rules hold.
void check_options(const PlanFile& pf, const std::string& target) {
  const ExportResult r = export_plan(pf, target);
  const cuboid::test::OptionSet set = cuboid::test::load_options(kOptionFiles.at(target));
  const Emitted e = read(target, r.text);
  INFO(target << " export of " << pf.source << ":\n" << r.text);
  CHECK(e.size() >= 5);
  std::map<std::string, int> seen;
  for (const auto& [name, value] : e) {
    if (target != "nemo" || name != "defaults") CHECK_MESSAGE(++seen[name] == 1, name << " emitted twice");
    const std::string problem = cuboid::test::check_option(set, name, value);
    CHECK_MESSAGE(problem.empty(), problem);
  }
  check_rules(target, e, pf);
}

// The (plan, target) pairs with golden files: every target that can run the plan.
const std::vector<std::pair<std::string, std::string>> kGoldens = {
    {"seed", "megatron"},
    {"seed", "megatron-bridge"},
    {"seed", "nemo"},
    {"gpt3-interleaved", "megatron"},
    {"gpt3-interleaved", "megatron-bridge"},
    {"seed-zero3", "megatron"},
    {"seed-zero3", "megatron-bridge"},
    {"seed-zero3", "torchtitan"},
    {"llama8b-pp4", "deepspeed"},
};

}  // namespace

TEST_CASE("golden exports") {
  for (const auto& [plan, target] : kGoldens) {
    INFO(plan << " -> " << target);
    check_golden(plan, target);
  }
}

TEST_CASE("every emitted option is the trainer's own, with the trainer's cross-field rules") {
  for (const auto& [plan, target] : kGoldens) check_options(plan_for(plan, target), target);
  SUBCASE("the plan variants the refusal tests accept") {
    PlanFile pf = plan_file("seed");
    pf.plan.order = RankOrder::parse("tp-pp-dp", "test", "order");
    check_options(pf, "megatron");
    check_options(pf, "megatron-bridge");
    pf = titan("seed-zero3");
    pf.plan.zero_stage = 2;
    for (const char* t : {"megatron", "megatron-bridge", "torchtitan"}) check_options(pf, t);
    pf = plan_file("gpt3-interleaved");
    pf.plan.flash_attention = false;
    check_options(pf, "megatron");
  }
  SUBCASE("recompute modules: Megatron-LM's --recompute-modules list, Megatron-Bridge's recompute_modules") {
    PlanFile pf = plan_file("seed");
    pf.plan.recompute = Recompute::selective;
    pf.plan.recompute_modules = parse_recompute_modules("mlp,core_attn,layernorm", "test", "modules");
    check_options(pf, "megatron");
    check_options(pf, "megatron-bridge");
    CHECK(export_plan(pf, "megatron").text.find("--recompute-modules core_attn mlp layernorm\n") != std::string::npos);
    CHECK(export_plan(pf, "megatron-bridge").text.find(
              "recompute_modules=[\"core_attn\", \"mlp\", \"layernorm\"]") != std::string::npos);
  }
  SUBCASE("uneven stages in interleaved chunks: Megatron-LM takes only --num-virtual-stages-per-pipeline-rank") {
    PlanFile pf = plan_file("llama8b-pp4");  // 32 layers: 6 + 10 + 10 + 6 in 2 chunks per stage
    pf.plan.trainer = default_trainer().settings;  // priced as Megatron-Core (a reduce-scattered ZeRO-1)
    pf.plan.schedule = Schedule::interleaved;
    pf.plan.virtual_stages = 2;
    pf.plan.first_stage_layers = 6;
    pf.plan.last_stage_layers = 6;
    check_options(pf, "megatron");
    check_options(pf, "megatron-bridge");
    const std::string text = export_plan(pf, "megatron").text;
    CHECK(text.find("--num-virtual-stages-per-pipeline-rank 2\n") != std::string::npos);
    CHECK(text.find("--decoder-first-pipeline-num-layers 6\n") != std::string::npos);
    CHECK(text.find("--num-layers-per-virtual-pipeline-stage") == std::string::npos);
  }
}

TEST_CASE("plan --for TARGET: the best plan each target can run exports and passes its option checks") {
  // What cuboid plan --for does (src/cli/cmd_plan.cpp restrict_to_target),
  // analytically, on the seed's model and cluster, with the seed's batch.
  const ModelSpec model = load_model(cuboid::test::source_root() / "models/llama3-70b.json");
  const Cluster cluster = cuboid::test::four_dgx_a100();
  const Topology topo(cluster);
  for (const std::string& target : export_targets()) {
    if (target == "torchtitan-main") continue;  // refuses every plan (its own test case)
    for (const bool fixed : {false, true}) {
      INFO(target << (fixed ? " with TP 4 x PP 4 x DP 2, rank order tp-dp-pp" : ""));
      PlanFile pf = cuboid::test::plan_file_on(model, cluster, "for-" + target + ".plan.json");
      PlannerOptions o;
      o.trainer = cuboid::test::for_target_trainer(target);
      o.simulate_top = 0;
      o.threads = 1;
      o.global_batch = 64;
      // Micro-batches 1 and 2: every other dimension (CP included) searched,
      // each candidate exported, in well under the sanitizers' time limit.
      o.max_micro_batch = 2;
      if (fixed) {
        if (target == "deepspeed") continue;  // no tensor-parallel size in its config
        o.tp = 4;
        o.pp = 4;
        o.dp = 2;
        o.order = RankOrder{};
        o.search_rank_order = false;
      }
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
      const SearchResult r = search_plans(model, topo, o);
      REQUIRE_MESSAGE(!r.fitting.empty(), "no plan for " << target);
      pf.plan = r.fitting.front().plan;
      check_options(pf, target);
    }
  }
}

TEST_CASE("the Megatron export carries the flags that make the plan") {
  const std::string seed = text("seed", "megatron");
  for (const char* flag : {"--tensor-model-parallel-size 4\n", "--pipeline-model-parallel-size 4\n", "--sequence-parallel\n",
                           "--micro-batch-size 1\n", "--global-batch-size 64\n", "--recompute-granularity full\n",
                           "--recompute-method uniform\n", "--recompute-num-layers 1\n", "--use-distributed-optimizer\n",
                           "--overlap-grad-reduce\n", "--swiglu\n", "--group-query-attention\n",
                           "--num-query-groups 8\n", "--untie-embeddings-and-output-weights\n", "--normalization RMSNorm\n",
                           "--disable-bias-linear\n", "--position-embedding-type rope\n", "--rotary-base 500000\n",
                           "torchrun --nnodes 4 --nproc_per_node 8", "srun --nodes 4 --ntasks-per-node 1"})
    CHECK_MESSAGE(seed.find(flag) != std::string::npos, flag);
  CHECK(seed.find("--num-layers-per-virtual-pipeline-stage") == std::string::npos);
  // The distributed optimizer's all-gather is priced after the optimizer step
  // (exposed): no --overlap-param-gather for ZeRO-1; ZeRO-3 prefetches.
  CHECK(seed.find("--overlap-param-gather") == std::string::npos);
  CHECK(text("seed-zero3", "megatron").find("--overlap-param-gather\n") != std::string::npos);
  // Llama 3 has no rope scaling; Llama 3.1 has.
  CHECK(seed.find("--use-rope-scaling") == std::string::npos);
  // An ALiBi model: Megatron-Core has no such positions, so every Megatron-Core target refuses.
  PlanFile alibi = plan_file("seed");
  alibi.model.alibi = true;
  for (const char* target : {"megatron", "megatron-bridge", "nemo"}) {
    try {
      (void)export_plan(alibi, target);
      FAIL_CHECK("no refusal for ", target);
    } catch (const InputError& e) {
      CHECK(e.field() == "model.alibi");
      CHECK(e.problem().find("no ALiBi positions") != std::string::npos);
      CHECK(e.fix().find("--position-embedding-type alibi") != std::string::npos);
    }
  }
  PlanFile scaled = plan_file("seed");
  scaled.model.rope_scaling_factor = 8;
  const std::string with_scaling = export_plan(scaled, "megatron").text;
  CHECK(with_scaling.find("--use-rope-scaling\n") != std::string::npos);
  CHECK(with_scaling.find("--rope-scaling-factor 8\n") != std::string::npos);
  const std::string gpt3 = text("gpt3-interleaved", "megatron");
  // 96 layers / (PP 4 x 3 virtual stages) = 8 layers per virtual stage.
  CHECK(gpt3.find("--num-layers-per-virtual-pipeline-stage 8\n") != std::string::npos);
  CHECK(gpt3.find("--recompute-granularity selective\n") != std::string::npos);
  CHECK(gpt3.find("--untie-embeddings-and-output-weights") == std::string::npos);
  CHECK(gpt3.find("--rotary-base") == std::string::npos);
  // Gradient-accumulation fusion is Megatron's default: only a plan priced
  // without it turns it off.
  CHECK(seed.find("gradient-accumulation-fusion") == std::string::npos);
  PlanFile unfused = plan_file("seed");
  unfused.plan.grad_accum_fusion = false;
  CHECK(export_plan(unfused, "megatron").text.find("--no-gradient-accumulation-fusion\n") != std::string::npos);
  CHECK(export_plan(unfused, "nemo").text.find("  gradient_accumulation_fusion: false\n") != std::string::npos);
}

TEST_CASE("context parallelism: Megatron-LM, Megatron-Bridge, NeMo 1.x and torchtitan v0.2.2 carry it; DeepSpeed and torchtitan main refuse") {
  PlanFile pf = plan_file("seed");
  pf.plan.cp = 2;
  pf.plan.dp = 1;
  for (CpComm comm : {CpComm::p2p, CpComm::a2a}) {
    pf.plan.cp_comm = comm;
    check_options(pf, "megatron");
    check_options(pf, "megatron-bridge");
    const std::string megatron = export_plan(pf, "megatron").text;
    CHECK(megatron.find("--context-parallel-size 2\n") != std::string::npos);
    CHECK(megatron.find("--cp-comm-type " + std::string(to_string(comm)) + "\n") != std::string::npos);
    // DP 1 x CP 2: the gradients are still reduced (over the CP ranks), overlapped.
    CHECK(megatron.find("--overlap-grad-reduce\n") != std::string::npos);
    const std::string bridge = export_plan(pf, "megatron-bridge").text;
    CHECK(bridge.find("context_parallel_size=2") != std::string::npos);
    CHECK(bridge.find("cp_comm_type=\"" + std::string(to_string(comm)) + "\"") != std::string::npos);
    check_options(pf, "nemo");
    const std::string nemo = export_plan(pf, "nemo").text;
    CHECK(nemo.find("  context_parallel_size: 2\n") != std::string::npos);
    CHECK(nemo.find("  cp_comm_type: " + std::string(to_string(comm)) + "\n") != std::string::npos);
  }
  check_refused(pf, {"deepspeed"}, "parallel.cp");
  // Without CP nothing changes.
  CHECK(text("seed", "megatron").find("context-parallel") == std::string::npos);

  SUBCASE("Megatron-Bridge shards and reduces over DP x CP: DP 1 x CP 2 keeps the overlap and ZeRO-3 is FSDP") {
    const std::string bridge = export_plan(pf, "megatron-bridge").text;
    CHECK(bridge.find("    cfg.ddp.overlap_grad_reduce = True\n") != std::string::npos);
    PlanFile z3 = pf;
    z3.plan.zero_stage = 3;
    z3.plan.grad_accum_fusion = false;
    const std::string fsdp = export_plan(z3, "megatron-bridge").text;
    CHECK(fsdp.find("    cfg.ddp.use_megatron_fsdp = True\n") != std::string::npos);
    CHECK(fsdp.find("    cfg.ddp.data_parallel_sharding_strategy = \"optim_grads_params\"\n") != std::string::npos);
    CHECK(fsdp.find("    cfg.ddp.overlap_param_gather = True\n") != std::string::npos);
  }

  SUBCASE("torchtitan v0.2.2: PyTorch's ring attention, K/V passed one rank per step (alltoall), FSDP over DP x CP") {
    PlanFile tt = titan("seed-zero3");  // TP 4 x PP 4 x DP 2, ZeRO-3
    tt.plan.cp = 2;
    tt.plan.dp = 1;
    tt.plan.cp_comm = CpComm::p2p;
    check_options(tt, "torchtitan");
    const std::string out = export_plan(tt, "torchtitan").text;
    for (const char* line : {"; TP 4 x CP 2 x PP 4 x DP 1, micro-batch", "--parallelism.context_parallel_degree=2 \\\n",
                             "--parallelism.context_parallel_rotate_method=alltoall \\\n",
                             "--parallelism.context_parallel_load_balancer=headtail \\\n",
                             "--parallelism.data_parallel_shard_degree=1 \\\n",
                             "--parallelism.fsdp_reshard_after_forward=always \\\n",
                             "context_parallel_rotate_method = \"alltoall\"\n"})
      CHECK_MESSAGE(out.find(line) != std::string::npos, line << " missing from\n" << out);
    tt.plan.zero_stage = 2;
    check_options(tt, "torchtitan");
    CHECK(export_plan(tt, "torchtitan").text.find("--parallelism.fsdp_reshard_after_forward=never") != std::string::npos);
    // Without CP the two fields stay out (torchtitan's defaults).
    CHECK(text("seed-zero3", "torchtitan").find("rotate_method") == std::string::npos);
    tt.plan.cp_comm = CpComm::a2a;
    CHECK_THROWS_WITH_AS(export_plan(tt, "torchtitan"),
                         "seed-zero3.plan.json: parallel.cp_comm: torchtitan v0.2.2's context parallelism rotates "
                         "K/V around the ring (context_parallel_rotate_method alltoall) or all-gathers it; it has no "
                         "all-to-all of attention heads (the plan's a2a exchange) (fix: plan with --cp-comm-type p2p)",
                         InputError);
    tt.plan.cp_comm = CpComm::p2p;
    tt.plan.zero_stage = 0;
    CHECK_THROWS_WITH_AS(export_plan(tt, "torchtitan"),
                         "seed-zero3.plan.json: parallel.zero_stage: torchtitan shards the weights, gradients and "
                         "optimizer states over the context-parallel ranks with FSDP whenever CP > 1 "
                         "(ParallelDims.fsdp_enabled), and the plan keeps them whole over its 2 CP ranks (fix: plan "
                         "with --zero 3 (FSDP) or --zero 2 (FSDP without resharding after forward))",
                         InputError);
  }
}

TEST_CASE("latent attention and MTP: Megatron-LM writes their flags; every other target refuses them") {
  // DeepSeek-V3 with its YaRN scaling (factor 40, mscale 1, mscale_all_dim 1)
  // on the seed's 4 DGX A100: TP 8 x DP 4, experts EP 32 x ETP 1.
  const ModelSpec model = load_model(cuboid::test::source_root() / "models/deepseek-v3.json");
  REQUIRE(model.rope_yarn);
  ParallelPlan p = cuboid::test::make_plan(8, 1, 4, 1, 1, Recompute::full, true, Schedule::one_f_one_b, 4096);
  p.ep = 32;
  p.etp = 1;
  const PlanFile pf = priced_plan_file(model, p, "dsv3.plan.json");
  check_options(pf, "megatron");
  const std::string megatron = export_plan(pf, "megatron").text;
  for (const char* flag : {"--multi-latent-attention\n", "--q-lora-rank 1536\n", "--kv-lora-rank 512\n",
                           "--qk-head-dim 128\n", "--qk-pos-emb-head-dim 64\n", "--v-head-dim 128\n",
                           "--rope-type yarn\n", "--rotary-scaling-factor 40\n", "--mscale 1\n",
                           "--mscale-all-dim 1\n", "--mtp-num-layers 1\n", "--moe-layer-freq \"[0]*3+[1]*58\"\n"}) {
    CAPTURE(flag);
    CHECK(megatron.find(flag) != std::string::npos);
  }
  // YaRN is not Llama 3.1's scaling.
  CHECK(megatron.find("--use-rope-scaling") == std::string::npos);
  // Without YaRN the latent attention takes plain rotary positions.
  PlanFile plain = pf;
  plain.model.rope_yarn = false;
  plain.model.rope_scaling_factor = 0;
  const std::string rope = export_plan(plain, "megatron").text;
  CHECK(rope.find("--rope-type rope\n") != std::string::npos);
  CHECK(rope.find("--rotary-scaling-factor") == std::string::npos);
  // MLA heads have no kv-channels or query groups (arguments.py: MLA excludes GQA).
  CHECK(megatron.find("--kv-channels") == std::string::npos);
  CHECK(megatron.find("--group-query-attention") == std::string::npos);
  CHECK_THROWS_WITH_AS(export_plan(pf, "megatron-bridge"),
                       "dsv3.plan.json: model.mla: The Megatron-Bridge script (a GPTModelProvider) cannot build "
                       "multi-head latent attention from its pinned options (Megatron-LM's --multi-latent-attention "
                       "and MLA flags can) (fix: export with --to megatron)",
                       InputError);
  // Without MLA (and so without its YaRN), MTP alone is refused the same way.
  PlanFile mtp_only = plain;
  mtp_only.model.mla = {};
  CHECK_THROWS_WITH_AS(export_plan(mtp_only, "megatron-bridge"),
                       "dsv3.plan.json: model.mtp_layers: The Megatron-Bridge script (a GPTModelProvider) cannot "
                       "build the model's 1 multi-token-prediction layer from its pinned options (Megatron-LM's "
                       "--mtp-num-layers can) (fix: export with --to megatron, or drop mtp_layers from the card)",
                       InputError);
  // The targets without experts say so first; a dense latent-attention model reaches the MLA refusal.
  PlanFile dense_mla = pf;
  dense_mla.model.moe = {};
  dense_mla.plan.ep = 1;
  dense_mla.plan.etp = 0;
  dense_mla.plan.tp = 1;
  dense_mla.plan.sequence_parallel = false;
  dense_mla.plan.dp = 32;
  dense_mla.plan.zero_stage = 3;
  dense_mla.plan.grad_accum_fusion = false;
  check_refused(dense_mla, {"megatron-bridge", "deepspeed", "nemo", "torchtitan"}, "model.mla");
}

TEST_CASE("expert parallelism: Megatron-LM, Megatron-Bridge, NeMo 1.x (ETP = TP) and torchtitan v0.2.2 (Qwen3 MoE) carry the MoE layer; DeepSpeed and torchtitan main refuse") {
  // Mixtral-8x7B on the seed's 4 DGX A100: TP 2 x PP 2 x DP 8, experts EP 8 x ETP 1.
  const ModelSpec model = load_model(cuboid::test::source_root() / "models/mixtral-8x7b.json");
  ParallelPlan p = cuboid::test::make_plan(2, 2, 8, 1, 1, Recompute::none, true, Schedule::one_f_one_b, 4096);
  p.ep = 8;
  p.etp = 1;
  const PlanFile pf = priced_plan_file(model, p, "mixtral.plan.json");
  CHECK(pf.plan.ep == 8);
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  const std::string megatron = export_plan(pf, "megatron").text;
  for (const char* flag : {"--num-experts 8\n", "--moe-router-topk 2\n", "--moe-ffn-hidden-size 14336\n",
                           "--expert-model-parallel-size 8\n", "--expert-tensor-parallel-size 1\n",
                           "--moe-grouped-gemm\n", "--moe-token-dispatcher-type alltoall\n"}) {
    CAPTURE(flag);
    CHECK(megatron.find(flag) != std::string::npos);
  }
  const std::string bridge = export_plan(pf, "megatron-bridge").text;
  CHECK(bridge.find("expert_model_parallel_size=8,") != std::string::npos);
  CHECK(bridge.find("num_moe_experts=8,") != std::string::npos);
  check_refused(pf, {"deepspeed", "torchtitan"}, "model.moe");
  SUBCASE("flex with HybridEP and its SMs, and CUDA graphs of the router and preprocessing: checked against the pinned options") {
    PlanFile flex = pf;
    flex.plan.moe_dispatcher = MoeDispatcher::flex;
    flex.plan.moe_flex = FlexSetting{FlexBackend::hybridep, 32};
    flex.plan.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:attn,moe_router,moe_preprocess", "test", "f");
    check_options(flex, "megatron");
    check_options(flex, "megatron-bridge");
    const std::string lm = export_plan(flex, "megatron").text;
    for (const char* flag : {"--moe-token-dispatcher-type flex\n", "--moe-flex-dispatcher-backend hybridep\n",
                             "--moe-flex-dispatcher-num-sms 32\n", "--cuda-graph-modules attn moe_router moe_preprocess\n"}) {
      CAPTURE(flag);
      CHECK(lm.find(flag) != std::string::npos);
    }
    const std::string br = export_plan(flex, "megatron-bridge").text;
    for (const char* line : {"moe_flex_dispatcher_backend=\"hybridep\",", "moe_flex_dispatcher_num_sms=32,",
                             "cuda_graph_modules=[\"attn\", \"moe_router\", \"moe_preprocess\"],"}) {
      CAPTURE(line);
      CHECK(br.find(line) != std::string::npos);
    }
    // DeepEP with its default SMs writes neither key (Megatron-Core's defaults).
    flex.plan.moe_flex = FlexSetting{};
    CHECK(export_plan(flex, "megatron").text.find("--moe-flex-dispatcher") == std::string::npos);
    flex.plan.moe_flex = FlexSetting{FlexBackend::hybridep, 0};
    flex.plan.trainer.cuda_graphs = CudaGraphs{};
    CHECK(refusal(flex, "nemo").find("mixtral.plan.json: parallel.moe_flex_backend: NeMo 1.x's") == 0);
    // HybridEP's rank capacity factor with the op fuser it needs
    // (transformer_config.py:1875-1883@d98e8a64), the paged stash and its buffer factor.
    flex.plan.moe_flex = FlexSetting{FlexBackend::hybridep, 0, 1.5, true, 1.2};
    check_options(flex, "megatron");
    check_options(flex, "megatron-bridge");
    const std::string stash_lm = export_plan(flex, "megatron").text;
    for (const char* flag : {"--moe-expert-rank-capacity-factor 1.5\n", "--use-transformer-engine-op-fuser\n",
                             "--moe-paged-stash\n", "--moe-paged-stash-buffer-size-factor-cuda 1.2\n"}) {
      CAPTURE(flag);
      CHECK(stash_lm.find(flag) != std::string::npos);
    }
    const std::string stash_br = export_plan(flex, "megatron-bridge").text;
    for (const char* line : {"moe_expert_rank_capacity_factor=1.5,", "use_transformer_engine_op_fuser=True,",
                             "moe_paged_stash=True,", "moe_paged_stash_buffer_size_factor_cuda=1.2,"}) {
      CAPTURE(line);
      CHECK(stash_br.find(line) != std::string::npos);
    }
    // Megatron-Core's default buffer factor is not written.
    flex.plan.moe_flex.stash_buffer_factor = 1.10;
    CHECK(export_plan(flex, "megatron").text.find("--moe-paged-stash-buffer-size-factor-cuda") == std::string::npos);
  }
  SUBCASE("tp-pp-dp with PP > 1: Megatron asserts the experts' DP (world / (ETP x EP x PP)) equals the layers'") {
    PlanFile order = pf;
    order.plan.order = RankOrder::parse("tp-pp-dp", "test", "order");
    for (const char* target : {"megatron", "megatron-bridge"}) {
      CAPTURE(target);
      const std::string why = refusal(order, target);
      CHECK(why.find("mixtral.plan.json: parallel.rank_order: ") == 0);
      CHECK(why.find("ETP 1 x EP 8 x PP)) equals the layers' (world / (TP 2 x CP 1 x PP))") != std::string::npos);
    }
    // ETP x EP = TP x CP: the two data-parallel sizes agree and the order is kept.
    order.plan.ep = 2;
    CHECK(export_plan(order, "megatron").text.find("--use-tp-pp-dp-mapping\n") != std::string::npos);
    // With CP as well, Megatron puts CP next to TP (tp-cp-ep-pp-dp) and so
    // does core's rank map: the order is kept (it was refused while cuboid
    // kept CP inside DP).
    order.plan.cp = 2;
    order.plan.dp = 4;
    order.plan.ep = 4;
    CHECK(export_plan(order, "megatron").text.find("--use-tp-pp-dp-mapping\n") != std::string::npos);
    CHECK(export_plan(order, "megatron-bridge").text.find("cfg.dist.use_tp_pp_dp_mapping = True\n") != std::string::npos);
    // ETP x EP 8 against TP x CP 4: still Megatron's assertion.
    order.plan.ep = 8;
    CHECK(refusal(order, "megatron").find("(ETP 1 x EP 8 x PP)) equals the layers' (world / (TP 2 x CP 2 x PP))") !=
          std::string::npos);
  }
  SUBCASE("torchtitan v0.2.2: Qwen3-30B-A3B as its qwen3 flavour, EP and ETP as its degrees") {
    const ModelSpec qwen = load_model(cuboid::test::source_root() / "models/qwen3-30b-a3b.json");
    ParallelPlan q = cuboid::test::make_plan(2, 1, 16, 1, 2, Recompute::none, true, Schedule::one_f_one_b, 4096);
    q.micro_batch = 4;  // 64 / (4 x 16): no accumulation, where torchtitan's ZeRO-2 would regather (refused)
    q.ep = 8;
    q.etp = 1;
    q.flash_attention = true;
    q.grad_accum_fusion = false;
    q.trainer = find_trainer("torchtitan")->settings;
    const PlanFile qf = priced_plan_file(qwen, q, "qwen.plan.json");
    check_options(qf, "torchtitan");
    const std::string tt = export_plan(qf, "torchtitan").text;
    for (const char* line : {"--model.name=qwen3 \\\n", "--model.flavor=30B-A3B \\\n",
                             "--parallelism.expert_parallel_degree=8 \\\n",
                             "--parallelism.expert_tensor_parallel_degree=1 \\\n", "qwen3/train_configs/qwen3_32b.toml",
                             "; TP 2 x PP 1 x DP 16 (experts: EP 8 x ETP 1), micro-batch"}) {
      CAPTURE(line);
      CHECK(tt.find(line) != std::string::npos);
    }
    // ETP = TP too; any other ETP is refused, as is DDP with experts spread over the replicas.
    PlanFile other = qf;
    other.plan.etp = 2;
    check_options(other, "torchtitan");
    other.plan.tp = 4;
    other.plan.dp = 8;
    other.plan.micro_batch = 8;
    other.plan.etp = 2;
    CHECK_THROWS_WITH_AS(export_plan(other, "torchtitan"),
                         "qwen.plan.json: parallel.etp: torchtitan v0.2.2 splits the experts over ETP = TP or ETP = 1 "
                         "ranks (parallel_dims.py: \"Currently we only support ETP=TP or ETP=1\"), not ETP 2 (fix: plan "
                         "with --etp 4 or --etp 1)",
                         InputError);
  }
  // NeMo 1.x: the experts at ETP = TP only (no expert tensor-parallel size reaches parallel_state).
  CHECK_THROWS_WITH_AS(export_plan(pf, "nemo"),
                       "mixtral.plan.json: parallel.etp: NeMo 1.x sets up Megatron's parallel state without an "
                       "expert tensor-parallel size (nlp_overrides.py init_model_parallel), so its experts run at "
                       "ETP = TP = 2, not the plan's ETP 1 (fix: plan with --etp 2, or export with --to "
                       "megatron-bridge (NeMo 2's trainer) or --to megatron)",
                       InputError);
  PlanFile etp_tp = pf;
  etp_tp.plan.etp = 2;
  check_options(etp_tp, "nemo");
  const std::string nemo = export_plan(etp_tp, "nemo").text;
  for (const char* key : {"  expert_model_parallel_size: 8\n", "  num_moe_experts: 8\n", "  moe_router_topk: 2\n",
                          "  moe_ffn_hidden_size: 14336\n", "  moe_grouped_gemm: true\n",
                          "  moe_token_dispatcher_type: alltoall\n"}) {
    CAPTURE(key);
    CHECK(nemo.find(key) != std::string::npos);
  }
  CHECK(nemo.find("moe_layer_freq") == std::string::npos);
  // A dense plan carries none of it.
  CHECK(text("seed", "nemo").find("moe") == std::string::npos);
  CHECK(text("seed", "megatron").find("expert") == std::string::npos);
  CHECK(megatron.find("--moe-layer-freq") == std::string::npos);  // every layer an MoE layer: the default
  // Dense first layers: Megatron's list expression.
  PlanFile mixed = pf;
  for (int l = 0; l < 3; ++l) mixed.model.moe.moe_layers[static_cast<std::size_t>(l)] = false;
  check_options(mixed, "megatron");
  check_options(mixed, "megatron-bridge");
  CHECK(export_plan(mixed, "megatron").text.find("--moe-layer-freq \"[0]*3+[1]*29\"\n") != std::string::npos);
  mixed.plan.etp = 2;
  check_options(mixed, "nemo");
  CHECK(export_plan(mixed, "nemo").text.find("  moe_layer_freq: [0, 0, 0, 1, 1, ") != std::string::npos);
  CHECK(export_plan(mixed, "megatron-bridge").text.find("moe_layer_freq=[0]*3+[1]*29,") != std::string::npos);
  // The EP overlap (PP 1): Megatron-LM's and Megatron-Bridge's flags, checked against the
  // pinned options; NeMo 1.x and torchtitan refuse it.
  PlanFile overlap = pf;
  overlap.plan.pp = 1;
  overlap.plan.dp = 16;
  overlap.plan.moe_ep_overlap = true;
  check_options(overlap, "megatron");
  check_options(overlap, "megatron-bridge");
  const std::string ov = export_plan(overlap, "megatron").text;
  CHECK(ov.find("--overlap-moe-expert-parallel-comm\n") != std::string::npos);
  CHECK(ov.find("--delay-wgrad-compute\n") != std::string::npos);
  const std::string ovb = export_plan(overlap, "megatron-bridge").text;
  CHECK(ovb.find("overlap_moe_expert_parallel_comm=True,") != std::string::npos);
  CHECK(ovb.find("delay_wgrad_compute=True,") != std::string::npos);
  CHECK(megatron.find("overlap-moe") == std::string::npos);  // off: not written
  overlap.plan.etp = 2;
  CHECK(refusal(overlap, "nemo").find("mixtral.plan.json: parallel.moe_ep_overlap: NeMo 1.x's") == 0);
  // YaRN prices like any rotary embedding, but no export writes it on
  // standard attention yet (latent attention: the MLA test above).
  PlanFile yarn = pf;
  yarn.model.rope_yarn = true;
  yarn.model.rope_scaling_factor = 40;
  check_refused(yarn, {"megatron", "megatron-bridge"}, "model.rope_scaling_type");
}

namespace {

PlanFile quantized(const std::string& plan, Precision precision, bool gather, int zero_stage = -1) {
  PlanFile pf = plan_for(plan, zero_stage >= 2 ? "torchtitan" : "");
  if (zero_stage >= 0) pf.plan.zero_stage = zero_stage;
  pf.plan.precision = precision;
  pf.plan.fp8_param_gather = gather;
  return pf;
}

std::string value(const Emitted& e, const std::string& key) {
  const auto it = e.find(key);
  return it == e.end() ? "(absent)" : it->second;
}

}  // namespace

TEST_CASE("quantized GEMMs: Megatron-LM and Megatron-Bridge write every recipe, checked against their pinned options") {
  struct Row {
    Precision precision;
    const char* format_flag;
    const char* format;
    const char* recipe;
    const char* bridge;
  };
  const Row rows[] = {
      {Precision::fp8_delayed, "--fp8", "hybrid", "delayed", "bf16_with_fp8_delayed_scaling_mixed()"},
      {Precision::fp8_current, "--fp8", "hybrid", "tensorwise", "bf16_with_fp8_current_scaling_mixed()"},
      {Precision::fp8_blockwise, "--fp8", "hybrid", "blockwise", "bf16_with_fp8_subchannel_scaling_mixed()"},
      {Precision::mxfp8, "--fp8", "e4m3", "mxfp8", "bf16_with_mxfp8_mixed()"},
      {Precision::nvfp4, "--fp4", "e2m1", "nvfp4", "bf16_with_nvfp4_mixed()"},
  };
  for (const Row& r : rows)
    for (const bool gather : {false, true}) {
      CAPTURE(to_string(r.precision));
      CAPTURE(gather);
      const PlanFile pf = quantized("seed", r.precision, gather);  // ZeRO-1: the distributed optimizer
      check_options(pf, "megatron");
      check_options(pf, "megatron-bridge");
      const Emitted m = cuboid::test::read_megatron(export_plan(pf, "megatron").text);
      const std::string kind = r.format_flag;
      const std::string other = kind == "--fp8" ? "--fp4" : "--fp8";
      CHECK(value(m, kind + "-format") == r.format);
      CHECK(value(m, kind + "-recipe") == r.recipe);
      CHECK(m.count(other + "-format") == 0);
      CHECK(m.count(kind + "-param-gather") == (gather ? 1u : 0u));
      CHECK(m.count("--bf16") == 1);
      const bool delayed = r.precision == Precision::fp8_delayed;
      CHECK(value(m, "--fp8-amax-history-len") == (delayed ? "1024" : "(absent)"));
      CHECK(value(m, "--fp8-amax-compute-algo") == (delayed ? "max" : "(absent)"));

      const std::string text = export_plan(pf, "megatron-bridge").text;
      const Emitted b = cuboid::test::read_python(text, "cfg", "model.");
      CHECK(value(b, "mixed_precision") == r.bridge);
      // The recipe function is imported by name.
      const std::string fn = std::string(r.bridge).substr(0, std::string(r.bridge).size() - 2);
      CHECK(text.find("from megatron.bridge.training.mixed_precision import " + fn + "\n") != std::string::npos);
      CHECK(value(b, "mixed_precision.first_last_layers_bf16") == "False");
      const std::string g = r.precision == Precision::nvfp4 ? "fp4" : "fp8";
      CHECK(value(b, "mixed_precision." + g + "_param_gather") == (gather ? "True" : "False"));
      CHECK(value(b, "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag") ==
            (r.precision != Precision::mxfp8 ? "(absent)" : gather ? "True" : "False"));
    }
  SUBCASE("a bf16 plan writes none of it") {
    const Emitted m = cuboid::test::read_megatron(text("seed", "megatron"));
    for (const char* flag : {"--fp8-format", "--fp8-recipe", "--fp4-format", "--fp8-param-gather"})
      CHECK(m.count(flag) == 0);
    CHECK(text("seed", "megatron-bridge").find("mixed_precision.") == std::string::npos);
  }
  SUBCASE("ZeRO-2 as Megatron FSDP gathers FP8 weights too") {
    const PlanFile pf = quantized("seed-zero3", Precision::fp8_current, true, 2);
    check_options(pf, "megatron");
    check_options(pf, "megatron-bridge");
    const Emitted m = cuboid::test::read_megatron(export_plan(pf, "megatron").text);
    CHECK(m.count("--use-megatron-fsdp") == 1);
    CHECK(m.count("--fp8-param-gather") == 1);
  }
}

TEST_CASE("quantized GEMMs: torchtitan's float8 and MX converters, NeMo 1.x's delayed scaling; the rest refuse with the reason") {
  SUBCASE("torchtitan v0.2.2: tensorwise float8 (FSDP's FP8 all-gather for --fp8-param-gather) and MXFP8, the output layer in bf16") {
    PlanFile pf = quantized("seed-zero3", Precision::fp8_current, true, 2);
    check_options(pf, "torchtitan");
    Emitted e = cuboid::test::read_torchtitan_flags(export_plan(pf, "torchtitan").text);
    CHECK(value(e, "model.converters") == "quantize.linear.float8");
    CHECK(value(e, "quantize.linear.float8.filter_fqns") == "output");
    CHECK(value(e, "quantize.linear.float8.enable_fsdp_float8_all_gather") == "true");
    CHECK(value(e, "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp") == "true");
    pf = quantized("seed-zero3", Precision::mxfp8, false, 2);
    check_options(pf, "torchtitan");
    e = cuboid::test::read_torchtitan_flags(export_plan(pf, "torchtitan").text);
    CHECK(value(e, "model.converters") == "quantize.linear.mx");
    CHECK(value(e, "quantize.linear.mx.recipe_name") == "mxfp8_cublas");
    CHECK(value(e, "quantize.linear.mx.filter_fqns") == "output");
    CHECK(text("seed-zero3", "torchtitan").find("converters") == std::string::npos);
    CHECK(refusal(quantized("seed-zero3", Precision::fp8_blockwise, false, 2), "torchtitan") ==
          "seed-zero3.plan.json: parallel.precision: the plan is priced with fp8-blockwise GEMMs, and torchtitan "
          "v0.2.2's float8 recipes are tensorwise, rowwise and rowwise_with_gw_hp (Float8Linear.recipe_name); none "
          "scales 1 x 128 activation and 128 x 128 weight blocks (fix: plan with --precision fp8-current or mxfp8, or "
          "export with --to megatron or --to megatron-bridge)");
    CHECK(refusal(quantized("seed-zero3", Precision::mxfp8, true, 2), "torchtitan").find(
              "parallel.fp8_param_gather: torchtitan v0.2.2's MX converter all-gathers the weights in bf16") !=
          std::string::npos);
    pf = quantized("seed-zero3", Precision::fp8_current, true, 2);
    pf.plan.tp = pf.plan.pp = pf.plan.dp = 1;  // one GPU: no FSDP (the only layout that reaches the check)
    CHECK(refusal(pf, "torchtitan").find("parallel.fp8_param_gather: torchtitan's FP8 weights exist only for FSDP's") !=
          std::string::npos);
  }
  SUBCASE("NeMo 1.x: delayed scaling's keys; no key for the other recipes") {
    const PlanFile pf = quantized("seed", Precision::fp8_delayed, true);
    check_options(pf, "nemo");
    const Emitted e = cuboid::test::read_yaml(export_plan(pf, "nemo").text);
    CHECK(value(e, "model.fp8") == "true");
    CHECK(value(e, "model.fp8_hybrid") == "true");
    CHECK(value(e, "model.fp8_e4m3") == "false");
    CHECK(value(e, "model.fp8_amax_history_len") == "1024");
    CHECK(value(e, "model.fp8_amax_compute_algo") == "max");
    CHECK(value(e, "model.fp8_params") == "true");
    CHECK(refusal(quantized("seed", Precision::mxfp8, false), "nemo") ==
          "seed.plan.json: parallel.precision: the plan is priced with mxfp8 GEMMs, and NeMo 1.x's "
          "megatron_gpt_config.yaml has FP8 keys for delayed scaling only (fp8, fp8_hybrid, fp8_amax_history_len); "
          "none selects current, blockwise, MXFP8 or NVFP4 scaling (fix: plan with --precision fp8-delayed, or export "
          "with --to megatron or --to megatron-bridge)");
  }
  SUBCASE("DeepSpeed has no quantized-GEMM setting") {
    CHECK(refusal(quantized("llama8b-pp4", Precision::fp8_current, false), "deepspeed") ==
          "llama8b-pp4.plan.json: parallel.precision: the plan is priced with fp8-current GEMMs, and DeepSpeed "
          "v0.16.4's configuration has no quantized-GEMM setting (runtime/config.py reads fp16 and bf16 sections only; "
          "FP8 layers would be the model code's own) (fix: export with --to megatron or --to megatron-bridge)");
  }
}

TEST_CASE("DeepSpeed: batch sizes consistent with DP, fp32 accumulation, the pipeline in the notes") {
  const ExportResult r = export_plan(plan_file("llama8b-pp4"), "deepspeed");
  const auto j = nlohmann::json::parse(r.text);
  CHECK(j["train_batch_size"] == 64);
  CHECK(j["train_micro_batch_size_per_gpu"] == 1);
  // train_batch_size = micro x accumulation x DP (8).
  CHECK(j["gradient_accumulation_steps"] == 8);
  CHECK(j["zero_optimization"]["stage"] == 1);
  CHECK(j["bf16"]["enabled"] == true);
  // bf16 + ZeRO-1 accumulates in bf16 unless grad_accum_dtype is fp32.
  CHECK(j["data_types"]["grad_accum_dtype"] == "fp32");
  // pipeline.stages / partition are never read: the notes carry PipelineModule's arguments.
  CHECK_FALSE(j["pipeline"].contains("stages"));
  CHECK(j["pipeline"]["activation_checkpoint_interval"] == 1);
  CHECK(r.notes.find("num_stages=4, partition_method=\"type:DecoderLayer\"") != std::string::npos);
  CHECK(r.notes.find("checkpointable_layers=[\"DecoderLayer\"]") != std::string::npos);
  CHECK(r.notes.find("deepspeed --hostfile hostfile --num_nodes 4 --num_gpus 8") != std::string::npos);
  // deepspeed.initialize takes the config from --deepspeed_config or config=, never both.
  CHECK(r.notes.find("config=") == std::string::npos);
}

TEST_CASE("exports a target cannot represent, or would silently change, are refused with the reason and the fix") {
  CHECK(refusal("seed", "deepspeed") ==
        "seed.plan.json: parallel.tp: DeepSpeed's config has no tensor-parallel size: Megatron-style TP (and sequence "
        "parallelism) comes from the model code, e.g. Megatron-DeepSpeed's --tensor-model-parallel-size (fix: export "
        "with --to megatron, or plan with --tp 1)");
  CHECK(refusal("seed", "torchtitan") ==
        "seed.plan.json: parallel.zero_stage: ZeRO-1 (sharded optimizer states, replicated weights and gradients) has "
        "no torchtitan equivalent: FSDP2 shards weights, gradients and optimizer states together (fix: plan with "
        "--zero 3 (FSDP), --zero 2 (FSDP without resharding after forward) or --zero 0 (DDP))");
  CHECK(refusal("seed-zero3", "nemo") ==
        "seed-zero3.plan.json: parallel.zero_stage: NeMo 1.x's ZeRO-3 is model.fsdp, PyTorch FSDP (nlp_overrides.py "
        "NLPFSDPStrategy: BackwardPrefetch.BACKWARD_PRE, no forward prefetch, no gradient-accumulation fusion), not "
        "the Megatron FSDP gather schedule the plan was priced with (fix: plan with --zero 0 or 1, or export with --to "
        "megatron-bridge or --to megatron (Megatron FSDP))");

  SUBCASE("torchtitan v0.2.2: TP/PP without FSDP trains in fp32; no flavour for GPT-3") {
    PlanFile pf = plan_file("gpt3-interleaved");
    CHECK(refusal(pf, "torchtitan") ==
          "gpt3-interleaved.plan.json: parallel.dp: torchtitan v0.2.2 applies bf16 mixed precision through FSDP only; "
          "with TP or PP and no FSDP (maybe_enable_amp: \"Mixed precision training with TP or PP is only supported when "
          "FSDP/HSDP/CP is enabled\") it trains in training.dtype, float32, and the plan was priced in bf16 (fix: plan "
          "with --dp 2 or more and --zero 2 or 3 (FSDP), or export with --to megatron)");
    pf.plan.dp = 2;
    pf.plan.tp = 4;
    pf.plan.zero_stage = 3;
    pf.plan.trainer = find_trainer("torchtitan")->settings;
    CHECK(refusal(pf, "torchtitan") ==
          "gpt3-interleaved.plan.json: model: gpt3-175b is not a Llama-style model (torchtitan's llama3 has rotary "
          "positions, RMSNorm, SwiGLU, no biases and an untied output layer), and torchtitan has no model of its shape "
          "(fix: export with --to megatron or --to megatron-bridge)");
    pf = titan("seed-zero3");
    pf.model.num_layers = 40;
    CHECK(refusal(pf, "torchtitan") ==
          "seed-zero3.plan.json: model: torchtitan's llama3 flavours are 8B, 70B and 405B; none has the shape of "
          "llama3-70b (40 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocabulary 128256) (fix: register a "
          "flavour of that shape in torchtitan/models/llama3/__init__.py, or export with --to megatron)");
  }
  SUBCASE("NeMo 1.x: no virtual pipeline stages on the mcore path; fusion only where NeMo keeps it") {
    CHECK(refusal("gpt3-interleaved", "nemo") ==
          "gpt3-interleaved.plan.json: parallel.virtual_stages: NeMo 1.x's mcore GPT asserts "
          "virtual_pipeline_model_parallel_size is None (\"Virtual pipeline model parallel size is no longer supported "
          "for nemo 1.0\", megatron_gpt_model.py mcore_model_customize) (fix: plan with --schedule 1f1b, or export with "
          "--to megatron-bridge)");
    PlanFile pf = plan_file("seed");
    pf.plan.tp = 8;
    pf.plan.pp = 1;
    pf.plan.dp = 4;
    pf.plan.zero_stage = 0;
    CHECK(refusal(pf, "nemo") ==
          "seed.plan.json: parallel.grad_accum_fusion: NeMo 1.x turns gradient_accumulation_fusion off without "
          "pipeline parallelism unless the optimizer is distributed (\"gradient accumulation fusion can only be used "
          "with distributed_fused_adam\") (fix: plan with --zero 1, or with --grad-accum-fusion off)");
    const std::string yaml = text("seed", "nemo");
    CHECK(yaml.find("  transformer_engine: true\n") != std::string::npos);
    CHECK(yaml.find("  megatron_amp_O2: true\n") != std::string::npos);
    CHECK(yaml.find("use_flash_attention") == std::string::npos);
    CHECK(yaml.find("  rotary_base: 500000\n") != std::string::npos);
  }
  SUBCASE("DeepSpeed: no interleaved schedule, no ZeRO-2/3 with pipelines, no selective recompute") {
    PlanFile pf = plan_file("llama8b-pp4");
    pf.plan.zero_stage = 0;
    CHECK(refusal(pf, "deepspeed").find("llama8b-pp4.plan.json: parallel.zero_stage: DeepSpeed with bf16 and ZeRO 0 "
                                        "runs its BF16_Optimizer, which partitions") == 0);
    pf = plan_file("llama8b-pp4");
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
  SUBCASE("DeepSpeed: a plan priced with an overlapped or reduce-scattered reduction") {
    PlanFile pf = plan_file("llama8b-pp4");
    pf.plan.trainer = default_trainer().settings;  // megatron-core: overlapped, reduce-scatter
    CHECK(refusal(pf, "deepspeed") ==
          "llama8b-pp4.plan.json: trainer.dp_overlap: DeepSpeed's pipeline engine reduces gradients after the last "
          "micro-batch's backward (TrainSchedule's ReduceGrads), and the plan was priced with the reduction overlapped "
          "(fix: plan --for deepspeed (it prices DeepSpeed's reduction))");
    pf.plan.trainer.dp_overlap = false;
    CHECK(refusal(pf, "deepspeed") ==
          "llama8b-pp4.plan.json: trainer.zero1_grad_all_reduce: DeepSpeed's BF16_Optimizer all-reduces the full "
          "gradients with ZeRO-1, and the plan was priced with a reduce-scatter (Megatron's distributed optimizer) "
          "(fix: plan --for deepspeed (it prices DeepSpeed's reduction))");
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
    // Megatron and Megatron-Bridge express either.
    CHECK_NOTHROW(export_plan(pf, "megatron"));
    CHECK_NOTHROW(export_plan(pf, "megatron-bridge"));
  }
  SUBCASE("NeMo 1.x: tp-pp-dp as model.use_tp_pp_dp_mapping; ZeRO 0 with SP reduces after the backward") {
    PlanFile pf = plan_file("seed");
    pf.plan.order = RankOrder::parse("tp-pp-dp", "test", "order");
    check_options(pf, "nemo");
    CHECK(export_plan(pf, "nemo").text.find("  use_tp_pp_dp_mapping: true\n") != std::string::npos);
    CHECK(text("seed", "nemo").find("use_tp_pp_dp_mapping") == std::string::npos);
    pf.plan.order = RankOrder::parse("dp-tp-pp", "test", "order");
    CHECK(refusal(pf, "nemo").find("seed.plan.json: parallel.rank_order: NeMo 1.x orders ranks tp-dp-pp (default) or "
                                   "tp-pp-dp (model.use_tp_pp_dp_mapping), not dp-tp-pp") == 0);
    pf = plan_file("seed");
    pf.plan.tp = 8;
    pf.plan.pp = 1;
    pf.plan.dp = 4;
    pf.plan.zero_stage = 0;
    pf.plan.grad_accum_fusion = false;
    pf.plan.sequence_parallel = true;
    pf.plan.trainer.dp_overlap = true;
    CHECK(refusal(pf, "nemo").find("seed.plan.json: trainer.dp_overlap: NeMo 1.x without a distributed optimizer "
                                   "all-reduces the gradients after the backward with sequence parallelism") == 0);
    pf.plan.sequence_parallel = false;
    CHECK_NOTHROW(export_plan(pf, "nemo"));
  }
  SUBCASE("Megatron-Bridge: ZeRO 0 sets the optimizer's flag too, which validation would sync back to the recipe's True") {
    PlanFile pf = plan_file("seed");
    pf.plan.zero_stage = 0;
    const std::string bridge = export_plan(pf, "megatron-bridge").text;
    CHECK(bridge.find("    cfg.ddp.use_distributed_optimizer = False\n") != std::string::npos);
    CHECK(bridge.find("    cfg.optimizer.use_distributed_optimizer = False\n") != std::string::npos);
    CHECK(text("seed", "megatron-bridge").find("    cfg.optimizer.use_distributed_optimizer = True\n") !=
          std::string::npos);
  }
  SUBCASE("Megatron-Bridge: bf16 gradient reduction is set on the recipe, which would overwrite the DDP config's") {
    PlanFile pf = plan_file("seed");
    CHECK(text("seed", "megatron-bridge").find("grad_reduce_in_fp32 = True") != std::string::npos);
    pf.plan.trainer.dp_grad_bytes = 2;
    check_options(pf, "megatron-bridge");
    const std::string bridge = export_plan(pf, "megatron-bridge").text;
    CHECK(bridge.find("from megatron.bridge.training.mixed_precision import bf16_mixed\n") != std::string::npos);
    CHECK(bridge.find("    cfg.mixed_precision = bf16_mixed()\n") != std::string::npos);
    CHECK(bridge.find("    cfg.mixed_precision.grad_reduce_in_fp32 = False\n") != std::string::npos);
    CHECK(bridge.find("    cfg.ddp.grad_reduce_in_fp32 = False\n") != std::string::npos);
  }
  SUBCASE("Megatron-Bridge: the interleaved schedule's p2p overlapped and unbatched, as Megatron-LM runs it") {
    const std::string interleaved = text("gpt3-interleaved", "megatron-bridge");
    CHECK(interleaved.find("        overlap_p2p_comm=True,\n") != std::string::npos);
    CHECK(interleaved.find("        batch_p2p_comm=False,\n") != std::string::npos);
    PlanFile one_chunk = plan_file("llama8b-pp4");
    one_chunk.plan.trainer = default_trainer().settings;
    CHECK(export_plan(one_chunk, "megatron-bridge").text.find("p2p_comm") == std::string::npos);
  }
  SUBCASE("Megatron: a fused core is Transformer Engine's choice (auto), not Dao's FlashAttention pinned") {
    CHECK(text("seed", "megatron").find("    --attention-backend auto\n") != std::string::npos);
    PlanFile pf = plan_file("seed");
    pf.plan.flash_attention = false;
    CHECK(export_plan(pf, "megatron").text.find("    --attention-backend unfused\n") != std::string::npos);
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
    CHECK(export_plan(pf, "megatron").text.find("--use-tp-pp-dp-mapping\n") != std::string::npos);
    CHECK(export_plan(pf, "megatron-bridge").text.find("cfg.dist.use_tp_pp_dp_mapping = True\n") != std::string::npos);
  }
  SUBCASE("torchtitan: DDP only without TP/PP in v0.2.2, TP implies sequence parallelism") {
    PlanFile pf = plan_file("seed-zero3");
    pf.plan.zero_stage = 0;
    CHECK_THROWS_WITH_AS(export_plan(pf, "torchtitan"),
                         "seed-zero3.plan.json: parallel.zero_stage: torchtitan v0.2.2 replicates with DDP "
                         "(data_parallel_replicate_degree) only without tensor or pipeline parallelism (\"DDP has not "
                         "supported > 1D parallelism\") (fix: plan with --zero 3 (FSDP), or export with --to "
                         "megatron)",
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
    PlanFile pf = titan("seed-zero3");
    pf.plan.zero_stage = 2;
    const std::string out = export_plan(pf, "torchtitan").text;
    CHECK(out.find("--parallelism.fsdp_reshard_after_forward=never") != std::string::npos);
    CHECK(out.find("--parallelism.data_parallel_shard_degree=2") != std::string::npos);
  }
}

TEST_CASE("an unknown target names the flag and the choices") {
  CHECK_THROWS_WITH_AS(export_plan(plan_file("seed"), "jax"),
                       "command line: --to: unknown export target \"jax\" (fix: use megatron, megatron-bridge, "
                       "deepspeed, torchtitan, torchtitan-main or nemo)",
                       InputError);
  CHECK(export_targets() ==
        std::vector<std::string>{"megatron", "megatron-bridge", "deepspeed", "torchtitan", "torchtitan-main", "nemo"});
}

TEST_CASE("a node of several hosts (an NVL72 rack's trays): every launcher starts once per host, with its 4 GPUs") {
  PlanFile pf = plan_file("seed");  // TP 4 x PP 4 x DP 2 = 32 GPUs
  pf.nodes = 1;
  pf.gpus_per_node = 32;
  pf.gpus_per_host = 4;
  CHECK(pf.hosts() == 8);
  const std::string megatron = export_plan(pf, "megatron").text;
  CHECK(megatron.find("# torchrun on each of the 8 hosts (NODE_RANK 0..7, MASTER_ADDR = host 0):\n") !=
        std::string::npos);
  CHECK(megatron.find("torchrun --nnodes 8 --nproc_per_node 4 ") != std::string::npos);
  CHECK(megatron.find("srun --nodes 8 --ntasks-per-node 1 ") != std::string::npos);
  pf.plan.schedule = Schedule::one_f_one_b;
  pf.plan.virtual_stages = 1;
  const std::string nemo = export_plan(pf, "nemo").text;
  CHECK(nemo.find("  num_nodes: 8\n  devices: 4\n") != std::string::npos);
  // One host per node: as before.
  CHECK(text("seed", "megatron").find("torchrun --nnodes 4 --nproc_per_node 8 ") != std::string::npos);
}

TEST_CASE("Megatron-Core's overlaps and CUDA graphs: Megatron-LM, Megatron-Bridge and NeMo 1.x write them; DeepSpeed and torchtitan refuse") {
  PlanFile pf = plan_file("seed");  // TP 4 with SP, ZeRO-1 over DP 2
  const std::string before = export_plan(pf, "megatron").text;
  CHECK(before.find("--tp-comm-overlap") == std::string::npos);
  CHECK(before.find("--cuda-graph") == std::string::npos);
  pf.plan.trainer.tp_comm_overlap = true;
  pf.plan.trainer.overlap_param_gather = true;
  pf.plan.trainer.cuda_graphs = CudaGraphs::parse("full_iteration", "test", "cuda_graphs");
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  const std::string megatron = export_plan(pf, "megatron").text;
  for (const char* line : {"--tp-comm-overlap\n", "--overlap-param-gather\n", "--cuda-graph-impl full_iteration\n",
                           "--no-check-for-nan-in-loss-and-grad\n"})
    CHECK_MESSAGE(megatron.find(line) != std::string::npos, line);
  CHECK(megatron.find("--cuda-graph-modules") == std::string::npos);
  const std::string bridge = export_plan(pf, "megatron-bridge").text;
  for (const char* line : {"        tp_comm_overlap=True,\n", "        cuda_graph_impl=\"full_iteration\",\n",
                           "        use_te_rng_tracker=True,\n", "    cfg.ddp.overlap_param_gather = True\n",
                           "    cfg.rerun_state_machine.check_for_nan_in_loss = False\n"})
    CHECK_MESSAGE(bridge.find(line) != std::string::npos, line);
  // NeMo 1.x has Megatron-Core's per-layer graphs of whole layers only.
  CHECK(refusal(pf, "nemo").find("parallel.trainer.cuda_graphs: NeMo 1.x has enable_cuda_graph only") !=
        std::string::npos);
  check_refused(pf, {"deepspeed", "torchtitan"}, "parallel.trainer.cuda_graphs");

  pf.plan.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:attn,mlp", "test", "cuda_graphs");
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  CHECK(export_plan(pf, "megatron").text.find("--cuda-graph-impl transformer_engine\n    --cuda-graph-modules attn mlp\n") !=
        std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("        cuda_graph_modules=[\"attn\", \"mlp\"],\n") !=
        std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("check_for_nan_in_loss") == std::string::npos);

  pf.plan.trainer.cuda_graphs = CudaGraphs::parse("local", "test", "cuda_graphs");
  check_options(pf, "nemo");
  const std::string nemo = export_plan(pf, "nemo").text;
  for (const char* line : {"  ub_tp_comm_overlap: true\n", "  enable_cuda_graph: true\n", "  use_te_rng_tracker: true\n",
                           "    overlap_param_sync: true\n"})
    CHECK_MESSAGE(nemo.find(line) != std::string::npos, line);
  check_refused(pf, {"deepspeed"}, "parallel.trainer.cuda_graphs");
  pf.plan.trainer.cuda_graphs = CudaGraphs{};
  check_refused(pf, {"deepspeed", "torchtitan"}, "parallel.trainer.tp_comm_overlap");
  pf.plan.trainer.tp_comm_overlap = false;
  check_refused(pf, {"deepspeed"}, "parallel.trainer.overlap_param_gather");
}

TEST_CASE("the parameter gather under the optimizer step: Megatron-LM and Megatron-Bridge write it as priced; the rest refuse") {
  PlanFile pf = cuboid::test::with_gather_in_step(plan_file("seed"));
  REQUIRE_FALSE(check_plan(pf.plan, pf.model, cuboid::test::four_dgx_a100()));
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  // Megatron-LM asserts torch checkpoints with it (arguments.py:1073).
  const std::string megatron = export_plan(pf, "megatron").text;
  for (const char* line : {"--overlap-param-gather\n", "--overlap-param-gather-with-optimizer-step\n", "--ckpt-format torch\n"})
    CHECK_MESSAGE(megatron.find(line) != std::string::npos, line);
  CHECK(export_plan(pf, "megatron-bridge").text.find("    cfg.optimizer.overlap_param_gather_with_optimizer_step = True\n") !=
        std::string::npos);
  check_refused(pf, {"nemo"}, "parallel.virtual_stages");  // which it needs
  check_refused(pf, {"deepspeed"}, "parallel.trainer.overlap_param_gather");  // which it needs
  // Bridge's MXFP8 parameter gather reuses the gradient buffer, which
  // Megatron-Core refuses with it; Megatron-LM does not reuse it.
  pf.plan.precision = Precision::mxfp8;
  pf.plan.fp8_param_gather = true;
  CHECK(refusal(pf, "megatron-bridge").find("parallel.trainer.overlap_param_gather_with_optimizer_step: ") !=
        std::string::npos);
  // Off: neither flag nor checkpoint format written, as before.
  pf = plan_file("seed");
  CHECK(export_plan(pf, "megatron").text.find("ckpt-format") == std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("overlap_param_gather_with_optimizer_step") == std::string::npos);
}

TEST_CASE("the DDP bucket size: Megatron-LM and Megatron-Bridge write it when the plan gives one; the rest refuse") {
  PlanFile pf = plan_file("seed");
  pf.plan.trainer.ddp_bucket_params = 134217728;
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  CHECK(export_plan(pf, "megatron").text.find("    --ddp-bucket-size 134217728\n") != std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("    cfg.ddp.bucket_size = 134217728\n") != std::string::npos);
  for (const char* target : {"deepspeed", "torchtitan", "nemo"}) {
    CAPTURE(target);
    CHECK(refusal(pf, target).find("parallel.trainer.ddp_bucket_size: ") != std::string::npos);
  }
  // Not given: Megatron-Core's rule, nothing written.
  pf.plan.trainer.ddp_bucket_params = 0;
  CHECK(export_plan(pf, "megatron").text.find("ddp-bucket-size") == std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("bucket_size") == std::string::npos);
}

TEST_CASE("the aligned parameter gathers: Megatron-LM runs them by default, Megatron-Bridge is told") {
  PlanFile pf = cuboid::test::with_gather_in_forward(plan_file("seed"));
  REQUIRE(pf.plan.aligns_param_gather());
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  CHECK(export_plan(pf, "megatron").text.find("--no-align-param-gather") == std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("    cfg.ddp.align_param_gather = True\n") != std::string::npos);
  check_refused(pf, {"nemo"}, "parallel.virtual_stages");  // NeMo 1.x has no interleaved schedule
  pf.plan.trainer.align_param_gather = false;
  check_options(pf, "megatron");
  CHECK(export_plan(pf, "megatron").text.find("    --no-align-param-gather\n") != std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find("align_param_gather") == std::string::npos);
}

TEST_CASE("activation offloading: Megatron-LM and Megatron-Bridge write it, checked against their pinned options; the rest refuse") {
  PlanFile pf = plan_file("seed");  // TP 4 x PP 1 x DP 8 = 32 GPUs, no recompute: what Megatron-Core offloads with
  pf.plan.pp = 1;
  pf.plan.dp = 8;
  pf.plan.recompute = Recompute::none;
  pf.plan.offload_layers = 20;
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  const Emitted m = cuboid::test::read_megatron(export_plan(pf, "megatron").text);
  CHECK(value(m, "--cpu-offloading-num-layers") == "20");
  const Emitted b = cuboid::test::read_python(export_plan(pf, "megatron-bridge").text, "cfg", "model.");
  CHECK(value(b, "model.cpu_offloading") == "True");
  CHECK(value(b, "model.cpu_offloading_num_layers") == "20");
  check_refused(pf, {"deepspeed", "torchtitan", "nemo"}, "parallel.offload_activations");
  CHECK(refusal(pf, "nemo") ==
        "seed.plan.json: parallel.offload_activations: cuboid's NeMo 1.x export has no setting for Megatron-Core's CPU "
        "activation offloading (its pinned option list has no cpu_offloading keys) (fix: export with --to megatron "
        "or --to megatron-bridge, or plan without --offload-activations)");
  SUBCASE("a plan without it writes none of it") {
    CHECK(text("seed", "megatron").find("cpu-offloading") == std::string::npos);
    CHECK(text("seed", "megatron-bridge").find("cpu_offloading") == std::string::npos);
  }
}

TEST_CASE("fine-grained activation offloading: Megatron-LM and Megatron-Bridge write it; the rest refuse") {
  PlanFile pf = plan_file("seed");
  pf.plan.offload_modules = parse_offload_modules("core_attn,attn_proj", "test", "offload_modules");
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  const std::string m = export_plan(pf, "megatron").text;
  CHECK(m.find("--fine-grained-activation-offloading") != std::string::npos);
  CHECK(value(cuboid::test::read_megatron(m), "--offload-modules") == "core_attn attn_proj");
  const Emitted b = cuboid::test::read_python(export_plan(pf, "megatron-bridge").text, "cfg", "model.");
  CHECK(value(b, "model.fine_grained_activation_offloading") == "True");
  CHECK(value(b, "model.offload_modules") == "[\"core_attn\", \"attn_proj\"]");
  check_refused(pf, {"deepspeed", "torchtitan", "nemo"}, "parallel.offload_modules");
  SUBCASE("a plan without it writes none of it") {
    CHECK(text("seed", "megatron").find("offload-modules") == std::string::npos);
    CHECK(text("seed", "megatron-bridge").find("offload_modules") == std::string::npos);
  }
}

TEST_CASE("the precision-aware optimizer: Megatron-LM and Megatron-Bridge write it and the moments' dtype; the rest refuse") {
  PlanFile pf = plan_file("seed");
  pf.plan.precision_aware_optimizer = true;
  pf.plan.adam_moment_bytes = 2;
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  const std::string m = export_plan(pf, "megatron").text;
  CHECK(m.find("--use-precision-aware-optimizer") != std::string::npos);
  const Emitted me = cuboid::test::read_megatron(m);
  CHECK(value(me, "--exp-avg-dtype") == "bf16");
  CHECK(value(me, "--exp-avg-sq-dtype") == "bf16");
  const std::string bt = export_plan(pf, "megatron-bridge").text;
  const Emitted b = cuboid::test::read_python(bt, "cfg", "model.");
  CHECK(value(b, "optimizer.use_precision_aware_optimizer") == "True");
  CHECK(value(b, "optimizer.exp_avg_dtype") == "torch.bfloat16");
  CHECK(value(b, "optimizer.exp_avg_sq_dtype") == "torch.bfloat16");
  CHECK(bt.find("\nimport torch\n") != std::string::npos);
  check_refused(pf, {"deepspeed", "torchtitan", "nemo"}, "parallel.precision_aware_optimizer");
  CHECK(refusal(pf, "nemo") ==
        "seed.plan.json: parallel.precision_aware_optimizer: cuboid's NeMo 1.x export has no setting for "
        "Megatron-Core's precision-aware optimizer (its pinned option list has no use_precision_aware_optimizer or "
        "exp_avg_dtype keys) (fix: export with --to megatron or --to megatron-bridge, or plan without "
        "--precision-aware-optimizer and --adam-moments)");
  SUBCASE("a plan without it writes none of it") {
    CHECK(text("seed", "megatron").find("precision-aware") == std::string::npos);
    CHECK(text("seed", "megatron").find("exp-avg") == std::string::npos);
    CHECK(text("seed", "megatron-bridge").find("precision_aware") == std::string::npos);
  }
}

TEST_CASE("FP8 attention: Megatron-Bridge writes it, checked against its pinned options; the rest refuse") {
  PlanFile pf = quantized("seed", Precision::mxfp8, true);
  pf.plan.fp8_attention = true;
  check_options(pf, "megatron-bridge");
  const Emitted b = cuboid::test::read_python(export_plan(pf, "megatron-bridge").text, "cfg", "model.");
  CHECK(value(b, "mixed_precision.fp8_dot_product_attention") == "True");
  check_refused(pf, {"megatron"}, "parallel.fp8_attention");
  CHECK(refusal(pf, "megatron").find("Megatron-LM d98e8a64's command line has no setting for FP8 attention "
                                     "(megatron/training/arguments.py _add_network_size_args excludes "
                                     "TransformerConfig's fp8_dot_product_attention") != std::string::npos);
  PlanFile titan = quantized("seed-zero3", Precision::mxfp8, true, 2);
  titan.plan.fp8_attention = true;
  check_refused(titan, {"torchtitan"}, "parallel.fp8_attention");
  PlanFile nemo = quantized("seed", Precision::fp8_delayed, false);
  nemo.plan.fp8_attention = true;
  check_refused(nemo, {"nemo"}, "parallel.fp8_attention");
  SUBCASE("an FP8 plan without it writes none of it") {
    CHECK(export_plan(quantized("seed", Precision::mxfp8, true), "megatron-bridge").text.find("dot_product") ==
          std::string::npos);
  }
}

TEST_CASE("torchtitan v0.2.2 runs what was priced: what its start-up and base TOMLs would change") {
  SUBCASE("booleans are tyro flags (--key / --no_key): --key=false does not parse") {
    const std::string gather = export_plan(quantized("seed-zero3", Precision::fp8_current, true, 2), "torchtitan").text;
    CHECK(gather.find("--quantize.linear.float8.enable_fsdp_float8_all_gather \\\n") != std::string::npos);
    CHECK(gather.find("--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp\n") != std::string::npos);
    const std::string plain = export_plan(quantized("seed-zero3", Precision::fp8_current, false, 2), "torchtitan").text;
    CHECK(plain.find("--quantize.linear.float8.no_enable_fsdp_float8_all_gather \\\n") != std::string::npos);
    for (const std::string& t : {gather, plain}) {
      CHECK(t.find("=true") == std::string::npos);
      CHECK(t.find("=false") == std::string::npos);
    }
  }
  SUBCASE("torch.compile and async TP off whatever the base TOML says (llama3_405b.toml turns both on)") {
    const std::string out = export_plan(titan("seed-zero3"), "torchtitan").text;
    CHECK(out.find("--parallelism.no_enable_async_tensor_parallel \\\n") != std::string::npos);
    CHECK(out.find("--compile.no_enable\n") != std::string::npos);
    CHECK(out.find("[compile]\nenable = false\n") != std::string::npos);
    CHECK(out.find("enable_async_tensor_parallel = false\n") != std::string::npos);
  }
  SUBCASE("405B starts from llama3_70b.toml: llama3_405b.toml's converters = [\"float8\"] cannot be cleared") {
    PlanFile pf = titan("seed-zero3");
    pf.model = load_model(cuboid::test::source_root() / "models/llama3.1-405b.json");
    pf.plan.pp = 2;  // 126 layers: 63 a stage
    pf.plan.dp = 4;
    check_options(pf, "torchtitan");
    const std::string out = export_plan(pf, "torchtitan").text;
    CHECK(out.find("--model.flavor=405B \\\n") != std::string::npos);
    CHECK(out.find("-m torchtitan.train --job.config_file ./torchtitan/models/llama3/train_configs/llama3_70b.toml ") !=
          std::string::npos);
    CHECK(out.find("# The base TOML is llama3_70b.toml: llama3_405b.toml names a converter v0.2.2 does not register\n") !=
          std::string::npos);
    CHECK(out.find("--model.converters") == std::string::npos);  // a bf16 plan: no converter
  }
  SUBCASE("CP: training never reads the rotate method, so the launch sets the ring before torchtitan.train") {
    PlanFile pf = titan("seed-zero3");
    pf.plan.cp = 2;
    pf.plan.dp = 1;
    const std::string out = export_plan(pf, "torchtitan").text;
    CHECK(out.find("#     --no-python python -c \"from torch.distributed.tensor.experimental._attention import "
                   "set_rotate_method; set_rotate_method('alltoall'); from torchtitan.train import Trainer, main; "
                   "main(Trainer)\" --job.config_file ./torchtitan/models/llama3/train_configs/llama3_70b.toml <the "
                   "overrides below>\n") != std::string::npos);
    CHECK(out.find("# Context parallelism: torchtitan v0.2.2's training never applies context_parallel_rotate_method") !=
          std::string::npos);
    CHECK(export_plan(titan("seed-zero3"), "torchtitan").text.find("#     -m torchtitan.train --job.config_file") !=
          std::string::npos);
    CHECK(export_plan(titan("seed-zero3"), "torchtitan").text.find("set_rotate_method") == std::string::npos);
  }
  SUBCASE("PP with FSDP priced without the pipeline's unsharded gradients is refused") {
    CHECK(refusal("seed-zero3", "torchtitan") ==
          "seed-zero3.plan.json: trainer.pp_fsdp_no_sync: torchtitan's pipeline turns FSDP's gradient sync off until "
          "the last micro-batch (torch.distributed.pipelining backward_maybe_with_nosync), so each GPU holds its "
          "stage's gradients unsharded in fp32 and its parameters gathered in bf16, and the plan was priced with them "
          "sharded over its 2 ranks (fix: plan --for torchtitan (it prices torchtitan's pipeline memory))");
    PlanFile z2 = plan_file("seed-zero3");
    z2.plan.zero_stage = 2;
    CHECK(refusal(z2, "torchtitan").find("stage's gradients unsharded in fp32, and the plan") != std::string::npos);
    CHECK_NOTHROW(export_plan(titan("seed-zero3"), "torchtitan"));
  }
  SUBCASE("ZeRO-2 with gradient accumulation and no pipeline regathers every micro-batch: refused") {
    PlanFile pf = titan("seed-zero3");
    pf.plan.zero_stage = 2;
    pf.plan.pp = 1;
    pf.plan.dp = 8;  // 64 / (1 x 8) = 8 micro-batches
    CHECK(refusal(pf, "torchtitan") ==
          "seed-zero3.plan.json: parallel.zero_stage: torchtitan reshards FSDP's parameters after every backward, so "
          "with ZeRO-2 (fsdp_reshard_after_forward \"never\") and 8 micro-batches of gradient accumulation it "
          "all-gathers them again in each micro-batch's forward, and the plan was priced with one gather per step "
          "(fix: plan with --zero 3 (FSDP's gathers in every forward and backward, as priced), or with a micro-batch "
          "that fills the global batch without accumulation)");
    pf.plan.micro_batch = 8;  // one micro-batch: one gather, as priced
    check_options(pf, "torchtitan");
    pf.plan.micro_batch = 1;
    pf.plan.zero_stage = 3;
    check_options(pf, "torchtitan");
  }
}

TEST_CASE("torchtitan main refuses every plan: its language models attend per document with FlexAttention") {
  for (const char* plan : {"seed", "seed-zero3", "gpt3-interleaved", "llama8b-pp4"}) {
    CAPTURE(plan);
    const std::string why = refusal(titan(plan), "torchtitan-main");
    CHECK(why.find(std::string(plan) + ".plan.json: model: torchtitan main (b5bcd76c) runs a language model's "
                                       "attention as FlexAttention or varlen with block-causal masks over the packed "
                                       "documents") == 0);
    CHECK(why.find("(fix: export with --to torchtitan (v0.2.2's llama3 flavours run SDPA, causal over the whole "
                   "sequence), --to megatron or --to megatron-bridge)") != std::string::npos);
  }
}

TEST_CASE("partial full recomputation: Megatron-LM, Megatron-Bridge and NeMo 1.x write the method and layer count, checked against their pinned options; DeepSpeed and torchtitan refuse") {
  PlanFile pf = plan_file("seed");  // full recompute, PP 4: 20 layers a stage
  pf.plan.recompute_method = RecomputeMethod::block;
  pf.plan.recompute_num_layers = 5;
  check_options(pf, "megatron");
  check_options(pf, "megatron-bridge");
  check_options(pf, "nemo");
  const Emitted m = cuboid::test::read_megatron(export_plan(pf, "megatron").text);
  CHECK(value(m, "--recompute-granularity") == "full");
  CHECK(value(m, "--recompute-method") == "block");
  CHECK(value(m, "--recompute-num-layers") == "5");
  const Emitted b = cuboid::test::read_python(export_plan(pf, "megatron-bridge").text, "cfg", "model.");
  CHECK(value(b, "model.recompute_method") == "block");
  CHECK(value(b, "model.recompute_num_layers") == "5");
  const Emitted n = cuboid::test::read_yaml(export_plan(pf, "nemo").text);
  CHECK(value(n, "model.activations_checkpoint_method") == "block");
  CHECK(value(n, "model.activations_checkpoint_num_layers") == "5");
  check_refused(pf, {"torchtitan"}, "parallel.recompute_method");
  PlanFile ds = plan_file("llama8b-pp4");  // a pipeline DeepSpeed runs with full recomputation
  ds.plan.recompute_method = RecomputeMethod::block;
  ds.plan.recompute_num_layers = 2;
  check_refused(ds, {"deepspeed"}, "parallel.recompute_method");
  pf.plan.recompute_method = ds.plan.recompute_method = RecomputeMethod::uniform;
  check_options(pf, "megatron");
  CHECK(value(cuboid::test::read_megatron(export_plan(pf, "megatron").text), "--recompute-method") == "uniform");
  check_refused(pf, {"torchtitan"}, "parallel.recompute_num_layers");
  check_refused(ds, {"deepspeed"}, "parallel.recompute_num_layers");
}
