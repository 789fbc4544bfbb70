#include "cuboid/core/trainer.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"
#include "trainer_files.hpp"

namespace cuboid {

namespace {

constexpr std::string_view kSchema = "schemas/cuboid.trainer.1.schema.json";

// One field of a preset file: its key and how its "value" is read.
struct Field {
  std::string_view key;
  void (*read)(JsonReader& setting, TrainerPreset& t);
};

// An element count of the ZeRO-3 settings (0: off).
std::int64_t count(JsonReader& r) { return r.count<std::int64_t>("value", 0); }

// The byte counts the cost model prices (TrainerSettings says what each means).
int bytes_of(JsonReader& r, std::initializer_list<int> allowed, const std::string& meaning) {
  const int v = r.count<int>("value");
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end())
    r.fail("value", "must be " + meaning + ", got " + std::to_string(v), "give one of those");
  return v;
}

// The ZeRO stages the trainer runs, ascending; the first is the plan's default.
void read_zero_stages(JsonReader& r, TrainerPreset& t) {
  const nlohmann::json& v = r.raw("value");
  if (!v.is_array())
    r.fail("value", "expected an array of ZeRO stages, got " + v.dump().substr(0, 40), "give e.g. [0, 1]");
  if (v.empty()) r.fail("value", "is empty", "give the ZeRO stages the trainer runs, e.g. [0]");
  t.zero_stages.clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = "value[" + std::to_string(i) + "]";
    if (!v[i].is_number_integer())
      r.fail(at, "expected a ZeRO stage, got " + v[i].dump().substr(0, 40), "give 0, 1, 2 or 3");
    const std::int64_t z = v[i].get<std::int64_t>();
    if (z < 0 || z > 3) r.fail(at, "must be 0 to 3, got " + std::to_string(z), "give 0, 1, 2 or 3");
    if (!t.zero_stages.empty() && z <= t.zero_stages.back())
      r.fail(at, "stages must ascend without repeats, got " + std::to_string(z) + " after " +
                     std::to_string(t.zero_stages.back()),
             "list each stage once, lowest first");
    t.zero_stages.push_back(static_cast<int>(z));
  }
}

// The attention kernels the trainer's code calls, each once.
void read_attention_kernels(JsonReader& r, TrainerPreset& t) {
  const nlohmann::json& v = r.raw("value");
  if (!v.is_array() || v.empty())
    r.fail("value", "expected a non-empty array of attention kernels, got " + v.dump().substr(0, 40),
           "give e.g. [\"unfused\", \"flash2\"]");
  t.attention_kernels.clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = r.field_path("value") + "[" + std::to_string(i) + "]";
    if (!v[i].is_string()) r.fail("value[" + std::to_string(i) + "]", "expected a kernel name", "give e.g. \"flash2\"");
    const AttentionKernel k = parse_attention_kernel(v[i].get<std::string>(), r.source(), at);
    if (k == AttentionKernel::auto_) r.fail("value[" + std::to_string(i) + "]", "auto is not a kernel", "name the kernels");
    if (std::find(t.attention_kernels.begin(), t.attention_kernels.end(), k) != t.attention_kernels.end())
      r.fail("value[" + std::to_string(i) + "]", "repeats " + v[i].get<std::string>(), "list each kernel once");
    t.attention_kernels.push_back(k);
  }
}

// What the trainer can run at all (TrainerPreset's capabilities).
// The MoE token dispatchers it has, the first its default.
void read_moe_dispatchers(JsonReader& r, TrainerPreset& t) {
  const nlohmann::json& v = r.raw("value");
  if (!v.is_array() || v.empty())
    r.fail("value", "expected a non-empty array of dispatchers, got " + v.dump().substr(0, 40),
           "give e.g. [\"alltoall\", \"allgather\", \"flex\"]");
  t.moe_dispatchers.clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = "value[" + std::to_string(i) + "]";
    if (!v[i].is_string()) r.fail(at, "expected a dispatcher name, got " + v[i].dump().substr(0, 40), "give alltoall, allgather or flex");
    const MoeDispatcher d = parse_moe_dispatcher(v[i].get<std::string>(), r.source(), r.field_path(at));
    if (std::find(t.moe_dispatchers.begin(), t.moe_dispatchers.end(), d) != t.moe_dispatchers.end())
      r.fail(at, "lists " + v[i].get<std::string>() + " twice", "list each dispatcher once");
    t.moe_dispatchers.push_back(d);
  }
}

