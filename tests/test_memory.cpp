// Per-GPU memory against hand arithmetic, Korthikanti et al. 2022 Table 2 and
// Megatron-LM's theoretical memory report (theoretical_memory_usage.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using test::llama3_70b;

namespace {

constexpr double tight = 1e-12;
constexpr double MiB = 1024.0 * 1024.0;
constexpr double GiB = 1024.0 * MiB;

// Korthikanti et al.'s 22B GPT: 48 layers, h 6144, 64 heads, vocab 51200,
// without learned positions or linear biases, as Megatron's parameter formula
// assumes.
ModelSpec gpt_22b() {
  ModelSpec m = test::gpt_22b();
  m.name = "gpt";
  m.learned_position_embeddings = false;
  m.linear_bias = false;
  return m;
}

// Only the memory fields: capacity 80 GiB, 2 GiB reserved.
GpuProfile a100_80gb() {
  GpuProfile g;
  g.name = "A100-like";
  g.memory_bytes = 81920LL * 1024 * 1024;
  g.memory_reserve_bytes = 2LL * 1024 * 1024 * 1024;
  return g;
}

ParallelPlan plan(int tp, int pp, int dp, int micro_batch, std::int64_t global_batch,
                  std::int64_t seq, Recompute r, bool sp, bool flash) {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  p.seq_length = seq;
  p.recompute = r;
  p.sequence_parallel = sp;
  p.flash_attention = flash;
  p.schedule = Schedule::one_f_one_b;
  return p;
}

// Megatron-LM's compute_activation_memory (first stage), written out: every
// layer of the model at s*b*h*(18 + 4f/h), pp micro-batches of embedding input
// and dropout, the interleaving penalty or the m/pp discount, the output layer
// when pp == 1, all divided by t.
double megatron_activation_bytes(const ModelSpec& m, const ParallelPlan& p) {
  const double s = static_cast<double>(p.seq_length), b = p.micro_batch;
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size);
  const double L = static_cast<double>(m.num_layers), pp = p.pp;
  const double V = static_cast<double>(padded_vocab_size(m.vocab_size, p.tp));
  double act = s * b * h * (18 + 4 * f / h) * L;
  act += 8 * s * b * pp;
  act += s * b * h * pp;
  if (p.virtual_stages > 1) {
    act *= 1 + (pp - 1) / (pp * p.virtual_stages);
  } else if (p.pp > 1) {
    act *= std::min(1.0, static_cast<double>(p.num_micro_batches()) / pp);
  }
  if (p.pp == 1) act += s * b * h * 4 * (1 + V / h);
  return act / p.tp;
}

// Megatron-LM's compute_weight_and_optimizer_memory "most loaded shard", in
// parameters: (transformer / pp + embedding) / t (+ embedding / t untied, pp 1).
// Its transformer count (no linear biases, LayerNorm with bias, final norm):
// 10*L*h^2*((1 + f/h)/5 + g/(5a) + 2/(5h) + 1/(5Lh)).
double megatron_most_loaded_parameters(const ModelSpec& m, const ParallelPlan& p) {
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size);
  const double L = static_cast<double>(m.num_layers);
  const double ratio = static_cast<double>(m.num_kv_heads) / static_cast<double>(m.num_attention_heads);
  const double transformer =
      10 * L * h * h * ((1 + f / h) / 5 + ratio / 5 + 2 / (5 * h) + 1 / (5 * L * h));
  const double embedding = h * static_cast<double>(padded_vocab_size(m.vocab_size, p.tp));
  double shard = (transformer / p.pp + embedding) / p.tp;
  if (!m.tied_embeddings && p.pp == 1) shard += embedding / p.tp;
  return shard;
}

}  // namespace

TEST_CASE("bytes per parameter for each ZeRO stage at dp 8") {
  CHECK(bytes_per_parameter(0, 8, 4, 12) == 18.0);
  CHECK(bytes_per_parameter(1, 8, 4, 12) == 7.5);   // 6 + 12/8
  CHECK(bytes_per_parameter(2, 8, 4, 12) == 4.0);   // 2 + 16/8
  CHECK(bytes_per_parameter(3, 8, 4, 12) == 2.25);  // 18/8
  // dp 1: sharding saves nothing.
  for (int zero = 0; zero <= 3; ++zero) CHECK(bytes_per_parameter(zero, 1, 4, 12) == 18.0);
}

TEST_CASE("bytes per parameter with bf16 gradients (--grad-reduce-dtype bf16) at dp 8") {
  // 2 bf16 weight + 2 bf16 gradient + 12 fp32 master and Adam moments.
  CHECK(bytes_per_parameter(0, 8, 2, 12) == 16.0);
  CHECK(bytes_per_parameter(1, 8, 2, 12) == 5.5);   // 4 + 12/8
  CHECK(bytes_per_parameter(2, 8, 2, 12) == 3.75);  // 2 + 14/8
  CHECK(bytes_per_parameter(3, 8, 2, 12) == 2.0);   // 16/8
  for (int zero = 0; zero <= 3; ++zero) CHECK(bytes_per_parameter(zero, 1, 2, 12) == 16.0);
}

