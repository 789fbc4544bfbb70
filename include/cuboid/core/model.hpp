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
#include <vector>

#include <nlohmann/json.hpp>

namespace cuboid {

enum class Activation { gelu, swiglu };
enum class Normalization { layernorm, rmsnorm };

std::string_view to_string(Activation a);
std::string_view to_string(Normalization n);

enum class RouterBalancing { aux_loss, aux_loss_free };
std::string_view to_string(RouterBalancing b);

// A mixture-of-experts MLP as Megatron-Core builds it (its MoELayer): a
// router, `num_experts` routed experts of which each token uses
// `experts_per_token`, and optionally shared experts that every token uses.
// num_experts == 0: every MLP is dense.
struct MoeSpec {
  std::int64_t num_experts = 0;             // routed experts per MoE layer (--num-experts)
  std::int64_t experts_per_token = 0;       // router top-k (--moe-router-topk)
  std::int64_t expert_ffn_hidden_size = 0;  // one routed expert's FFN width (--moe-ffn-hidden-size)
  // All shared experts together, as Megatron's --moe-shared-expert-intermediate-size
  // (DeepSeek: n_shared_experts x moe_intermediate_size); 0: none.
  std::int64_t shared_expert_ffn_hidden_size = 0;
  bool shared_expert_gate = false;  // a sigmoid gate (h -> 1) on the shared experts' output (Qwen2-MoE)
  // Tokens an expert may take, as a multiple of the balanced share
  // (--moe-expert-capacity-factor); 0: dropless, Megatron-Core's default.
  double capacity_factor = 0;
  // The busiest EP rank's routed tokens over the mean, per MoE layer and
  // micro-batch (--moe-imbalance): it sets the pace of the dispatch, the
  // expert GEMMs and the combine, as every EP rank waits for it. 0: not
  // given, ep_rank_load (core/workload.hpp) derives it from the measured
  // load of the router's balancing.
  double router_load_imbalance = 0.0;
  // How the router was trained to balance its experts, which sets the
  // default imbalance (ep_rank_load): an auxiliary loss (Switch / GShard,
  // Megatron-Core's aux_loss; Mixtral, Qwen) or DeepSeek-V3's auxiliary-
  // loss-free expert bias (HF topk_method "noaux_tc").
  RouterBalancing balancing = RouterBalancing::aux_loss;
  // Group-limited routing (DeepSeek-V3: the experts in 8 groups, a token's
  // experts from at most 4 of them; --moe-router-num-groups,
  // --moe-router-group-topk); 0: any expert.
  std::int64_t router_groups = 0;
  std::int64_t router_group_topk = 0;
  // One entry per layer: true where the layer's MLP is an MoE layer, false
  // where it is a dense MLP of ffn_hidden_size (DeepSeek-V3's first three).
  std::vector<bool> moe_layers;

  bool enabled() const { return num_experts > 0; }
  std::int64_t moe_layer_count() const;
  friend bool operator==(const MoeSpec&, const MoeSpec&) = default;
};

// Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core's
// MLASelfAttention): queries through an optional low-rank bottleneck, keys and
// values from one shared low-rank latent, a decoupled rotary part of the
// query/key heads. kv_lora_rank == 0: standard (GQA) attention.
struct MlaSpec {
  std::int64_t q_lora_rank = 0;       // 0: the query is projected from h directly
  std::int64_t kv_lora_rank = 0;      // the compressed KV latent's width
  std::int64_t qk_head_dim = 0;       // the query/key heads' non-rotary part (qk_nope_head_dim)
  std::int64_t qk_rope_head_dim = 0;  // the decoupled rotary part (--qk-pos-emb-head-dim)
  std::int64_t v_head_dim = 0;

  bool enabled() const { return kv_lora_rank > 0; }
  friend bool operator==(const MlaSpec&, const MlaSpec&) = default;
};

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
  // The scaling's kind when rope_scaling_factor > 0: Llama 3.1's (false) or
  // YaRN's (true; DeepSeek-V3). Neither changes the cost.
  bool rope_yarn = false;
  // YaRN's attention scale terms (HuggingFace rope_scaling mscale and
  // mscale_all_dim; Megatron-Core's MLATransformerConfig mscale, default 1.0,
  // and mscale_all_dim, default 0.0). No cost; the exports write them.
  double rope_mscale = 1.0;
  double rope_mscale_all_dim = 0.0;
  // ALiBi attention biases (Press et al., BLOOM) instead of position
  // embeddings or rotary positions. Without flash attention the bias enters
  // the score GEMM as its C operand (torch.baddbmm with beta = 1).
  bool alibi = false;
  // Dropout probabilities the model trains with: after the attention
  // projection and the MLP (Megatron's --hidden-dropout) and on the attention
  // probabilities (--attention-dropout). 0.1 is Megatron's default and GPT-3's;
  // Llama-style models train without (HF attention_dropout 0.0, no hidden
  // dropout). The exports carry them; the memory model keeps no dropout mask
  // at a probability of 0 (torch's dropout returns its input without drawing
  // one); the cost model prices dropout's kernels at any probability.
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  MoeSpec moe;
  MlaSpec mla;
  // Multi-token prediction modules after the last layer (DeepSeek-V3: 1;
  // Megatron's --mtp-num-layers), each a transformer layer of the last
  // layer's kind, a 2h -> h projection, two norms before it and one after.
  std::int64_t mtp_layers = 0;

  // Every MLP dense, standard attention, no MTP: the models cuboid can plan.
  bool dense() const { return !moe.enabled() && !mla.enabled() && mtp_layers == 0; }
  // An MoE model with dense layers too (DeepSeek-V3's first three): each kind priced apart.
  bool has_dense_and_moe_layers() const { return moe.enabled() && moe.moe_layer_count() < num_layers; }

  std::int64_t query_projection_size() const { return head_dim * num_attention_heads; }
  std::int64_t kv_projection_size() const { return head_dim * num_kv_heads; }
  bool gated_mlp() const { return activation == Activation::swiglu; }

  // Parameters of one transformer layer (weights, biases, norms), unsharded:
  // a dense layer's; with experts, see the per-part counts below.
  std::int64_t parameters_per_layer() const;
  // All parameters with the vocabulary padded for `tp` (tp = 1: the padding of
  // a single GPU), counting the LM head separately unless tied, every expert
  // and the multi-token prediction modules included.
  std::int64_t parameter_count(std::int64_t tp = 1) const;
  // The parameters one token's forward pass uses: parameter_count less the
  // routed experts it is not sent to (and less the MTP modules, which
  // predict further tokens). Embedding and LM head included.
  std::int64_t active_parameter_count(std::int64_t tp = 1) const;

  // The parts of one layer, unsharded.
  std::int64_t attention_parameters() const;  // QKV (or MLA's projections), output projection, their biases and norms
  std::int64_t dense_mlp_parameters() const;  // an MLP of ffn_hidden_size
  std::int64_t expert_parameters() const;     // one routed expert (expert_ffn_hidden_size)
  std::int64_t moe_mlp_parameters() const;    // router + all routed experts + shared experts (+ gate)
  std::int64_t layer_norm_parameters() const; // one norm's parameters (2h LayerNorm, h RMSNorm)
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