// The gradient bytes its DP reduction runs at, each once.
// A can_run list of gradient bytes: 2 and / or 4, each once.
std::vector<int> read_grad_bytes(JsonReader& r) {
  const nlohmann::json& v = r.raw("value");
  if (!v.is_array() || v.empty())
    r.fail("value", "expected a non-empty array of gradient bytes, got " + v.dump().substr(0, 40), "give e.g. [2, 4]");
  std::vector<int> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = "value[" + std::to_string(i) + "]";
    if (!v[i].is_number_integer() || (v[i].get<std::int64_t>() != 2 && v[i].get<std::int64_t>() != 4))
      r.fail(at, "must be 2 (16-bit gradients) or 4 (fp32), got " + v[i].dump().substr(0, 40), "give 2 or 4");
    const int b = v[i].get<int>();
    if (std::find(out.begin(), out.end(), b) != out.end()) r.fail(at, "lists " + std::to_string(b) + " twice", "list each once");
    out.push_back(b);
  }
  return out;
}

constexpr std::array<Field, 30> kCanRun{{
    {"pipeline", [](JsonReader& r, TrainerPreset& t) { t.pipeline = r.boolean("value"); }},
    {"sequence_parallel", [](JsonReader& r, TrainerPreset& t) { t.sequence_parallel = r.boolean("value"); }},
    {"selective_recompute", [](JsonReader& r, TrainerPreset& t) { t.selective_recompute = r.boolean("value"); }},
    {"interleaved", [](JsonReader& r, TrainerPreset& t) { t.interleaved = r.boolean("value"); }},
    {"flash_attention", [](JsonReader& r, TrainerPreset& t) { t.flash_attention = r.boolean("value"); }},
    {"grad_accum_fusion",
     [](JsonReader& r, TrainerPreset& t) { t.grad_accum_fusion = t.default_grad_accum_fusion = r.boolean("value"); }},
    {"uneven_stages", [](JsonReader& r, TrainerPreset& t) { t.uneven_stages = r.boolean("value"); }},
    {"uneven_interleaved", [](JsonReader& r, TrainerPreset& t) { t.uneven_interleaved = r.boolean("value"); }},
    {"pipeline_layout", [](JsonReader& r, TrainerPreset& t) { t.pipeline_layout = r.boolean("value"); }},
    {"context_parallel", [](JsonReader& r, TrainerPreset& t) { t.context_parallel = r.boolean("value"); }},
    {"context_parallel_a2a", [](JsonReader& r, TrainerPreset& t) { t.context_parallel_a2a = r.boolean("value"); }},
    {"expert_parallel", [](JsonReader& r, TrainerPreset& t) { t.expert_parallel = r.boolean("value"); }},
    {"fp8", [](JsonReader& r, TrainerPreset& t) { t.fp8 = r.boolean("value"); }},
    {"recompute_modules", [](JsonReader& r, TrainerPreset& t) { t.recompute_modules = r.boolean("value"); }},
    {"recompute_layers", [](JsonReader& r, TrainerPreset& t) { t.recompute_layers = r.boolean("value"); }},
    {"cuda_graphs", [](JsonReader& r, TrainerPreset& t) { t.cuda_graphs = r.boolean("value"); }},
    {"tp_comm_overlap", [](JsonReader& r, TrainerPreset& t) { t.tp_comm_overlap = r.boolean("value"); }},
    {"overlap_param_gather", [](JsonReader& r, TrainerPreset& t) { t.overlap_param_gather = r.boolean("value"); }},
    {"overlap_param_gather_with_optimizer_step",
     [](JsonReader& r, TrainerPreset& t) { t.overlap_param_gather_with_optimizer_step = r.boolean("value"); }},
    {"ddp_bucket_size", [](JsonReader& r, TrainerPreset& t) { t.ddp_bucket_size = r.boolean("value"); }},
    {"activation_offloading", [](JsonReader& r, TrainerPreset& t) { t.activation_offloading = r.boolean("value"); }},
    {"precision_aware_optimizer",
     [](JsonReader& r, TrainerPreset& t) { t.precision_aware_optimizer = r.boolean("value"); }},
    {"fp8_attention", [](JsonReader& r, TrainerPreset& t) { t.fp8_attention = r.boolean("value"); }},
    {"muon", [](JsonReader& r, TrainerPreset& t) { t.muon = r.boolean("value"); }},
    {"zero_stages", read_zero_stages},
    {"attention_kernels", read_attention_kernels},
    {"moe_dispatchers", read_moe_dispatchers},
    {"moe_ep_overlap", [](JsonReader& r, TrainerPreset& t) { t.moe_ep_overlap = r.boolean("value"); }},
    {"dp_grad_bytes", [](JsonReader& r, TrainerPreset& t) { t.dp_grad_bytes = read_grad_bytes(r); }},
    {"fsdp_grad_bytes", [](JsonReader& r, TrainerPreset& t) { t.fsdp_grad_bytes = read_grad_bytes(r); }},
}};