TEST_CASE("gradient bytes: the plan's reduce dtype, Megatron-FSDP's FP8 plans bf16") {
  ParallelPlan p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  CHECK(p.grad_element_bytes() == 4.0);  // megatron-core's default: fp32 main_grad
  p.trainer.dp_grad_bytes = 2;
  CHECK(p.grad_element_bytes() == 2.0);
  p.trainer.dp_grad_bytes = 4;
  p.precision = Precision::fp8_current;
  CHECK(p.grad_element_bytes() == 4.0);  // the distributed optimizer's DDP buffer
  p.zero_stage = 3;
  CHECK(p.grad_element_bytes() == 2.0);  // Megatron-FSDP: the parameters' dtype, bf16 for FP8
  p.precision = Precision::bf16;
  CHECK(p.grad_element_bytes() == 4.0);
}

TEST_CASE("Megatron-FSDP's gradients: its own dtype at ZeRO 2 / 3 (default bf16), the DP reduction's below") {
  ParallelPlan p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  p.trainer = find_trainer("megatron-core")->settings;
  CHECK(p.trainer.fsdp_grad_bytes == 2);  // --megatron-fsdp-main-grads-dtype auto: the bf16 parameters'
  CHECK(p.trainer.dp_grad_bytes == 4);
  for (const int zero : {0, 1}) {
    p.zero_stage = zero;
    CHECK(p.grad_element_bytes() == 4);  // the DDP buffer: grad_reduce_in_fp32
  }
  for (const int zero : {2, 3}) {
    p.zero_stage = zero;
    CHECK(p.grad_element_bytes() == 2);  // --grad-reduce-dtype fp32 does not reach Megatron-FSDP
    p.trainer.fsdp_grad_bytes = 4;       // --megatron-fsdp-main-grads-dtype fp32
    CHECK(p.grad_element_bytes() == 4);
    p.trainer.fsdp_grad_bytes = 2;
  }
  // ZeRO-3 over DP 2 of Llama-3-70B's first stage (4,541,464,576 parameters):
  // 16 bytes per parameter over 2 ranks (2 bf16 weight + 2 bf16 gradient +
  // 12 fp32 master and moments), and at the step the fp32 copy of the
  // gradient shard, 4 / 2 bytes (update_main_grads' .to(param.dtype)). And
  // the gathered units: a block on a TP 4 rank, (150,994,944 attention +
  // 704,643,072 MLP + 16,384 norms) / 4 = 213,913,600 elements, gathered in
  // bf16 with the blocks Megatron-FSDP prefetches until they hold 5e8
  // elements (ceil(2.34) = 3 more), and its bf16 gradients: x (2 x 4 + 2).
  const ModelSpec m = llama3_70b();
  const StageParameters first = stage_parameters(m, p, 0);
  CHECK(zero3_gathered_bytes(m, p, 0) == 2139136000.0);
  const MemoryReport bf16 = memory_per_gpu(m, p, a100_80gb());
  REQUIRE(bf16.peak_stage == 0);
  CHECK(bf16.weight_and_optimizer_bytes == 36331716608.0 + 2139136000.0);  // * 8, and the units
  CHECK(step_grad_copy_bytes(p, first) == 9082929152.0);                   // * 2
  p.trainer.fsdp_grad_bytes = 4;
  CHECK(zero3_gathered_bytes(m, p, 0) == 213913600.0 * (2 * 4 + 4));
  CHECK(memory_per_gpu(m, p, a100_80gb()).weight_and_optimizer_bytes == 40873181184.0 + 2566963200.0);  // * 9
  CHECK(step_grad_copy_bytes(p, first) == 0.0);
  // FSDP2 (torchtitan): no Megatron-FSDP dtype, no copy at ZeRO-3.
  p.trainer = find_trainer("torchtitan")->settings;
  CHECK(p.trainer.fsdp_grad_bytes == 0);
  CHECK(p.grad_element_bytes() == 4);
  p.trainer.dp_grad_bytes = 2;
  CHECK(step_grad_copy_bytes(p, first) == 0.0);
}

TEST_CASE("the precision-aware optimizer: FusedAdam's master-weight remainders and bf16 moments") {
  ParallelPlan p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  p.zero_stage = 1;
  CHECK(p.optimizer_state_bytes() == 12.0);  // fp32 master + m + v
  p.precision_aware_optimizer = true;
  // bf16: FusedAdam holds the master weights as the 16 bits the bf16 weight
  // lacks (store_param_remainders): 2 + 4 + 4.
  CHECK(p.optimizer_holds_master_weights());
  CHECK(p.optimizer_state_bytes() == 10.0);
  p.adam_moment_bytes = 2;  // --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16
  CHECK(p.optimizer_state_bytes() == 6.0);
  // ZeRO-1 at DP 8 with bf16 gradients: 2 weight + 2 gradient + 6 / 8.
  CHECK(bytes_per_parameter(1, 8, 2, p.optimizer_state_bytes()) == 4.75);
  // Per-tensor FP8: Megatron-Core keeps fp32 main weights itself: 4 + 2 + 2.
  p.precision = Precision::fp8_current;
  CHECK(!p.optimizer_holds_master_weights());
  CHECK(p.optimizer_state_bytes() == 8.0);
  // 16-bit gradients: the fp32 copy of the shard, unless FusedAdam reads the buffer.
  p.trainer.dp_grad_bytes = 2;
  CHECK(p.optimizer_casts_gradients());
  p.precision = Precision::bf16;
  CHECK(!p.optimizer_casts_gradients());
  // Megatron-FSDP keeps its own main weights.
  p.zero_stage = 3;
  CHECK(!p.optimizer_holds_master_weights());
  CHECK(p.optimizer_state_bytes() == 8.0);
  // Llama-3-70B, TP 4 x PP 4 x DP 2, ZeRO-1, fp32 gradients: 12 - 6 = 6 bytes
  // a parameter of the stage, over DP 2.
  const ModelSpec m = llama3_70b();
  p.zero_stage = 1;
  p.trainer.dp_grad_bytes = 4;
  ParallelPlan plain = p;
  plain.precision_aware_optimizer = false;
  plain.adam_moment_bytes = 4;
  const MemoryReport before = memory_per_gpu(m, plain, a100_80gb()), after = memory_per_gpu(m, p, a100_80gb());
  REQUIRE(before.peak_stage == after.peak_stage);
  const double params = stage_parameters(m, p, after.peak_stage).total();
  CHECK(before.weight_and_optimizer_bytes - after.weight_and_optimizer_bytes == doctest::Approx(params * 6 / 2));
}

