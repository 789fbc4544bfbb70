// FLOPs per iteration, as Megatron-LM's num_floating_point_operations counts
// them (dense transformer branch). Per token and per layer the forward pass is
//   2 * [ h*(q + 2*kv)         QKV projection (GQA: K and V at kv width)
//       + 2 * q * s/2          causal core: QK^T and scores x V, lower half only
//       + q*h                  output projection
//       + h*f*(3 | 2) ]        MLP: SwiGLU has three h x f GEMMs, GeLU two
// plus 2*h*V once for the logit GEMM; backward (dgrad + wgrad) is twice the
// forward, so model FLOPs are 3 x forward.
#include "cuboid/cost/flops.hpp"

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
  const double layers = static_cast<double>(m.num_layers);
  double recomputed = 0;
  switch (plan.recompute) {
    case Recompute::none:
      break;
    case Recompute::selective:
      recomputed = layers * attention_core_forward_flops(m, plan.global_batch, plan.seq_length);
      break;
    case Recompute::full:
      recomputed = layers * layer_forward_flops(m, plan.global_batch, plan.seq_length);
      break;
  }
  return model_flops_per_iteration(m, plan) + recomputed;
}

}  // namespace cuboid
