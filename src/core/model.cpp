#include "cuboid/core/model.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"

namespace cuboid {

std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::gelu: return "gelu";
    case Activation::swiglu: return "swiglu";
  }
  return "?";
}

std::string_view to_string(Normalization n) {
  switch (n) {
    case Normalization::layernorm: return "layernorm";
    case Normalization::rmsnorm: return "rmsnorm";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Sizes

std::int64_t ModelSpec::parameters_per_layer() const {
  const std::int64_t h = hidden_size;
  const std::int64_t f = ffn_hidden_size;
  const std::int64_t q = query_projection_size();
  const std::int64_t kv = kv_projection_size();
  const std::int64_t qkv_weights = h * (q + 2 * kv);
  const std::int64_t proj_weights = q * h;
  // A gated MLP has two input projections (gate and up) and one output projection.
  const std::int64_t mlp_weights = (gated_mlp() ? 3 : 2) * h * f;
  const std::int64_t biases = linear_bias ? (q + 2 * kv) + h + (gated_mlp() ? 2 * f : f) + h : 0;
  // Two norms per layer (before attention and before the MLP); LayerNorm has a bias.
  const std::int64_t norms = normalization == Normalization::layernorm ? 2 * 2 * h : 2 * h;
  return qkv_weights + proj_weights + mlp_weights + biases + norms;
}

std::int64_t ModelSpec::parameter_count(std::int64_t tp) const {
  const std::int64_t h = hidden_size;
  const std::int64_t vocab_params = padded_vocab_size(vocab_size, tp) * h;
  const std::int64_t positions = learned_position_embeddings ? max_position_embeddings * h : 0;
  const std::int64_t final_norm = normalization == Normalization::layernorm ? 2 * h : h;
  const std::int64_t lm_head = tied_embeddings ? 0 : vocab_params;
  return num_layers * parameters_per_layer() + vocab_params + positions + final_norm + lm_head;
}

std::int64_t padded_vocab_size(std::int64_t vocab_size, std::int64_t tp, std::int64_t divisible_by) {
  if (vocab_size <= 0 || tp <= 0 || divisible_by <= 0) {
    throw std::invalid_argument("padded_vocab_size: vocab_size, tp and divisible_by must be positive");
  }
  const std::int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

std::int64_t default_ffn_hidden_size(std::int64_t hidden_size, Activation activation) {
  if (activation == Activation::swiglu) {
    // Megatron-LM: int((4h * 2/3) / 64) * 64, which for positive h is floor(8h / 192) * 64.
    return (8 * hidden_size) / (3 * 64) * 64;
  }
  return 4 * hidden_size;
}

// ---------------------------------------------------------------------------
// Validation

namespace {

void check_positive(std::int64_t value, const char* field, const std::string& source) {
  if (value <= 0) {
    throw InputError(source, field, "must be positive, got " + std::to_string(value), "give a value >= 1");
  }
}

void check_heads_divide_hidden(std::int64_t hidden, std::int64_t heads, const std::string& source) {
  if (hidden % heads != 0) {
    throw InputError(source, "hidden_size",
                     std::to_string(hidden) + " is not divisible by the " + std::to_string(heads) +
                         " attention heads",
                     "use a hidden size that is a multiple of the head count, or give head_dim explicitly");
  }
}

}  // namespace

void validate_model(const ModelSpec& m, const std::string& source) {
  if (m.name.empty()) throw InputError(source, "name", "is empty", "give the model a name");
  check_positive(m.num_layers, "num_layers", source);
  check_positive(m.hidden_size, "hidden_size", source);
  check_positive(m.num_attention_heads, "num_attention_heads", source);
  check_positive(m.num_kv_heads, "num_kv_heads", source);
  if (m.num_attention_heads % m.num_kv_heads != 0) {
    throw InputError(source, "num_kv_heads",
                     std::to_string(m.num_kv_heads) + " key/value heads do not divide the " +
                         std::to_string(m.num_attention_heads) + " attention heads",
                     "use a key/value head count that divides the attention-head count");
  }
  // head_dim == 0 means "not given": then the heads must split the hidden size evenly.
  if (m.head_dim == 0) check_heads_divide_hidden(m.hidden_size, m.num_attention_heads, source);
  check_positive(m.head_dim, "head_dim", source);
  check_positive(m.ffn_hidden_size, "ffn_hidden_size", source);
  check_positive(m.vocab_size, "vocab_size", source);
  check_positive(m.seq_length, "seq_length", source);
  check_positive(m.max_position_embeddings, "max_position_embeddings", source);
  // Upper bounds keep every size product of the FLOPs and memory formulas
  // inside 64 bits (a typo of a few digits is caught here, not as an overflow).
  constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"num_attention_heads", m.num_attention_heads},
      {"num_kv_heads", m.num_kv_heads}, {"head_dim", m.head_dim}, {"ffn_hidden_size", m.ffn_hidden_size},
      {"vocab_size", m.vocab_size}, {"seq_length", m.seq_length}, {"max_position_embeddings", m.max_position_embeddings}};
  for (const auto& [field, value] : sizes)
    if (value > kMaxSize)
      throw InputError(source, field, std::to_string(value) + " is above cuboid's limit of " + std::to_string(kMaxSize),
                       "check the value (a typo?); sizes up to 2^24 are supported");
  if (m.num_attention_heads * m.head_dim > kMaxSize)
    throw InputError(source, "head_dim",
                     "attention heads x head_dim = " + std::to_string(m.num_attention_heads * m.head_dim) +
                         " is above cuboid's limit of " + std::to_string(kMaxSize),
                     "check num_attention_heads and head_dim");
  // 1e15 parameters (100x a 10T model) keeps parameter and byte counts exact in int64.
  const double h = static_cast<double>(m.hidden_size);
  const double per_layer = h * static_cast<double>(m.num_attention_heads * m.head_dim) * 4.0 +
                           3.0 * h * static_cast<double>(m.ffn_hidden_size);
  const double params = static_cast<double>(m.num_layers) * per_layer + 2.0 * h * static_cast<double>(m.vocab_size) +
                        h * static_cast<double>(m.max_position_embeddings);
  if (params > 1e15)
    throw InputError(source, "num_layers",
                     "the model would have about " + std::to_string(static_cast<long long>(params / 1e12)) +
                         " T parameters, above cuboid's limit of 1000 T",
                     "check num_layers, hidden_size and ffn_hidden_size (a typo?)");
  if (m.seq_length > m.max_position_embeddings) {
    throw InputError(source, "seq_length",
                     std::to_string(m.seq_length) + " exceeds max_position_embeddings " +
                         std::to_string(m.max_position_embeddings),
                     "lower seq_length or raise max_position_embeddings");
  }
}

// ---------------------------------------------------------------------------
// cuboid's own model card

namespace {

constexpr std::array<std::string_view, 18> kCardFields = {
    "name",          "num_layers",         "hidden_size", "num_attention_heads",
    "num_kv_heads",  "head_dim",           "ffn_hidden_size", "activation",
    "normalization", "vocab_size",         "seq_length",  "max_position_embeddings",
    "tied_embeddings", "learned_position_embeddings", "linear_bias", "rope_theta", "rope_scaling_factor", "alibi"};

void reject_near_miss_keys(const nlohmann::json& j, const std::string& source) {
  for (const auto& [key, value] : j.items()) {
    if (key.rfind('_', 0) == 0) continue;
    if (std::find(kCardFields.begin(), kCardFields.end(), key) != kCardFields.end()) continue;
    if (const auto known = closest_field(key, kCardFields, 2))
      throw InputError(source, key, "unknown field", "did you mean \"" + std::string(*known) + "\"?");
  }
}

Activation parse_activation(const std::string& s) {
  return s == "swiglu" ? Activation::swiglu : Activation::gelu;
}

Normalization parse_normalization(const std::string& s) {
  return s == "rmsnorm" ? Normalization::rmsnorm : Normalization::layernorm;
}

// head_dim defaults to hidden / heads; 0 (left for validate_model to report)
// when the heads do not split the hidden size and no head_dim is given.
std::int64_t resolve_head_dim(const ModelSpec& m, std::optional<std::int64_t> head_dim) {
  if (head_dim) return *head_dim;
  return m.hidden_size % m.num_attention_heads == 0 ? m.hidden_size / m.num_attention_heads : 0;
}

ModelSpec model_from_card(const nlohmann::json& j, const std::string& source) {
  reject_near_miss_keys(j, source);
  JsonReader r(j, source);
  ModelSpec m;
  m.name = r.string("name");
  m.num_layers = r.positive_integer("num_layers");
  m.hidden_size = r.positive_integer("hidden_size");
  m.num_attention_heads = r.positive_integer("num_attention_heads");
  m.num_kv_heads = r.optional_positive_integer("num_kv_heads").value_or(m.num_attention_heads);
  const std::optional<std::int64_t> head_dim = r.optional_positive_integer("head_dim");
  m.activation = parse_activation(r.optional_choice("activation", {"gelu", "swiglu"}).value_or("gelu"));
  m.normalization =
      parse_normalization(r.optional_choice("normalization", {"layernorm", "rmsnorm"}).value_or("layernorm"));
  m.ffn_hidden_size = r.optional_positive_integer("ffn_hidden_size")
                          .value_or(default_ffn_hidden_size(m.hidden_size, m.activation));
  m.vocab_size = r.positive_integer("vocab_size");
  m.seq_length = r.positive_integer("seq_length");
  m.max_position_embeddings = r.optional_positive_integer("max_position_embeddings").value_or(m.seq_length);
  m.tied_embeddings = r.optional_boolean("tied_embeddings").value_or(false);
  m.learned_position_embeddings = r.optional_boolean("learned_position_embeddings").value_or(false);
  m.linear_bias = r.optional_boolean("linear_bias").value_or(false);
  m.rope_theta = r.optional_positive_number("rope_theta").value_or(10000.0);
  m.rope_scaling_factor = r.optional_number("rope_scaling_factor").value_or(0.0);
  if (m.rope_scaling_factor < 0)
    throw InputError(source, "rope_scaling_factor", "must not be negative", "give 0 (no scaling) or the factor, e.g. 8");
  m.alibi = r.optional_boolean("alibi").value_or(false);
  if (m.alibi && m.learned_position_embeddings)
    throw InputError(source, "alibi", "ALiBi replaces position embeddings, and learned_position_embeddings is true too",
                     "keep one of them: alibi for BLOOM-style models, learned positions for GPT-2-style ones");
  if (m.alibi && m.rope_scaling_factor > 0)
    throw InputError(source, "alibi", "ALiBi replaces rotary positions, and rope_scaling_factor is set too",
                     "drop rope_scaling_factor from an ALiBi model");
  r.reject_unknown();
  m.head_dim = resolve_head_dim(m, head_dim);
  validate_model(m, source);
  return m;
}

// ---------------------------------------------------------------------------
// HuggingFace config.json

using FieldMap = std::vector<std::pair<std::string_view, std::string_view>>;

// Own-schema field -> the HF key the user actually wrote.
const FieldMap kLlamaKeys = {{"num_layers", "num_hidden_layers"},
                             {"num_kv_heads", "num_key_value_heads"},
                             {"ffn_hidden_size", "intermediate_size"},
                             {"seq_length", "max_position_embeddings"}};
const FieldMap kGpt2Keys = {{"num_layers", "n_layer"},           {"hidden_size", "n_embd"},
                            {"num_attention_heads", "n_head"},   {"num_kv_heads", "n_head"},
                            {"ffn_hidden_size", "n_inner"},      {"max_position_embeddings", "n_positions"},
                            {"seq_length", "n_positions"}};

// Runs validate_model but reports problems under the HF key names.
void validate_hf(const ModelSpec& m, const std::string& source, const FieldMap& keys) {
  try {
    validate_model(m, source);
  } catch (const InputError& e) {
    for (const auto& [own, hf] : keys) {
      if (e.field() == own) throw InputError(e.source(), std::string(hf), e.problem(), e.fix());
    }
    throw;
  }
}

void reject_moe(JsonReader& r) {
  for (std::string_view key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (!r.has(key) || !r.raw(key).is_number()) continue;
    const double experts = r.number(key);
    if (experts > 1) {
      r.fail(key, "mixture-of-experts is not supported yet (" + r.raw(key).dump() + " experts)",
             "plan a dense model; cuboid does not model expert parallelism");
    }
  }
}

std::string hf_name(JsonReader& r, const std::string& source) {
  if (auto path = r.optional_string("_name_or_path"); path && !path->empty()) {
    std::string p = *path;
    while (!p.empty() && p.back() == '/') p.pop_back();
    const auto slash = p.find_last_of('/');
    if (slash != std::string::npos && slash + 1 < p.size()) return p.substr(slash + 1);
    if (!p.empty()) return p;
  }
  if (auto type = r.optional_string("model_type"); type && !type->empty()) return *type;
  if (r.has("architectures")) {
    const nlohmann::json& arch = r.raw("architectures");
    if (arch.is_array() && !arch.empty() && arch.front().is_string()) return arch.front().get<std::string>();
  }
  const std::filesystem::path p(source);
  // A checkpoint's config is usually "<model>/config.json": the folder names the model.
  if (p.stem() == "config" && p.has_parent_path()) return p.parent_path().filename().string();
  return p.stem().empty() ? std::string("hf-model") : p.stem().string();
}

Activation hf_activation(JsonReader& r) {
  const std::string act = r.optional_string("hidden_act").value_or("silu");
  if (act == "silu" || act == "swiglu") return Activation::swiglu;
  if (act.rfind("gelu", 0) == 0 || act == "relu") return Activation::gelu;
  r.fail("hidden_act", "unsupported activation \"" + act + "\"",
         "use silu/swiglu (gated MLP) or gelu/relu (plain MLP), or write a cuboid model card");
}

ModelSpec model_from_gpt2_config(JsonReader& r, const std::string& source) {
  ModelSpec m;
  m.name = hf_name(r, source);
  m.num_layers = r.positive_integer("n_layer");
  m.hidden_size = r.positive_integer("n_embd");
  m.num_attention_heads = r.positive_integer("n_head");
  m.num_kv_heads = m.num_attention_heads;
  m.activation = Activation::gelu;
  m.normalization = Normalization::layernorm;
  m.ffn_hidden_size = r.optional_positive_integer("n_inner").value_or(4 * m.hidden_size);
  m.vocab_size = r.positive_integer("vocab_size");
  if (r.has("n_positions")) {
    m.max_position_embeddings = r.positive_integer("n_positions");
  } else if (r.has("n_ctx")) {
    m.max_position_embeddings = r.positive_integer("n_ctx");
  } else {
    r.fail("n_positions", "missing required field", "add \"n_positions\" (or \"n_ctx\"), the context length");
  }
  m.seq_length = m.max_position_embeddings;
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);
  m.learned_position_embeddings = true;
  m.linear_bias = true;
  m.head_dim = resolve_head_dim(m, std::nullopt);
  validate_hf(m, source, kGpt2Keys);
  return m;
}

// Llama 3.1's rope_scaling ({"rope_type": "llama3", "factor": 8.0, ...}); null
// or absent: none. Other scalings (linear, dynamic, yarn) would build a
// different model in the trainers the exports target, so they are refused.
double hf_rope_scaling_factor(JsonReader& r, const std::string& source) {
  if (!r.has("rope_scaling") || !r.is_object("rope_scaling")) return 0.0;
  JsonReader s = r.object("rope_scaling");
  const std::string type = s.has("rope_type") ? s.string("rope_type") : s.string("type");
  if (type != "llama3")
    throw InputError(source, "rope_scaling", "rope scaling \"" + type + "\" is not supported (only Llama 3.1's \"llama3\")",
                     "remove rope_scaling, or use a config with rope_type \"llama3\"");
  return s.positive_number("factor");
}

ModelSpec model_from_llama_config(JsonReader& r, const std::string& source) {
  ModelSpec m;
  m.name = hf_name(r, source);
  m.num_layers = r.positive_integer("num_hidden_layers");
  m.hidden_size = r.positive_integer("hidden_size");
  m.num_attention_heads = r.positive_integer("num_attention_heads");
  m.num_kv_heads = r.optional_positive_integer("num_key_value_heads").value_or(m.num_attention_heads);
  const std::optional<std::int64_t> head_dim = r.optional_positive_integer("head_dim");
  m.activation = hf_activation(r);
  m.ffn_hidden_size = r.positive_integer("intermediate_size");
  m.vocab_size = r.positive_integer("vocab_size");
  m.max_position_embeddings = r.positive_integer("max_position_embeddings");
  m.seq_length = m.max_position_embeddings;  // the planner's --seq-length overrides it
  // LLaMA-family configs name their norm by its epsilon; RMSNorm is the family default.
  m.normalization = Normalization::rmsnorm;
  if (!r.has("rms_norm_eps") && (r.has("layer_norm_eps") || r.has("layer_norm_epsilon"))) {
    m.normalization = Normalization::layernorm;
  }
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(false);
  m.learned_position_embeddings = false;  // rotary positions
  const bool attention_bias = r.optional_boolean("attention_bias").value_or(false);
  const bool mlp_bias = r.optional_boolean("mlp_bias").value_or(false);
  m.linear_bias = attention_bias || mlp_bias;
  m.rope_theta = r.optional_positive_number("rope_theta").value_or(10000.0);
  m.rope_scaling_factor = hf_rope_scaling_factor(r, source);
  m.head_dim = resolve_head_dim(m, head_dim);
  validate_hf(m, source, kLlamaKeys);
  return m;
}

}  // namespace

