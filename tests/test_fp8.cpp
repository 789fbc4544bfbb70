// FP8 and FP4 plans (--precision): which GEMMs run quantized and at which
// peak, the quantizers' kernels and their bytes, the FP8 weight copies and
// saved activations, the refusals on GPUs without the formats, the plan
// file's field, and that a bf16 plan is priced as before. Hand numbers for a
// Llama-3-8B layer (h 4096, 32 heads of 128, 8 KV heads, SwiGLU f 14336) at
// 4096 tokens on an H100 SXM5 profile.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/step.hpp"
#include "cuboid/io/planfile.hpp"
#include "fixtures.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;

namespace {

// topologies/gpus/h100-sxm5-80gb.json's figures, launch cost 0.
GpuProfile h100() {
  GpuProfile g;
  g.name = "H100-SXM5-80GB";
  g.peak_bf16_flops = 989e12;
  g.peak_fp8_flops = 1979e12;
  g.hbm_bandwidth_Bps = 3350e9;
  g.memory_bytes = 80LL << 30;
  g.sm_count = 132;
  g.gemm_max_efficiency = 0.803;
  g.memory_bound_efficiency = 0.83;
  g.kernel_launch_ns = 0;
  g.memory_reserve_bytes = 2LL << 30;
  return g;
}

Cluster h100_node(const GpuProfile& gpu) {
  Cluster c = test::dgx_a100(1);
  c.name = "test-h100";
  c.gpu = gpu;
  return c;
}

ParallelPlan layer_plan(Precision p, int tp = 1) {
  ParallelPlan plan;
  plan.tp = tp;
  plan.seq_length = 4096;
  plan.global_batch = 8;
  plan.sequence_parallel = tp > 1;
  plan.precision = p;
  return plan;
}

const Op& find(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  FAIL("no op " << name);
  return ops.front();
}

// The names of ops[first, first + n).
std::vector<std::string> names(const std::vector<Op>& ops, std::size_t first, std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = first; i < first + n && i < ops.size(); ++i) out.push_back(ops[i].name);
  return out;
}

std::size_t index_of(const std::vector<Op>& ops, const std::string& name) {
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].name == name) return i;
  return ops.size();
}

}  // namespace

TEST_CASE("fp8: FC1 runs at the FP8 peak x the bf16 GEMM's efficiency, twice as fast as bf16") {
  const ModelSpec m = test::llama3_8b();
  const Op fp8 = find(transformer_layer_ops(m, layer_plan(Precision::fp8_current)).forward, op::fc1);
  const Op bf16 = find(transformer_layer_ops(m, layer_plan(Precision::bf16)).forward, op::fc1);
  CHECK(fp8.precision == Precision::fp8_current);
  CHECK(bf16.precision == Precision::bf16);
  // [4096 x 4096] x [4096 x 28672]: 2 x 4096 x 28672 x 4096 FLOPs; 32 x 224
  // = 7168 tiles on 132 SMs take 55 waves.
  CHECK(fp8.m == 4096);
  CHECK(fp8.n == 28672);
  CHECK(fp8.k == 4096);
  const double flops = 962072674304.0;
  const double waves = 117440512.0 / (55.0 * 132 * 128 * 128);
  // Compute-bound: HBM (4096 x 4096 + 4096 x 28672) x 1 B + 4096 x 28672 x 2 B
  // = 369 MB at 2.78 TB/s is 133 us against 613 us of tensor-core time.
  const GpuProfile gpu = h100();
  CHECK(op_time_ns(gpu, fp8) == std::llround(flops / (1979e12 * 0.803 * waves) * 1e9));
  CHECK(op_time_ns(gpu, bf16) == std::llround(flops / (989e12 * 0.803 * waves) * 1e9));
  // dgrad and wgrad too.
  const LayerOps ops = transformer_layer_ops(m, layer_plan(Precision::fp8_current));
  CHECK(find(ops.backward, op::fc1_dgrad).precision == Precision::fp8_current);
  CHECK(find(ops.backward, op::fc1_wgrad).precision == Precision::fp8_current);
  // SMs taken by an overlapped collective take their share of the FP8 peak.
  CHECK(with_sms_taken(gpu, 33).peak_fp8_flops == doctest::Approx(1979e12 * 99 / 132));
}

TEST_CASE("fp8: the attention core, the embedding and the LM head stay bf16; every linear layer's GEMMs do not") {
  const ModelSpec m = test::llama3_8b();
  const ParallelPlan p = layer_plan(Precision::fp8_delayed);
  const LayerOps layer = transformer_layer_ops(m, p);
  for (const auto* list : {&layer.forward, &layer.backward})
    for (const Op& op : *list) {
      CAPTURE(op.name);
      if (op.kind == OpKind::attention_core) CHECK(op.precision == Precision::bf16);
      if (op.kind == OpKind::gemm) CHECK(op.precision == Precision::fp8_delayed);
    }
  for (const LayerOps& ops : {embedding_ops(m, p), lm_head_ops(m, p)})
    for (const auto* list : {&ops.forward, &ops.backward})
      for (const Op& op : *list) CHECK(op.precision == Precision::bf16);
}