TEST_CASE("Llama-3-70B with bf16 gradients on tp 4, pp 4, dp 2 by hand") {
  const ModelSpec m = llama3_70b();
  auto p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  p.trainer.dp_grad_bytes = 2;
  const StageParameters first = stage_parameters(m, p, 0);  // 4,541,464,576, all dense
  SUBCASE("ZeRO 0: 16 bytes per parameter; the step's fp32 copy of every gradient under the activations") {
    p.zero_stage = 0;
    CHECK(step_grad_copy_bytes(p, first) == 18165858304.0);  // 4,541,464,576 * 4
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.peak_stage == 0);
    CHECK(r.activation_bytes == 47714467840.0);            // as with fp32 gradients (below)
    CHECK(r.weight_and_optimizer_bytes == 72663433216.0);  // 4,541,464,576 * 16
  }
  SUBCASE("ZeRO 1: 4 + 12/2 = 10 bytes per parameter; the copy of the shard, 4/2") {
    p.zero_stage = 1;
    CHECK(step_grad_copy_bytes(p, first) == 9082929152.0);  // 4,541,464,576 * 2
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.weight_and_optimizer_bytes == 45414645760.0);  // 4,541,464,576 * 10
    p.trainer.dp_grad_bytes = 4;
    CHECK(step_grad_copy_bytes(p, first) == 0.0);  // `.float()` of an fp32 buffer is the buffer
  }
  SUBCASE("ZeRO 0 at 256 tokens: the copy outgrows the activations and sets the peak") {
    p.zero_stage = 0;
    p.seq_length = 256;
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    // Every stage at 16 + 4 = 20 bytes per parameter; the last holds the
    // most (4,541,466,624, the final norm): 90,829,332,480 + the 2 GiB reserve.
    CHECK(r.peak_stage == 3);
    CHECK(r.weight_and_optimizer_bytes + r.activation_bytes == 90829332480.0);
    CHECK(r.total_bytes == 90829332480.0 + 2 * GiB);
  }
  SUBCASE("ZeRO 3 (DeepSpeed, FSDP): sharded bf16 gradients, no copy priced") {
    p.zero_stage = 3;
    CHECK(step_grad_copy_bytes(p, first) == 0.0);
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    // 4,541,464,576 * 16 / 2, and a 213,913,600-element block gathered in
    // bf16 with the one FSDP2 prefetches, and its bf16 gradients: x 6.
    CHECK(r.weight_and_optimizer_bytes == 36331716608.0 + 1283481600.0);
  }
}

TEST_CASE("Korthikanti Table 2: one layer of the 22B GPT (s 2048, b 4, h 6144, a 64, t 8)") {
  const ModelSpec m = gpt_22b();
  // s*b*h = 2048 * 4 * 6144 = 50,331,648; 5*a*s^2*b/t = 5*64*2048^2*4/8 = 671,088,640
  // (= s*b*h * 5as/(ht) = s*b*h * 13.33).
  const double sbh = 50331648.0;
  const double scores_over_t = 671088640.0;
  SUBCASE("no recompute, no SP: sbh(10 + 24/t + 5as/(ht))") {
    const auto p = plan(8, 1, 1, 4, 4, 2048, Recompute::none, false, false);
    // 10 sbh + 3 sbh + 671,088,640 = 1,325,400,064
    CHECK(activation_bytes_per_layer(m, p) == 1325400064.0);
    CHECK(activation_bytes_per_layer(m, p) == 13 * sbh + scores_over_t);
  }
  SUBCASE("no recompute, SP: sbh/t(34 + 5as/h)") {
    const auto p = plan(8, 1, 1, 4, 4, 2048, Recompute::none, true, false);
    CHECK(activation_bytes_per_layer(m, p) == 884998144.0);  // 34 sbh / 8 + 671,088,640
    CHECK(activation_bytes_per_layer(m, p) == 34 * sbh / 8 + scores_over_t);
  }
  SUBCASE("selective + SP: 34 sbh / t") {
    const auto p = plan(8, 1, 1, 4, 4, 2048, Recompute::selective, true, false);
    CHECK(activation_bytes_per_layer(m, p) == 213909504.0);
  }
  SUBCASE("selective, no SP: sbh(10 + 24/t)") {
    const auto p = plan(8, 1, 1, 4, 4, 2048, Recompute::selective, false, false);
    CHECK(activation_bytes_per_layer(m, p) == 13 * sbh);
  }
  SUBCASE("full recompute: 2 sbh, / t with SP") {
    CHECK(activation_bytes_per_layer(m, plan(8, 1, 1, 4, 4, 2048, Recompute::full, false, false)) ==
          100663296.0);
    CHECK(activation_bytes_per_layer(m, plan(8, 1, 1, 4, 4, 2048, Recompute::full, true, false)) ==
          12582912.0);
  }
  SUBCASE("flash attention removes the 5as/h term") {
    CHECK(activation_bytes_per_layer(m, plan(8, 1, 1, 4, 4, 2048, Recompute::none, false, true)) ==
          13 * sbh);
    CHECK(activation_bytes_per_layer(m, plan(8, 1, 1, 4, 4, 2048, Recompute::none, true, true)) ==
          34 * sbh / 8);
  }
}

