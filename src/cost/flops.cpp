// FLOPs per iteration, as Megatron-LM's num_floating_point_operations counts
// them (dense transformer branch). Per token and per layer the forward pass is
//   2 * [ h*(q + 2*kv)         QKV projection (GQA: K and V at kv width)
//       + 2 * q * s/2          causal core: QK^T and scores x V, lower half only
//       + q*h                  output projection
//       + h*f*(3 | 2) ]        MLP: SwiGLU has three h x f GEMMs, GeLU two
// plus 2*h*V once for the logit GEMM; backward (dgrad + wgrad) is twice the
// forward, so model FLOPs are 3 x forward.
#include "cuboid/cost/flops.hpp"

#include <algorithm>
#include <array>

#include "cuboid/cost/memory.hpp"

namespace cuboid {
namespace {

// Forward FLOPs per token; integers are exact here (no rounding before the
// final multiplication by the token count).
std::int64_t attention_core_forward_per_token(const ModelSpec& m, std::int64_t seq_length) {
  // QK^T and scores x V, each 2 * q * s/2 FLOPs per token (causal half).
  return 2 * m.query_projection_size() * seq_length;
}

std::int64_t layer_forward_per_token(const ModelSpec& m, std::int64_t seq_length) {
  const std::int64_t h = m.hidden_size;
  const std::int64_t q = m.query_projection_size();
  const std::int64_t kv = m.kv_projection_size();
  const std::int64_t mlp_gemms = m.gated_mlp() ? 3 : 2;
  const std::int64_t projections = 2 * (h * (q + 2 * kv) + q * h);
  const std::int64_t mlp = 2 * h * m.ffn_hidden_size * mlp_gemms;
  return projections + attention_core_forward_per_token(m, seq_length) + mlp;
}

double tokens(std::int64_t batch, std::int64_t seq_length) {
  return static_cast<double>(batch) * static_cast<double>(seq_length);
}

// Models with experts, latent attention or MTP modules, as the general branch
// of Megatron-LM's num_floating_point_operations counts them (training.py at
// d98e8a64, transformer_flops): per token and layer the forward pass is
//   attention projections  standard: 2 [h (q + 2 kv) + q h]
//                          MLA: 2 [q_term + c (h + n (d_qk + d_v) + 1) + h r + n d_v h],
//                          q_term = c_q (h + n (d_qk + r) + 1), or h n (d_qk + r) without c_q
//   causal core            standard: 2 q s; MLA: n (d_qk + r + d_v) s
//   MLP                    dense: 2 h f g; MoE: 2 h (f_e k + f_shared) g (g = 3 gated, 2 plain)
// (the router's h x experts GEMM is not counted, as Megatron does not), each
// MTP module one more layer of the last layer's kind plus 2 (3h + 2h^2), and
// one logit GEMM (2 h V) for the model and one per MTP module.
struct GeneralCounts {
  double attention_linear = 0;  // per token, one layer
  double core = 0;              // per token, one layer
  double dense_mlp = 0;         // per token
  double moe_mlp = 0;           // per token
  double shared_mlp = 0;        // per token, the shared experts' part of moe_mlp
  double mla_up_proj = 0;       // per token, latent attention's up projections (part of attention_linear)
  std::int64_t dense_layers = 0;
  std::int64_t moe_layers = 0;  // the MTP modules' layers included
  double mtp_extra = 0;         // per token, all MTP modules' projections and norms
};

GeneralCounts general_counts(const ModelSpec& m, std::int64_t seq_length) {
  GeneralCounts c;
  const double h = static_cast<double>(m.hidden_size);
  const double s = static_cast<double>(seq_length);
  const double n = static_cast<double>(m.num_attention_heads);
  if (m.mla.enabled()) {
    const double qk = static_cast<double>(m.mla.qk_head_dim);
    const double r = static_cast<double>(m.mla.qk_rope_head_dim);
    const double v = static_cast<double>(m.mla.v_head_dim);
    const double cq = static_cast<double>(m.mla.q_lora_rank);
    const double ckv = static_cast<double>(m.mla.kv_lora_rank);
    const double q_term = m.mla.q_lora_rank > 0 ? cq * (h + n * (qk + r) + 1) : h * n * (qk + r);
    c.attention_linear = 2 * (q_term + ckv * (h + n * (qk + v) + 1) + h * r + n * v * h);
    c.core = n * (qk + r + v) * s;
    // Counted as in q_term and the c_kv term: c (n (d_qk + r)) and c_kv (n (d_qk + d_v)).
    c.mla_up_proj = 2 * ((m.mla.q_lora_rank > 0 ? cq : h) * n * (qk + r) + ckv * n * (qk + v));
  } else {
    const double q = static_cast<double>(m.query_projection_size());
    const double kv = static_cast<double>(m.kv_projection_size());
    c.attention_linear = 2 * (h * (q + 2 * kv) + q * h);
    c.core = 2 * q * s;
  }
  const double g = m.gated_mlp() ? 3 : 2;
  c.dense_mlp = 2 * h * static_cast<double>(m.ffn_hidden_size) * g;
  c.moe_mlp = 2 * h *
              (static_cast<double>(m.moe.expert_ffn_hidden_size * m.moe.experts_per_token) +
               static_cast<double>(m.moe.shared_expert_ffn_hidden_size)) *
              g;
  c.shared_mlp = 2 * h * static_cast<double>(m.moe.shared_expert_ffn_hidden_size) * g;
  c.moe_layers = m.moe.moe_layer_count();
  c.dense_layers = m.num_layers - c.moe_layers;
  const bool last_is_moe = m.moe.enabled() && m.moe.moe_layers.back();
  (last_is_moe ? c.moe_layers : c.dense_layers) += m.mtp_layers;
  c.mtp_extra = static_cast<double>(m.mtp_layers) * 2 * (3 * h + 2 * h * h);
  return c;
}

// Forward FLOPs per token of every transformer layer (MTP modules' included).
double general_layers_forward_per_token(const GeneralCounts& c) {
  const double attention = c.attention_linear + c.core;
  return static_cast<double>(c.dense_layers) * (attention + c.dense_mlp) +
         static_cast<double>(c.moe_layers) * (attention + c.moe_mlp);
}

// The decoder layers whose forward re-runs in backward, [dense, MoE], over
// every stage's chunks.
std::array<double, 2> recomputed_layers(const ModelSpec& m, const ParallelPlan& plan) {
  std::array<double, 2> n{};
  for (int s = 0; s < std::max(1, plan.pp); ++s) {
    const StageRecompute r = stage_recompute(m, plan, s);
    n[0] += r.recomputed[0];
    n[1] += r.recomputed[1];
  }
  return n;
}

}  // namespace

double layer_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length) {
  return static_cast<double>(layer_forward_per_token(m, seq_length)) * tokens(batch, seq_length);
}