// How it runs a plan by default (TrainerSettings).
constexpr std::array<Field, 25> kSettings{{
    {"dp_overlap", [](JsonReader& r, TrainerPreset& t) { t.settings.dp_overlap = r.boolean("value"); }},
    {"dp_grad_bytes",
     [](JsonReader& r, TrainerPreset& t) {
       t.settings.dp_grad_bytes = bytes_of(r, {2, 4}, "2 (16-bit gradients) or 4 (fp32)");
     }},
    {"fsdp_grad_bytes",
     [](JsonReader& r, TrainerPreset& t) {
       t.settings.fsdp_grad_bytes = bytes_of(r, {2, 4}, "2 (the parameters' 16-bit dtype) or 4 (fp32)");
     }},
    {"zero1_grad_all_reduce",
     [](JsonReader& r, TrainerPreset& t) { t.settings.zero1_grad_all_reduce = r.boolean("value"); }},
    {"tp_backward_overlap",
     [](JsonReader& r, TrainerPreset& t) { t.settings.tp_backward_overlap = r.boolean("value"); }},
    {"cp_overlap", [](JsonReader& r, TrainerPreset& t) { t.settings.cp_overlap = r.boolean("value"); }},
    {"grad_accum_bytes",
     [](JsonReader& r, TrainerPreset& t) {
       t.settings.grad_accum_bytes = bytes_of(r, {6, 10, 18},
                                              "6 (16-bit .grad accumulated by autograd), 10 (Megatron's main_grad "
                                              "hook) or 18 (DeepSpeed's BF16Optimizer)");
     }},
    {"pp_fsdp_no_sync", [](JsonReader& r, TrainerPreset& t) { t.settings.pp_fsdp_no_sync = r.boolean("value"); }},
    {"zero3_unit",
     [](JsonReader& r, TrainerPreset& t) {
       t.settings.zero3_unit = r.choice("value", {"block", "tensor"}) == "block" ? Zero3Unit::block : Zero3Unit::tensor;
     }},
    {"zero3_persist_params", [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_persist_params = count(r); }},
    {"zero3_prefetch_units",
     [](JsonReader& r, TrainerPreset& t) {
       t.settings.zero3_prefetch_units = r.count<int>("value", 0);
     }},
    {"zero3_prefetch_params", [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_prefetch_params = count(r); }},
    {"zero3_reuse_params", [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_reuse_params = count(r); }},
    {"zero3_reduce_bucket_params",
     [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_reduce_bucket_params = count(r); }},
    {"zero3_reduce_per_tensor",
     [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_reduce_per_tensor = r.boolean("value"); }},
    {"zero3_sync", [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_sync = r.boolean("value"); }},
    {"zero3_list_collectives",
     [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_list_collectives = r.boolean("value"); }},
    {"zero3_fetch_norm", [](JsonReader& r, TrainerPreset& t) { t.settings.zero3_fetch_norm = r.boolean("value"); }},
    {"attention_kernel",
     [](JsonReader& r, TrainerPreset& t) {
       t.attention_kernel = parse_attention_kernel(r.string("value"), r.source(), r.field_path("value"));
     }},
    {"cuda_graphs",
     [](JsonReader& r, TrainerPreset& t) {
       t.settings.cuda_graphs = CudaGraphs::parse(r.string("value"), r.source(), r.field_path("value"));
     }},
    {"tp_comm_overlap", [](JsonReader& r, TrainerPreset& t) { t.settings.tp_comm_overlap = r.boolean("value"); }},
    {"overlap_param_gather",
     [](JsonReader& r, TrainerPreset& t) { t.settings.overlap_param_gather = r.boolean("value"); }},
    {"overlap_param_gather_with_optimizer_step",
     [](JsonReader& r, TrainerPreset& t) { t.settings.overlap_param_gather_with_optimizer_step = r.boolean("value"); }},
    {"align_param_gather", [](JsonReader& r, TrainerPreset& t) { t.settings.align_param_gather = r.boolean("value"); }},
    {"moe_ep_overlap", [](JsonReader& r, TrainerPreset& t) { t.default_moe_ep_overlap = r.boolean("value"); }},
}};

