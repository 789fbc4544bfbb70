// CPU activation offloading: which layers, their bytes, the copies' time and
// what of it the compute stream waits for (offload.hpp).
#include "cuboid/cost/offload.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/precision.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/memory.hpp"

namespace cuboid {

namespace {

// Megatron-Core's min_offloaded_tensor_size default (transformer_config.py:1343
// at d98e8a64): smaller tensors stay on the GPU (tensor_need_offloading_checker).
constexpr double kMinOffloadedElements = 1024.0 * 1024.0;

// A tensor of `elements` elements at `bytes` bytes each, if it is offloaded.
double tensor(double elements, double bytes) { return elements >= kMinOffloadedElements ? elements * bytes : 0.0; }

bool moe_layer_at(const ModelSpec& m, int layer) {
  return m.moe.enabled() && m.moe.moe_layers[static_cast<std::size_t>(layer)];
}

}  // namespace

ActivationOffload activation_offload(const ModelSpec& m, const ParallelPlan& plan) {
  ActivationOffload off{static_cast<int>(m.num_layers), plan.offload_layers, {}};
  if (plan.offload_modules == 0) return off;
  off.offloaded = off.layers;
  off.fine.assign(static_cast<std::size_t>(off.layers), 1);
  // Each chunk's last layer keeps its modules on the GPU.
  for (int s = 0; s < plan.pp; ++s)
    for (int c = 0; c < chunks_per_stage(plan); ++c) {
      const int n = layers_in_chunk(plan, m.num_layers, s, c);
      if (n > 0) off.fine[static_cast<std::size_t>(first_layer_of_chunk(plan, m.num_layers, s, c) + n - 1)] = 0;
    }
  return off;
}

ActivationOffload fine_offload_chunk(int layers) {
  ActivationOffload off{layers, layers, std::vector<char>(static_cast<std::size_t>(std::max(layers, 0)), 1)};
  if (layers > 0) off.fine.back() = 0;
  return off;
}

// The tensors each module's offload group saves, Megatron-Core d98e8a64 with
// Transformer Engine (s x b tokens of the rank's sequence; "replicated"
// tensors split by TP only with sequence parallelism), matched to what
// layer_activation_bytes counts:
//  - attn_norm: the input norm's input (bf16, h wide), where the norm is a
//    module of its own: before latent attention's down projections; fused
//    into linear_qkv otherwise (an IdentityOp, skipped:
//    transformer_layer.py:1547-1549); off when the CUDA graphs' modules
//    name attn (:1565-1572; a whole-layer graph names none: CudaGraphs::names);
//  - qkv_linear: standard attention's linear_qkv, a LayerNormColumnParallel
//    linear, saves the norm's input (bf16) and output (the GEMM input,
//    quantized under FP8); latent attention's get_query_key_value_tensors
//    the down projections' input (the norm's output) and the two latents'
//    norms' inputs and outputs (multi_latent_attention.py:343-352);
//  - core_attn: the fused attention's Q, K, V and output (bf16), unless the
//    core is recomputed (its checkpoint bypasses the group, attention.py
//    :1555-1606); the output is the projection's input, freed with attn_proj;
//  - attn_proj: linear_proj's saved input (the core's bf16 output, or its
//    quantized copy under delayed scaling: projection_saves_quantized_copy);
//  - mlp_norm: an MoE layer's pre-MLP norm's input (a dense layer's norm is
//    fused into linear_fc1); off when the graphs' modules name attn or
//    moe_router (transformer_layer.py:1575-1580);
//  - expert_fc1: the grouped FC1's input, the routed tokens as TE saves them
//    (expert_gemm_input_bytes: bf16 outside MXFP8 and NVFP4, where
//    set_save_original_input keeps the original, experts.py:278-284);
//  - moe_act: the activation's input, FC1's output (bf16, 2f wide gated;
//    experts.py:941-1037).
// With full recomputation the groups run inside the layer's checkpoint and
// save nothing.
ModuleOffload module_offload(const ModelSpec& m, const ParallelPlan& plan, OffloadModule module, bool moe_layer) {
  ModuleOffload out;
  if (!plan.offloads(module) || plan.recompute == Recompute::full) return out;
  const double sb = static_cast<double>(plan.seq_per_rank()) * plan.micro_batch;
  const double h = static_cast<double>(m.hidden_size);
  const double t = plan.tp;
  const double r = plan.sequence_parallel ? t : 1.0;  // the replicated tensors' split
  const double e = quantized_element_bytes(plan.precision);
  const CudaGraphs& g = plan.trainer.cuda_graphs;
  const bool attn_graph = g.names(CudaGraphModule::attn);
  const bool router_graph = g.names(CudaGraphModule::moe_router);
  auto both = [&](double bytes) {
    out.copied += bytes;
    out.freed += bytes;
  };
  const double a = static_cast<double>(m.num_attention_heads);
  switch (module) {
    case OffloadModule::attn_norm:
      if (m.mla.enabled() && !attn_graph) both(tensor(sb * h / r, kBf16Bytes));
      break;
    case OffloadModule::qkv_linear:
      if (m.mla.enabled()) {
        const bool up_recomputed = plan.recomputes(RecomputeModule::mla_up_proj);
        both(tensor(sb * h / r, e));
        for (const std::int64_t rank : {m.mla.q_lora_rank, m.mla.kv_lora_rank}) {
          both(tensor(sb * static_cast<double>(rank) / r, kBf16Bytes));
          if (!up_recomputed) both(tensor(sb * static_cast<double>(rank) / r, e));
        }
      } else {
        both(tensor(sb * h / r, kBf16Bytes));
        both(tensor(sb * h / r, e));
      }
      break;
    case OffloadModule::core_attn: {
      if (plan.checkpoints(RecomputeModule::core_attn)) break;
      double q = 0, k = 0, v = 0, o = 0;
      if (m.mla.enabled()) {
        const double qk = static_cast<double>(m.mla.qk_head_dim + m.mla.qk_rope_head_dim);
        q = k = a * qk / t;
        v = o = a * static_cast<double>(m.mla.v_head_dim) / t;
      } else {
        q = o = static_cast<double>(m.query_projection_size()) / t;
        k = v = static_cast<double>(m.kv_projection_size()) / t;
      }
      // Under FP8 attention the core's own quantized Q, K, V (and, under
      // delayed scaling, its FP8 output) are what it saves.
      const double qkv_bytes = core_saved_input_bytes(plan);
      const double o_bytes = core_saved_output_bytes(plan);
      for (const double width : {q, k, v}) out.copied += tensor(sb * width, qkv_bytes);
      out.copied += tensor(sb * o, o_bytes);
      // Freed: Q, K and V as memory.cpp counts them (latent attention's are
      // not kept under mla_up_proj recomputation, which discards them), and
      // the output where linear_proj keeps a quantized copy of its own
      // (delayed scaling); otherwise linear_proj holds the output too and
      // attn_proj frees it.
      if (core_input_copy_bytes(plan) > 0 || !(m.mla.enabled() && plan.recomputes(RecomputeModule::mla_up_proj)))
        for (const double width : {q, k, v}) out.freed += tensor(sb * width, qkv_bytes);
      if (plan.flash_attention && projection_saves_quantized_copy(plan)) out.freed += tensor(sb * o, o_bytes);
      // Without a fused kernel, the scores the core keeps too.
      if (!plan.flash_attention) {
        const double s = static_cast<double>(plan.seq_per_rank());
        both(tensor(a * s * sb / t, m.attention_dropout > 0 ? 5.0 : 2.0));
      }
      break;
    }
    case OffloadModule::attn_proj: {
      const double width = m.mla.enabled() ? a * static_cast<double>(m.mla.v_head_dim)
                                           : static_cast<double>(m.query_projection_size());
      // The bf16 output itself where linear_proj keeps it, else its
      // quantized copy.
      both(tensor(sb * width / t, projection_saves_quantized_copy(plan) ? e : kBf16Bytes));
      break;
    }
    case OffloadModule::mlp_norm:
      if (moe_layer && !attn_graph && !router_graph) both(tensor(sb * h / r, kBf16Bytes));
      break;
    case OffloadModule::expert_fc1: {
      if (!moe_layer) break;
      const double rows = expert_tokens(m, plan);
      both(tensor(rows * h, expert_gemm_input_bytes(plan, ExpertGemm::fc1)));
      break;
    }
    case OffloadModule::moe_act: {
      if (!moe_layer) break;
      const double rows = expert_tokens(m, plan);
      const double fe = static_cast<double>(m.moe.expert_ffn_hidden_size / plan.expert_tp());
      both(tensor(rows * fe * (m.gated_mlp() ? 2.0 : 1.0), kBf16Bytes));
      break;
    }
  }
  return out;
}

ModuleOffload layer_module_offload(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer) {
  ModuleOffload sum;
  for (const OffloadModule module : {OffloadModule::attn_norm, OffloadModule::qkv_linear, OffloadModule::core_attn,
                                     OffloadModule::attn_proj, OffloadModule::mlp_norm, OffloadModule::expert_fc1,
                                     OffloadModule::moe_act}) {
    const ModuleOffload one = module_offload(m, plan, module, moe_layer);
    sum.copied += one.copied;
    sum.freed += one.freed;
  }
  return sum;
}

double offloaded_layer_bytes(const ModelSpec& m, const ParallelPlan& plan, int layer) {
  const bool moe = moe_layer_at(m, layer);
  if (plan.offload_modules != 0) return layer_module_offload(m, plan, moe).copied;
  return layer_activation_bytes(m, plan, moe);
}

double offloaded_host_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  double bytes = 0;
  const auto layers = static_cast<int>(std::min<std::int64_t>(plan.offload_layers, m.num_layers));
  for (int i = 0; i < layers; ++i) bytes += offloaded_layer_bytes(m, plan, i);
  return bytes;
}