double attention_core_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length) {
  return static_cast<double>(attention_core_forward_per_token(m, seq_length)) *
         tokens(batch, seq_length);
}

double logit_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length,
                           std::int64_t padded_vocab) {
  return static_cast<double>(2 * m.hidden_size * padded_vocab) * tokens(batch, seq_length);
}

double model_flops_per_iteration(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length,
                                 std::int64_t padded_vocab) {
  if (!m.dense()) {
    const GeneralCounts c = general_counts(m, seq_length);
    const double logits = static_cast<double>(1 + m.mtp_layers) * 2 * static_cast<double>(m.hidden_size) *
                          static_cast<double>(padded_vocab);
    return 3.0 * (general_layers_forward_per_token(c) + c.mtp_extra + logits) * tokens(batch, seq_length);
  }
  // Forward, dgrad and wgrad: 3 x the forward FLOPs.
  return 3.0 * (static_cast<double>(m.num_layers) * layer_forward_flops(m, batch, seq_length) +
                logit_forward_flops(m, batch, seq_length, padded_vocab));
}

double model_flops_per_iteration(const ModelSpec& m, const ParallelPlan& plan) {
  return model_flops_per_iteration(m, plan.global_batch, plan.seq_length,
                                   padded_vocab_size(m.vocab_size, plan.tp));
}