TEST_CASE("Llama-3-70B layer activations: GQA and SwiGLU generalisation") {
  const ModelSpec m = llama3_70b();
  const auto p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  // s*b = 8192. Replicated 10 sbh = 10 * 8192 * 8192 = 671,088,640.
  // Split: Q 2sbq + K, V 2 * 2sb*kv + proj input 2sbq = 2 * 8192 * (8192 + 2048 + 8192)
  //        = 301,989,888; SwiGLU 6 s b f = 6 * 8192 * 28672 = 1,409,286,144.
  // With SP everything / 4: (671,088,640 + 1,711,276,032) / 4 = 595,591,168.
  CHECK(activation_bytes_per_layer(m, p) == 595591168.0);
}

TEST_CASE("no dropout, no masks: Llama-3-70B as it trains (hidden and attention dropout 0)") {
  // torch's dropout returns its input at p = 0 without drawing a mask
  // (aten/src/ATen/native/Dropout.cpp, _dropout_impl), so the two hidden
  // dropout masks (1 byte per element each) and the embedding's are not kept.
  ModelSpec m = llama3_70b();
  m.hidden_dropout = 0;
  m.attention_dropout = 0;
  const auto p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  // Replicated 8 sbh = 536,870,912 (not 10 sbh); split as above 1,711,276,032;
  // with SP / 4: 562,036,736.
  CHECK(activation_bytes_per_layer(m, p) == 562036736.0);
  // The first stage: 20 layers x 4 in flight + the token ids alone (8 s b / t).
  auto z1 = p;
  z1.zero_stage = 1;
  CHECK(memory_per_gpu(m, z1, a100_80gb()).activation_bytes == 562036736.0 * 20 * 4 + 8.0 * 8192 / 4 * 4);
  // Unfused attention with its scores stored: the softmax output alone
  // (2 bytes a score, not 5): 2 * 64 heads * 8192^2 / 4 = 2,147,483,648 more.
  auto unfused = p;
  unfused.flash_attention = false;
  unfused.recompute = Recompute::none;
  CHECK(activation_bytes_per_layer(m, unfused) == 562036736.0 + 2.0 * 64 * 8192 * 8192 / 4);
  m.attention_dropout = 0.1;
  CHECK(activation_bytes_per_layer(m, unfused) == 562036736.0 + 5.0 * 64 * 8192 * 8192 / 4);
}

TEST_CASE("Megatron theoretical report: first-stage activations coincide (selective + SP)") {
  const ModelSpec m = gpt_22b();  // f = 4h: Megatron's 18 + 4f/h = 34
  SUBCASE("1F1B, pp 4, m = 8 >= pp") {
    const auto p = plan(8, 4, 1, 1, 8, 2048, Recompute::selective, true, true);
    REQUIRE(p.num_micro_batches() == 8);
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    // First stage: 34sbh/t * (48/4 layers) * 4 in flight + (8sb + sbh)/t * 4.
    const double s = 2048, h = 6144;
    const double by_hand = 34 * s * h / 8 * 12 * 4 + (8 * s + s * h) / 8 * 4;
    CHECK(megatron_activation_bytes(m, p) == doctest::Approx(by_hand).epsilon(tight));
    CHECK(r.peak_stage == 0);
    CHECK(r.activation_bytes == doctest::Approx(megatron_activation_bytes(m, p)).epsilon(tight));
  }
  SUBCASE("1F1B, pp 4, m = 2 < pp: Megatron's m/pp discount") {
    const auto p = plan(8, 4, 1, 1, 2, 2048, Recompute::selective, true, true);
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.peak_stage == 0);
    CHECK(r.activation_bytes == doctest::Approx(megatron_activation_bytes(m, p)).epsilon(tight));
  }
  SUBCASE("interleaved, pp 4, v 2: Megatron's penalty 1 + (pp-1)/(pp v)") {
    auto p = plan(8, 4, 1, 1, 8, 2048, Recompute::selective, true, true);
    p.schedule = Schedule::interleaved;
    p.virtual_stages = 2;
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.activation_bytes == doctest::Approx(megatron_activation_bytes(m, p)).epsilon(tight));
  }
  SUBCASE("pp 1: the output layer term s*b*h*4*(1 + V/h)/t is included") {
    const auto p = plan(8, 1, 1, 1, 4, 2048, Recompute::selective, true, true);
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.activation_bytes == doctest::Approx(megatron_activation_bytes(m, p)).epsilon(tight));
  }
}