TEST_CASE("fp8: delayed scaling casts each linear input and output gradient once, rowwise + columnwise") {
  const ModelSpec m = test::llama3_8b();
  const LayerOps ops = transformer_layer_ops(m, layer_plan(Precision::fp8_delayed));
  // Before QKV: the norm's output, 4096 x 4096, read 2 B, written 1 + 1 B.
  const std::size_t qkv = index_of(ops.forward, op::qkv);
  REQUIRE(qkv >= 1);
  CHECK(ops.forward[qkv - 1].name == op::fp8_cast);
  CHECK(ops.forward[qkv - 1].bytes == 4096.0 * 4096 * 4);
  // FC1's output gradient, 4096 x 28672, before its dgrad.
  const std::size_t dgrad = index_of(ops.backward, op::fc1_dgrad);
  REQUIRE(dgrad >= 1);
  CHECK(ops.backward[dgrad - 1].name == op::fp8_grad_cast);
  CHECK(ops.backward[dgrad - 1].bytes == 4096.0 * 28672 * 4);
  int casts = 0, grad_casts = 0;
  for (const Op& op : ops.forward) casts += op.name == op::fp8_cast ? 1 : 0;
  for (const Op& op : ops.backward) grad_casts += op.name == op::fp8_grad_cast ? 1 : 0;
  CHECK(casts == 4);
  CHECK(grad_casts == 4);
  // The weights, per layer: QKV 4096 x 6144, proj 4096 x 4096, FC1 4096 x
  // 28672, FC2 14336 x 4096.
  CHECK(quantized_weight_elements(ops) == 218103808.0);
}

TEST_CASE("fp8: current scaling adds the amax pass and the scale kernel; with SP the amax is all-reduced over TP") {
  const ModelSpec m = test::llama3_8b();
  const LayerOps tp1 = transformer_layer_ops(m, layer_plan(Precision::fp8_current));
  const std::size_t qkv = index_of(tp1.forward, op::qkv);
  CHECK(names(tp1.forward, qkv - 3, 4) == std::vector<std::string>{op::fp8_amax, op::fp8_scale, op::fp8_cast, op::qkv});
  CHECK(tp1.forward[qkv - 3].bytes == 4096.0 * 4096 * 2);
  CHECK(tp1.forward[qkv - 2].bytes == 8.0);
  // TP 2 with SP: the shard (2048 tokens) is quantized, its amax all-reduced
  // (4 B), and the FP8 input gathered at 1 B per element.
  const LayerOps tp2 = transformer_layer_ops(m, layer_plan(Precision::fp8_current, 2));
  const std::size_t q2 = index_of(tp2.forward, op::qkv);
  CHECK(names(tp2.forward, q2 - 5, 6) ==
        std::vector<std::string>{op::fp8_amax, op::tp_ar_amax, op::fp8_scale, op::fp8_cast, op::tp_ag_attn, op::qkv});
  CHECK(tp2.forward[q2 - 5].bytes == 2048.0 * 4096 * 2);
  CHECK(tp2.forward[q2 - 4].comm_bytes == 4.0);
  CHECK(tp2.forward[q2 - 4].group == Group::tp);
  CHECK(tp2.forward[q2 - 2].bytes == 2048.0 * 4096 * 4);
  CHECK(tp2.forward[q2 - 1].comm_bytes == 4096.0 * 4096 * 1);
  // The row-parallel FC2's output gradient is gathered quantized too.
  const std::size_t d2 = index_of(tp2.backward, op::fc2_dgrad);
  CHECK(names(tp2.backward, d2 - 5, 6) == std::vector<std::string>{op::fp8_amax, op::tp_ar_amax, op::fp8_scale,
                                                                   op::fp8_grad_cast, op::tp_ag_mlp_bwd, op::fc2_dgrad});
  CHECK(tp2.backward[d2 - 1].comm_bytes == 4096.0 * 4096 * 1);
}

TEST_CASE("fp8: MXFP8 and blockwise count their scales; NVFP4 runs at the FP4 peak") {
  const ModelSpec m = test::llama3_8b();
  const LayerOps mx = transformer_layer_ops(m, layer_plan(Precision::mxfp8));
  // 1 + 1/32 B per element, rowwise and columnwise.
  CHECK(mx.forward[index_of(mx.forward, op::qkv) - 1].bytes == doctest::Approx(4096.0 * 4096 * (2 + 2 * (1 + 1 / 32.0))));
  const LayerOps bw = transformer_layer_ops(m, layer_plan(Precision::fp8_blockwise));
  CHECK(bw.forward[index_of(bw.forward, op::qkv) - 1].bytes == doctest::Approx(4096.0 * 4096 * (2 + 2 * (1 + 4 / 128.0))));
  GpuProfile gpu = h100();
  gpu.peak_fp4_flops = 2 * gpu.peak_fp8_flops;
  gpu.microscaling_formats = true;
  const Op fc1 = find(transformer_layer_ops(m, layer_plan(Precision::nvfp4)).forward, op::fc1);
  const double waves = 117440512.0 / (55.0 * 132 * 128 * 128);
  CHECK(op_time_ns(gpu, fc1) == std::llround(962072674304.0 / (3958e12 * 0.803 * waves) * 1e9));
}

TEST_CASE("fp8: a bf16 plan lists and prices its ops as before") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = h100();
  const LayerOps ops = transformer_layer_ops(m, layer_plan(Precision::bf16, 2));
  for (const auto* list : {&ops.forward, &ops.backward})
    for (const Op& op : *list) {
      CAPTURE(op.name);
      CHECK(op.precision == Precision::bf16);
      CHECK(op.name.rfind("fp8_", 0) == std::string::npos);
      if (op.kind == OpKind::gemm) CHECK(op_time_ns(gpu, op) == gemm_time_ns(gpu, op.m, op.n, op.k, op.batch, op.bytes));
      if (op.name == op::tp_ag_attn) CHECK(op.comm_bytes == 4096.0 * 4096 * 2);
    }
  CHECK(quantized_weight_elements(ops) == 0);
}