bool has_key(std::span<const Field> fields, std::string_view key) {
  return std::any_of(fields.begin(), fields.end(), [&](const Field& f) { return f.key == key; });
}

// Unknown keys are reported before any field is read, so that a misspelt
// required field reads "unknown field ... did you mean", not "missing".
void check_keys(const nlohmann::json& j, const JsonReader& r, std::span<const std::string_view> known,
                std::span<const Field> other_group = {}, std::string_view other_name = {}) {
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (has_key(other_group, key)) r.fail(key, "belongs in \"" + std::string(other_name) + "\"", "move it there");
    const auto best = closest_field(key, known, 3);
    r.fail(key, "unknown field",
           best ? "remove it or check its spelling (did you mean \"" + std::string(*best) + "\"?)"
                : "remove it or check its spelling (" + std::string(kSchema) + " lists the fields)");
  }
}

// A group of sourced fields: each {"value": ..., "source": "<repository>
// <commit> <file>: what it says"}. `required` fields must be there.
void read_group(JsonReader& file, std::string_view name, std::span<const Field> fields,
                std::span<const Field> other_group, std::string_view other_name,
                std::initializer_list<std::string_view> required, TrainerPreset& t) {
  JsonReader group = file.object(name);
  const nlohmann::json& j = file.raw(name);
  std::vector<std::string_view> keys;
  for (const Field& f : fields) keys.push_back(f.key);
  check_keys(j, group, keys, other_group, other_name);
  for (std::string_view key : required)
    if (!group.has(key)) group.fail(key, "missing required field", "add it with its value and source");
  const std::string sourced = "give {\"value\": ..., \"source\": \"<repository> <commit> <file>: what it says\"}";
  for (const Field& f : fields) {
    if (!group.has(f.key)) continue;
    if (!group.is_object(f.key)) group.fail(f.key, "has no source", sourced);
    JsonReader setting = group.object(f.key);
    const std::array<std::string_view, 2> setting_keys{"value", "source"};
    check_keys(group.raw(f.key), setting, setting_keys);
    if (!setting.has("source")) group.fail(f.key, "has no source", sourced);
    std::string source = setting.string("source");
    if (source.find_first_not_of(' ') == std::string::npos)
      setting.fail("source", "is empty", "name the upstream file and commit the value was read from");
    f.read(setting, t);
    t.sources.push_back({std::string(f.key), std::move(source)});
  }
}

// Names are what --trainer takes: lowercase letters, digits, '.' and '-'.
bool valid_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
  });
}

std::string file_stem(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::size_t dot = base.rfind(".json");
  return dot != std::string::npos && dot + 5 == base.size() ? base.substr(0, dot) : base;
}

const std::vector<TrainerPreset>& presets() {
  static const std::vector<TrainerPreset> p = [] {
    std::vector<TrainerPreset> out;
    for (const EmbeddedFile& f : embedded_trainer_files())
      out.push_back(parse_trainer(std::string(f.text), std::string(f.path)));
    return out;
  }();
  return p;
}

}  // namespace