TEST_CASE("Megatron most loaded shard: parameters coincide where the models agree") {
  ModelSpec m = gpt_22b();
  SUBCASE("pp 1, untied: embedding and LM head on the one stage") {
    m.tied_embeddings = false;
    const auto p = plan(8, 1, 1, 1, 4, 2048, Recompute::selective, true, true);
    CHECK(parameters_on_stage(m, p, 0) ==
          doctest::Approx(megatron_most_loaded_parameters(m, p)).epsilon(tight));
    // And it is the whole model / t.
    CHECK(parameters_on_stage(m, p, 0) ==
          doctest::Approx(static_cast<double>(m.parameter_count(8)) / 8).epsilon(tight));
  }
  SUBCASE("pp 4, tied: Megatron spreads the final norm over stages, we keep it on the last") {
    const auto p = plan(8, 4, 1, 1, 8, 2048, Recompute::selective, true, true);
    const double h = 6144;
    const double megatron = megatron_most_loaded_parameters(m, p);
    CHECK(parameters_on_stage(m, p, 0) == doctest::Approx(megatron - 2 * h / (4 * 8)).epsilon(tight));
    CHECK(parameters_on_stage(m, p, 3) ==
          doctest::Approx(parameters_on_stage(m, p, 0) + 2 * h / 8).epsilon(tight));
    // Middle stages: transformer layers only.
    CHECK(parameters_on_stage(m, p, 1) ==
          doctest::Approx(static_cast<double>(m.parameters_per_layer()) * 12 / 8).epsilon(tight));
    // The tied LM head is a second copy: the stages sum to the model plus one embedding.
    const double V = 51200;
    double sum = 0;
    for (int stage = 0; stage < 4; ++stage) sum += parameters_on_stage(m, p, stage) * 8;
    CHECK(sum == doctest::Approx(static_cast<double>(m.parameter_count(8)) + V * h).epsilon(tight));
  }
}

TEST_CASE("Llama-3-70B weights + optimizer on tp 4, pp 4, dp 2 by hand") {
  const ModelSpec m = llama3_70b();
  // Per layer: QKV 8192 * (8192 + 2 * 1024) = 83,886,080; proj 8192^2 = 67,108,864;
  // MLP 3 * 8192 * 28672 = 704,643,072; two RMSNorms 16,384 -> 855,654,400.
  // 20 layers per stage: 17,113,088,000.
  // Vocabulary padded to 512 (128 * tp 4): 251 * 512 = 128,512; embedding
  // 128,512 * 8192 = 1,052,770,304.
  // Stage 0: (17,113,088,000 + 1,052,770,304) / 4 = 4,541,464,576.
  // Stage 3: + final norm 8192 + LM head 1,052,770,304 -> 18,165,866,496 / 4 = 4,541,466,624.
  auto p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  CHECK(m.parameters_per_layer() == 855654400);
  CHECK(parameters_on_stage(m, p, 0) == 4541464576.0);
  CHECK(parameters_on_stage(m, p, 1) == 4278272000.0);  // 17,113,088,000 / 4
  CHECK(parameters_on_stage(m, p, 3) == 4541466624.0);
  SUBCASE("ZeRO 0: 18 bytes per parameter") {
    p.zero_stage = 0;
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    // The first stage's activations make it the peak; its 4,541,464,576 * 18.
    CHECK(r.peak_stage == 0);
    CHECK(r.weight_and_optimizer_bytes == 81746362368.0);
  }
  SUBCASE("ZeRO 1 (distributed optimizer): 6 + 12/2 = 12 bytes per parameter") {
    p.zero_stage = 1;
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.weight_and_optimizer_bytes == 54497574912.0);  // 4,541,464,576 * 12
    CHECK(r.parameters == 4541464576.0);
  }
}

TEST_CASE("Llama-3-70B memory_per_gpu pieces (tp 4, pp 4, dp 2, mb 1, gbs 64, seq 8192, "
          "selective, SP, 1F1B, ZeRO 1, A100 80 GB)") {
  const ModelSpec m = llama3_70b();
  auto p = plan(4, 4, 2, 1, 64, 8192, Recompute::selective, true, true);
  p.zero_stage = 1;
  const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
  // m = 64 / (1 * 2) = 32 micro-batches; the first stage holds pp = 4.
  // Activations: 595,591,168 per layer * 20 layers * 4 = 47,647,293,440
  //   + embedding (8 * 8192 + 8192 * 8192) / 4 * 4 = 67,174,400 -> 47,714,467,840.
  // (The last stage: 595,591,168 * 20 * 1 + 4sbh/t 67,108,864 + fp32 logits
  //  4 * 8192 * 128,512 / 4 = 1,052,770,304 -> 13,031,702,528.)
  CHECK(r.peak_stage == 0);
  CHECK(r.parameters == 4541464576.0);
  CHECK(r.weight_and_optimizer_bytes == 54497574912.0);  // 50.75 GiB
  CHECK(r.activation_bytes == 47714467840.0);            // 44.44 GiB
  CHECK(r.reserve_bytes == 2 * GiB);
  CHECK(r.total_bytes == 104359526400.0);                // 97.19 GiB
  CHECK(r.capacity_bytes == 81920 * MiB);
  CHECK_FALSE(r.fits());
  CHECK(r.headroom_bytes() == 81920 * MiB - 104359526400.0);
}