TEST_CASE("fp8: FP8 weight copies and the inputs saved in FP8, by hand") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = h100();
  ParallelPlan bf16 = layer_plan(Precision::bf16);
  bf16.seq_length = 4096;
  ParallelPlan fp8 = bf16;
  fp8.precision = Precision::fp8_delayed;
  // Rowwise and columnwise copy of 218,103,808 weights per layer, 32 layers.
  const MemoryReport a = memory_per_gpu(m, bf16, gpu), b = memory_per_gpu(m, fp8, gpu);
  CHECK(b.weight_and_optimizer_bytes - a.weight_and_optimizer_bytes == 32 * 218103808.0 * 2);
  // Saved 1 B instead of 2: QKV's and FC1's inputs (2 x 4096 x 4096) and
  // FC2's (4096 x 14336). The projection's input is the attention core's
  // output: with the core recomputed (the plan's selective default) only
  // linear_proj keeps it, under delayed scaling as a 1 B copy (4096 x 4096
  // saved), under current scaling as the bf16 original
  // (set_save_original_input, attention.py:428-444@d98e8a64: nothing saved).
  CHECK(layer_activation_bytes(m, bf16, false) - layer_activation_bytes(m, fp8, false) ==
        2 * 4096.0 * 4096 + 4096.0 * 4096 + 4096.0 * 14336);
  ParallelPlan current = fp8;
  current.precision = Precision::fp8_current;
  CHECK(layer_activation_bytes(m, bf16, false) - layer_activation_bytes(m, current, false) ==
        2 * 4096.0 * 4096 + 4096.0 * 14336);
  // Not recomputed, the fused core keeps its bf16 output too: delayed
  // scaling's copy then costs 1 B more than bf16 (- 4096 x 4096).
  ParallelPlan kept = fp8, kept_bf16 = bf16, kept_current = current;
  kept.recompute = kept_bf16.recompute = kept_current.recompute = Recompute::none;
  CHECK(layer_activation_bytes(m, kept_bf16, false) - layer_activation_bytes(m, kept, false) ==
        2 * 4096.0 * 4096 - 4096.0 * 4096 + 4096.0 * 14336);
  CHECK(layer_activation_bytes(m, kept_bf16, false) - layer_activation_bytes(m, kept_current, false) ==
        2 * 4096.0 * 4096 + 4096.0 * 14336);
  // Full recomputation keeps the bf16 layer input only.
  bf16.recompute = fp8.recompute = Recompute::full;
  CHECK(layer_activation_bytes(m, bf16, false) == layer_activation_bytes(m, fp8, false));
}

TEST_CASE("fp8: the weights are cast once per step, with the optimizer") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = h100();
  const ParallelPlan bf16 = layer_plan(Precision::bf16);
  const ParallelPlan fp8 = layer_plan(Precision::fp8_delayed);
  const StageParameters sp = stage_parameters(m, bf16, 0);
  const std::int64_t extra =
      StepDescription(m, fp8, nullptr).optimizer_ns(gpu, sp, 0) - StepDescription(m, bf16, nullptr).optimizer_ns(gpu, sp, 0);
  // 32 x 218,103,808 weights read (2 B) and written rowwise + columnwise (1 + 1 B).
  CHECK(extra == std::llround(32 * 218103808.0 * 4 / (3350e9 * 0.83) * 1e9));
}

TEST_CASE("fp8: a GPU without the format refuses the plan, with the reason") {
  const ModelSpec m = test::llama3_8b();
  ParallelPlan p = layer_plan(Precision::fp8_current);
  p.dp = 8;
  p.global_batch = 8;
  const Cluster a100 = test::dgx_a100(1);
  auto r = check_plan(p, m, a100);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::precision_no_fp8);
  CHECK(r->field == PlanField::precision);
  CHECK(describe(*r, m, a100) ==
        "A100-SXM4-80GB has no FP8 tensor cores (its profile gives no peak_fp8_tflops; Transformer Engine needs "
        "compute capability 8.9 or more)");
  const Cluster h = h100_node(h100());
  CHECK_FALSE(check_plan(p, m, h));
  p.precision = Precision::mxfp8;
  r = check_plan(p, m, h);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::precision_no_microscaling);
  CHECK(describe(*r, m, h) ==
        "H100-SXM5-80GB has no block-scaled tensor-core formats (MXFP8, NVFP4: Transformer Engine runs them on "
        "compute capability 10.0, Blackwell; its profile's microscaling_formats is false)");
  p.precision = Precision::nvfp4;
  r = check_plan(p, m, h);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::precision_no_fp4);
  // Megatron-FSDP runs FP8, with or without the FP8 parameter gather.
  p.precision = Precision::fp8_delayed;
  p.zero_stage = 3;
  CHECK_FALSE(check_plan(p, m, h));
  p.fp8_param_gather = true;
  CHECK_FALSE(check_plan(p, m, h));
}

