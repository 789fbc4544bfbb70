// Model and hardware FLOPs against hand arithmetic, Megatron-LM's closed form
// and the MFU numbers of Korthikanti et al. 2022 (tests/data/reference/korthikanti2022.csv).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuboid/cost/flops.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "reference_data.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

constexpr double tight = 1e-12;

ParallelPlan plan_for(int tp, std::int64_t global_batch, std::int64_t seq, Recompute r) {
  ParallelPlan p;
  p.tp = tp;
  p.global_batch = global_batch;
  p.seq_length = seq;
  p.recompute = r;
  return p;
}

// Megatron-LM's transformer_flops closed form, written out independently:
// 12 * B * s * L * h^2 * [ (1 + g/a + s/(2h)) * q/h + f*gate/h + V/(2*L*h) ], gate = 3/2 for SwiGLU.
double megatron_closed_form(const ModelSpec& m, double batch, double seq, double vocab) {
  const double h = static_cast<double>(m.hidden_size);
  const double L = static_cast<double>(m.num_layers);
  const double a = static_cast<double>(m.num_attention_heads);
  const double g = static_cast<double>(m.num_kv_heads);
  const double q_ratio = static_cast<double>(m.query_projection_size()) / h;
  const double gate = m.gated_mlp() ? 1.5 : 1.0;
  const double f = static_cast<double>(m.ffn_hidden_size);
  return 12 * batch * seq * L * h * h *
         ((1 + g / a + seq / h / 2) * q_ratio + f * gate / h + vocab / (2 * L * h));
}

// The paper's (Narayanan et al. 2021, Korthikanti et al. 2022) model FLOPs for
// GPT: the attention core counted in full (no causal halving).
double paper_flops(double batch, double seq, double layers, double hidden, double vocab) {
  return 72 * batch * seq * layers * hidden * hidden *
         (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers));
}

}  // namespace

TEST_CASE("GPT-3 175B model FLOPs by hand") {
  const ModelSpec m = gpt3_175b();
  // 50257 padded to a multiple of 128 * 8 = 1024: 50 * 1024 = 51200.
  CHECK(padded_vocab_size(m.vocab_size, 8) == 51200);
  // Forward per token per layer (q = kv = h = 12288, f = 4h, s = 2048):
  //   QKV 2*h*3h + proj 2*h*h + MLP 2*h*4h*2 = 24 h^2 = 3,623,878,656
  //   core 2*q*s = 2 * 12288 * 2048         =    50,331,648
  //   total                                   3,674,210,304
  CHECK(layer_forward_flops(m, 1, 2048) == doctest::Approx(3674210304.0 * 2048).epsilon(tight));
  CHECK(attention_core_forward_flops(m, 1, 2048) == doctest::Approx(50331648.0 * 2048).epsilon(tight));
  // Logit forward per token: 2 * h * V = 2 * 12288 * 51200 = 1,258,291,200.
  CHECK(logit_forward_flops(m, 1, 2048, 51200) == doctest::Approx(1258291200.0 * 2048).epsilon(tight));
  // Per token, three passes: 3 * 3,674,210,304 * 96 = 1,058,172,567,552
  //                        + 3 * 1,258,291,200      =     3,774,873,600
  //                                                 = 1,061,947,441,152
  // x B*s = 1536 * 2048 = 3,145,728 tokens = 3,340,597,800,160,198,656.
  const double expected = 3340597800160198656.0;
  CHECK(model_flops_per_iteration(m, 1536, 2048, 51200) == doctest::Approx(expected).epsilon(tight));
  const ParallelPlan plan = plan_for(8, 1536, 2048, Recompute::none);
  CHECK(model_flops_per_iteration(m, plan) == doctest::Approx(expected).epsilon(tight));
  CHECK(hardware_flops_per_iteration(m, plan) == doctest::Approx(expected).epsilon(tight));
  CHECK(model_flops_per_iteration(m, plan) ==
        doctest::Approx(megatron_closed_form(m, 1536, 2048, 51200)).epsilon(tight));
}

TEST_CASE("GPT-3 175B: the paper's 72BsLh^2(1 + s/6h + V/12hL) minus ours is the halved core") {
  const ModelSpec m = gpt3_175b();
  const double B = 1536, s = 2048;
  const double theirs = paper_flops(B, s, 96, 12288, 51200);
  const double ours = model_flops_per_iteration(m, 1536, 2048, 51200);
  // The paper counts the core at 3 passes x 4*q*s per token; Megatron now
  // counts the causal half, 3 x 2*q*s. The difference is exactly the half left
  // out: 3 * L * (2*q*s) * B*s = 3 * L * attention_core_forward_flops, i.e.
  // 6 * B * s^2 * L * h = 6 * 1536 * 2048^2 * 96 * 12288 = 4.5598e16 (1.35 %).
  const double halved_core = 3.0 * 96 * attention_core_forward_flops(m, 1536, 2048);
  CHECK(halved_core == doctest::Approx(6 * B * s * s * 96 * 12288).epsilon(tight));
  CHECK(theirs - ours == doctest::Approx(halved_core).epsilon(1e-9));
  // Per token: theirs 72h^2*L + 12hs*L + 6hV = 1,076,442,955,776.
  CHECK(theirs / (B * s) == doctest::Approx(1076442955776.0).epsilon(tight));
}

