#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// ModelSpec: the shape of a decoder-only transformer, validated once at load
// and immutable after. Loaded from cuboid's own model card or from a
// HuggingFace config.json (LLaMA-style or GPT-2-style keys).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cuboid {

enum class Activation { gelu, swiglu };
enum class Normalization { layernorm, rmsnorm };

std::string_view to_string(Activation a);
std::string_view to_string(Normalization n);

struct ModelSpec {
  std::string name;
  std::int64_t num_layers = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_kv_heads = 0;       // = num_attention_heads unless GQA/MQA
  std::int64_t head_dim = 0;           // kv_channels; default hidden_size / heads
  std::int64_t ffn_hidden_size = 0;
  Activation activation = Activation::gelu;
  Normalization normalization = Normalization::layernorm;
  std::int64_t vocab_size = 0;         // unpadded; padding depends on TP (see padded_vocab_size)
  std::int64_t seq_length = 0;         // default training sequence length
  std::int64_t max_position_embeddings = 0;  // = seq_length unless given
  bool tied_embeddings = false;        // input embedding shared with the LM head
  bool learned_position_embeddings = false;  // GPT-style absolute positions (RoPE: false)
  bool linear_bias = false;            // biases on QKV/proj/FC1/FC2 (GPT: true, LLaMA: false)
  // Rotary positions (unused with learned positions): the base (HF rope_theta;
  // Llama 3: 500000) and Llama 3.1's frequency scaling (HF rope_scaling with
  // rope_type "llama3"): its factor, 0 = no scaling. Neither changes the cost;
  // the exports carry them so that the trainer builds the same model.
  double rope_theta = 10000.0;
  double rope_scaling_factor = 0.0;
  // ALiBi attention biases (Press et al., BLOOM) instead of position
  // embeddings or rotary positions. Without flash attention the bias enters
  // the score GEMM as its C operand (torch.baddbmm with beta = 1).
  bool alibi = false;

  std::int64_t query_projection_size() const { return head_dim * num_attention_heads; }
  std::int64_t kv_projection_size() const { return head_dim * num_kv_heads; }
  bool gated_mlp() const { return activation == Activation::swiglu; }

  // Parameters of one transformer layer (weights, biases, norms), unsharded.
  std::int64_t parameters_per_layer() const;
  // All parameters with the vocabulary padded for `tp` (tp = 1: the padding of
  // a single GPU), counting the LM head separately unless tied.
  std::int64_t parameter_count(std::int64_t tp = 1) const;
};

// Megatron-LM's vocabulary padding: round up to a multiple of
// make_vocab_size_divisible_by * tp (default 128 * tp).
std::int64_t padded_vocab_size(std::int64_t vocab_size, std::int64_t tp,
                               std::int64_t divisible_by = 128);

// Megatron-LM's default FFN size: 4h, or int(4h * 2/3 / 64) * 64 for SwiGLU.
std::int64_t default_ffn_hidden_size(std::int64_t hidden_size, Activation activation);

// Loads a model card or a HuggingFace config.json (detected by its keys).
// `source` names the file in error messages. Throws InputError on any problem.
ModelSpec model_from_json(const nlohmann::json& j, const std::string& source);
ModelSpec model_from_hf_config(const nlohmann::json& j, const std::string& source);
ModelSpec load_model(const std::filesystem::path& path);

// The model as a cuboid model card (round-trips through model_from_json).
nlohmann::json model_to_json(const ModelSpec& m);

// Checks the invariants every loader guarantees (positive sizes, heads divide
// hidden size unless head_dim is explicit, kv heads divide heads, ...).
void validate_model(const ModelSpec& m, const std::string& source);

}  // namespace cuboid