TEST_CASE("fp8: FP8 attention runs where Transformer Engine runs it, on a GPU with cuDNN's measured rates") {
  const ModelSpec m = test::llama3_8b();
  ParallelPlan p = layer_plan(Precision::mxfp8);
  p.dp = 8;
  p.fp8_attention = true;
  // A GB200 tray's 8 GPUs of the shipped NVL72 card: cuDNN's MXFP8 rates.
  Cluster gb = load_cluster(test::source_root() / "topologies" / "gb200-nvl72.json");
  gb.nodes = 1;
  gb.gpus_per_node = 8;
  REQUIRE(fp8_attention_rates_of(gb.gpu, Fp8AttentionFormat::mxfp8) != nullptr);
  REQUIRE(fp8_attention_rates_of(gb.gpu, Fp8AttentionFormat::per_tensor) != nullptr);
  CHECK(gb.gpu.sources.count("attention_kernels.cudnn.mxfp8") == 1);
  CHECK_FALSE(check_plan(p, m, gb));
  p.precision = Precision::fp8_current;
  CHECK_FALSE(check_plan(p, m, gb));
  const auto refused = [&](const Cluster& c) {
    const auto r = check_plan(p, m, c);
    REQUIRE(r);
    CHECK(r->field == PlanField::fp8_attention);
    return std::pair{r->kind, describe(*r, m, c)};
  };
  // The blockwise recipe gets no fp8_dpa from Megatron-Core; NVFP4 runs it
  // only with NVTE_DPA_FP8_RECIPE; bf16 has no recipe at all.
  p.precision = Precision::fp8_blockwise;
  CHECK(refused(gb) == std::pair{PlanCheck::fp8_attention_recipe,
                                 std::string("FP8 attention under the blockwise recipe: Megatron-Core gives that recipe no "
                                             "fp8_dpa, so the attention core stays bf16")});
  p.precision = Precision::nvfp4;
  CHECK(refused(gb).first == PlanCheck::fp8_attention_recipe);
  p.precision = Precision::bf16;
  CHECK(refused(gb).first == PlanCheck::fp8_attention_recipe);
  // cuDNN's fused attention only, CP 1 only.
  p.precision = Precision::mxfp8;
  p.flash_attention = false;
  CHECK(refused(gb) == std::pair{PlanCheck::fp8_attention_cudnn,
                                 std::string("FP8 attention is cuDNN's fused attention (Transformer Engine's FP8 "
                                             "backend), not the unfused attention core")});
  p.flash_attention = true;
  p.cp = 2;
  p.dp = 4;
  CHECK(refused(gb).first == PlanCheck::fp8_attention_cp);
  p.cp = 1;
  p.dp = 8;
  // The H100 profile has no measured FP8 attention rates: refused, named.
  p.precision = Precision::fp8_current;
  const Cluster h = load_cluster(test::source_root() / "topologies" / "dgx-h100.json");
  CHECK(refused(h) == std::pair{PlanCheck::fp8_attention_rates,
                                std::string("H100-SXM5-80GB's profile has no measured rates for cuDNN's per-tensor FP8 "
                                            "attention (attention_kernels.cudnn.fp8)")});
}

TEST_CASE("fp8: the shipped GPU profiles give the FP8 peak where the GPU has it") {
  const auto card = [](const char* name) { return load_cluster(test::source_root() / "topologies" / name).gpu; };
  for (const char* name : {"dgx-h100.json", "hgx-h200.json"}) {
    CAPTURE(name);
    const GpuProfile g = card(name);
    CHECK(g.peak_fp8_flops == 1979e12);
    CHECK(g.peak_fp4_flops == 0);
    CHECK_FALSE(g.microscaling_formats);
    CHECK(g.sources.count("peak_fp8_flops") == 1);
  }
  const GpuProfile a100 = card("dgx-a100.json");
  CHECK(a100.peak_fp8_flops == 0);
  CHECK_FALSE(a100.microscaling_formats);
}

TEST_CASE("fp8: the plan file writes precision only when not bf16 and reads it back") {
  nlohmann::json j = test::fixture_json(test::fixtures().front());
  CHECK_FALSE(j["parallel"].contains("precision"));
  CHECK(plan_file_from_json(j, "plan.json").plan.precision == Precision::bf16);
  j["parallel"]["precision"] = "fp8-current";
  const PlanFile pf = plan_file_from_json(j, "plan.json");
  CHECK(pf.plan.precision == Precision::fp8_current);
  CHECK(plan_layout_json(pf.plan)["precision"] == "fp8-current");
  // Its A100 card has no FP8: refused where the card is known.
  CHECK(test::input_error_message([&] { check_plan_matches_cluster(pf, test::four_dgx_a100()); }) ==
        "plan.json: parallel.precision: A100-SXM4-80GB has no FP8 tensor cores (its profile gives no "
        "peak_fp8_tflops; Transformer Engine needs compute capability 8.9 or more) (fix: drop precision (bf16), or "
        "use the plan with a cluster card whose GPU runs it (--cluster))");
  j["parallel"]["precision"] = "fp8";
  CHECK(test::input_error_message([&] { (void)plan_file_from_json(j, "plan.json"); })
            .rfind("plan.json: parallel.precision: unknown precision \"fp8\"", 0) == 0);
}

TEST_CASE("fp8: --fp8-param-gather drops the bf16 weight and gathers the FP8 one at 1 byte") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = h100();
  ParallelPlan p = layer_plan(Precision::fp8_delayed);
  p.dp = 8;
  p.global_batch = 8;
  p.zero_stage = 1;
  ParallelPlan g = p;
  g.fp8_param_gather = true;
  // 32 layers x 218,103,808 quantized weights lose their 2-byte bf16 copy.
  CHECK(memory_per_gpu(m, p, gpu).weight_and_optimizer_bytes - memory_per_gpu(m, g, gpu).weight_and_optimizer_bytes ==
        32 * 218103808.0 * 2);
  // The distributed optimizer's all-gather: the other weights at 2 B, the quantized ones at 1 B.
  const auto gather_bytes = [&](const ParallelPlan& plan) {
    const StageStep step = StepDescription(m, plan, nullptr).stage(0);
    for (const StepCollective& c : step.collectives())
      if (c.name == std::string("param all-gather")) return c.bytes;
    return -1.0;
  };
  const double params = stage_parameters(m, p, 0).dense;
  CHECK(gather_bytes(p) == params * 2);
  CHECK(gather_bytes(g) == (params - 32 * 218103808.0) * 2 + 32 * 218103808.0);
  // Refused without FP8 or without the distributed optimizer.
  const Cluster h = h100_node(gpu);
  g.zero_stage = 0;
  auto r = check_plan(g, m, h);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::param_gather_needs_dist_opt);
  CHECK(r->field == PlanField::fp8_param_gather);
  g.zero_stage = 1;
  g.precision = Precision::bf16;
  r = check_plan(g, m, h);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::param_gather_needs_fp8);
}

