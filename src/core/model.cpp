#include "cuboid/core/model.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"

namespace cuboid {

namespace {

// The largest model size (layers, widths, heads, vocabulary, positions,
// experts): keeps every product of the FLOPs and memory formulas inside 64 bits.
constexpr std::int64_t kMaxModelSize = std::int64_t{1} << 24;

}  // namespace

std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::gelu: return "gelu";
    case Activation::swiglu: return "swiglu";
  }
  return "?";
}

std::string_view to_string(RouterBalancing b) {
  switch (b) {
    case RouterBalancing::aux_loss: return "aux_loss";
    case RouterBalancing::aux_loss_free: return "aux_loss_free";
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

std::int64_t MoeSpec::moe_layer_count() const {
  if (!enabled()) return 0;
  return static_cast<std::int64_t>(std::count(moe_layers.begin(), moe_layers.end(), true));
}

std::int64_t ModelSpec::layer_norm_parameters() const {
  // LayerNorm has a weight and a bias; RMSNorm a weight.
  return normalization == Normalization::layernorm ? 2 * hidden_size : hidden_size;
}

std::int64_t ModelSpec::attention_parameters() const {
  const std::int64_t h = hidden_size;
  if (mla.enabled()) {
    // DeepSeek-V3's attention (HF DeepseekV3Attention, Megatron-Core
    // MLASelfAttention): q_a (h -> q_lora) + its RMSNorm + q_b (q_lora ->
    // heads x (qk + rope)), or one h -> heads x (qk + rope); kv_a (h ->
    // kv_lora + rope) + its RMSNorm + kv_b (kv_lora -> heads x (qk + v));
    // the output projection heads x v -> h. The low-rank norms are RMSNorms.
    const std::int64_t n = num_attention_heads;
    const std::int64_t qk = mla.qk_head_dim + mla.qk_rope_head_dim;
    const std::int64_t q = mla.q_lora_rank > 0 ? h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * n * qk
                                               : h * n * qk;
    const std::int64_t kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank +
                            mla.kv_lora_rank * n * (mla.qk_head_dim + mla.v_head_dim);
    const std::int64_t out = n * mla.v_head_dim * h;
    const std::int64_t biases = linear_bias ? (mla.q_lora_rank > 0 ? mla.q_lora_rank : n * qk) +
                                                  (mla.kv_lora_rank + mla.qk_rope_head_dim) + h
                                            : 0;
    return q + kv + out + biases;
  }
  const std::int64_t q = query_projection_size();
  const std::int64_t kv = kv_projection_size();
  const std::int64_t biases = linear_bias ? (q + 2 * kv) + h : 0;
  return h * (q + 2 * kv) + q * h + biases;
}

namespace {

// An MLP of width f: a gated one has two input projections (gate and up) and
// one output projection.
std::int64_t mlp_parameters(const ModelSpec& m, std::int64_t f) {
  const std::int64_t h = m.hidden_size;
  const std::int64_t weights = (m.gated_mlp() ? 3 : 2) * h * f;
  const std::int64_t biases = m.linear_bias ? (m.gated_mlp() ? 2 * f : f) + h : 0;
  return weights + biases;
}

}  // namespace

std::int64_t ModelSpec::dense_mlp_parameters() const { return mlp_parameters(*this, ffn_hidden_size); }

std::int64_t ModelSpec::expert_parameters() const {
  return moe.enabled() ? mlp_parameters(*this, moe.expert_ffn_hidden_size) : 0;
}

std::int64_t ModelSpec::moe_mlp_parameters() const {
  if (!moe.enabled()) return 0;
  // The router is one h -> experts GEMM without bias (Megatron-Core's TopKRouter).
  const std::int64_t router = moe.num_experts * hidden_size;
  const std::int64_t shared =
      moe.shared_expert_ffn_hidden_size > 0 ? mlp_parameters(*this, moe.shared_expert_ffn_hidden_size) : 0;
  const std::int64_t gate = moe.shared_expert_gate ? hidden_size : 0;
  return router + moe.num_experts * expert_parameters() + shared + gate;
}

std::int64_t ModelSpec::parameters_per_layer() const {
  // Two norms per layer (before attention and before the MLP).
  return attention_parameters() + dense_mlp_parameters() + 2 * layer_norm_parameters();
}

namespace {

// Embedding, positions, final norm and LM head.
std::int64_t outside_layers(const ModelSpec& m, std::int64_t tp) {
  const std::int64_t h = m.hidden_size;
  const std::int64_t vocab_params = padded_vocab_size(m.vocab_size, tp) * h;
  const std::int64_t positions = m.learned_position_embeddings ? m.max_position_embeddings * h : 0;
  const std::int64_t lm_head = m.tied_embeddings ? 0 : vocab_params;
  return vocab_params + positions + m.layer_norm_parameters() + lm_head;
}

// All layers, with `experts` routed experts counted in each MoE layer.
std::int64_t layer_parameters(const ModelSpec& m, std::int64_t experts) {
  const std::int64_t moe_layers = m.moe.moe_layer_count();
  const std::int64_t dense_layers = m.num_layers - moe_layers;
  const std::int64_t common = m.attention_parameters() + 2 * m.layer_norm_parameters();
  const std::int64_t moe_mlp = m.moe_mlp_parameters() - (m.moe.num_experts - experts) * m.expert_parameters();
  return dense_layers * (common + m.dense_mlp_parameters()) + moe_layers * (common + moe_mlp);
}

// One multi-token prediction module: a layer of the last layer's kind, the
// 2h -> h projection, the norms of the hidden state and of the embedding, and
// the module's own final norm; the embedding and the LM head are the main
// model's (Megatron-Core's MultiTokenPredictionLayer).
std::int64_t mtp_module_parameters(const ModelSpec& m) {
  const bool last_is_moe = m.moe.enabled() && !m.moe.moe_layers.empty() && m.moe.moe_layers.back();
  const std::int64_t mlp = last_is_moe ? m.moe_mlp_parameters() : m.dense_mlp_parameters();
  return m.attention_parameters() + mlp + 2 * m.layer_norm_parameters() + 2 * m.hidden_size * m.hidden_size +
         3 * m.layer_norm_parameters();
}

}  // namespace

std::int64_t ModelSpec::parameter_count(std::int64_t tp) const {
  return layer_parameters(*this, moe.num_experts) + outside_layers(*this, tp) +
         mtp_layers * mtp_module_parameters(*this);
}

std::int64_t ModelSpec::active_parameter_count(std::int64_t tp) const {
  return layer_parameters(*this, moe.experts_per_token) + outside_layers(*this, tp);
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

void check_size(std::int64_t value, const char* field, const std::string& source, std::int64_t min = 1) {
  constexpr std::int64_t kMaxSize = kMaxModelSize;
  if (value < min || value > kMaxSize)
    throw InputError(source, field,
                     "must be " + std::to_string(min) + " to " + std::to_string(kMaxSize) + ", got " +
                         std::to_string(value),
                     "check the value (a typo?)");
}

void validate_moe(const ModelSpec& m, const std::string& source) {
  const MoeSpec& e = m.moe;
  if (!e.enabled()) return;
  check_size(e.num_experts, "moe.num_experts", source);
  check_size(e.experts_per_token, "moe.experts_per_token", source);
  if (e.experts_per_token > e.num_experts)
    throw InputError(source, "moe.experts_per_token",
                     std::to_string(e.experts_per_token) + " experts per token, but the layer has only " +
                         std::to_string(e.num_experts),
                     "give a top-k no larger than num_experts");
  check_size(e.expert_ffn_hidden_size, "moe.expert_ffn_hidden_size", source);
  check_size(e.shared_expert_ffn_hidden_size, "moe.shared_expert_ffn_hidden_size", source, 0);
  if (e.shared_expert_gate && e.shared_expert_ffn_hidden_size == 0)
    throw InputError(source, "moe.shared_expert_gate", "a gate on the shared experts, but there are none",
                     "set shared_expert_ffn_hidden_size, or drop shared_expert_gate");
  if (!(e.capacity_factor >= 0) || e.capacity_factor > 1e3)
    throw InputError(source, "moe.capacity_factor", "must be 0 (dropless) or a positive factor",
                     "give e.g. 1.25, or 0 for dropless routing");
  if (e.router_load_imbalance != 0.0 && (!(e.router_load_imbalance >= 1.0) || e.router_load_imbalance > 1e3))
    throw InputError(source, "moe.router_load_imbalance",
                     "must be >= 1 (the busiest EP rank's tokens over the mean; 1: balanced)",
                     "give e.g. 1.2, 1 for a balanced router, or drop it for the measured load of its balancing");
  if (static_cast<std::int64_t>(e.moe_layers.size()) != m.num_layers)
    throw InputError(source, "moe.layer_pattern",
                     "has " + std::to_string(e.moe_layers.size()) + " entries for " + std::to_string(m.num_layers) +
                         " layers",
                     "give one entry (1: MoE, 0: dense) per layer");
  if (e.moe_layer_count() == 0)
    throw InputError(source, "moe.layer_pattern", "no layer is an MoE layer",
                     "make at least one layer an MoE layer, or drop \"moe\" for a dense model");
  if (e.router_groups > 0) {
    check_size(e.router_groups, "moe.router_groups", source);
    if (e.num_experts % e.router_groups != 0)
      throw InputError(source, "moe.router_groups",
                       std::to_string(e.router_groups) + " groups do not divide the " +
                           std::to_string(e.num_experts) + " experts",
                       "use a group count that divides num_experts");
    if (e.router_group_topk < 1 || e.router_group_topk > e.router_groups)
      throw InputError(source, "moe.router_group_topk",
                       "must be 1 to router_groups (" + std::to_string(e.router_groups) + "), got " +
                           std::to_string(e.router_group_topk),
                       "give how many expert groups a token may use (DeepSeek-V3: 4 of 8)");
  } else if (e.router_group_topk != 0) {
    throw InputError(source, "moe.router_group_topk", "given without router_groups",
                     "add router_groups, or drop router_group_topk");
  }
  // Keep every parameter product inside 64 bits (as for the dense sizes).
  const double per_expert = 3.0 * static_cast<double>(m.hidden_size) * static_cast<double>(e.expert_ffn_hidden_size);
  if (static_cast<double>(m.num_layers) * static_cast<double>(e.num_experts) * per_expert > 1e15)
    throw InputError(source, "moe.num_experts", "the experts would have more than 1000 T parameters",
                     "check num_experts and expert_ffn_hidden_size (a typo?)");
}

void validate_mla(const ModelSpec& m, const std::string& source) {
  const MlaSpec& a = m.mla;
  if (!a.enabled()) return;
  check_size(a.kv_lora_rank, "mla.kv_lora_rank", source);
  check_size(a.q_lora_rank, "mla.q_lora_rank", source, 0);
  check_size(a.qk_head_dim, "mla.qk_head_dim", source);
  check_size(a.qk_rope_head_dim, "mla.qk_rope_head_dim", source, 0);
  check_size(a.v_head_dim, "mla.v_head_dim", source);
  if (m.num_kv_heads != m.num_attention_heads)
    throw InputError(source, "num_kv_heads",
                     "latent attention has one key/value head per query head (" +
                         std::to_string(m.num_attention_heads) + "), not " + std::to_string(m.num_kv_heads),
                     "drop num_kv_heads from a latent-attention card");
  if (m.num_attention_heads * (a.qk_head_dim + a.qk_rope_head_dim + a.v_head_dim) > (std::int64_t{1} << 26))
    throw InputError(source, "mla.qk_head_dim", "heads x head widths are above cuboid's limit",
                     "check num_attention_heads and the head widths");
  // Keep every parameter product inside 64 bits (as for the dense sizes).
  const double h = static_cast<double>(m.hidden_size);
  const double heads = static_cast<double>(m.num_attention_heads);
  const double per_layer =
      (h + 1) * static_cast<double>(a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim) +
      static_cast<double>(std::max(a.q_lora_rank, m.hidden_size) + a.kv_lora_rank + h) * heads *
          static_cast<double>(a.qk_head_dim + a.qk_rope_head_dim + a.v_head_dim);
  if (static_cast<double>(m.num_layers) * per_layer > 1e15)
    throw InputError(source, "mla.kv_lora_rank", "the latent attention would have more than 1000 T parameters",
                     "check the ranks and head widths (a typo?)");
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
  constexpr std::int64_t kMaxSize = kMaxModelSize;
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
  validate_moe(m, source);
  validate_mla(m, source);
  if (m.mtp_layers < 0 || m.mtp_layers > 64)
    throw InputError(source, "mtp_layers", "must be 0 to 64, got " + std::to_string(m.mtp_layers),
                     "give the number of multi-token prediction modules (DeepSeek-V3: 1), or 0");
}

// ---------------------------------------------------------------------------
// cuboid's own model card

namespace {

constexpr std::array<std::string_view, 24> kCardFields = {
    "name",          "num_layers",         "hidden_size", "num_attention_heads",
    "num_kv_heads",  "head_dim",           "ffn_hidden_size", "activation",
    "normalization", "vocab_size",         "seq_length",  "max_position_embeddings",
    "tied_embeddings", "learned_position_embeddings", "linear_bias", "rope_theta", "rope_scaling_factor", "alibi",
    "rope_scaling_type", "moe", "mla", "mtp_layers", "hidden_dropout", "attention_dropout"};

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

// A model size read from a card or config: 1 to kMaxModelSize, checked as it
// is read (before any list of layers is sized by it or any product taken).
std::int64_t size_of(JsonReader& r, std::string_view key) { return r.count<std::int64_t>(key, 1, kMaxModelSize); }
std::optional<std::int64_t> optional_size_of(JsonReader& r, std::string_view key) {
  return r.optional_count<std::int64_t>(key, 1, kMaxModelSize);
}

// head_dim defaults to hidden / heads; 0 (left for validate_model to report)
// when the heads do not split the hidden size and no head_dim is given.
std::int64_t resolve_head_dim(const ModelSpec& m, std::optional<std::int64_t> head_dim) {
  if (head_dim) return *head_dim;
  return m.hidden_size % m.num_attention_heads == 0 ? m.hidden_size / m.num_attention_heads : 0;
}

// Megatron-Core's integer --moe-layer-freq after `first_dense` dense layers:
// layer i is an MoE layer when i >= first_dense and i % frequency == 0.
std::vector<bool> moe_layer_pattern(std::int64_t layers, std::int64_t first_dense, std::int64_t frequency) {
  std::vector<bool> pattern(static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)));
  for (std::int64_t i = 0; i < layers; ++i)
    pattern[static_cast<std::size_t>(i)] = i >= first_dense && i % frequency == 0;
  return pattern;
}

MoeSpec parse_moe(JsonReader& card, std::int64_t num_layers) {
  JsonReader r = card.object("moe");
  MoeSpec e;
  e.num_experts = size_of(r, "num_experts");
  e.experts_per_token = size_of(r, "experts_per_token");
  e.expert_ffn_hidden_size = size_of(r, "expert_ffn_hidden_size");
  e.shared_expert_ffn_hidden_size = optional_size_of(r, "shared_expert_ffn_hidden_size").value_or(0);
  e.shared_expert_gate = r.optional_boolean("shared_expert_gate").value_or(false);
  e.capacity_factor = r.optional_positive_number("capacity_factor").value_or(0.0);
  e.router_load_imbalance = r.optional_positive_number("router_load_imbalance").value_or(0.0);
  e.balancing = r.optional_choice("balancing", {"aux_loss", "aux_loss_free"}).value_or("aux_loss") == "aux_loss_free"
                    ? RouterBalancing::aux_loss_free
                    : RouterBalancing::aux_loss;
  e.router_groups = optional_size_of(r, "router_groups").value_or(0);
  e.router_group_topk = optional_size_of(r, "router_group_topk").value_or(0);
  if (r.has("layer_pattern")) {
    if (r.has("first_dense_layers") || r.has("layer_frequency"))
      r.fail("layer_pattern", "given together with first_dense_layers / layer_frequency",
             "give either the pattern (one 0 or 1 per layer) or first_dense_layers and layer_frequency");
    const nlohmann::json& list = r.raw("layer_pattern");
    if (!list.is_array())
      r.fail("layer_pattern", "is not a list", "give one entry per layer: 1 for an MoE layer, 0 for a dense one");
    for (const nlohmann::json& v : list) {
      if (!v.is_number_integer() || (v.get<std::int64_t>() != 0 && v.get<std::int64_t>() != 1))
        r.fail("layer_pattern", "has an entry that is not 0 or 1: " + v.dump(),
               "give one entry per layer: 1 for an MoE layer, 0 for a dense one");
      e.moe_layers.push_back(v.get<std::int64_t>() == 1);
    }
  } else {
    const std::int64_t first_dense = r.has("first_dense_layers") ? r.integer("first_dense_layers") : 0;
    if (first_dense < 0 || first_dense >= num_layers)
      r.fail("first_dense_layers", "must be 0 to num_layers - 1, got " + std::to_string(first_dense),
             "give how many layers before the first MoE layer are dense (DeepSeek-V3: 3)");
    const std::int64_t frequency = optional_size_of(r, "layer_frequency").value_or(1);
    e.moe_layers = moe_layer_pattern(num_layers, first_dense, frequency);
  }
  r.reject_unknown();
  return e;
}

MlaSpec parse_mla(JsonReader& card) {
  JsonReader r = card.object("mla");
  MlaSpec a;
  a.q_lora_rank = optional_size_of(r, "q_lora_rank").value_or(0);
  a.kv_lora_rank = size_of(r, "kv_lora_rank");
  a.qk_head_dim = size_of(r, "qk_head_dim");
  a.qk_rope_head_dim = r.has("qk_rope_head_dim") ? r.integer("qk_rope_head_dim") : 0;
  a.v_head_dim = size_of(r, "v_head_dim");
  r.reject_unknown();
  return a;
}

// A dropout probability in [0, 1), `fallback` when absent.
double dropout_of(JsonReader& r, const char* field, double fallback) {
  const double p = r.optional_number(field).value_or(fallback);
  if (p < 0 || p >= 1) r.fail(field, "must be in [0, 1)", "give the probability, e.g. 0 (none) or 0.1");
  return p;
}

ModelSpec model_from_card(const nlohmann::json& j, const std::string& source) {
  reject_near_miss_keys(j, source);
  JsonReader r(j, source);
  ModelSpec m;
  m.name = r.string("name");
  m.num_layers = size_of(r, "num_layers");
  m.hidden_size = size_of(r, "hidden_size");
  m.num_attention_heads = size_of(r, "num_attention_heads");
  m.num_kv_heads = optional_size_of(r, "num_kv_heads").value_or(m.num_attention_heads);
  const std::optional<std::int64_t> head_dim = optional_size_of(r, "head_dim");
  m.activation = parse_activation(r.optional_choice("activation", {"gelu", "swiglu"}).value_or("gelu"));
  m.normalization =
      parse_normalization(r.optional_choice("normalization", {"layernorm", "rmsnorm"}).value_or("layernorm"));
  m.ffn_hidden_size = optional_size_of(r, "ffn_hidden_size")
                          .value_or(default_ffn_hidden_size(m.hidden_size, m.activation));
  m.vocab_size = size_of(r, "vocab_size");
  m.seq_length = size_of(r, "seq_length");
  m.max_position_embeddings = optional_size_of(r, "max_position_embeddings").value_or(m.seq_length);
  m.tied_embeddings = r.optional_boolean("tied_embeddings").value_or(false);
  m.learned_position_embeddings = r.optional_boolean("learned_position_embeddings").value_or(false);
  m.linear_bias = r.optional_boolean("linear_bias").value_or(false);
  m.rope_theta = r.optional_positive_number("rope_theta").value_or(10000.0);
  m.rope_scaling_factor = r.optional_number("rope_scaling_factor").value_or(0.0);
  if (m.rope_scaling_factor < 0)
    throw InputError(source, "rope_scaling_factor", "must not be negative", "give 0 (no scaling) or the factor, e.g. 8");
  m.rope_yarn = r.optional_choice("rope_scaling_type", {"llama3", "yarn"}).value_or("llama3") == "yarn";
  if (m.rope_yarn && m.rope_scaling_factor == 0)
    throw InputError(source, "rope_scaling_type", "YaRN without a factor", "give rope_scaling_factor (DeepSeek-V3: 40)");
  if (m.rope_yarn) {
    m.rope_mscale = r.optional_number("rope_mscale").value_or(1.0);
    m.rope_mscale_all_dim = r.optional_number("rope_mscale_all_dim").value_or(0.0);
    if (!(m.rope_mscale >= 0) || !(m.rope_mscale_all_dim >= 0))
      throw InputError(source, m.rope_mscale >= 0 ? "rope_mscale_all_dim" : "rope_mscale", "must not be negative",
                       "give YaRN's mscale terms as the model's rope_scaling has them (DeepSeek-V3: 1.0 and 1.0)");
  } else {
    for (const char* key : {"rope_mscale", "rope_mscale_all_dim"})
      if (r.has(key))
        throw InputError(source, key, "YaRN's attention scale without YaRN", "drop it, or set rope_scaling_type \"yarn\"");
  }
  m.alibi = r.optional_boolean("alibi").value_or(false);
  m.hidden_dropout = dropout_of(r, "hidden_dropout", 0.1);
  m.attention_dropout = dropout_of(r, "attention_dropout", 0.1);
  if (r.has("moe")) m.moe = parse_moe(r, m.num_layers);
  if (r.has("mla")) m.mla = parse_mla(r);
  m.mtp_layers = r.has("mtp_layers") ? r.integer("mtp_layers") : 0;
  if (m.alibi && m.learned_position_embeddings)
    throw InputError(source, "alibi", "ALiBi replaces position embeddings, and learned_position_embeddings is true too",
                     "keep one of them: alibi for BLOOM-style models, learned positions for GPT-2-style ones");
  if (m.alibi && m.rope_scaling_factor > 0)
    throw InputError(source, "alibi", "ALiBi replaces rotary positions, and rope_scaling_factor is set too",
                     "drop rope_scaling_factor from an ALiBi model");
  r.reject_unknown();
  m.head_dim = resolve_head_dim(m, head_dim);
  if (m.mla.enabled()) {
    if (head_dim && *head_dim != m.mla.qk_head_dim + m.mla.qk_rope_head_dim)
      throw InputError(source, "head_dim", "differs from the latent attention's qk_head_dim + qk_rope_head_dim",
                       "drop head_dim from a latent-attention card");
    m.head_dim = m.mla.qk_head_dim + m.mla.qk_rope_head_dim;
  }
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

// The HuggingFace families whose experts and attention cuboid reads.
enum class HfFamily { dense, mixtral, qwen2_moe, qwen3_moe, deepseek_v3 };

// Which family the config is; refuses a config with experts or latent
// attention of any other family, naming the field.
HfFamily hf_family(JsonReader& r) {
  const std::string type = r.optional_string("model_type").value_or("");
  if (type == "mixtral") return HfFamily::mixtral;
  if (type == "qwen2_moe") return HfFamily::qwen2_moe;
  if (type == "qwen3_moe") return HfFamily::qwen3_moe;
  if (type == "deepseek_v3") return HfFamily::deepseek_v3;
  const std::string named = type.empty() ? std::string("a config without model_type") : "model_type " + quote_value(type);
  // A field of the wrong type is refused, not skipped: "16" experts are experts.
  for (std::string_view key : {"num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"}) {
    if (!r.has(key)) continue;
    const double experts = r.number(key);
    if (experts > 1) {
      r.fail(key,
             "mixture-of-experts (" + r.raw(key).dump() + " experts) in " + named +
                 ", which cuboid does not read (it reads mixtral, qwen2_moe, qwen3_moe and deepseek_v3)",
             "write a cuboid model card with a \"moe\" section (docs/cards.md)");
    }
  }
  if (r.has("kv_lora_rank")) {
    (void)r.number("kv_lora_rank");  // a wrong type is named as such
    r.fail("kv_lora_rank", "multi-head latent attention in " + named + ", which cuboid does not read (only deepseek_v3)",
           "write a cuboid model card with an \"mla\" section (docs/cards.md)");
  }
  return HfFamily::dense;
}

// HF's rule for Qwen2-MoE and Qwen3-MoE (Qwen2MoeDecoderLayer): layer i is
// sparse unless listed in mlp_only_layers, and when (i + 1) % step == 0.
std::vector<bool> qwen_moe_layers(JsonReader& r, std::int64_t layers) {
  const std::int64_t step = optional_size_of(r, "decoder_sparse_step").value_or(1);
  std::vector<bool> pattern(static_cast<std::size_t>(layers));
  for (std::int64_t i = 0; i < layers; ++i) pattern[static_cast<std::size_t>(i)] = (i + 1) % step == 0;
  if (r.has("mlp_only_layers") && !r.raw("mlp_only_layers").is_null()) {
    const nlohmann::json& list = r.raw("mlp_only_layers");
    if (!list.is_array()) r.fail("mlp_only_layers", "is not a list", "give the indices of the dense layers");
    for (const nlohmann::json& v : list) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= layers)
        r.fail("mlp_only_layers", "has an entry that is not a layer index: " + v.dump(),
               "give layer indices from 0 to num_hidden_layers - 1");
      pattern[v.get<std::size_t>()] = false;
    }
  }
  return pattern;
}

// The experts and the attention of the MoE families (their configuration_*.py
// in HF transformers): sets m.moe (and for DeepSeek-V3 m.mla and m.mtp_layers).
void read_hf_experts(JsonReader& r, HfFamily family, ModelSpec& m) {
  MoeSpec& e = m.moe;
  switch (family) {
    case HfFamily::dense: return;
    case HfFamily::mixtral:
      // MixtralSparseMoeBlock: every layer; each expert is an MLP of intermediate_size.
      e.num_experts = size_of(r, "num_local_experts");
      e.experts_per_token = size_of(r, "num_experts_per_tok");
      e.expert_ffn_hidden_size = m.ffn_hidden_size;
      e.moe_layers.assign(static_cast<std::size_t>(m.num_layers), true);
      break;
    case HfFamily::qwen2_moe:
    case HfFamily::qwen3_moe:
      e.num_experts = size_of(r, "num_experts");
      e.experts_per_token = size_of(r, "num_experts_per_tok");
      e.expert_ffn_hidden_size = size_of(r, "moe_intermediate_size");
      if (family == HfFamily::qwen2_moe) {
        // Qwen2MoeSparseMoeBlock: one shared expert with a sigmoid gate.
        e.shared_expert_ffn_hidden_size = optional_size_of(r, "shared_expert_intermediate_size").value_or(0);
        e.shared_expert_gate = e.shared_expert_ffn_hidden_size > 0;
      }
      e.moe_layers = qwen_moe_layers(r, m.num_layers);
      break;
    case HfFamily::deepseek_v3: {
      // DeepseekV3MoE: n_shared_experts shared experts of moe_intermediate_size
      // (one MLP of their summed width, as Megatron builds it); layer i is MoE
      // when i >= first_k_dense_replace and i % moe_layer_freq == 0.
      e.num_experts = size_of(r, "n_routed_experts");
      e.experts_per_token = size_of(r, "num_experts_per_tok");
      e.expert_ffn_hidden_size = size_of(r, "moe_intermediate_size");
      e.shared_expert_ffn_hidden_size =
          optional_size_of(r, "n_shared_experts").value_or(0) * e.expert_ffn_hidden_size;
      const std::int64_t first_dense = r.has("first_k_dense_replace") ? r.integer("first_k_dense_replace") : 0;
      if (first_dense < 0 || first_dense >= m.num_layers)
        r.fail("first_k_dense_replace", "must be 0 to num_hidden_layers - 1, got " + std::to_string(first_dense),
               "give how many leading layers are dense (DeepSeek-V3: 3)");
      e.moe_layers = moe_layer_pattern(m.num_layers, first_dense, optional_size_of(r, "moe_layer_freq").value_or(1));
      // "noaux_tc": top-k on scores plus the expert bias that DeepSeek-V3's
      // auxiliary-loss-free balancing adjusts (modeling_deepseek.py).
      if (r.optional_string("topk_method").value_or("") == "noaux_tc") e.balancing = RouterBalancing::aux_loss_free;
      if (r.has("n_group") && !r.raw("n_group").is_null()) {
        e.router_groups = size_of(r, "n_group");
        e.router_group_topk = size_of(r, "topk_group");
        if (e.router_groups == 1) e.router_groups = e.router_group_topk = 0;  // one group: no limit
      }
      MlaSpec& a = m.mla;
      a.q_lora_rank = optional_size_of(r, "q_lora_rank").value_or(0);
      a.kv_lora_rank = size_of(r, "kv_lora_rank");
      a.qk_head_dim = size_of(r, "qk_nope_head_dim");
      a.qk_rope_head_dim = size_of(r, "qk_rope_head_dim");
      a.v_head_dim = size_of(r, "v_head_dim");
      m.head_dim = a.qk_head_dim + a.qk_rope_head_dim;
      m.num_kv_heads = m.num_attention_heads;  // one latent, expanded to every head
      m.mtp_layers = r.has("num_nextn_predict_layers") && !r.raw("num_nextn_predict_layers").is_null()
                         ? r.integer("num_nextn_predict_layers")
                         : 0;
      break;
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
    if (!arch.is_array() || (!arch.empty() && !arch.front().is_string()))
      r.fail("architectures", "expected a list of class names, got " + arch.dump().substr(0, 40),
             "give e.g. [\"LlamaForCausalLM\"]");
    if (!arch.empty()) return arch.front().get<std::string>();
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
  r.fail("hidden_act", "unsupported activation " + quote_value(act),
         "use silu/swiglu (gated MLP) or gelu/relu (plain MLP), or write a cuboid model card");
}

ModelSpec model_from_gpt2_config(JsonReader& r, const std::string& source) {
  ModelSpec m;
  m.name = hf_name(r, source);
  m.num_layers = size_of(r, "n_layer");
  m.hidden_size = size_of(r, "n_embd");
  m.num_attention_heads = size_of(r, "n_head");
  m.num_kv_heads = m.num_attention_heads;
  m.activation = Activation::gelu;
  m.normalization = Normalization::layernorm;
  m.ffn_hidden_size = optional_size_of(r, "n_inner").value_or(4 * m.hidden_size);
  m.vocab_size = size_of(r, "vocab_size");
  if (r.has("n_positions")) {
    m.max_position_embeddings = size_of(r, "n_positions");
  } else if (r.has("n_ctx")) {
    m.max_position_embeddings = size_of(r, "n_ctx");
  } else {
    r.fail("n_positions", "missing required field", "add \"n_positions\" (or \"n_ctx\"), the context length");
  }
  m.seq_length = m.max_position_embeddings;
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(true);
  m.learned_position_embeddings = true;
  m.linear_bias = true;
  // transformers' GPT2Config: resid_pdrop and attn_pdrop, default 0.1.
  m.hidden_dropout = dropout_of(r, "resid_pdrop", 0.1);
  m.attention_dropout = dropout_of(r, "attn_pdrop", 0.1);
  m.head_dim = resolve_head_dim(m, std::nullopt);
  validate_hf(m, source, kGpt2Keys);
  return m;
}

// Llama 3.1's rope_scaling ({"rope_type": "llama3", "factor": 8.0, ...}); null
// or absent: none. Other scalings (linear, dynamic, yarn) would build a
// different model in the trainers the exports target, so they are refused.
// DeepSeek-V3's YaRN ({"type": "yarn", "factor": 40, ...}) is read for that
// family only.
void read_hf_rope_scaling(JsonReader& r, const std::string& source, HfFamily family, ModelSpec& m) {
  m.rope_yarn = false;
  m.rope_scaling_factor = 0.0;
  if (!r.has("rope_scaling")) return;
  JsonReader s = r.object("rope_scaling");
  const std::string type = s.has("rope_type") ? s.string("rope_type") : s.string("type");
  m.rope_yarn = type == "yarn" && family == HfFamily::deepseek_v3;
  if (type != "llama3" && !m.rope_yarn)
    throw InputError(source, "rope_scaling",
                     "rope scaling \"" + type + "\" is not supported (only Llama 3.1's \"llama3\", and DeepSeek-V3's \"yarn\")",
                     "remove rope_scaling, or use a config with rope_type \"llama3\"");
  m.rope_scaling_factor = s.positive_number("factor");
  if (!m.rope_yarn) return;
  // transformers' DeepseekV3 YaRN: mscale and mscale_all_dim (default 1 and
  // 0, as Megatron-Core's MLATransformerConfig). Its other terms are fixed
  // in Megatron-Core's MLA (transformer_config.py at d98e8a64: beta_fast 32,
  // beta_slow 1, original_max_position_embeddings 4096; no flag sets them),
  // so a config with others describes a model no export could build.
  m.rope_mscale = s.optional_number("mscale").value_or(1.0);
  m.rope_mscale_all_dim = s.optional_number("mscale_all_dim").value_or(0.0);
  for (const auto& [key, fixed] : {std::pair<const char*, double>{"beta_fast", 32.0}, {"beta_slow", 1.0},
                                   {"original_max_position_embeddings", 4096.0}}) {
    const std::optional<double> v = s.optional_number(key);
    if (v && *v != fixed)
      throw InputError(source, std::string("rope_scaling.") + key,
                       fmt::format("YaRN's {} {} where Megatron-Core's multi-latent attention fixes it at {}", key, *v,
                                   fixed),
                       "use a config with the MLA defaults, or remove rope_scaling");
  }
}

ModelSpec model_from_llama_config(JsonReader& r, const std::string& source, HfFamily family) {
  ModelSpec m;
  m.name = hf_name(r, source);
  m.num_layers = size_of(r, "num_hidden_layers");
  m.hidden_size = size_of(r, "hidden_size");
  m.num_attention_heads = size_of(r, "num_attention_heads");
  m.num_kv_heads = optional_size_of(r, "num_key_value_heads").value_or(m.num_attention_heads);
  const std::optional<std::int64_t> head_dim = optional_size_of(r, "head_dim");
  m.activation = hf_activation(r);
  m.ffn_hidden_size = size_of(r, "intermediate_size");
  m.vocab_size = size_of(r, "vocab_size");
  m.max_position_embeddings = size_of(r, "max_position_embeddings");
  m.seq_length = m.max_position_embeddings;  // the planner's --seq-length overrides it
  // LLaMA-family configs name their norm by its epsilon; RMSNorm is the family default.
  m.normalization = Normalization::rmsnorm;
  for (std::string_view key : {"rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"}) (void)r.optional_number(key);
  if (!r.has("rms_norm_eps") && (r.has("layer_norm_eps") || r.has("layer_norm_epsilon"))) {
    m.normalization = Normalization::layernorm;
  }
  m.tied_embeddings = r.optional_boolean("tie_word_embeddings").value_or(false);
  m.learned_position_embeddings = false;  // rotary positions
  const bool attention_bias = r.optional_boolean("attention_bias").value_or(false);
  const bool mlp_bias = r.optional_boolean("mlp_bias").value_or(false);
  m.linear_bias = attention_bias || mlp_bias;
  m.rope_theta = r.optional_positive_number("rope_theta").value_or(10000.0);
  read_hf_rope_scaling(r, source, family, m);
  // transformers' LlamaConfig (and Mixtral's, Qwen3's, DeepSeek-V3's):
  // attention_dropout, default 0.0; no hidden dropout.
  m.attention_dropout = dropout_of(r, "attention_dropout", 0.0);
  m.hidden_dropout = 0.0;
  m.head_dim = resolve_head_dim(m, head_dim);
  read_hf_experts(r, family, m);
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
  const HfFamily family = hf_family(r);
  if (r.has("n_layer") && !r.has("num_hidden_layers")) return model_from_gpt2_config(r, source);
  return model_from_llama_config(r, source, family);
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

namespace {

nlohmann::json moe_to_json(const MoeSpec& e) {
  nlohmann::json j{{"num_experts", e.num_experts},
                   {"experts_per_token", e.experts_per_token},
                   {"expert_ffn_hidden_size", e.expert_ffn_hidden_size}};
  if (e.shared_expert_ffn_hidden_size > 0) j["shared_expert_ffn_hidden_size"] = e.shared_expert_ffn_hidden_size;
  if (e.shared_expert_gate) j["shared_expert_gate"] = true;
  if (e.capacity_factor > 0) j["capacity_factor"] = e.capacity_factor;
  if (e.router_load_imbalance > 0) j["router_load_imbalance"] = e.router_load_imbalance;
  if (e.balancing != RouterBalancing::aux_loss) j["balancing"] = std::string(to_string(e.balancing));
  if (e.router_groups > 0) {
    j["router_groups"] = e.router_groups;
    j["router_group_topk"] = e.router_group_topk;
  }
  // The short form (first dense layers, then every n-th) where it says the
  // same; else the pattern.
  const auto layers = static_cast<std::int64_t>(e.moe_layers.size());
  const auto first = static_cast<std::int64_t>(std::find(e.moe_layers.begin(), e.moe_layers.end(), true) -
                                               e.moe_layers.begin());
  for (std::int64_t frequency = 1; frequency <= layers; ++frequency) {
    if (first % frequency != 0 || moe_layer_pattern(layers, first, frequency) != e.moe_layers) continue;
    if (first > 0) j["first_dense_layers"] = first;
    if (frequency > 1) j["layer_frequency"] = frequency;
    return j;
  }
  nlohmann::json pattern = nlohmann::json::array();
  for (bool moe : e.moe_layers) pattern.push_back(moe ? 1 : 0);
  j["layer_pattern"] = std::move(pattern);
  return j;
}

}  // namespace

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
  // Written only when set: plans of other models keep their bytes.
  if (m.alibi) j["alibi"] = true;
  if (m.rope_yarn) {
    j["rope_scaling_type"] = "yarn";
    // Written where not Megatron-Core's defaults: plans of other models keep their bytes.
    if (m.rope_mscale != 1.0) j["rope_mscale"] = m.rope_mscale;
    if (m.rope_mscale_all_dim != 0.0) j["rope_mscale_all_dim"] = m.rope_mscale_all_dim;
  }
  if (m.hidden_dropout != 0.1) j["hidden_dropout"] = m.hidden_dropout;
  if (m.attention_dropout != 0.1) j["attention_dropout"] = m.attention_dropout;
  if (m.moe.enabled()) j["moe"] = moe_to_json(m.moe);
  if (m.mla.enabled()) {
    nlohmann::json a{{"kv_lora_rank", m.mla.kv_lora_rank},
                     {"qk_head_dim", m.mla.qk_head_dim},
                     {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                     {"v_head_dim", m.mla.v_head_dim}};
    if (m.mla.q_lora_rank > 0) a["q_lora_rank"] = m.mla.q_lora_rank;
    j["mla"] = std::move(a);
  }
  if (m.mtp_layers > 0) j["mtp_layers"] = m.mtp_layers;
  return j;
}


}  // namespace cuboid