double hardware_flops_per_iteration(const ModelSpec& m, const ParallelPlan& plan) {
  // Recomputation repeats forward work inside backward. Flash attention also
  // recomputes the attention core in its backward kernel; Megatron's HFU does
  // not count that, and neither do we, so selective recompute with flash
  // attention is counted as one extra core forward (what Megatron reports).
  if (!m.dense()) {
    // Full recomputation repeats every layer's forward (the MTP modules'
    // layers too), selective the attention cores.
    const GeneralCounts c = general_counts(m, plan.seq_length);
    const double t = tokens(plan.global_batch, plan.seq_length);
    const double layers = static_cast<double>(c.dense_layers + c.moe_layers);
    double recomputed = 0;
    if (plan.recompute == Recompute::full) {
      // Of the decoder layers, those the method re-runs (the MTP modules'
      // layers are checkpoints of their own under full granularity:
      // multi_token_prediction.py _checkpointed_forward at d98e8a64).
      GeneralCounts r = c;
      if (plan.recompute_layers_set()) {
        const std::array<double, 2> n = recomputed_layers(m, plan);
        const bool last_is_moe = m.moe.enabled() && m.moe.moe_layers.back();
        r.dense_layers = static_cast<std::int64_t>(n[0]) + (last_is_moe ? 0 : m.mtp_layers);
        r.moe_layers = static_cast<std::int64_t>(n[1]) + (last_is_moe ? m.mtp_layers : 0);
      }
      recomputed = general_layers_forward_per_token(r) * t;
    }
    if (plan.recomputes(RecomputeModule::core_attn)) recomputed = layers * c.core * t;
    if (plan.checkpoints(RecomputeModule::mlp)) recomputed += static_cast<double>(c.dense_layers) * c.dense_mlp * t;
    // Latent attention's up projections (every layer), the MoE MLP and the
    // shared experts (MoE layers) as counted above; the norms and the
    // activation (layernorm, moe_act) are not matrix products. A module
    // inside a recomputed MoE MLP runs once more (workload.cpp).
    if (plan.recomputes(RecomputeModule::mla_up_proj)) recomputed += layers * c.mla_up_proj * t;
    if (plan.checkpoints(RecomputeModule::moe)) recomputed += static_cast<double>(c.moe_layers) * c.moe_mlp * t;
    if (plan.checkpoints(RecomputeModule::shared_experts))
      recomputed += static_cast<double>(c.moe_layers) * c.shared_mlp * t;
    return model_flops_per_iteration(m, plan) + recomputed;
  }
  const double layers = static_cast<double>(m.num_layers);
  double recomputed = 0;
  switch (plan.recompute) {
    case Recompute::none:
      break;
    case Recompute::selective:
      if (plan.recomputes(RecomputeModule::core_attn))
        recomputed = layers * attention_core_forward_flops(m, plan.global_batch, plan.seq_length);
      // A dense MLP's forward: 2 h f per token and GEMM, three GEMMs gated.
      if (plan.checkpoints(RecomputeModule::mlp))
        recomputed += layers * 2.0 * static_cast<double>(m.hidden_size) * static_cast<double>(m.ffn_hidden_size) *
                      (m.gated_mlp() ? 3 : 2) * tokens(plan.global_batch, plan.seq_length);
      break;
    case Recompute::full: {
      // The layers the method re-runs: all but block's stored ones.
      double n = layers;
      if (plan.recompute_layers_set()) {
        const std::array<double, 2> k = recomputed_layers(m, plan);
        n = k[0] + k[1];
      }
      recomputed = n * layer_forward_flops(m, plan.global_batch, plan.seq_length);
      break;
    }
  }
  return model_flops_per_iteration(m, plan) + recomputed;
}

}  // namespace cuboid