TEST_CASE("fp8: an FP8 GEMM runs at the card's FP8 MAMF fraction of the FP8 peak, on H100 by hand") {
  // topologies/gpus/h100-sxm5-80gb.json: ml-engineering's FP8 MAMF row,
  // 1402.6 of 1979 TFLOP/s = 0.709; the bf16 row stays 794.5 of 989 = 0.803.
  const GpuProfile gpu = load_cluster(test::source_root() / "topologies" / "dgx-h100.json").gpu;
  CHECK(gpu.gemm_max_efficiency_fp8 == 0.709);
  CHECK(gpu.gemm_max_efficiency_fp4 == 0);
  CHECK(gpu.gemm_max_efficiency == 0.803);
  CHECK(gpu.sources.count("gemm_max_efficiency_fp8") == 1);
  REQUIRE(gpu.kernel_launch_ns == 4900);
  const ModelSpec m = test::llama3_8b();
  // FC1 [4096 x 4096] x [4096 x 28672], 962,072,674,304 FLOPs in 55 waves of
  // 132 tiles (wave efficiency 7168 / 7260), compute-bound as above:
  // 962.07e9 / (1979e12 x 0.709 x 0.98733) = 694.47 us, + 4.9 us launch.
  for (Precision p : {Precision::fp8_delayed, Precision::fp8_current, Precision::fp8_blockwise}) {
    CAPTURE(static_cast<int>(p));
    CHECK(op_time_ns(gpu, find(transformer_layer_ops(m, layer_plan(p)).forward, op::fc1)) == 699372);
  }
  // bf16 is priced as before: 962.07e9 / (989e12 x 0.803 x 0.98733) + 4.9 us.
  CHECK(op_time_ns(gpu, find(transformer_layer_ops(m, layer_plan(Precision::bf16)).forward, op::fc1)) == 1231872);
  // A card without the key: the bf16 fraction for the FP8 peak (618,076 ns).
  GpuProfile plain = gpu;
  plain.gemm_max_efficiency_fp8 = 0;
  CHECK(op_time_ns(plain, find(transformer_layer_ops(m, layer_plan(Precision::fp8_current)).forward, op::fc1)) ==
        618076);
}

TEST_CASE("fp8: MXFP8 and NVFP4 GEMMs on GB200 at the card's FP8 and FP4 MAMF fractions, sustained, by hand") {
  // topologies/gpus/gb200.json: FP8 3615.6 of 5000 TFLOP/s = 0.723 (its own
  // MAMF row); FP4 the B200's NVFP4 6624 of 9000 = 0.736; both x the
  // sustained fraction 0.804 (Azure's cuBLASLt FP8 after 10,000 warm-up
  // calls, 2906.9 / 3615.6); an MXFP8 forward GEMM at 0.912 of the
  // per-tensor rate (Transformer Engine's kernels-only profile, B300).
  const GpuProfile gpu = load_cluster(test::source_root() / "topologies" / "gb200-nvl72.json").gpu;
  CHECK(gpu.gemm_max_efficiency_fp8 == 0.723);
  CHECK(gpu.gemm_max_efficiency_fp4 == 0.736);
  CHECK(gpu.gemm_sustained_fraction == 0.804);
  CHECK(gpu.mxfp8_gemm_fprop == 0.912);
  REQUIRE(gpu.sm_count == 152);
  REQUIRE(gpu.kernel_launch_ns == 4900);
  const ModelSpec m = test::llama3_8b();
  // FC1: 7168 tiles on 152 SMs take 48 waves (wave efficiency 7168 / 7296).
  // MXFP8: 962.07e9 / (5000e12 x 0.723 x 0.804 x 0.912 x 0.98246) = 369.43 us,
  // + 4.9 us. Its HBM side, (4096 x 4096 + 4096 x 28672) x (1 + 1/32) B +
  // 4096 x 28672 x 2 B at 8 TB/s x 0.83, is 56 us: compute-bound.
  CHECK(op_time_ns(gpu, find(transformer_layer_ops(m, layer_plan(Precision::mxfp8)).forward, op::fc1)) == 374333);
  // NVFP4: 962.07e9 / (10000e12 x 0.736 x 0.804 x 0.98246) = 165.49 us, + 4.9 us.
  CHECK(op_time_ns(gpu, find(transformer_layer_ops(m, layer_plan(Precision::nvfp4)).forward, op::fc1)) == 170386);
}

TEST_CASE("fp8: NVFP4 on GB300 at the FP8 burst rate x Transformer Engine's measured NVFP4 / FP8 ratio, by hand") {
  // topologies/gpus/gb300.json: no FP4 MAMF row; the card's FP8 burst rate
  // 0.745 x 5000 = 3725 x the B300's kernels-only NVFP4 speed over per-tensor
  // FP8 (6.812 / 3.764 ms a layer = 1.810) = 6741 TFLOP/s, 0.449 of 15000
  // (it was the bf16 fraction, 0.786 x 15000 = 11,790); x the sustained 0.888.
  const GpuProfile gpu = load_cluster(test::source_root() / "topologies" / "gb300-nvl72.json").gpu;
  CHECK(gpu.gemm_max_efficiency_fp4 == 0.449);
  CHECK(gpu.sources.count("gemm_max_efficiency_fp4") == 1);
  CHECK(gpu.gemm_sustained_fraction == 0.888);
  REQUIRE(gpu.sm_count == 152);
  REQUIRE(gpu.kernel_launch_ns == 4900);
  const ModelSpec m = test::llama3_8b();
  // FC1: 7168 tiles on 152 SMs, 48 waves (7168 / 7296):
  // 962.07e9 / (15000e12 x 0.449 x 0.888 x 0.98246) = 163.74 us, + 4.9 us.
  CHECK(op_time_ns(gpu, find(transformer_layer_ops(m, layer_plan(Precision::nvfp4)).forward, op::fc1)) ==
        std::llround(2.0 * 4096 * 28672 * 4096 / (15000e12 * 0.449 * 0.888 * 7168.0 / 7296.0) * 1e9) + 4900);
  CHECK(op_time_ns(gpu, find(transformer_layer_ops(m, layer_plan(Precision::nvfp4)).forward, op::fc1)) == 168636);
}