TrainerPreset parse_trainer(const std::string& text, const std::string& source) {
  const nlohmann::json j = parse_json_text(text, source);
  JsonReader r(j, source);
  constexpr std::array<std::string_view, 4> kTop{"name", "description", "can_run", "settings"};
  check_keys(j, r, kTop);
  TrainerPreset t;
  t.name = r.string("name");
  if (!valid_name(t.name))
    r.fail("name", quote_value(t.name) + " is not a --trainer name", "use lowercase letters, digits, '.' and '-'");
  if (t.name != file_stem(source))
    r.fail("name", "is \"" + t.name + "\" but the file is named " + file_stem(source) + ".json",
           "name the file after the preset");
  t.description = r.string("description");
  if (t.description.empty()) r.fail("description", "is empty", "say in one line: trainer, version, precision");
  t.settings.preset = t.name;
  // Every trainer differs in these, so none may fall back to a default.
  read_group(r, "can_run", kCanRun, kSettings, "settings", {"grad_accum_fusion"}, t);
  read_group(r, "settings", kSettings, kCanRun, "can_run", {"dp_overlap", "dp_grad_bytes"}, t);
  const auto& runs = t.attention_kernels;
  if (t.attention_kernel != AttentionKernel::auto_ && std::find(runs.begin(), runs.end(), t.attention_kernel) == runs.end())
    r.fail("settings.attention_kernel", "is " + std::string(to_string(t.attention_kernel)) + ", which can_run.attention_kernels does not list",
           "list it there or name one it lists");
  if (t.settings.cuda_graphs.on() && !t.cuda_graphs)
    r.fail("settings.cuda_graphs", "is on but can_run.cuda_graphs is false", "give none");
  if (t.settings.tp_comm_overlap && !t.tp_comm_overlap)
    r.fail("settings.tp_comm_overlap", "is on but can_run.tp_comm_overlap is false", "give false");
  if (t.settings.overlap_param_gather && !t.overlap_param_gather)
    r.fail("settings.overlap_param_gather", "is on but can_run.overlap_param_gather is false", "give false");
  if (t.settings.overlap_param_gather_with_optimizer_step && !t.overlap_param_gather_with_optimizer_step)
    r.fail("settings.overlap_param_gather_with_optimizer_step",
           "is on but can_run.overlap_param_gather_with_optimizer_step is false", "give false");
  if (!t.flash_attention && (t.attention_kernel != AttentionKernel::auto_ && t.attention_kernel != AttentionKernel::unfused))
    r.fail("settings.attention_kernel", "names a fused kernel but can_run.flash_attention is false", "give unfused");
  if (t.default_moe_ep_overlap && !t.moe_ep_overlap)
    r.fail("settings.moe_ep_overlap", "is true but can_run.moe_ep_overlap is false", "set can_run.moe_ep_overlap true");
  if (t.dp_grad_bytes.empty()) t.dp_grad_bytes = {t.settings.dp_grad_bytes};
  if (!t.runs_dp_grad_bytes(t.settings.dp_grad_bytes))
    r.fail("settings.dp_grad_bytes", "is " + std::to_string(t.settings.dp_grad_bytes) + ", which can_run.dp_grad_bytes does not list",
           "list it there or give one it lists");
  // Megatron-FSDP's gradient dtype: listed and set together, or neither.
  if (t.fsdp_grad_bytes.empty() != (t.settings.fsdp_grad_bytes == 0))
    r.fail(t.fsdp_grad_bytes.empty() ? "settings.fsdp_grad_bytes" : "can_run.fsdp_grad_bytes",
           "is given without " + std::string(t.fsdp_grad_bytes.empty() ? "can_run" : "settings") + ".fsdp_grad_bytes",
           "give both (a trainer with Megatron-FSDP) or neither");
  if (!t.fsdp_grad_bytes.empty() && !t.runs_fsdp_grad_bytes(t.settings.fsdp_grad_bytes))
    r.fail("settings.fsdp_grad_bytes",
           "is " + std::to_string(t.settings.fsdp_grad_bytes) + ", which can_run.fsdp_grad_bytes does not list",
           "list it there or give one it lists");
  return t;
}

bool TrainerPreset::runs_dp_grad_bytes(int bytes) const {
  return std::find(dp_grad_bytes.begin(), dp_grad_bytes.end(), bytes) != dp_grad_bytes.end();
}

bool TrainerPreset::runs_fsdp_grad_bytes(int bytes) const {
  // 0: the DP reduction's dtype, which every trainer runs (exported to
  // Megatron-FSDP as its main gradients' dtype).
  return bytes == 0 || std::find(fsdp_grad_bytes.begin(), fsdp_grad_bytes.end(), bytes) != fsdp_grad_bytes.end();
}

std::span<const TrainerPreset> trainer_presets() { return presets(); }

const TrainerPreset& default_trainer() { return presets().front(); }

const TrainerPreset* find_trainer(std::string_view name) {
  for (const TrainerPreset& t : presets())
    if (t.name == name) return &t;
  return nullptr;
}

std::string trainer_names() {
  std::string out;
  for (const TrainerPreset& t : presets()) {
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

}  // namespace cuboid