TEST_CASE("full recompute keeps one layer's full activations once") {
  const ModelSpec m = gpt_22b();
  const auto full = plan(8, 4, 1, 1, 8, 2048, Recompute::full, true, true);
  auto none = full;
  none.recompute = Recompute::none;
  const double s = 2048, h = 6144;
  // Stage 0: 2sbh/t * 12 layers * 4 in flight + one layer stored (34sbh/t, flash)
  //   + embedding (8sb + sbh)/t * 4.
  const double by_hand = 2 * s * h / 8 * 12 * 4 + 34 * s * h / 8 + (8 * s + s * h) / 8 * 4;
  const MemoryReport r = memory_per_gpu(m, full, a100_80gb());
  CHECK(r.peak_stage == 0);
  CHECK(r.activation_bytes == doctest::Approx(by_hand).epsilon(tight));
  CHECK(activation_bytes_per_layer(m, none) == 34 * s * h / 8);
  CHECK(r.activation_bytes < memory_per_gpu(m, none, a100_80gb()).activation_bytes);
}

TEST_CASE("in-flight micro-batches: GPipe, 1F1B, interleaved") {
  auto p = plan(1, 4, 1, 1, 8, 2048, Recompute::selective, false, true);  // m = 8
  SUBCASE("GPipe holds all m on every stage") {
    p.schedule = Schedule::gpipe;
    for (int stage = 0; stage < 4; ++stage) CHECK(in_flight_micro_batches(p, stage) == 8.0);
  }
  SUBCASE("1F1B holds pp - stage") {
    CHECK(in_flight_micro_batches(p, 0) == 4.0);
    CHECK(in_flight_micro_batches(p, 1) == 3.0);
    CHECK(in_flight_micro_batches(p, 2) == 2.0);
    CHECK(in_flight_micro_batches(p, 3) == 1.0);
    p.global_batch = 2;  // m = 2 < pp
    CHECK(in_flight_micro_batches(p, 0) == 2.0);
    CHECK(in_flight_micro_batches(p, 2) == 2.0);
    CHECK(in_flight_micro_batches(p, 3) == 1.0);
  }
  SUBCASE("interleaved v 2: (2(pp - r - 1) + (v - 1)pp + 1)/v chunk forwards") {
    p.schedule = Schedule::interleaved;
    p.virtual_stages = 2;
    // Stage 0: (6 + 4 + 1)/2 = 5.5 = 4 * (1 + 3/8), Megatron's penalty.
    CHECK(in_flight_micro_batches(p, 0) == 5.5);
    CHECK(in_flight_micro_batches(p, 1) == 4.5);  // (4 + 4 + 1)/2
    CHECK(in_flight_micro_batches(p, 2) == 3.5);  // (2 + 4 + 1)/2
    CHECK(in_flight_micro_batches(p, 3) == 2.5);  // (0 + 4 + 1)/2
    p.global_batch = 4;  // m = 4: capped at all micro-batches
    CHECK(in_flight_micro_batches(p, 0) == 4.0);
    CHECK(in_flight_micro_batches(p, 1) == 4.0);
    CHECK(in_flight_micro_batches(p, 2) == 3.5);
  }
  SUBCASE("pp 1: one micro-batch at a time") {
    p.pp = 1;
    CHECK(in_flight_micro_batches(p, 0) == 1.0);
    p.schedule = Schedule::gpipe;
    CHECK(in_flight_micro_batches(p, 0) == 1.0);
  }
}

TEST_CASE("GPipe needs more memory than 1F1B; the reserve and capacity come from the profile") {
  const ModelSpec m = gpt_22b();
  auto p = plan(8, 4, 1, 1, 16, 2048, Recompute::selective, true, true);
  const MemoryReport one_f_one_b = memory_per_gpu(m, p, a100_80gb());
  p.schedule = Schedule::gpipe;
  const MemoryReport gpipe = memory_per_gpu(m, p, a100_80gb());
  CHECK(gpipe.activation_bytes > one_f_one_b.activation_bytes);
  // 1F1B peaks on the first stage (pp micro-batches in flight); GPipe holds all
  // m on every stage, so the last stage (LM head copy, logits) is the peak.
  CHECK(one_f_one_b.peak_stage == 0);
  CHECK(gpipe.peak_stage == 3);
  // GPipe, last stage: 34sbh/t * 12 layers * 16 + 4sbh/t + 4sbV/t.
  const double s = 2048, h = 6144, V = 51200;
  CHECK(gpipe.activation_bytes ==
        doctest::Approx(34 * s * h / 8 * 12 * 16 + 4 * s * h / 8 + 4 * s * V / 8).epsilon(tight));
  CHECK(gpipe.total_bytes == doctest::Approx(gpipe.weight_and_optimizer_bytes + gpipe.activation_bytes +
                                             gpipe.reserve_bytes).epsilon(tight));
}