TEST_CASE("fp8: an MXFP8 GEMM at the card's measured fraction of the per-tensor FP8 rate, per pass, by hand") {
  // topologies/gpus/b200.json: Transformer Engine's GEMM profiling guide
  // (B300, kernels only, the same shapes): per-tensor FP8 over MXFP8 ms,
  // fprop 2.158 / 2.365 = 0.912, dgrad 2.329 / 2.397 = 0.972, wgrad
  // 2.325 / 2.400 = 0.969.
  const GpuProfile gpu = load_cluster(test::source_root() / "topologies" / "dgx-b200.json").gpu;
  CHECK(gpu.mxfp8_gemm_fprop == 0.912);
  CHECK(gpu.mxfp8_gemm_dgrad == 0.972);
  CHECK(gpu.mxfp8_gemm_wgrad == 0.969);
  CHECK(gpu.sources.count("mxfp8_gemm_rate") == 1);
  REQUIRE(gpu.sm_count == 148);
  REQUIRE(gpu.kernel_launch_ns == 4900);
  const ModelSpec m = test::llama3_8b();
  const LayerOps mx = transformer_layer_ops(m, layer_plan(Precision::mxfp8));
  const LayerOps cur = transformer_layer_ops(m, layer_plan(Precision::fp8_current));
  // The B200's FP8 rate: 4500e12 x 0.763 x 0.853 (sustained). FC1 forward
  // [4096 x 4096] x [4096 x 28672]: 7168 tiles, 49 waves of 148 (7168 / 7252).
  const double rate = 4500e12 * 0.763 * 0.853;
  const double flops = 2.0 * 4096 * 28672 * 4096;
  const auto ns = [&](double tiles, double slots, double fraction) {
    return std::llround(flops / (rate * fraction * tiles / slots) * 1e9) + 4900;
  };
  CHECK(op_time_ns(gpu, find(cur.forward, op::fc1)) == ns(7168, 7252, 1.0));
  CHECK(op_time_ns(gpu, find(mx.forward, op::fc1)) == ns(7168, 7252, 0.912));
  // dgrad [4096 x 28672] x [28672 x 4096]: 1024 tiles, 7 waves (1024 / 1036).
  CHECK(op_time_ns(gpu, find(cur.backward, op::fc1_dgrad)) == ns(1024, 1036, 1.0));
  CHECK(op_time_ns(gpu, find(mx.backward, op::fc1_dgrad)) == ns(1024, 1036, 0.972));
  // wgrad [4096 x 4096] x [4096 x 28672] (k = tokens): as the forward's tiles.
  CHECK(op_time_ns(gpu, find(mx.backward, op::fc1_wgrad)) == ns(7168, 7252, 0.969));
  // A card without the key prices MXFP8 at the per-tensor rate; NVFP4 and
  // per-tensor FP8 never take the ratios.
  GpuProfile plain = gpu;
  plain.mxfp8_gemm_fprop = plain.mxfp8_gemm_dgrad = plain.mxfp8_gemm_wgrad = 1;
  CHECK(op_time_ns(plain, find(mx.forward, op::fc1)) == ns(7168, 7252, 1.0));
  CHECK(op_time_ns(plain, find(mx.backward, op::fc1_dgrad)) == ns(1024, 1036, 1.0));
  GpuProfile slow = gpu;
  slow.mxfp8_gemm_fprop = 0.5;
  const Op nv = find(transformer_layer_ops(m, layer_plan(Precision::nvfp4)).forward, op::fc1);
  CHECK(op_time_ns(slow, nv) == op_time_ns(gpu, nv));
  CHECK(op_time_ns(slow, find(cur.forward, op::fc1)) == ns(7168, 7252, 1.0));
  // Hopper's cards have none.
  const GpuProfile h100 = load_cluster(test::source_root() / "topologies" / "dgx-h100.json").gpu;
  CHECK(h100.mxfp8_gemm_fprop == 1);
  CHECK(h100.sources.count("mxfp8_gemm_rate") == 0);
}

TEST_CASE("fp8: the FP8 and FP4 MAMF fractions are read sourced, at most 1, and default to absent") {
  const GpuProfile a100 = load_cluster(test::source_root() / "topologies" / "dgx-a100.json").gpu;
  CHECK(a100.gemm_max_efficiency_fp8 == 0);
  CHECK(a100.gemm_max_efficiency_fp4 == 0);
  for (const char* name : {"dgx-b200.json", "gb200-nvl72.json", "gb300-nvl72.json", "hgx-h200.json"}) {
    CAPTURE(name);
    const GpuProfile g = load_cluster(test::source_root() / "topologies" / name).gpu;
    CHECK(g.gemm_max_efficiency_fp8 > 0.7);
    CHECK(g.gemm_max_efficiency_fp8 < g.gemm_max_efficiency + 0.001);
    CHECK(g.sources.count("gemm_max_efficiency_fp8") == 1);
  }
}