ModelSpec model_from_hf_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) {
    throw InputError(source, "", "top level is not a JSON object", "give a HuggingFace config.json object");
  }
  // HF configs carry many fields cuboid does not need, so unknown keys are not rejected.
  JsonReader r(j, source);
  reject_moe(r);
  if (r.has("n_layer") && !r.has("num_hidden_layers")) return model_from_gpt2_config(r, source);
  return model_from_llama_config(r, source);
}

ModelSpec model_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) {
    throw InputError(source, "", "top level is not a JSON object", "wrap the fields in { ... }");
  }
  const bool hf_keys = j.contains("num_hidden_layers") || j.contains("n_layer");
  if (hf_keys && !j.contains("num_layers")) return model_from_hf_config(j, source);
  return model_from_card(j, source);
}

ModelSpec load_model(const std::filesystem::path& path) {
  return model_from_json(read_json_file(path), path.string());
}

nlohmann::json model_to_json(const ModelSpec& m) {
  nlohmann::json j{
      {"name", m.name},
      {"num_layers", m.num_layers},
      {"hidden_size", m.hidden_size},
      {"num_attention_heads", m.num_attention_heads},
      {"num_kv_heads", m.num_kv_heads},
      {"head_dim", m.head_dim},
      {"ffn_hidden_size", m.ffn_hidden_size},
      {"activation", std::string(to_string(m.activation))},
      {"normalization", std::string(to_string(m.normalization))},
      {"vocab_size", m.vocab_size},
      {"seq_length", m.seq_length},
      {"max_position_embeddings", m.max_position_embeddings},
      {"tied_embeddings", m.tied_embeddings},
      {"learned_position_embeddings", m.learned_position_embeddings},
      {"linear_bias", m.linear_bias},
      {"rope_theta", m.rope_theta},
      {"rope_scaling_factor", m.rope_scaling_factor},
  };
  if (m.alibi) j["alibi"] = true;  // written only when set: plans of other models keep their bytes
  return j;
}

}  // namespace cuboid
