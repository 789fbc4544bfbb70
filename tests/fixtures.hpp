#pragma once
// Fixtures the unit tests share, built in code so each test's numbers do not
// depend on the cards under models/ and topologies/: an A100 GPU profile, DGX
// A100 nodes on an HDR fat tree, and the model shapes the papers use (GPT of
// Korthikanti et al. 2022, GPT-3 175B, Llama-3-70B and 8B). A test that needs a
// different value copies a fixture and sets the field where it is used.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid::test {

// The message of the InputError that f() throws, or "<no InputError>", so a
// test compares the whole one-line message a user would read.
template <typename F>
std::string input_error_message(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "<no InputError>";
}

// The source tree (the build passes CUBOID_SOURCE_ROOT_DIR; meson runs the
// tests from the source root otherwise).
inline std::filesystem::path source_root() {
#ifdef CUBOID_SOURCE_ROOT_DIR
  return CUBOID_SOURCE_ROOT_DIR;
#else
  return ".";
#endif
}

// A100 SXM4 80GB (hardware.md: 312 TFLOP/s, 2039 GB/s, 108 SMs, MAMF 271.2 /
// 312 = 0.869). Memory-bound efficiency and launch cost (none) are test values.
inline GpuProfile a100() {
  GpuProfile g;
  g.name = "A100-SXM4-80GB";
  g.peak_bf16_flops = 312e12;
  g.hbm_bandwidth_Bps = 2039e9;
  g.memory_bytes = 80LL << 30;
  g.sm_count = 108;
  g.gemm_max_efficiency = 0.869;
  g.memory_bound_efficiency = 0.8;
  g.kernel_launch_ns = 0;
  g.memory_reserve_bytes = 2LL << 30;
  return g;
}

// DGX A100 nodes (hardware.md): NVSwitch busbw 220 GB/s (all_reduce 230),
// 8 x HDR NICs at 25 GB/s line rate, 24 GB/s busbw each, rail-optimised, a
// leaf/spine fat tree with `nodes_per_leaf` nodes under each leaf.
inline Cluster dgx_a100(int nodes, int nodes_per_leaf = 32, double oversubscription = 1.0) {
  Cluster c;
  c.name = "test-dgx-a100";
  c.nodes = nodes;
  c.gpus_per_node = 8;
  c.gpu = a100();
  c.intra.kind = "nvswitch";
  c.intra.link_bandwidth_GBps = 300;
  c.intra.allreduce_busbw_GBps = 230;
  c.intra.busbw_GBps = 220;
  c.intra.latency_ns = 1000;
  c.inter.kind = "infiniband-hdr";
  c.inter.nics_per_node = 8;
  c.inter.nic_bandwidth_Gbps = 200;
  c.inter.nic_busbw_GBps = 24;
  c.inter.latency_ns = 3000;
  c.inter.switch_latency_ns = 500;
  c.inter.levels = 2;
  c.inter.nodes_per_leaf = nodes_per_leaf;
  c.inter.oversubscription = oversubscription;
  c.inter.rail_optimized = true;
  return c;
}

// A Megatron-style GPT: f = 4h, GELU, LayerNorm, embedding tied to the LM
// head, learned absolute positions, biases on every linear layer. The default
// vocabulary and sequence are those of Korthikanti et al. Table 3 (51200, 2048).
inline ModelSpec gpt(std::int64_t layers, std::int64_t hidden, std::int64_t heads, std::int64_t vocab = 51200,
                     std::int64_t seq = 2048) {
  ModelSpec m;
  m.name = "gpt-test";
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.num_kv_heads = heads;
  m.head_dim = hidden / heads;
  m.ffn_hidden_size = 4 * hidden;
  m.activation = Activation::gelu;
  m.normalization = Normalization::layernorm;
  m.vocab_size = vocab;
  m.seq_length = seq;
  m.max_position_embeddings = seq;
  m.tied_embeddings = true;
  m.learned_position_embeddings = true;
  m.linear_bias = true;
  return m;
}

// Korthikanti et al.'s 22B GPT: 48 layers, h 6144, 64 heads, vocab 51200.
inline ModelSpec gpt_22b() {
  ModelSpec m = gpt(48, 6144, 64);
  m.name = "gpt-22b";
  return m;
}

// GPT-3 175B (Brown et al. 2020, Table 2.1; models/gpt3-175b.json): 96
// layers, d_model 12288, 96 heads, the GPT-2 BPE vocabulary of 50257.
inline ModelSpec gpt3_175b() {
  ModelSpec m = gpt(96, 12288, 96, 50257, 2048);
  m.name = "gpt3-175b";
  return m;
}

// A Llama-3 shape: GQA with 8 KV heads, head_dim 128, SwiGLU, RMSNorm, no
// biases, untied embeddings, vocab 128256, s 8192.
inline ModelSpec llama3(std::string name, std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                        std::int64_t ffn) {
  ModelSpec m;
  m.name = std::move(name);
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.num_kv_heads = 8;
  m.head_dim = hidden / heads;
  m.ffn_hidden_size = ffn;
  m.activation = Activation::swiglu;
  m.normalization = Normalization::rmsnorm;
  m.vocab_size = 128256;
  m.seq_length = 8192;
  m.max_position_embeddings = 8192;
  m.tied_embeddings = false;
  return m;
}

inline ModelSpec llama3_70b() { return llama3("llama3-70b", 80, 8192, 64, 28672); }
inline ModelSpec llama3_8b() { return llama3("llama3-8b", 32, 4096, 32, 14336); }

// A small Mixtral-like model (test_expert_parallel, test_moe_routing): 4
// layers, h 1024, 16 heads (4 KV, head_dim 64), SwiGLU, RMSNorm, vocab 32,000
// untied; every layer an MoE layer of 8 experts of FFN 2048, top-2; the
// router's load from the card's default (router_load_imbalance unset).
inline ModelSpec small_mixtral_model() {
  ModelSpec m = llama3("small-mixtral", 4, 1024, 16, 4096);
  m.num_kv_heads = 4;
  m.vocab_size = 32000;
  m.seq_length = 2048;
  m.max_position_embeddings = 2048;
  m.moe.num_experts = 8;
  m.moe.experts_per_token = 2;
  m.moe.expert_ffn_hidden_size = 2048;
  m.moe.moe_layers.assign(4, true);
  return m;
}

// 16 GPUs: TP 2 (SP) x PP 2 x DP 4, the experts as EP 4 x ETP 1 x expert-DP
// 2; micro-batch 1, global batch 64 x 2,048 tokens, ZeRO 1, no recompute.
inline ParallelPlan ep4_plan() {
  ParallelPlan p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 4;
  p.ep = 4;
  p.etp = 1;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_length = 2048;
  p.sequence_parallel = true;
  p.recompute = Recompute::none;
  p.zero_stage = 1;
  return p;
}

// A plan of micro-batch 1 with full recomputation and SP wherever TP > 1:
// the builder's and the step description's tests walk their mechanisms on it.
inline ParallelPlan recompute_plan(int tp, int pp, int dp, std::int64_t global_batch, int zero_stage = 1) {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = global_batch;
  p.recompute = Recompute::full;
  p.sequence_parallel = tp > 1;
  p.zero_stage = zero_stage;
  return p;
}

}  // namespace cuboid::test
