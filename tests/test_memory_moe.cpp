// Megatron-Core's selective recomputation of the MoE and latent-attention
// modules (--recompute-modules layernorm, moe_act, shared_experts, moe,
// mla_up_proj) and the MoE / MLA activations they act on, against hand
// arithmetic: each module's saved bytes, the ops it runs again and their
// bytes, FLOPs and time, and DeepSeek-V3 on GB200 as NVIDIA's recipe lays it
// out.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/pipeline_layout.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/report/report.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

constexpr auto bits(RecomputeModule m) { return static_cast<std::uint8_t>(m); }

// The small Mixtral (h 1024, 8 experts of FFN 2048, top-2) with one shared
// expert of FFN 1024 and the router's load at exactly the mean (no
// imbalance): its numbers stay round.
ModelSpec mixtral_shared() {
  ModelSpec m = test::small_mixtral_model();
  m.moe.shared_expert_ffn_hidden_size = 1024;
  m.moe.router_load_imbalance = 1.0;
  return m;
}

// TP 2 with SP, EP 4 (ep4_plan: 2,048 tokens, micro-batch 1), selective
// recomputation of `modules`.
ParallelPlan moe_plan(std::uint8_t modules) {
  ParallelPlan p = test::ep4_plan();
  p.recompute = Recompute::selective;
  p.recompute_modules = modules;
  return p;
}

std::vector<std::string> names(const std::vector<Op>& ops) {
  std::vector<std::string> out;
  for (const Op& op : ops) out.push_back(op.name);
  return out;
}

const Op& find(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  FAIL("no op " << name);
  return ops.front();
}

ModelSpec deepseek_v3() {
  ModelSpec m = load_model(test::source_root() / "tests/data/hf/deepseek-v3-config.json");
  m.moe.router_load_imbalance = 1.0;  // --moe-imbalance 1
  return m;
}

// NVIDIA's DeepSeek-V3 layout on GB200 (Megatron-Bridge 067f987d,
// perf_recipes/deepseek): TP 1 x PP 4 (4 virtual stages, the layout
// Et*4|(t*4|)*14tmL) x DP 64, EP 64, micro-batch 1, 4,096 tokens, global
// batch 4,096, ZeRO 1, flex dispatcher, bf16.
ParallelPlan deepseek_gb200_plan(std::uint8_t modules) {
  ParallelPlan p;
  p.tp = 1;
  p.pp = 4;
  p.dp = 64;
  p.ep = 64;
  p.etp = 1;
  p.micro_batch = 1;
  p.global_batch = 4096;
  p.seq_length = 4096;
  p.zero_stage = 1;
  p.schedule = Schedule::interleaved;
  p.virtual_stages = 4;
  p.pipeline_layout = parse_pipeline_layout("Et*4|(t*4|)*14tmL", "test", "layout");
  p.moe_dispatcher = MoeDispatcher::flex;
  p.recompute = Recompute::selective;
  p.recompute_modules = modules;
  return p;
}

}  // namespace

TEST_CASE("an MoE layer keeps the router's scores, the experts' input, FC1's and the activation's outputs") {
  // 1,024 local tokens (2,048 / TP 2 with SP), 2,048 expert rows (top-2, EP
  // 4: 4 ranks' tokens for 2 of 8 experts), FFN 2048: fp32 scores 1,024 x 8
  // x 4 B, the rows' input 2,048 x 1,024 x 2 B, FC1's output 2,048 x 4,096
  // x 2 B, SwiGLU's output 2,048 x 2,048 x 2 B, the shared expert's FC1 and
  // SwiGLU outputs 2,048 tokens x (2 x 1,024 + 1,024) / TP 2 x 2 B. The
  // experts' output is not kept (the probabilities multiply the activation).
  const ModelSpec m = mixtral_shared();
  const ParallelPlan none = moe_plan(bits(RecomputeModule::core_attn));
  const double moe_mlp = 32'768.0 + 4'194'304 + 16'777'216 + 8'388'608 + 6'291'456;
  CHECK(layer_activation_bytes(m, none, true) - layer_activation_bytes(m, none, false) ==
        moe_mlp - 6.0 * 2048 * 4096 / 2);  // the dense MLP's FC1 + SwiGLU outputs it replaces
}