TEST_CASE("Llama-3-70B model FLOPs (GQA 64/8, SwiGLU, vocab padded for tp 8)") {
  const ModelSpec m = llama3_70b();
  // 128256 padded to a multiple of 1024: 126 * 1024 = 129024.
  CHECK(padded_vocab_size(m.vocab_size, 8) == 129024);
  // Forward per token per layer (h = q = 8192, kv = 1024, f = 28672, s = 8192):
  //   QKV 2*8192*(8192 + 2048)  =   167,772,160
  //   proj 2*8192*8192          =   134,217,728
  //   core 2*8192*8192          =   134,217,728
  //   MLP 2*8192*28672*3        = 1,409,286,144
  //   total                       1,845,493,760
  CHECK(layer_forward_flops(m, 1, 8192) == doctest::Approx(1845493760.0 * 8192).epsilon(tight));
  // Per token x3: 3 * (80 * 1,845,493,760 + 2 * 8192 * 129024) = 3 * (147,639,500,800
  //   + 2,113,929,216) = 449,260,290,048; x 1024 * 8192 tokens = 3,768,668,463,178,973,184.
  const ParallelPlan full = plan_for(8, 1024, 8192, Recompute::full);
  const double model = 3768668463178973184.0;
  CHECK(model_flops_per_iteration(m, full) == doctest::Approx(model).epsilon(tight));
  CHECK(model == doctest::Approx(megatron_closed_form(m, 1024, 8192, 129024)).epsilon(tight));
  // Full recompute adds one forward of every layer: per token 80 * 1,845,493,760
  // = 147,639,500,800; HFU/MFU = (449,260,290,048 + 147,639,500,800) /
  // 449,260,290,048 = 17789/13389.
  CHECK(hardware_flops_per_iteration(m, full) / model == doctest::Approx(17789.0 / 13389.0).epsilon(tight));
  // Selective adds the core: 80 * 134,217,728 = 10,737,418,240 per token;
  // ratio 1 + 10,737,418,240 / 449,260,290,048 = 1.023900216595713.
  const ParallelPlan selective = plan_for(8, 1024, 8192, Recompute::selective);
  CHECK(hardware_flops_per_iteration(m, selective) / model ==
        doctest::Approx(1.0 + 10737418240.0 / 449260290048.0).epsilon(tight));
}

TEST_CASE("Llama-3-8B model FLOPs (tp 1: vocab 128256 already a multiple of 128)") {
  const ModelSpec m = llama3_8b();
  CHECK(padded_vocab_size(m.vocab_size, 1) == 128256);
  // Forward per token per layer (h = q = 4096, kv = 1024, f = 14336, s = 8192):
  //   QKV 2*4096*6144 = 50,331,648; proj 2*4096^2 = 33,554,432;
  //   core 2*4096*8192 = 67,108,864; MLP 2*4096*14336*3 = 352,321,536
  //   total 503,316,480
  CHECK(layer_forward_flops(m, 2, 8192) == doctest::Approx(503316480.0 * 2 * 8192).epsilon(tight));
  // x3 per token: 3 * (32 * 503,316,480 + 2 * 4096 * 128256) = 3 * (16,106,127,360
  //   + 1,050,673,152) = 51,470,401,536; x 512 * 8192 = 215,882,511,044,050,944.
  const ParallelPlan none = plan_for(1, 512, 8192, Recompute::none);
  const double model = 215882511044050944.0;
  CHECK(model_flops_per_iteration(m, none) == doctest::Approx(model).epsilon(tight));
  // Full: + 16,106,127,360 per token -> 67,576,528,896 / 51,470,401,536 = 10741/8181.
  const ParallelPlan full = plan_for(1, 512, 8192, Recompute::full);
  CHECK(hardware_flops_per_iteration(m, full) / model == doctest::Approx(10741.0 / 8181.0).epsilon(tight));
  // Selective: + 32 * 67,108,864 = 2,147,483,648 per token.
  const ParallelPlan selective = plan_for(1, 512, 8192, Recompute::selective);
  CHECK(hardware_flops_per_iteration(m, selective) / model ==
        doctest::Approx(1.0 + 2147483648.0 / 51470401536.0).epsilon(tight));
}

