// Trainer presets as data (trainers/*.json): the loaded presets are those the
// planner was written for, every bad field of a preset file gets one exact
// error, the schema's defaults are the loader's, and docs/cli.md's trainer
// table says what the files say.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/error.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/trainer.hpp"

using namespace cuboid;
using nlohmann::json;

namespace {

// Every capability and setting of a preset, written out by hand: what
// make_presets() held in code before the presets became files.
struct Expected {
  const char* name;
  std::vector<int> zero_stages;
  bool pipeline, sequence_parallel, selective_recompute, interleaved, flash_attention, grad_accum_fusion,
      uneven_stages, uneven_interleaved, context_parallel, context_parallel_a2a, expert_parallel,
      default_grad_accum_fusion;
  bool dp_overlap;
  int dp_grad_bytes;
  bool zero1_grad_all_reduce, tp_backward_overlap, cp_overlap;
  int grad_accum_bytes;
  Zero3Unit zero3_unit;
  std::int64_t zero3_persist_params;
  int zero3_prefetch_units;
  std::int64_t zero3_prefetch_params, zero3_reuse_params, zero3_reduce_bucket_params;
  bool zero3_reduce_per_tensor, zero3_sync, zero3_list_collectives, zero3_fetch_norm;
};

// clang-format off
const std::vector<Expected> kExpected = {
    {"megatron-core", {0, 1, 2, 3}, true, true, true, true, true, true, true, true, true, true, true, true,
     true, 4, false, true, true, 10, Zero3Unit::block, 0, 0, 500000000, 0, 0, false, false, false, false},
    {"megatron-lm-2023", {0, 1}, true, true, true, true, true, true, false, false, false, false, false, true,
     false, 4, false, true, true, 10, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"megatron-2022", {0}, true, true, true, true, false, false, false, false, false, false, false, false,
     false, 4, false, true, true, 10, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"megatron-2021", {0}, true, false, false, true, false, false, false, false, false, false, false, false,
     false, 2, false, false, true, 6, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"megatron-deepspeed", {0, 1}, true, true, true, false, true, false, true, false, false, false, false, false,
     false, 4, true, true, true, 18, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"megatron-deepspeed-2022", {0, 1}, true, false, false, false, false, false, true, false, false, false, false, false,
     false, 4, true, false, true, 18, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"megatron-deepspeed-2021", {0, 1}, true, false, false, false, false, false, true, false, false, false, false, false,
     false, 2, true, false, true, 6, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"torchtitan", {0, 2, 3}, true, true, true, true, true, false, true, false, true, false, true, false,
     true, 4, false, true, true, 10, Zero3Unit::block, 0, 1, 0, 0, 0, false, false, false, false},
    {"deepspeed-2021", {0, 1, 2, 3}, false, false, false, false, false, false, false, false, false, false, false, false,
     false, 2, false, false, true, 10, Zero3Unit::tensor, 100000, 0, 50000000, 1000000000, 500000000, true, true, true, true},
};
// clang-format on

bool same_preset(const TrainerPreset& a, const TrainerPreset& b) {
  return a.pipeline == b.pipeline && a.sequence_parallel == b.sequence_parallel &&
         a.selective_recompute == b.selective_recompute && a.interleaved == b.interleaved &&
         a.flash_attention == b.flash_attention && a.grad_accum_fusion == b.grad_accum_fusion &&
         a.uneven_stages == b.uneven_stages && a.uneven_interleaved == b.uneven_interleaved &&
         a.pipeline_layout == b.pipeline_layout &&
         a.context_parallel == b.context_parallel && a.context_parallel_a2a == b.context_parallel_a2a &&
         a.expert_parallel == b.expert_parallel && a.fp8 == b.fp8 && a.recompute_modules == b.recompute_modules && a.recompute_layers == b.recompute_layers && a.activation_offloading == b.activation_offloading && a.precision_aware_optimizer == b.precision_aware_optimizer && a.fp8_attention == b.fp8_attention && a.muon == b.muon && a.overlap_param_gather_with_optimizer_step == b.overlap_param_gather_with_optimizer_step && a.zero_stages == b.zero_stages && a.moe_dispatchers == b.moe_dispatchers &&
         a.default_grad_accum_fusion == b.default_grad_accum_fusion && a.settings == b.settings &&
         a.attention_kernels == b.attention_kernels && a.attention_kernel == b.attention_kernel &&
         a.cuda_graphs == b.cuda_graphs && a.tp_comm_overlap == b.tp_comm_overlap &&
         a.overlap_param_gather == b.overlap_param_gather && a.moe_ep_overlap == b.moe_ep_overlap &&
         a.default_moe_ep_overlap == b.default_moe_ep_overlap && a.dp_grad_bytes == b.dp_grad_bytes;
}

// The smallest valid preset file: the required fields only.
json minimal() {
  const auto sourced = [](json v) { return json{{"value", std::move(v)}, {"source", "a test"}}; };
  return {{"name", "t"},
          {"description", "a test trainer"},
          {"can_run", {{"grad_accum_fusion", sourced(true)}}},
          {"settings", {{"dp_overlap", sourced(true)}, {"dp_grad_bytes", sourced(4)}}}};
}

std::string error_of(const json& j, const std::string& file = "trainers/t.json") {
  try {
    (void)parse_trainer(j.dump(), file);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("the presets loaded from trainers/ are those the code held") {
  const auto presets = trainer_presets();
  REQUIRE(presets.size() == kExpected.size());
  CHECK(default_trainer().name == "megatron-core");
  CHECK(trainer_names() ==
        "megatron-core, megatron-lm-2023, megatron-2022, megatron-2021, megatron-deepspeed, megatron-deepspeed-2022, "
        "megatron-deepspeed-2021, torchtitan, deepspeed-2021");
  for (std::size_t i = 0; i < presets.size(); ++i) {
    const TrainerPreset& t = presets[i];
    const Expected& e = kExpected[i];
    CAPTURE(t.name);
    CHECK(t.name == e.name);
    CHECK(find_trainer(e.name) == &t);
    CHECK(t.zero_stages == e.zero_stages);
    CHECK(t.pipeline == e.pipeline);
    CHECK(t.sequence_parallel == e.sequence_parallel);
    CHECK(t.selective_recompute == e.selective_recompute);
    CHECK(t.interleaved == e.interleaved);
    CHECK(t.flash_attention == e.flash_attention);
    CHECK(t.grad_accum_fusion == e.grad_accum_fusion);
    CHECK(t.uneven_stages == e.uneven_stages);
    CHECK(t.uneven_interleaved == e.uneven_interleaved);
    // Megatron-Core's --account-for-*-in-pipeline-split and layout (2025): the current preset's only.
    CHECK(t.pipeline_layout == (t.name == "megatron-core"));
    // Transformer Engine's FusedAdam holding the optimizer's states: the current preset's only.
    CHECK(t.precision_aware_optimizer == (t.name == "megatron-core"));
    // Transformer Engine's FP8 attention (fp8_dpa): the current preset's only.
    CHECK(t.fp8_attention == (t.name == "megatron-core"));
    CHECK(t.overlap_param_gather_with_optimizer_step == (t.name == "megatron-core"));
    // Megatron-LM's --ddp-bucket-size: the current preset's only.
    CHECK(t.ddp_bucket_size == (t.name == "megatron-core"));
    // Megatron-Core's emerging optimizers (Muon, 2025): the current preset's only.
    CHECK(t.muon == (t.name == "megatron-core"));
    CHECK_FALSE(t.settings.overlap_param_gather_with_optimizer_step);
    CHECK(t.context_parallel == e.context_parallel);
    CHECK(t.context_parallel_a2a == e.context_parallel_a2a);
    CHECK(t.expert_parallel == e.expert_parallel);
    CHECK(t.default_grad_accum_fusion == e.default_grad_accum_fusion);
    TrainerSettings s;
    s.preset = e.name;
    s.dp_overlap = e.dp_overlap;
    s.dp_grad_bytes = e.dp_grad_bytes;
    s.zero1_grad_all_reduce = e.zero1_grad_all_reduce;
    s.tp_backward_overlap = e.tp_backward_overlap;
    s.cp_overlap = e.cp_overlap;
    s.grad_accum_bytes = e.grad_accum_bytes;
    s.zero3_unit = e.zero3_unit;
    s.zero3_persist_params = e.zero3_persist_params;
    s.zero3_prefetch_units = e.zero3_prefetch_units;
    s.zero3_prefetch_params = e.zero3_prefetch_params;
    s.zero3_reuse_params = e.zero3_reuse_params;
    s.zero3_reduce_bucket_params = e.zero3_reduce_bucket_params;
    s.zero3_reduce_per_tensor = e.zero3_reduce_per_tensor;
    s.zero3_sync = e.zero3_sync;
    s.zero3_list_collectives = e.zero3_list_collectives;
    s.zero3_fetch_norm = e.zero3_fetch_norm;
    s.pp_fsdp_no_sync = std::string(e.name) == "torchtitan";  // its own test case below
    s.fsdp_grad_bytes = std::string(e.name) == "megatron-core" ? 2 : 0;  // its own test case below
    // Megatron-LM's --no-align-param-gather default (store_false); it acts
    // only with the overlapped gather, which the others cannot run.
    s.align_param_gather = std::string(e.name) == "megatron-core";
    CHECK(t.settings == s);
  }
  CHECK(find_trainer("megatron") == nullptr);
}

// Each preset's attention kernel, read from its code at its commit (the
// files' sources): the one it runs by default and the ones it can call.
TEST_CASE("the presets' attention kernels") {
  using K = AttentionKernel;
  struct Row {
    const char* name;
    K runs;
    std::vector<K> calls;
  };
  const std::vector<Row> rows = {
      {"megatron-core", K::auto_, {K::unfused, K::flash2, K::flash3, K::cudnn}},
      {"megatron-lm-2023", K::unfused, {K::unfused, K::flash1}},
      {"megatron-2022", K::unfused, {K::unfused}},
      {"megatron-2021", K::unfused, {K::unfused}},
      {"megatron-deepspeed", K::flash2, {K::unfused, K::flash1, K::flash2}},
      {"megatron-deepspeed-2022", K::unfused, {K::unfused}},
      {"megatron-deepspeed-2021", K::unfused, {K::unfused}},
      {"torchtitan", K::auto_, {K::unfused, K::flash2, K::cudnn}},
      {"deepspeed-2021", K::unfused, {K::unfused}},
  };
  REQUIRE(rows.size() == trainer_presets().size());
  for (const Row& r : rows) {
    CAPTURE(r.name);
    const TrainerPreset* t = find_trainer(r.name);
    REQUIRE(t != nullptr);
    CHECK(t->attention_kernel == r.runs);
    CHECK(t->attention_kernels == r.calls);
  }
}

TEST_CASE("a preset's attention kernel: one it calls, fused only with flash") {
  json j = minimal();
  j["settings"]["attention_kernel"] = {{"value", "flash3"}, {"source", "a test"}};
  j["can_run"]["attention_kernels"] = {{"value", {"unfused", "flash2"}}, {"source", "a test"}};
  CHECK(error_of(j) ==
        "trainers/t.json: settings.attention_kernel: is flash3, which can_run.attention_kernels does not list (fix: "
        "list it there or name one it lists)");
  j["settings"]["attention_kernel"]["value"] = "flash4";
  CHECK(error_of(j) == "trainers/t.json: settings.attention_kernel.value: unknown attention kernel \"flash4\" (fix: use "
                       "auto, unfused, flash1, flash2, flash3 or cudnn)");
  j["settings"]["attention_kernel"]["value"] = "flash2";
  j["can_run"]["flash_attention"] = {{"value", false}, {"source", "a test"}};
  CHECK(error_of(j) == "trainers/t.json: settings.attention_kernel: names a fused kernel but can_run.flash_attention is "
                       "false (fix: give unfused)");
  j["can_run"]["attention_kernels"]["value"] = {"flash2", "flash2"};
  CHECK(error_of(j) == "trainers/t.json: can_run.attention_kernels.value[1]: repeats flash2 (fix: list each kernel once)");
}

TEST_CASE("every setting a preset file gives names its upstream source") {
  for (const TrainerPreset& t : trainer_presets()) {
    CAPTURE(t.name);
    CHECK(!t.description.empty());
    CHECK(t.sources.size() >= 3);
    for (const TrainerSource& s : t.sources) CHECK_MESSAGE(s.source.size() > 20, s.setting);
  }
  // The sources moved from the code verbatim; two spot checks.
  const auto source_of = [](const char* trainer, const char* setting) {
    for (const TrainerSource& s : find_trainer(trainer)->sources)
      if (s.setting == setting) return s.source;
    return std::string();
  };
  CHECK(source_of("megatron-2021", "grad_accum_fusion") ==
        "Megatron-LM de7dc40f megatron/mpu/layers.py: no fused wgrad accumulation");
  CHECK(source_of("deepspeed-2021", "zero3_persist_params").rfind("DeepSpeed v0.5.4 deepspeed/runtime/zero/constants.py "
                                                                  "stage3_param_persistence_threshold 100000", 0) == 0);
}

TEST_CASE("a preset file's fields default to the schema's defaults") {
  const TrainerPreset base = parse_trainer(minimal().dump(), "trainers/t.json");
  CHECK(base.name == "t");
  CHECK(base.settings.preset == "t");
  CHECK(base.sources.size() == 3);
  const json schema = json::parse(read_text(std::string(CUBOID_SOURCE_ROOT_DIR) + "/schemas/cuboid.trainer.1.schema.json"));
  int defaults = 0;
  for (const char* group : {"can_run", "settings"}) {
    for (const auto& [key, property] : schema["properties"][group]["properties"].items()) {
      CAPTURE(key);
      // can_run.dp_grad_bytes defaults to settings.dp_grad_bytes (next test).
      if (std::string_view(group) == "can_run" && key == "dp_grad_bytes") continue;
      // fsdp_grad_bytes: both groups or neither, absent a trainer without Megatron-FSDP (own test).
      if (key == "fsdp_grad_bytes") continue;
      if (!property.contains("default")) {
        CHECK(schema["properties"][group]["required"].dump().find('"' + key + '"') != std::string::npos);
        continue;
      }
      json j = minimal();
      j[group][key] = {{"value", property["default"]}, {"source", "the schema's default"}};
      CHECK(same_preset(parse_trainer(j.dump(), "trainers/t.json"), base));
      ++defaults;
    }
  }
  // 27 + attention_kernels (can_run) and attention_kernel (settings) + recompute_modules (can_run) +
  // moe_dispatchers (can_run) + cuda_graphs, tp_comm_overlap, overlap_param_gather, moe_ep_overlap (each in
  // both groups) + activation_offloading (can_run) + pp_fsdp_no_sync (settings) + recompute_layers (can_run) +
  // precision_aware_optimizer (can_run) + fp8_attention (can_run) + overlap_param_gather_with_optimizer_step (both) +
  // align_param_gather (settings) + ddp_bucket_size (can_run) + muon (can_run)
  CHECK(defaults == 49);
}

TEST_CASE("the gradient dtypes a preset reduces in: megatron-core both, the others their own") {
  for (const TrainerPreset& t : trainer_presets()) {
    CAPTURE(t.name);
    if (t.name == "megatron-core") {
      CHECK(t.dp_grad_bytes == std::vector<int>{2, 4});  // --grad-reduce-in-bf16
      CHECK(t.settings.dp_grad_bytes == 4);
    } else {
      CHECK(t.dp_grad_bytes == std::vector<int>{t.settings.dp_grad_bytes});
    }
  }
  const TrainerPreset base = parse_trainer(minimal().dump(), "trainers/t.json");
  CHECK(base.dp_grad_bytes == std::vector<int>{4});
  CHECK(base.runs_dp_grad_bytes(4));
  CHECK_FALSE(base.runs_dp_grad_bytes(2));
  json j = minimal();
  j["can_run"]["dp_grad_bytes"] = {{"value", {2}}, {"source", "a test"}};
  CHECK(error_of(j) == "trainers/t.json: settings.dp_grad_bytes: is 4, which can_run.dp_grad_bytes does not list "
                       "(fix: list it there or give one it lists)");
  j["can_run"]["dp_grad_bytes"]["value"] = {4, 4};
  CHECK(error_of(j) == "trainers/t.json: can_run.dp_grad_bytes.value[1]: lists 4 twice (fix: list each once)");
  j["can_run"]["dp_grad_bytes"]["value"] = {4, 8};
  CHECK(error_of(j) == "trainers/t.json: can_run.dp_grad_bytes.value[1]: must be 2 (16-bit gradients) or 4 (fp32), "
                       "got 8 (fix: give 2 or 4)");
  // A plan's reduce dtype is one its trainer runs (check_trainer).
  ParallelPlan p;
  p.flash_attention = false;     // megatron-2022 runs the unfused core
  p.grad_accum_fusion = false;   // and no fused accumulation
  p.trainer = find_trainer("megatron-2022")->settings;
  CHECK_FALSE(check_trainer(p, *find_trainer("megatron-2022")));
  p.trainer.dp_grad_bytes = 2;
  const auto r = check_trainer(p, *find_trainer("megatron-2022"));
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::trainer_no_dp_grad_bytes);
  CHECK(r->field == PlanField::dp_grad_bytes);
  CHECK_FALSE(check_trainer(p, *find_trainer("megatron-core")));
}

TEST_CASE("Megatron-FSDP's gradient dtype: megatron-core alone has one, listed and set together") {
  for (const TrainerPreset& t : trainer_presets()) {
    CAPTURE(t.name);
    const bool mcore = t.name == "megatron-core";
    CHECK(t.settings.fsdp_grad_bytes == (mcore ? 2 : 0));
    CHECK(t.fsdp_grad_bytes == (mcore ? std::vector<int>{2, 4} : std::vector<int>{}));
  }
  ParallelPlan p;
  p.grad_accum_fusion = false;  // torchtitan has no fused accumulation
  p.trainer = find_trainer("torchtitan")->settings;
  CHECK_FALSE(check_trainer(p, *find_trainer("torchtitan")));
  p.trainer.fsdp_grad_bytes = 4;
  const auto r = check_trainer(p, *find_trainer("torchtitan"));
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::trainer_no_fsdp_grad_bytes);
  CHECK(r->field == PlanField::fsdp_grad_bytes);
  // 0 (the DP reduction's dtype) is every trainer's; megatron-core runs 2 and 4.
  p.trainer.fsdp_grad_bytes = 0;
  CHECK_FALSE(check_trainer(p, *find_trainer("torchtitan")));
  CHECK(find_trainer("megatron-core")->runs_fsdp_grad_bytes(4));
  CHECK(find_trainer("megatron-core")->runs_fsdp_grad_bytes(0));
  // A file gives both or neither, and the setting among the listed.
  json j = minimal();
  j["settings"]["fsdp_grad_bytes"] = {{"value", 2}, {"source", "a test"}};
  CHECK(error_of(j) == "trainers/t.json: settings.fsdp_grad_bytes: is given without can_run.fsdp_grad_bytes (fix: "
                       "give both (a trainer with Megatron-FSDP) or neither)");
  j["can_run"]["fsdp_grad_bytes"] = {{"value", {4}}, {"source", "a test"}};
  CHECK(error_of(j) == "trainers/t.json: settings.fsdp_grad_bytes: is 2, which can_run.fsdp_grad_bytes does not list "
                       "(fix: list it there or give one it lists)");
  j["settings"].erase("fsdp_grad_bytes");
  CHECK(error_of(j) == "trainers/t.json: can_run.fsdp_grad_bytes: is given without settings.fsdp_grad_bytes (fix: "
                       "give both (a trainer with Megatron-FSDP) or neither)");
}

TEST_CASE("Megatron-Core's overlaps and CUDA graphs: off in every preset, runnable where the code has them") {
  for (const TrainerPreset& t : trainer_presets()) {
    CAPTURE(t.name);
    CHECK_FALSE(t.settings.cuda_graphs.on());
    CHECK_FALSE(t.settings.tp_comm_overlap);
    CHECK_FALSE(t.settings.overlap_param_gather);
    const bool mcore = t.name == "megatron-core";
    CHECK(t.cuda_graphs == mcore);
    CHECK(t.tp_comm_overlap == mcore);
    CHECK(t.overlap_param_gather == mcore);
  }
  json j = minimal();
  j["can_run"]["tp_comm_overlap"] = {{"value", false}, {"source", "a test"}};
  j["settings"]["tp_comm_overlap"] = {{"value", true}, {"source", "a test"}};
  CHECK(error_of(j) ==
        "trainers/t.json: settings.tp_comm_overlap: is on but can_run.tp_comm_overlap is false (fix: give false)");
  j = minimal();
  j["settings"]["cuda_graphs"] = {{"value", "transformer_engine:mlp"}, {"source", "a test"}};
  const TrainerPreset t = parse_trainer(j.dump(), "trainers/t.json");
  CHECK(t.settings.cuda_graphs.impl == CudaGraphImpl::transformer_engine);
  CHECK(t.settings.cuda_graphs.modules == static_cast<std::uint8_t>(CudaGraphModule::mlp));
  j["settings"]["cuda_graphs"]["value"] = "full_iteration:mlp";
  CHECK(error_of(j) == "trainers/t.json: settings.cuda_graphs.value: \"full_iteration:mlp\": full_iteration takes no "
                       "modules (fix: give full_iteration alone)");
}

TEST_CASE("a bad preset file: one exact error per bad field") {
  json j = minimal();
  SUBCASE("unknown key") {
    j["nmae"] = "t";
    CHECK(error_of(j) ==
          "trainers/t.json: nmae: unknown field (fix: remove it or check its spelling (did you mean \"name\"?))");
    j = minimal();
    j["settings"]["dp_overlapp"] = {{"value", true}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.dp_overlapp: unknown field (fix: remove it or check its spelling "
                         "(did you mean \"dp_overlap\"?))");
    j = minimal();
    j["settings"]["fp16"] = {{"value", true}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.fp16: unknown field (fix: remove it or check its spelling "
                         "(schemas/cuboid.trainer.1.schema.json lists the fields))");
    j = minimal();
    j["settings"]["pipeline"] = {{"value", false}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.pipeline: belongs in \"can_run\" (fix: move it there)");
    j = minimal();
    j["settings"]["dp_overlap"]["note"] = "x";
    CHECK(error_of(j) == "trainers/t.json: settings.dp_overlap.note: unknown field (fix: remove it or check its "
                         "spelling (schemas/cuboid.trainer.1.schema.json lists the fields))");
  }
  SUBCASE("wrong type") {
    j["settings"]["dp_overlap"]["value"] = 1;
    CHECK(error_of(j) ==
          "trainers/t.json: settings.dp_overlap.value: expected true or false, got an integer 1 (fix: give true or false)");
    j = minimal();
    j["description"] = 5;
    CHECK(error_of(j) == "trainers/t.json: description: expected a string, got an integer 5 (fix: give a quoted string)");
    j = minimal();
    j["can_run"] = json::array();
    CHECK(error_of(j) == "trainers/t.json: can_run: expected an object, got an array (fix: give { ... })");
    j = minimal();
    j["can_run"]["zero_stages"] = {{"value", "0-3"}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: can_run.zero_stages.value: expected an array of ZeRO stages, got \"0-3\" "
                         "(fix: give e.g. [0, 1])");
    j = minimal();
    j["settings"]["zero3_persist_params"] = {{"value", 1.5}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.zero3_persist_params.value: expected an integer, got 1.5 (fix: give "
                         "a whole number)");
  }
  SUBCASE("out-of-range number") {
    j["settings"]["zero3_persist_params"] = {{"value", -1}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.zero3_persist_params.value: must not be negative, got -1 (fix: give "
                         "a value >= 0)");
    j = minimal();
    j["settings"]["zero3_prefetch_units"] = {{"value", 3000000000}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.zero3_prefetch_units.value: value 3000000000 is above the limit of "
                         "2147483647 (fix: give a value from 0 to 2147483647)");
    j = minimal();
    j["can_run"]["zero_stages"] = {{"value", {0, 4}}, {"source", "s"}};
    CHECK(error_of(j) ==
          "trainers/t.json: can_run.zero_stages.value[1]: must be 0 to 3, got 4 (fix: give 0, 1, 2 or 3)");
    j = minimal();
    j["can_run"]["zero_stages"] = {{"value", {1, 0}}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: can_run.zero_stages.value[1]: stages must ascend without repeats, got 0 "
                         "after 1 (fix: list each stage once, lowest first)");
    j = minimal();
    j["can_run"]["zero_stages"] = {{"value", json::array()}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: can_run.zero_stages.value: is empty (fix: give the ZeRO stages the trainer "
                         "runs, e.g. [0])");
  }
  SUBCASE("unknown enum value") {
    j["settings"]["zero3_unit"] = {{"value", "layer"}, {"source", "s"}};
    CHECK(error_of(j) ==
          "trainers/t.json: settings.zero3_unit.value: unknown value \"layer\" (fix: use one of block|tensor)");
    j = minimal();
    j["settings"]["dp_grad_bytes"]["value"] = 3;
    CHECK(error_of(j) == "trainers/t.json: settings.dp_grad_bytes.value: must be 2 (16-bit gradients) or 4 (fp32), got "
                         "3 (fix: give one of those)");
    j = minimal();
    j["settings"]["grad_accum_bytes"] = {{"value", 8}, {"source", "s"}};
    CHECK(error_of(j) == "trainers/t.json: settings.grad_accum_bytes.value: must be 6 (16-bit .grad accumulated by "
                         "autograd), 10 (Megatron's main_grad hook) or 18 (DeepSpeed's BF16Optimizer), got 8 (fix: give "
                         "one of those)");
  }
  SUBCASE("missing required field") {
    j.erase("settings");
    CHECK(error_of(j) == "trainers/t.json: settings: missing required field (fix: add \"settings\")");
    j = minimal();
    j["settings"].erase("dp_grad_bytes");
    CHECK(error_of(j) ==
          "trainers/t.json: settings.dp_grad_bytes: missing required field (fix: add it with its value and source)");
    j = minimal();
    j["can_run"].erase("grad_accum_fusion");
    CHECK(error_of(j) ==
          "trainers/t.json: can_run.grad_accum_fusion: missing required field (fix: add it with its value and source)");
    j = minimal();
    j["settings"]["dp_overlap"].erase("value");
    CHECK(error_of(j) == "trainers/t.json: settings.dp_overlap.value: missing required field (fix: add \"value\")");
  }
  SUBCASE("a setting with no source") {
    const std::string fix =
        " (fix: give {\"value\": ..., \"source\": \"<repository> <commit> <file>: what it says\"})";
    j["settings"]["dp_overlap"] = true;
    CHECK(error_of(j) == "trainers/t.json: settings.dp_overlap: has no source" + fix);
    j = minimal();
    j["can_run"]["pipeline"] = {{"value", false}};
    CHECK(error_of(j) == "trainers/t.json: can_run.pipeline: has no source" + fix);
    j = minimal();
    j["settings"]["dp_overlap"]["source"] = " ";
    CHECK(error_of(j) == "trainers/t.json: settings.dp_overlap.source: is empty (fix: name the upstream file and commit "
                         "the value was read from)");
  }
  SUBCASE("the name") {
    CHECK(error_of(j, "trainers/u.json") ==
          "trainers/u.json: name: is \"t\" but the file is named u.json (fix: name the file after the preset)");
    j["name"] = "Megatron Core";
    CHECK(error_of(j) == "trainers/t.json: name: \"Megatron Core\" is not a --trainer name (fix: use lowercase letters, "
                         "digits, '.' and '-')");
    j = minimal();
    j["description"] = "";
    CHECK(error_of(j) ==
          "trainers/t.json: description: is empty (fix: say in one line: trainer, version, precision)");
  }
  SUBCASE("malformed JSON") {
    CHECK_THROWS_WITH_AS(parse_trainer("{\"name\": ", "trainers/t.json"),
                         doctest::Contains("trainers/t.json: malformed JSON"), InputError);
  }
}

namespace {

// The cells of docs/cli.md's trainer table, one row per preset.
std::vector<std::vector<std::string>> trainer_table() {
  std::istringstream in(read_text(std::string(CUBOID_SOURCE_ROOT_DIR) + "/docs/cli.md"));
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("### ", 0) == 0 || line.rfind("## ", 0) == 0) in_section = line == "### Trainers";
    if (!in_section || line.rfind("| `", 0) != 0 || line.rfind("| `--trainer`", 0) == 0) continue;  // rows, not the head
    std::vector<std::string> cells;
    std::size_t start = 1;
    for (std::size_t bar = line.find(" | ", start); bar != std::string::npos; bar = line.find(" | ", start)) {
      cells.push_back(line.substr(start + 1, bar - start - 1));
      start = bar + 2;
    }
    cells.push_back(line.substr(start + 1, line.size() - start - 3));
    rows.push_back(cells);
  }
  return rows;
}

std::string yes_no(bool v) { return v ? "yes" : "no"; }

// "0", "0-3" when contiguous, else each: "0, 2, 3".
std::string stages(const std::vector<int>& z) {
  if (z.back() - z.front() + 1 == static_cast<int>(z.size()))
    return std::to_string(z.front()) + (z.size() > 1 ? "-" + std::to_string(z.back()) : "");
  std::string out;
  for (int s : z) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("docs/cli.md's trainer table says what trainers/*.json say") {
  const auto rows = trainer_table();
  const auto presets = trainer_presets();
  REQUIRE(rows.size() == presets.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const TrainerPreset& t = presets[i];
    const std::vector<std::string>& r = rows[i];
    CAPTURE(t.name);
    REQUIRE(r.size() == 11);
    CHECK(r[0] == "`" + t.name + "`" + (i == 0 ? " (default)" : ""));
    CHECK(starts_with(r[2], yes_no(t.sequence_parallel)));
    CHECK(starts_with(r[3], yes_no(t.selective_recompute)));
    CHECK(r[4] == (t.pipeline ? yes_no(t.interleaved) : "—"));
    const std::string uneven = !t.pipeline ? "—"
                               : !t.uneven_stages ? "no"
                               : t.uneven_interleaved ? "yes, also interleaved"
                               : t.interleaved ? "yes, not interleaved"
                                               : "yes";
    CHECK(r[5] == uneven);
    CHECK(starts_with(r[6], yes_no(t.flash_attention)));
    CHECK(starts_with(r[7], t.default_grad_accum_fusion ? "on" : "no"));
    CHECK(r[8] == stages(t.zero_stages));
    const std::string& dp = r[9];
    CHECK((dp.find("overlapped") != std::string::npos) == t.settings.dp_overlap);
    CHECK(dp.find(t.settings.dp_grad_bytes == 4 ? "fp32" : "fp16") != std::string::npos);
    CHECK((dp.find("bf16") != std::string::npos) == (t.dp_grad_bytes.size() > 1));  // --grad-reduce-dtype
    CHECK((dp.find("all-reduced") != std::string::npos) == t.settings.zero1_grad_all_reduce);
    CHECK((dp.find("ZeRO-3 per weight tensor") != std::string::npos) == (t.settings.zero3_unit == Zero3Unit::tensor));
    std::string tp = r[10];
    if (starts_with(tp, "**")) tp = tp.substr(2, tp.size() - 4);
    CHECK(tp == yes_no(t.settings.tp_backward_overlap));
  }
}

TEST_CASE("torchtitan's pipeline keeps FSDP's gradients unsharded until the last backward; no other preset does") {
  for (const TrainerPreset& t : trainer_presets()) {
    CAPTURE(t.name);
    CHECK(t.settings.pp_fsdp_no_sync == (t.name == "torchtitan"));
  }
  std::string source;
  for (const TrainerSource& s : find_trainer("torchtitan")->sources)
    if (s.setting == "pp_fsdp_no_sync") source = s.source;
  CHECK(source.find("torch/distributed/pipelining/stage.py backward_maybe_with_nosync") != std::string::npos);
}