TEST_CASE("moe_act, shared_experts, moe and layernorm: the bytes each drops and the ops each runs again") {
  using M = RecomputeModule;
  const ModelSpec m = mixtral_shared();
  const ParallelPlan base = moe_plan(bits(M::core_attn));
  const double kept = layer_activation_bytes(m, base, true);
  SUBCASE("moe_act: the activation's output, 2,048 rows x 2,048 x 2 B; SwiGLU again (read 2 x 2 B, write 2 B)") {
    const ParallelPlan p = moe_plan(bits(M::moe_act));
    CHECK(kept - layer_activation_bytes(m, p, true) == 8'388'608.0);
    const LayerOps ops = transformer_layer_ops(m, p, true);
    REQUIRE(names(ops.recompute) == std::vector<std::string>{op::expert_act});
    CHECK(ops.recompute[0].bytes == 2048.0 * 2048 * 6);
    const GpuProfile gpu = test::dgx_a100(1).gpu;
    CHECK(op_time_ns(gpu, ops.recompute[0]) == memory_bound_time_ns(gpu, 2048.0 * 2048 * 6));
    // A dense layer has no experts: nothing dropped.
    CHECK(layer_activation_bytes(m, p, false) == layer_activation_bytes(m, base, false));
  }
  SUBCASE("shared_experts: FC1's and SwiGLU's outputs; its MLP again with SP's all-gather and reduce-scatter") {
    const ParallelPlan p = moe_plan(bits(M::shared_experts));
    CHECK(kept - layer_activation_bytes(m, p, true) == 6'291'456.0);
    const LayerOps ops = transformer_layer_ops(m, p, true);
    CHECK(names(ops.recompute) == std::vector<std::string>{op::tp_ag_shared, op::shared_fc1, op::shared_act,
                                                           op::shared_fc2, op::tp_rs_shared});
    // 2,048 tokens x h 1,024 x (2 x 1,024 / TP 2) and back: 2 m n k each.
    CHECK(find(ops.recompute, op::shared_fc1).flops == 2.0 * 2048 * 1024 * 1024);
    CHECK(find(ops.recompute, op::shared_fc2).flops == 2.0 * 2048 * 512 * 1024);
  }
  SUBCASE("moe: everything but the input; the whole MoE MLP again, the EP exchanges included") {
    const ParallelPlan p = moe_plan(bits(M::moe));
    CHECK(kept - layer_activation_bytes(m, p, true) == 32'768.0 + 4'194'304 + 16'777'216 + 8'388'608 + 6'291'456);
    const LayerOps ops = transformer_layer_ops(m, p, true);
    std::vector<std::string> mlp;  // the forward between the pre-MLP norm and its bias-dropout-add
    bool in = false;
    for (const Op& op : ops.forward) {
      if (op.name == op::drop_add_mlp) in = false;
      if (in) mlp.push_back(op.name);
      if (op.name == op::norm_mlp) in = true;
    }
    CHECK(names(ops.recompute) == mlp);
    CHECK(find(ops.recompute, op::ep_a2a_dispatch).comm_bytes == 2048.0 * 1024 * 2);
    CHECK(find(ops.recompute, op::expert_fc1).flops == 2.0 * 2048 * 4096 * 1024);
    // A dense layer has no MoE MLP: nothing to recompute, nothing dropped.
    CHECK(transformer_layer_ops(m, p, false).recompute.empty());
    CHECK(layer_activation_bytes(m, p, false) == layer_activation_bytes(m, base, false));
    // Hardware FLOPs: per token the experts' 2 h (f_e k + f_s) x 3 GEMMs on
    // each of the 4 MoE layers, over 64 x 2,048 tokens (the router's GEMM
    // is not counted, as Megatron does not).
    const double per_token = 2.0 * 1024 * (2048 * 2 + 1024) * 3;
    CHECK(hardware_flops_per_iteration(m, p) - model_flops_per_iteration(m, p) ==
          doctest::Approx(4 * per_token * 64 * 2048).epsilon(1e-12));
  }
  SUBCASE("moe with moe_act and shared_experts: nothing kept; the inner modules run once more") {
    const ParallelPlan p = moe_plan(bits(M::moe) | bits(M::moe_act) | bits(M::shared_experts));
    CHECK(layer_activation_bytes(m, p, true) == layer_activation_bytes(m, moe_plan(bits(M::moe)), true));
    const LayerOps ops = transformer_layer_ops(m, p, true);
    CHECK(ops.recompute.size() == transformer_layer_ops(m, moe_plan(bits(M::moe)), true).recompute.size() + 1 + 5);
  }
  SUBCASE("layernorm: the pre-MLP norm's output of an MoE layer (2 s h / TP 2 B); none on a dense layer") {
    const ParallelPlan p = moe_plan(bits(M::layernorm));
    CHECK(kept - layer_activation_bytes(m, p, true) == 2.0 * 2048 * 1024 / 2);
    CHECK(names(transformer_layer_ops(m, p, true).recompute) == std::vector<std::string>{op::norm_mlp});
    // Standard attention's input norm is fused into linear_qkv (an IdentityOp).
    CHECK(transformer_layer_ops(m, p, false).recompute.empty());
    CHECK(layer_activation_bytes(m, p, false) == layer_activation_bytes(m, base, false));
  }
}

TEST_CASE("latent attention keeps its latents, Q, K, V and the projection's input; mla_up_proj drops Q, K, V") {
  const ModelSpec m = deepseek_v3();
  // One micro-batch of 4,096 tokens at TP 1: 8 s h (two norm inputs, the
  // down projections' input, the MLP's input) + the latents' norm inputs and
  // outputs 4 B x (1,536 + 512) + Q, K (128 x 192) and V, the projection's
  // input (128 x 128) at 2 B, per token; the dense MLP 6 x 18,432 per token.
  const ParallelPlan p = deepseek_gb200_plan(0);
  const double s = 4096, h = 7168;
  const double common = 8 * s * h + 4 * s * 2048 + 2 * s * 128 * (192 + 192 + 128 + 128);
  CHECK(common == 939'524'096.0);
  CHECK(layer_activation_bytes(m, p, false) == common + 6 * s * 18432);
  // mla_up_proj: the up projections' norm outputs (2 B x 2,048) and Q, K, V
  // (2 B x 128 x 512) per token, 553,648,128 B a layer, MoE or dense.
  const ParallelPlan up = deepseek_gb200_plan(bits(RecomputeModule::mla_up_proj));
  CHECK(layer_activation_bytes(m, p, false) - layer_activation_bytes(m, up, false) == 553'648'128.0);
  CHECK(layer_activation_bytes(m, p, true) - layer_activation_bytes(m, up, true) == 553'648'128.0);
  const LayerOps ops = transformer_layer_ops(m, up, true);
  REQUIRE(names(ops.recompute) ==
          std::vector<std::string>{op::mla_q_norm, op::mla_kv_norm, op::mla_q_up, op::mla_kv_up});
  CHECK(ops.recompute[2].flops == 2.0 * s * 1536 * 128 * 192);
  CHECK(ops.recompute[3].flops == 2.0 * s * 512 * 128 * 256);
  // Hardware FLOPs: those two GEMMs on each of the 61 + 1 (MTP) layers, per
  // token, 4,096 x 4,096 tokens.
  const double per_token = 2.0 * (1536 * 128 * 192 + 512 * 128 * 256);
  CHECK(hardware_flops_per_iteration(m, up) - model_flops_per_iteration(m, up) ==
        doctest::Approx(62 * per_token * 4096 * 4096).epsilon(1e-12));
  // layernorm: the input norm (a module of its own before latent
  // attention's down projections) on every layer, the pre-MLP norm on MoE
  // layers, 2 s h B each.
  const ParallelPlan ln = deepseek_gb200_plan(bits(RecomputeModule::layernorm));
  CHECK(layer_activation_bytes(m, p, false) - layer_activation_bytes(m, ln, false) == 2 * s * h);
  CHECK(layer_activation_bytes(m, p, true) - layer_activation_bytes(m, ln, true) == 4 * s * h);
  CHECK(names(transformer_layer_ops(m, ln, true).recompute) == std::vector<std::string>{op::norm_in, op::norm_mlp});
  CHECK(names(transformer_layer_ops(m, ln, false).recompute) == std::vector<std::string>{op::norm_in});
  // Under a transformer_engine graph naming moe_router the pre-MLP norm is
  // kept (its output leaves the graph in a static buffer), unless the graph
  // names moe_preprocess too with the alltoall dispatcher
  // (transformer_layer.py:481-531@d98e8a64).
  ParallelPlan graphed = ln;
  graphed.trainer.cuda_graphs =
      CudaGraphs::parse("transformer_engine:attn,moe_router,moe_preprocess", "test", "cuda_graphs");
  graphed.moe_dispatcher = MoeDispatcher::flex;
  CHECK(layer_activation_bytes(m, graphed, true) - layer_activation_bytes(m, ln, true) == 2 * s * h);
  CHECK(names(transformer_layer_ops(m, graphed, true).recompute) == std::vector<std::string>{op::norm_in});
  graphed.moe_dispatcher = MoeDispatcher::alltoall;
  CHECK(layer_activation_bytes(m, graphed, true) == layer_activation_bytes(m, ln, true));
  graphed.trainer.cuda_graphs = CudaGraphs::parse("local:attn,moe_router", "test", "cuda_graphs");  // local: recomputed
  graphed.moe_dispatcher = MoeDispatcher::flex;
  CHECK(layer_activation_bytes(m, graphed, true) == layer_activation_bytes(m, ln, true));
}

TEST_CASE("mla_up_proj with TP 2 and SP: the latents' all-gathers run again, the latents are sharded") {
  const ModelSpec m = deepseek_v3();
  ParallelPlan p = deepseek_gb200_plan(bits(RecomputeModule::mla_up_proj));
  p.tp = 2;
  p.dp = 32;
  p.sequence_parallel = true;
  const LayerOps ops = transformer_layer_ops(m, p, true);
  CHECK(names(ops.recompute) ==
        std::vector<std::string>{op::mla_q_norm, op::mla_kv_norm, op::mla_ag_q, op::mla_ag_kv, op::mla_q_up, op::mla_kv_up});
  // 2,048 + 2,048 tokens x 1,536 x 2 B gathered.
  CHECK(find(ops.recompute, op::mla_ag_q).comm_bytes == 4096.0 * 1536 * 2);
  ParallelPlan none = p;
  none.recompute_modules = 0;
  // (2 B x 2,048 latents) / TP with SP + (2 B x 128 x 512) / TP per token.
  CHECK(layer_activation_bytes(m, none, true) - layer_activation_bytes(m, p, true) ==
        (2.0 * 4096 * 2048 + 2.0 * 4096 * 128 * 512) / 2);
  // FP8 (current scaling): the up projections save their input in FP8 (1 B),
  // Q, K, V stay bf16.
  none.precision = p.precision = Precision::fp8_current;
  CHECK(layer_activation_bytes(m, none, true) - layer_activation_bytes(m, p, true) ==
        (1.0 * 4096 * 2048 + 2.0 * 4096 * 128 * 512) / 2);
  REQUIRE(names(transformer_layer_ops(m, p, true).recompute).size() > 6);  // the casts before the up projections
}

TEST_CASE("DeepSeek-V3 on 256 GB200 as NVIDIA lays it out: 126.7 GiB of activations, 87.5 GiB with mla_up_proj") {
  // Stage 0 holds layers 0-3, 16-19, 32-35, 48-51: 3 dense and 13 MoE
  // layers, 4 + 3/4 micro-batches in flight (interleaved, PP 4, v 4).
  // Dense layer: 939,524,096 (above) + 6 x 4,096 x 18,432 = 1,392,508,928 B.
  // MoE layer: 939,524,096 + the router's scores 4,096 x 256 x 4 + 32,768
  // rows (top-8) x 7,168 x 2 + 32,768 x 2,048 x 6 + the shared expert 6 x
  // 4,096 x 2,048 = 1,866,465,280 B. With EP the flex dispatch's buffers
  // (32,768 copies + 32,768 rows) x 7,168 x 2 B, and the token ids 8 B x
  // 4,096 per micro-batch in flight.
  const ModelSpec m = deepseek_v3();
  const Cluster c = load_cluster(test::source_root() / "topologies/gb200-nvl72.json", 4, 64);
  const double buffers = 939'524'096.0, ids = 8.0 * 4096 * 4.75;
  const ParallelPlan p = deepseek_gb200_plan(0);
  REQUIRE_FALSE(check_plan(p, m, c));
  CHECK(moe_layers_on_stage(m, p, 0) == 13);
  CHECK(layer_activation_bytes(m, p, true) == 1'866'465'280.0);
  const MemoryReport without = memory_per_gpu(m, p, c.gpu);
  CHECK(without.peak_stage == 0);
  CHECK(without.activation_bytes == (3 * 1'392'508'928.0 + 13 * 1'866'465'280.0) * 4.75 + buffers + ids);
  CHECK(without.activation_bytes / (1024.0 * 1024 * 1024) == doctest::Approx(126.69).epsilon(1e-4));
  // mla_up_proj: 553,648,128 B less a layer.
  const ParallelPlan up = deepseek_gb200_plan(bits(RecomputeModule::mla_up_proj));
  REQUIRE_FALSE(check_plan(up, m, c));
  const MemoryReport with = memory_per_gpu(m, up, c.gpu);
  CHECK(with.activation_bytes == (3 * 838'860'800.0 + 13 * 1'312'817'152.0) * 4.75 + buffers + ids);
  CHECK(with.activation_bytes / (1024.0 * 1024 * 1024) == doctest::Approx(87.51).epsilon(1e-4));
  CHECK(with.total_bytes < static_cast<double>(c.gpu.memory_bytes));
  CHECK(without.total_bytes > static_cast<double>(c.gpu.memory_bytes));
}

TEST_CASE("the modules Megatron-Core refuses, quoted; every other module is priced") {
  using M = RecomputeModule;
  const ModelSpec moe = mixtral_shared();
  const ModelSpec dsv3 = deepseek_v3();
  const Cluster c = test::dgx_a100(2);
  ParallelPlan p = moe_plan(bits(M::layernorm) | bits(M::moe_act) | bits(M::moe) | bits(M::shared_experts));
  CHECK_FALSE(check_plan(p, moe, c));
  // transformer_config.py:1969-1973@d98e8a64: mla_up_proj only with latent attention.
  p.recompute_modules = bits(M::mla_up_proj);
  auto r = check_plan(p, moe, c);
  REQUIRE(r);
  CHECK(describe(*r, moe, c) == "Megatron-Core recomputes mla_up_proj only with latent attention");
  // :2001-2006: neither moe_act nor layernorm with delayed FP8 scaling.
  p.recompute_modules = bits(M::layernorm);
  p.precision = Precision::fp8_delayed;
  r = check_plan(p, moe, c);
  REQUIRE(r);
  CHECK(describe(*r, moe, c) == "Megatron-Core does not recompute layernorm with delayed FP8 scaling");
  p.precision = Precision::bf16;
  // :3030-3032: the EP overlap refuses moe in recompute_modules.
  p.recompute_modules = bits(M::moe);
  p.pp = 1;
  p.dp = 8;
  p.moe_ep_overlap = true;
  r = check_plan(p, moe, c);
  REQUIRE(r);
  CHECK(r->kind == PlanCheck::ep_overlap_refused);
  CHECK(describe(*r, moe, c) ==
        "the EP all-to-all overlap (--overlap-moe-expert-parallel-comm) cannot run with the MoE layer recomputed "
        "(--recompute-modules moe) (Megatron-Core asserts it: megatron/core/transformer/transformer_config.py:"
        "3030@d98e8a64)");
  p.recompute_modules = bits(M::moe_act);
  CHECK_FALSE(check_plan(p, moe, c));
  // DeepSeek-V3's layout with every module.
  const Cluster gb200 = load_cluster(test::source_root() / "topologies/gb200-nvl72.json", 4, 64);
  CHECK_FALSE(check_plan(deepseek_gb200_plan(bits(M::mla_up_proj) | bits(M::layernorm) | bits(M::moe_act) |
                                             bits(M::moe) | bits(M::shared_experts) | bits(M::mlp)),
                         dsv3, gb200));
}

TEST_CASE("the MoE and MLA modules round-trip through a plan file and export to Megatron-LM and Megatron-Bridge") {
  using M = RecomputeModule;
  const ModelSpec m = mixtral_shared();
  const Cluster c = test::dgx_a100(2);
  const ParallelPlan p = moe_plan(bits(M::layernorm) | bits(M::moe_act) | bits(M::shared_experts));
  REQUIRE_FALSE(check_plan(p, m, c));
  const PlanFile pf = plan_file_from_json(plan_to_json(m, c, estimate(m, Topology(c), p)), "moe.plan.json");
  CHECK(pf.plan.recompute_modules == p.recompute_modules);
  CHECK(export_plan(pf, "megatron").text.find("--recompute-modules layernorm moe_act shared_experts\n") !=
        std::string::npos);
  CHECK(export_plan(pf, "megatron-bridge").text.find(
            "recompute_modules=[\"layernorm\", \"moe_act\", \"shared_experts\"]") != std::string::npos);
  // The report names them.
  CHECK(format_estimate(m, c, estimate(m, Topology(c), p)).find("recompute selective (layernorm,moe_act,shared_experts),") !=
        std::string::npos);
}

TEST_CASE("per-layer CUDA graphs: the plain checkpoints inside a captured part recompute nothing") {
  // Megatron-Core's tensor_parallel.checkpoint runs the function as it is
  // while a per-layer graph is captured (random.py:680-687 at d98e8a64):
  // moe, shared_experts, mlp and core_attn keep their activations there;
  // the output-discarding moe_act still drops its output.
  using M = RecomputeModule;
  const ModelSpec m = mixtral_shared();
  ParallelPlan p = moe_plan(bits(M::moe) | bits(M::moe_act));
  const double recomputed = layer_activation_bytes(m, p, true);
  const std::size_t ops = transformer_layer_ops(m, p, true).recompute.size();
  p.trainer.cuda_graphs = CudaGraphs::parse("local", "test", "graphs");  // the whole layer
  CHECK(p.recomputes(M::moe));
  CHECK_FALSE(p.checkpoints(M::moe));
  CHECK(p.checkpoints(M::moe_act));
  CHECK(layer_activation_bytes(m, p, true) - recomputed == 32'768.0 + 4'194'304 + 16'777'216 + 6'291'456);
  CHECK(names(transformer_layer_ops(m, p, true).recompute) == std::vector<std::string>{op::expert_act});
  // The attention alone captured: the MoE MLP is outside the graph.
  p.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:attn", "test", "graphs");
  CHECK(p.checkpoints(M::moe));
  CHECK(layer_activation_bytes(m, p, true) == recomputed);
  CHECK(transformer_layer_ops(m, p, true).recompute.size() == ops);
  // The full-iteration graph sets no capture flag: recomputed.
  p.trainer.cuda_graphs = CudaGraphs::parse("full_iteration", "test", "graphs");
  CHECK(p.checkpoints(M::moe));
  // A dense MLP under a graph of its part keeps its activations too.
  const ModelSpec dense = test::llama3_8b();
  ParallelPlan d = moe_plan(bits(M::mlp));
  d.ep = 1;
  const double mlp_recomputed = layer_activation_bytes(dense, d, false);
  d.trainer.cuda_graphs = CudaGraphs::parse("transformer_engine:mlp", "test", "graphs");
  CHECK(layer_activation_bytes(dense, d, false) - mlp_recomputed == 6.0 * 2048 * 14336 / 2);
  CHECK(transformer_layer_ops(dense, d, false).recompute.empty());
}
