#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// FLOPs per iteration. Model FLOPs follow Megatron-LM's
// num_floating_point_operations (megatron/training/training.py, dense
// transformer branch): 3 passes (forward, dgrad, wgrad) x 2 FLOPs per MAC, the
// causal attention core counted at half (only the lower triangle is computed),
// GQA key/value projections at their real size, SwiGLU's third GEMM, and the
// logit GEMM with the padded vocabulary. Hardware FLOPs add the forward work
// that recomputation repeats.
#include <cstdint>

#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

// Models with experts, latent attention or multi-token prediction
// (ModelSpec::dense() false) follow the same function's general branch: MoE
// layers count the routed experts a token uses plus the shared experts, dense
// layers the dense MLP, MLA its low-rank projections, and each MTP module one
// more layer and one more logit GEMM. The per-layer functions below are for
// dense models.

// Forward FLOPs of one transformer layer for `tokens` = batch x seq tokens
// (GEMMs plus the causal attention core; no element-wise ops, as Megatron).
double layer_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length);
// Forward FLOPs of the causal attention core alone (QK^T and attention x V).
double attention_core_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length);
// Forward FLOPs of the LM head (logit GEMM) with the padded vocabulary.
double logit_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length,
                           std::int64_t padded_vocab);

// Megatron-LM's num_floating_point_operations(args, batch_size) for one
// iteration of `batch` sequences; padded_vocab is Megatron's padded vocabulary.
double model_flops_per_iteration(const ModelSpec& m, std::int64_t batch, std::int64_t seq_length,
                                 std::int64_t padded_vocab);
// Model FLOPs plus the recomputed forward work of the plan's recompute mode
// (full: every layer's forward again; selective: the attention core again).
double hardware_flops_per_iteration(const ModelSpec& m, const ParallelPlan& plan);
// Convenience: model FLOPs for the plan (vocabulary padded for plan.tp).
double model_flops_per_iteration(const ModelSpec& m, const ParallelPlan& plan);

}  // namespace cuboid