TEST_CASE("fp8: an MXFP8 cast runs at the card's measured MXFP8 quantize rate; other casts at memory_bound_efficiency") {
  // topologies/gpus/b200.json: Transformer Engine's MXFP8 quantize kernel,
  // rowwise + columnwise in one pass, 4,427.8 of 7,672 GB/s = 0.577.
  const GpuProfile gpu = load_cluster(test::source_root() / "topologies" / "dgx-b200.json").gpu;
  CHECK(gpu.mxfp8_cast_efficiency == 0.577);
  CHECK(gpu.sources.count("mxfp8_cast_efficiency") == 1);
  REQUIRE(gpu.kernel_launch_ns == 4900);
  const ModelSpec m = test::llama3_8b();
  // The cast of QKV's input, 4096 x 4096 bf16 elements: read 2 B, write
  // 2 x (1 + 1/32) B = 68,157,440 B at 7,672 GB/s x 0.577 = 15.397 us, + 4.9 us.
  const LayerOps mx = transformer_layer_ops(m, layer_plan(Precision::mxfp8));
  const Op& cast = mx.forward[index_of(mx.forward, op::qkv) - 1];
  CHECK(cast.name == op::fp8_cast);
  CHECK(cast.precision == Precision::mxfp8);
  CHECK(op_time_ns(gpu, cast) == 20297);
  // The output gradient's cast before the dgrad likewise.
  const Op& grad_cast = mx.backward[index_of(mx.backward, op::fc2_dgrad) - 1];
  CHECK(grad_cast.name == op::fp8_grad_cast);
  CHECK(op_time_ns(gpu, grad_cast) ==
        std::llround(grad_cast.bytes / (7672e9 * 0.577) * 1e9) + 4900);
  // Per-tensor FP8's cast (2 + 2 x 1 B = 67,108,864 B) at the B200's
  // measured 0.876 of HBM (cub::DeviceTransform's add): 9.985 us + 4.9 us.
  const LayerOps cur = transformer_layer_ops(m, layer_plan(Precision::fp8_delayed));
  const Op& fp8 = cur.forward[index_of(cur.forward, op::qkv) - 1];
  CHECK(fp8.name == op::fp8_cast);
  CHECK(op_time_ns(gpu, fp8) == 14885);
  // A card without the figure: the MXFP8 cast at memory_bound_efficiency.
  GpuProfile plain = gpu;
  plain.mxfp8_cast_efficiency = 0;
  CHECK(op_time_ns(plain, cast) == 15041);
  // The H100 card has none (Hopper runs no MXFP8).
  CHECK(load_cluster(test::source_root() / "topologies" / "dgx-h100.json").gpu.mxfp8_cast_efficiency == 0);
}

TEST_CASE("fp8: a calibrated card's FP8 GEMM samples price FP8 GEMMs; its bf16 samples price only bf16 ones") {
  const ModelSpec m = test::llama3_8b();
  const Op fp8 = find(transformer_layer_ops(m, layer_plan(Precision::fp8_current)).forward, op::fc1);
  const Op bf16 = find(transformer_layer_ops(m, layer_plan(Precision::bf16)).forward, op::fc1);
  const Op fc2 = find(transformer_layer_ops(m, layer_plan(Precision::fp8_current)).forward, op::fc2);
  const GpuProfile datasheet = h100();
  GpuProfile gpu = h100();
  Calibration cal;
  cal.backend = "cuda";
  cal.ranks = 1;
  // bf16 samples only, FC1's shape at 1.6 ms: the FP8 GEMM keeps the datasheet model.
  cal.gemms.push_back(GemmSample{4096, 28672, 4096, 1, 1.6e6});
  gpu.calibration = std::make_shared<const Calibration>(cal);
  CHECK(op_time_ns(gpu, bf16) == 1600000);
  CHECK(op_time_ns(gpu, fp8) == op_time_ns(datasheet, fp8));
  // An FP8 sample at FC1's shape, 0.5 ms: the FP8 GEMM takes it, the bf16 one
  // still its own; best FP8 FLOP/s = 2 x 4096 x 28672 x 4096 / 0.5 ms.
  GemmSample s{4096, 28672, 4096, 1, 0.5e6};
  s.format = GemmFormat::fp8;
  cal.gemms.push_back(s);
  gpu.calibration = std::make_shared<const Calibration>(cal);
  CHECK(op_time_ns(gpu, fp8) == 500000);
  CHECK(op_time_ns(gpu, bf16) == 1600000);
  CHECK(*best_gemm_flops_per_s(cal, GemmFormat::fp8) == doctest::Approx(962072674304.0 / 0.5e-3));
  CHECK(*best_gemm_flops_per_s(cal) == doctest::Approx(962072674304.0 / 1.6e-3));
  // FC2 ([4096 x 14336] x [14336 x 4096]) is outside the one sample's range:
  // its roofline at the best FP8 rate (1924 TFLOP/s measured) instead of the
  // datasheet's 1979 x 0.803 = 1589, so faster than the datasheet FP8 model.
  const double fc2_flops = 2.0 * 4096 * 4096 * 14336;
  CHECK(op_time_ns(gpu, fc2) < op_time_ns(datasheet, fc2));
  CHECK(op_time_ns(gpu, fc2) >= std::llround(fc2_flops / (962072674304.0 / 0.5e-3) * 1e9));

  // The card's JSON: "precision": "fp8" on the FP8 sample only, read back; a
  // shape measured in both formats is no duplicate; another word is refused.
  const nlohmann::json j = calibration_to_json(cal);
  CHECK_FALSE(j["gemms"][0].contains("precision"));
  CHECK(j["gemms"][1]["precision"] == "fp8");
  const Calibration back = calibration_from_json(j, "card.json");
  REQUIRE(back.gemms.size() == 2);
  CHECK(back.gemms[0].format == GemmFormat::bf16);
  CHECK(back.gemms[1].format == GemmFormat::fp8);
  nlohmann::json bad = j;
  bad["gemms"][1]["precision"] = "fp16";
  CHECK_THROWS_AS(calibration_from_json(bad, "card.json"), InputError);
  bad["gemms"][1].erase("precision");
  CHECK_THROWS_AS(calibration_from_json(bad, "card.json"), InputError);  // now the same shape twice
}