namespace {

// Llama-3-8B (h 4096, SwiGLU f 14336) at 4096 tokens, one micro-batch,
// flash attention, on 8 GPUs with DP 8.
cuboid::ParallelPlan modules_plan(std::uint8_t modules, int tp = 1) {
  cuboid::ParallelPlan p;
  p.tp = tp;
  p.dp = 8 / tp;
  p.seq_length = 4096;
  p.global_batch = 8;
  p.sequence_parallel = tp > 1;
  p.recompute = cuboid::Recompute::selective;
  p.recompute_modules = modules;
  return p;
}

std::vector<std::string> op_names(const std::vector<cuboid::Op>& ops) {
  std::vector<std::string> out;
  for (const cuboid::Op& op : ops) out.push_back(op.name);
  return out;
}

}  // namespace

TEST_CASE("recompute modules: a recomputed MLP keeps its input only and runs its forward again") {
  using namespace cuboid;
  const ModelSpec m = test::llama3_8b();
  constexpr auto kMlp = static_cast<std::uint8_t>(RecomputeModule::mlp);
  constexpr auto kCore = static_cast<std::uint8_t>(RecomputeModule::core_attn);
  const ParallelPlan attn = modules_plan(0), mlp = modules_plan(kMlp);
  // FC1's output (2 x 14336 wide) and SwiGLU's output, bf16: 6 s f bytes.
  CHECK(layer_activation_bytes(m, attn, false) - layer_activation_bytes(m, mlp, false) == 6 * 4096.0 * 14336);
  // FP8: FC2's FP8 input (s f) is not saved either, and the MLP input is
  // kept as the checkpoint's bf16 tensor, not FC1's FP8 copy (+ s h).
  ParallelPlan attn8 = attn, mlp8 = mlp;
  attn8.precision = mlp8.precision = Precision::fp8_current;
  CHECK(layer_activation_bytes(m, attn8, false) - layer_activation_bytes(m, mlp8, false) ==
        6 * 4096.0 * 14336 - 4096.0 * 14336 - 4096.0 * 4096);
  // The recompute list: the MLP's forward (flash attention recomputes its
  // core inside its own backward), with SP its all-gather and reduce-scatter.
  CHECK(transformer_layer_ops(m, attn).recompute.empty());
  CHECK(op_names(transformer_layer_ops(m, mlp).recompute) == std::vector<std::string>{op::fc1, op::act, op::fc2});
  CHECK(op_names(transformer_layer_ops(m, modules_plan(kMlp, 2)).recompute) ==
        std::vector<std::string>{op::tp_ag_mlp, op::fc1, op::act, op::fc2, op::tp_rs_mlp});
  // Hardware FLOPs: 32 layers x 3 GEMMs x 2 h f per token x 8 x 4096 tokens;
  // core_attn adds the core's forward as before (Megatron's count).
  const double tokens = 8 * 4096.0;
  const double mlp_flops = 32 * 3 * 2 * 4096.0 * 14336 * tokens;
  CHECK(hardware_flops_per_iteration(m, mlp) - model_flops_per_iteration(m, mlp) == doctest::Approx(mlp_flops).epsilon(1e-12));
  const ParallelPlan both = modules_plan(kCore | kMlp);
  CHECK(hardware_flops_per_iteration(m, both) - hardware_flops_per_iteration(m, mlp) ==
        doctest::Approx(hardware_flops_per_iteration(m, attn) - model_flops_per_iteration(m, attn)).epsilon(1e-9));
  // core_attn alone is --recompute selective.
  CHECK(layer_activation_bytes(m, modules_plan(kCore), false) == layer_activation_bytes(m, attn, false));
}

TEST_CASE("FP8 attention's saved activations: the core keeps quantized copies of Q, K and V") {
  using namespace cuboid;
  const ModelSpec m = test::llama3_8b();
  ParallelPlan p = modules_plan(0);
  p.recompute = Recompute::none;
  // Llama 3 8B, one micro-batch of 4,096 tokens, TP 1: Q, K, V are 4,096 x
  // (4,096 + 2 x 1,024) elements, the core's output 4,096 x 4,096.
  const double qkv = 4096.0 * (4096 + 2 * 1024), out = 4096.0 * 4096;
  const auto saved = [&](Precision precision, bool fp8_attention) {
    ParallelPlan q = p;
    q.precision = precision;
    q.fp8_attention = fp8_attention;
    return layer_activation_bytes(m, q, false);
  };
  // MXFP8: rowwise and columnwise copies with their E8M0 scales, 2 x (1 +
  // 1/32) bytes an element instead of the bf16 tensors' 2.
  CHECK(saved(Precision::mxfp8, true) - saved(Precision::mxfp8, false) ==
        doctest::Approx(qkv * (2 * (1 + 1.0 / 32) - 2)));
  // Per-tensor current scaling: the rowwise E4M3 copy, 1 byte.
  CHECK(saved(Precision::fp8_current, false) - saved(Precision::fp8_current, true) == doctest::Approx(qkv));
  // Delayed scaling: also the core's FP8 output instead of its bf16 one
  // (linear_proj keeps its own quantized copy either way).
  CHECK(saved(Precision::fp8_delayed, false) - saved(Precision::fp8_delayed, true) == doctest::Approx(qkv + out));
  ParallelPlan d = p;
  d.precision = Precision::fp8_delayed;
  CHECK(projection_input_bytes(d) == 3.0);
  d.fp8_attention = true;
  CHECK(projection_input_bytes(d) == 2.0);
  CHECK(core_input_copy_bytes(d) == 1.0);
  // A checkpointed core keeps the checkpoint's bf16 inputs: nothing changes.
  d.recompute = Recompute::selective;
  CHECK(core_input_copy_bytes(d) == 0.0);
  ParallelPlan d_off = d;
  d_off.fp8_attention = false;
  CHECK(layer_activation_bytes(m, d, false) == layer_activation_bytes(m, d_off, false));
}