TimeNs host_copy_ns(const HostLink& link, double bytes, bool to_host) {
  const double GBps = to_host ? link.d2h_GBps : link.h2d_GBps;
  return static_cast<TimeNs>(std::llround(bytes / GBps));  // bytes / (GB/s) = ns
}

OffloadExposure offload_exposure(const ActivationOffload& off, std::span<const TimeNs> fwd_ns,
                                 std::span<const TimeNs> bwd_ns, std::span<const TimeNs> to_host_ns,
                                 std::span<const TimeNs> from_host_ns) {
  OffloadExposure e;
  std::vector<TimeNs> done(static_cast<std::size_t>(off.offloaded), 0);
  // Forward: layer j waits for the copies due before it, then runs; an
  // offloaded layer's copies start once it ends and the stream is free.
  TimeNs t = 0, stream_free = 0;
  for (int j = 0; j < off.layers; ++j) {
    if (const int i = off.due_before(j); i >= 0 && done[static_cast<std::size_t>(i)] > t) {
      e.forward_ns += done[static_cast<std::size_t>(i)] - t;
      t = done[static_cast<std::size_t>(i)];
    }
    t += fwd_ns[static_cast<std::size_t>(j)];
    if (off.offloads(j)) {
      stream_free = std::max(stream_free, t) + to_host_ns[static_cast<std::size_t>(j)];
      done[static_cast<std::size_t>(j)] = stream_free;
    }
  }
  // Backward, last layer first. CPU offloading's copies were all done
  // before the last layer's forward; fine-grained offloading's may still run
  // (the stream is free once they end).
  stream_free = std::max<TimeNs>(0, stream_free - t);
  t = 0;
  for (int j = off.layers - 1; j >= 0; --j) {
    if (const int i = off.reload_issued_at(j); i >= 0) {
      stream_free = std::max(stream_free, t) + from_host_ns[static_cast<std::size_t>(i)];
      done[static_cast<std::size_t>(i)] = stream_free;
    }
    if (off.offloads(j) && done[static_cast<std::size_t>(j)] > t) {
      e.backward_ns += done[static_cast<std::size_t>(j)] - t;
      t = done[static_cast<std::size_t>(j)];
    }
    t += bwd_ns[static_cast<std::size_t>(j)];
  }
  return e;
}

}  // namespace cuboid