TEST_CASE("Korthikanti 22B model: FLOPs and recompute ratios") {
  const ModelSpec m = gpt_22b();  // h 6144, 64 heads of 96, vocab 51200 (no padding at tp 8)
  CHECK(padded_vocab_size(m.vocab_size, 8) == 51200);
  // Per token x3: 48 * (72 * 6144^2 + 6 * 6144 * 2048) + 6 * 6144 * 51200
  //   = 48 * (2,717,908,992 + 75,497,472) + 1,887,436,800 = 135,970,947,072;
  // x B*s = 4 * 2048 = 8192 tokens = 1,113,873,998,413,824.
  const ParallelPlan none = plan_for(8, 4, 2048, Recompute::none);
  const double model = 1113873998413824.0;
  CHECK(model_flops_per_iteration(m, none) == doctest::Approx(model).epsilon(tight));
  // Full: + 48 * (24 * 6144^2 + 2 * 6144 * 2048) = 48 * 931,135,488 = 44,694,503,424
  // per token -> ratio 180,665,450,496 / 135,970,947,072 = 2393/1801.
  const ParallelPlan full = plan_for(8, 4, 2048, Recompute::full);
  CHECK(hardware_flops_per_iteration(m, full) / model == doctest::Approx(2393.0 / 1801.0).epsilon(tight));
  // Selective: + 48 * 2 * 6144 * 2048 = 1,207,959,552 per token.
  const ParallelPlan selective = plan_for(8, 4, 2048, Recompute::selective);
  CHECK(hardware_flops_per_iteration(m, selective) / model ==
        doctest::Approx(1.0 + 1207959552.0 / 135970947072.0).epsilon(tight));
  // Recompute never lowers the count, and full >= selective >= none.
  CHECK(hardware_flops_per_iteration(m, full) > hardware_flops_per_iteration(m, selective));
  CHECK(hardware_flops_per_iteration(m, selective) > hardware_flops_per_iteration(m, none));
}

TEST_CASE("Korthikanti et al. 2022 Table 5 MFU reproduced with the paper's convention") {
  // Every run of the paper's Table 5 (sequence parallel + selective recompute).
  const std::vector<test::CsvRow> rows = test::reference_csv("korthikanti2022.csv");
  REQUIRE(rows.size() == 5);
  constexpr double a100_peak = 312e12;
  for (const test::CsvRow& r : rows) {
    const std::string model = r["model"];
    CAPTURE(model);
    const std::int64_t layers = r.integer("num_layers"), hidden = r.integer("hidden_size");
    const std::int64_t heads = r.integer("attention_heads"), global_batch = r.integer("global_batch_size");
    const std::int64_t seq = r.integer("seq_len"), vocab = r.integer("vocab_size");
    const double denom = r.number("iter_time_seqpar_plus_selective_s") * r.number("num_gpus") * a100_peak;
    const double paper_mfu = 100 * paper_flops(static_cast<double>(global_batch), static_cast<double>(seq),
                                               static_cast<double>(layers), static_cast<double>(hidden),
                                               static_cast<double>(vocab)) / denom;
    CHECK(std::abs(paper_mfu - r.number("mfu_pct")) <= 0.5);  // percentage points
    // Megatron's causal-halved count is lower by 6*B*s^2*L*h (the half of the
    // core it leaves out), relative to the paper's count: 22B -2.6 %, 175B -1.35 %, 530B -0.82 %, 1T -0.66 % (relative), i.e. MFU
    // 40.6, 50.7, 55.6, 55.9 % instead of the paper's 41.5 .. 56.3 %.
    ModelSpec m = gpt(layers, hidden, heads, vocab, seq);
    m.name = model;
    const double ours_mfu = 100 * model_flops_per_iteration(m, global_batch, seq, vocab) / denom;
    CHECK(ours_mfu < paper_mfu);
    CHECK(paper_mfu - ours_mfu < 1.1);
  }
}

// Mixture-of-experts, latent attention and multi-token prediction: the general
// branch of Megatron-LM's num_floating_point_operations (training.py at
// d98e8a64). Small configs, by hand; b 2, s 32 (64 tokens), V 1000 -> 1024.
namespace {

// 4 layers, h 64, 4 heads, SwiGLU (dense width 128), 8 experts of width 32, top-2.
ModelSpec small_moe(std::int64_t kv_heads, std::int64_t head_dim, std::vector<bool> moe_layers) {
  ModelSpec m;
  m.name = "small";
  m.num_layers = 4;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.ffn_hidden_size = 128;
  m.activation = Activation::swiglu;
  m.vocab_size = 1000;
  m.moe.num_experts = 8;
  m.moe.experts_per_token = 2;
  m.moe.expert_ffn_hidden_size = 32;
  m.moe.moe_layers = std::move(moe_layers);
  return m;
}

}  // namespace