TEST_CASE("recompute modules: parsed by Megatron's names; what Megatron-Core or cuboid refuses") {
  using namespace cuboid;
  CHECK(parse_recompute_modules("mlp,core_attn", "cl", "--recompute-modules") == 3);
  CHECK(recompute_modules_string(3) == "core_attn,mlp");
  CHECK(test::input_error_message([] { (void)parse_recompute_modules("core_attn,mlps", "cl", "--recompute-modules"); }) ==
        "cl: --recompute-modules: unknown recompute module \"mlps\" (fix: use a comma-separated list of core_attn, "
        "mlp, layernorm, moe_act, moe, shared_experts, mla_up_proj)");
  const ModelSpec m = test::llama3_8b();
  const Cluster c = test::dgx_a100(1);
  const auto bits = [](RecomputeModule x) { return static_cast<std::uint8_t>(x); };
  // layernorm is fused into the linear layers of a dense layer: accepted, nothing recomputed.
  ParallelPlan p = modules_plan(bits(RecomputeModule::layernorm));
  CHECK_FALSE(check_plan(p, m, c));
  CHECK(transformer_layer_ops(m, p).recompute.empty());
  p.recompute_modules = bits(RecomputeModule::moe_act);
  auto r = check_plan(p, m, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::recompute_module_refused);
  CHECK(describe(*r, m, c) ==
        "Megatron-Core recomputes moe_act only with grouped expert GEMMs (an MoE model) and without delayed FP8 scaling");
  p.recompute_modules = bits(RecomputeModule::mlp);
  p.recompute = Recompute::full;
  r = check_plan(p, m, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::recompute_modules_need_selective);
  p.recompute = Recompute::selective;
  p.trainer.preset = "megatron-2022";
  p.flash_attention = p.grad_accum_fusion = false;  // as megatron-2022 runs
  r = check_plan(p, m, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::trainer_no_recompute_modules);
  CHECK(r->field == PlanField::recompute_modules);
}

TEST_CASE("torchtitan's pipeline with FSDP: the stage's gradients unsharded in fp32, ZeRO-3's parameters gathered") {
  // torch.distributed.pipelining turns FSDP's gradient sync and resharding
  // after backward off until the last backward (pp_fsdp_no_sync). Llama-3-70B
  // at TP 4 x PP 4 x DP 2: stage 0 holds 4,541,464,576 parameters (above).
  const ModelSpec m = llama3_70b();
  auto p = plan(4, 4, 2, 1, 64, 8192, Recompute::full, true, true);
  const double params = 4541464576.0;
  p.trainer.pp_fsdp_no_sync = true;
  SUBCASE("ZeRO-3: 18/2 priced + 4 - 4/2 (fp32 gradients whole, not sharded) + 2 (bf16 gathered) = 13 bytes") {
    p.zero_stage = 3;
    CHECK(pp_fsdp_no_sync_bytes(p, stage_parameters(m, p, 0)) == params * 4);  // 18,165,858,304
    const MemoryReport r = memory_per_gpu(m, p, a100_80gb());
    CHECK(r.peak_stage == 0);
    CHECK(r.weight_and_optimizer_bytes == 59039039488.0);  // 4,541,464,576 x 13
    p.trainer.pp_fsdp_no_sync = false;
    // x 9, and FSDP2's gathered block and the one after it in bf16 with the
    // block's fp32 gradients: 213,913,600 x (2 x 2 + 4).
    CHECK(memory_per_gpu(m, p, a100_80gb()).weight_and_optimizer_bytes == 40873181184.0 + 1711308800.0);
  }
  SUBCASE("ZeRO-2: 2 + 16/2 priced + 4 - 4/2 = 12 bytes (the bf16 weights were whole already)") {
    p.zero_stage = 2;
    CHECK(pp_fsdp_no_sync_bytes(p, stage_parameters(m, p, 0)) == params * 2);
    CHECK(memory_per_gpu(m, p, a100_80gb()).weight_and_optimizer_bytes == 54497574912.0);  // x 12
  }
  SUBCASE("nothing without the pipeline, without FSDP's sharding or with ZeRO 0 / 1") {
    p.zero_stage = 3;
    ParallelPlan one_stage = p;
    one_stage.pp = 1;
    one_stage.dp = 8;
    CHECK(pp_fsdp_no_sync_bytes(one_stage, stage_parameters(m, one_stage, 0)) == 0);
    ParallelPlan unsharded = p;
    unsharded.dp = 1;
    CHECK(pp_fsdp_no_sync_bytes(unsharded, stage_parameters(m, unsharded, 0)) == 0);
    for (int zero : {0, 1}) {
      ParallelPlan q = p;
      q.zero_stage = zero;
      CHECK(pp_fsdp_no_sync_bytes(q, stage_parameters(m, q, 0)) == 0);
    }
  }
}