namespace {

// Llama-3-8B on 8 H100 under ZeRO-3 (Megatron-FSDP), DP 8.
ParallelPlan fsdp_plan(Precision p, bool param_gather) {
  ParallelPlan plan = layer_plan(p);
  plan.dp = 8;
  plan.global_batch = 16;
  plan.zero_stage = 3;
  plan.fp8_param_gather = param_gather;
  return plan;
}

double collective_bytes(const ModelSpec& m, const ParallelPlan& plan, const std::string& name) {
  const StageStep step = StepDescription(m, plan, nullptr).stage(0);
  for (const StepCollective& c : step.collectives())
    if (c.name == name) return c.bytes;
  return -1.0;
}

}  // namespace

TEST_CASE("fp8: Megatron-FSDP gathers the FP8 shards, reduces bf16 gradients and transposes each backward's weights") {
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gpu = h100();
  constexpr double kQuantized = 218103808.0;  // per layer: QKV, proj, FC1, FC2
  const ParallelPlan bf16 = fsdp_plan(Precision::bf16, false);
  const ParallelPlan fp8 = fsdp_plan(Precision::fp8_current, true);
  const double params = stage_parameters(m, bf16, 0).dense;
  // Each unit gathered for the forward and the backward of each of the 2
  // micro-batches: the quantized weights at 1 B, the embedding, LM head and norms at 2 B.
  CHECK(collective_bytes(m, bf16, "zero3 gather") == params * 2);
  CHECK(collective_bytes(m, fp8, "zero3 gather") == (params - 32 * kQuantized) * 2 + 32 * kQuantized);
  // Gradients reduce-scattered in bf16, not the preset's fp32.
  CHECK(collective_bytes(m, bf16, "grad reduce") == params * 4);
  CHECK(collective_bytes(m, fp8, "grad reduce") == params * 2);
  // Memory: gradients 2 B instead of 4, the quantized weights' shard 1 B instead of 2, over DP 8;
  // and the gathered block's gradients (218,103,808 + 8,192 norm elements) 2 B instead of 4.
  const double base = memory_per_gpu(m, bf16, gpu).weight_and_optimizer_bytes;
  constexpr double kBlockGrads = -2 * (kQuantized + 8192);
  CHECK(memory_per_gpu(m, fp8, gpu).weight_and_optimizer_bytes - base ==
        doctest::Approx(-params * 2 / 8 - 32 * kQuantized / 8 + kBlockGrads).epsilon(1e-12));
  // MXFP8 keeps its columnwise shard too: 2 x 1.03125 B.
  const ParallelPlan mx = fsdp_plan(Precision::mxfp8, true);
  CHECK(memory_per_gpu(m, mx, gpu).weight_and_optimizer_bytes - base ==
        doctest::Approx(-params * 2 / 8 + 32 * kQuantized * (2 * 1.03125 - 2) / 8 + kBlockGrads).epsilon(1e-12));
  // Without the FP8 gather: bf16 shards, and Transformer Engine's cached rowwise + columnwise copies, whole.
  const ParallelPlan cached = fsdp_plan(Precision::fp8_current, false);
  CHECK(collective_bytes(m, cached, "zero3 gather") == params * 2);
  CHECK(memory_per_gpu(m, cached, gpu).weight_and_optimizer_bytes - base ==
        doctest::Approx(-params * 2 / 8 + 32 * kQuantized * 2 + kBlockGrads).epsilon(1e-12));
  // The backward's gathered rowwise data is transposed first (read 1 B,
  // write 1 B per weight); MXFP8 gathers its columnwise shard instead, and
  // without the FP8 gather the cached copies need none.
  const LayerOps ops = transformer_layer_ops(m, fp8);
  REQUIRE_FALSE(ops.backward.empty());
  CHECK(ops.backward.front().name == op::fp8_weight_transpose);
  CHECK(ops.backward.front().bytes == kQuantized * 2);
  CHECK(index_of(transformer_layer_ops(m, mx).backward, op::fp8_weight_transpose) ==
        transformer_layer_ops(m, mx).backward.size());
  CHECK(index_of(transformer_layer_ops(m, cached).backward, op::fp8_weight_transpose) ==
        transformer_layer_ops(m, cached).backward.size());
  // No per-step cast with the FP8 gather (the optimizer writes the FP8
  // shard); without it the cached copies are cast once per step as under ZeRO 0-2.
  // (Against a bf16 plan with the FP8 plans' bf16 gradients.)
  const StageParameters sp = stage_parameters(m, bf16, 0);
  ParallelPlan bf16_grads = bf16;
  bf16_grads.trainer.dp_grad_bytes = 2;
  const std::int64_t opt = StepDescription(m, bf16_grads, nullptr).optimizer_ns(gpu, sp, 0);
  CHECK(StepDescription(m, fp8, nullptr).optimizer_ns(gpu, sp, 0) == opt);
  // Current scaling: read 2 B for the amax, 2 B to cast, write 1 + 1 B.
  CHECK(StepDescription(m, cached, nullptr).optimizer_ns(gpu, sp, 0) - opt ==
        std::llround(32 * kQuantized * 6 / (3350e9 * 0.83) * 1e9));
}