TEST_CASE("MoE model FLOPs by hand: routed top-k, shared experts, a dense first layer") {
  ModelSpec m = small_moe(2, 16, {false, true, true, true});
  m.moe.shared_expert_ffn_hidden_size = 48;
  // Per token, forward: projections 2 (64 (64 + 2 * 32) + 64 * 64) = 24,576;
  // core 2 * 64 * 32 = 4,096; dense MLP 2 * 64 * 128 * 3 = 49,152; MoE MLP
  // 2 * 64 * (2 * 32 + 48) * 3 = 43,008; logits 2 * 64 * 1024 = 131,072.
  // (24,576 + 4,096 + 49,152) + 3 (24,576 + 4,096 + 43,008) + 131,072 = 423,936.
  const double expected = 3.0 * 423'936 * 64;
  CHECK(model_flops_per_iteration(m, 2, 32, 1024) == doctest::Approx(expected).epsilon(tight));
  CHECK(expected == 81'395'712.0);  // Megatron's expression, evaluated term by term outside cuboid
  // Full recomputation repeats every layer's forward (not the logits).
  ParallelPlan p = plan_for(1, 2, 32, Recompute::full);
  CHECK(hardware_flops_per_iteration(m, p) ==
        doctest::Approx(expected + (423'936.0 - 131'072) * 64).epsilon(tight));
  p.recompute = Recompute::selective;
  CHECK(hardware_flops_per_iteration(m, p) == doctest::Approx(expected + 4 * 4'096.0 * 64).epsilon(tight));
  // A top-1 model with no shared experts and every layer MoE is the dense model
  // with the expert's width.
  ModelSpec one = m;
  one.moe.experts_per_token = 1;
  one.moe.expert_ffn_hidden_size = 128;
  one.moe.shared_expert_ffn_hidden_size = 0;
  one.moe.moe_layers = {true, true, true, true};
  ModelSpec dense = m;
  dense.moe = MoeSpec{};
  CHECK(model_flops_per_iteration(one, 2, 32, 1024) ==
        doctest::Approx(model_flops_per_iteration(dense, 2, 32, 1024)).epsilon(tight));
}

TEST_CASE("MLA and MTP model FLOPs by hand") {
  ModelSpec m = small_moe(4, 12, {false, false, true, true});
  m.mla = MlaSpec{24, 16, 8, 4, 8};
  m.mtp_layers = 1;
  // Per token, forward: MLA projections 2 [24 (64 + 4 * 12 + 1) + 16 (64 + 4 * 16 + 1)
  // + 64 * 4 + 4 * 8 * 64] = 2 (2,712 + 2,064 + 256 + 2,048) = 14,160; core
  // 4 (8 + 4 + 8) 32 = 2,560; dense MLP 49,152; MoE MLP 2 * 64 * 64 * 3 = 24,576.
  // Layers: 2 dense + 2 MoE + the MTP module's MoE layer (the last layer is MoE):
  // 2 (14,160 + 2,560 + 49,152) + 3 (14,160 + 2,560 + 24,576) = 255,632;
  // the MTP module's 2 (3 * 64 + 2 * 64^2) = 16,768; two logit GEMMs 262,144.
  const double expected = 3.0 * (255'632 + 16'768 + 262'144) * 64;
  CHECK(model_flops_per_iteration(m, 2, 32, 1024) == doctest::Approx(expected).epsilon(tight));
  CHECK(expected == 102'632'448.0);  // Megatron's expression, evaluated term by term outside cuboid
  // Without the query's low rank: q_term = h n (qk + r) = 64 * 4 * 12 = 3,072 instead of 2,712.
  m.mla.q_lora_rank = 0;
  CHECK(model_flops_per_iteration(m, 2, 32, 1024) ==
        doctest::Approx(expected + 3.0 * 5 * 2 * (3'072 - 2'712) * 64).epsilon(tight));
  CHECK(expected + 3.0 * 5 * 2 * (3'072 - 2'712) * 64 == 103'323'648.0);
}

TEST_CASE("DeepSeek-V3's model FLOPs per token against its 37B activated parameters") {
  // Megatron counts 6 FLOPs per active GEMM parameter per token plus the
  // attention core; at s = 4096 DeepSeek-V3 lands near 6 x 37.6B x (1 + a few %).
  const ModelSpec m = load_model(std::string(CUBOID_SOURCE_ROOT_DIR) + "/models/deepseek-v3.json");
  const double per_token = model_flops_per_iteration(m, 1, 4096, padded_vocab_size(m.vocab_size, 1)) / 4096;
  const double six_n = 6.0 * static_cast<double>(m.active_parameter_count());
  CHECK(per_token > six_n);
  CHECK(per_token < 1.4 * six_n);
}
