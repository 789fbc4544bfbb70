// Cost models (GEMM, memory-bound, collectives, group link parameters) and the
// workload they price (ops of a layer, FLOPs against flops.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/core/workload.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

// The Llama-3-8B shape (GQA: 32 heads, 8 KV heads).
ModelSpec llama_gqa() {
  ModelSpec m = test::llama3_8b();
  m.name = "llama-gqa-test";
  return m;
}

ParallelPlan plan_of(int tp, int micro_batch, std::int64_t seq, bool sp, bool flash, Recompute r) {
  ParallelPlan p;
  p.tp = tp;
  p.micro_batch = micro_batch;
  p.global_batch = micro_batch;
  p.seq_length = seq;
  p.sequence_parallel = sp;
  p.flash_attention = flash;
  p.recompute = r;
  return p;
}

ParallelPlan unfused(ParallelPlan p) {
  p.grad_accum_fusion = false;
  return p;
}

double sum_flops(const std::vector<Op>& ops) {
  double total = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::gemm || op.kind == OpKind::attention_core) total += op.flops;
  }
  return total;
}

int count(const std::vector<Op>& ops, Collective c) {
  int n = 0;
  for (const Op& op : ops) n += op.kind == OpKind::collective && op.collective == c ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("collective times follow the NCCL bus-bandwidth formulas") {
  const LinkParams link{230e9, 1000.0};
  const double gib = 1073741824.0;
  // all-reduce of 1 GiB over 8 GPUs: 2 * 7/8 * 2^30 / 230e9 s + 14 alpha.
  const double ar_ns = 2.0 * 7.0 / 8.0 * gib / 230e9 * 1e9 + 14 * 1000.0;
  CHECK(std::abs(static_cast<double>(collective_time_ns(Collective::all_reduce, gib, 8, link)) - ar_ns) <= 1.0);
  CHECK(std::abs(ar_ns - 8183774.7) < 1.0);  // 1879048192 B / 230 GB/s = 8169774.7 ns, + 14 us
  const double rs_ns = 7.0 / 8.0 * gib / 230e9 * 1e9 + 7 * 1000.0;
  CHECK(std::abs(static_cast<double>(collective_time_ns(Collective::reduce_scatter, gib, 8, link)) - rs_ns) <= 1.0);
  CHECK(std::abs(static_cast<double>(collective_time_ns(Collective::all_gather, gib, 8, link)) - rs_ns) <= 1.0);
  const double bc_ns = gib / 230e9 * 1e9 + 7 * 1000.0;
  CHECK(std::abs(static_cast<double>(collective_time_ns(Collective::broadcast, gib, 8, link)) - bc_ns) <= 1.0);
  // send/recv of 100 MB at 24 GB/s: 4.1667 ms + one alpha.
  CHECK(collective_time_ns(Collective::send_recv, 100e6, 2, LinkParams{24e9, 3000.0}) == 4166667 + 3000);
  // Degenerate groups and sizes cost nothing.
  CHECK(collective_time_ns(Collective::all_reduce, gib, 1, link) == 0);
  CHECK(collective_time_ns(Collective::all_reduce, 0, 8, link) == 0);
}

TEST_CASE("GEMM efficiency: wave and tile quantisation over 108 SMs, roofline for shallow k") {
  const GpuProfile g = a100();
  // 12 x 9 = 108 tiles of 128 x 128: exactly one wave -> the profile's best.
  CHECK(gemm_efficiency(g, 128 * 12, 128 * 9, 8192) == doctest::Approx(0.869));
  // 109 tiles: two waves, 109 of 216 SM slots busy. One tile column has an
  // arithmetic intensity below A100's ridge point, so give this profile a
  // fast memory to look at quantisation alone.
  GpuProfile fast_hbm = g;
  fast_hbm.hbm_bandwidth_Bps *= 100;
  CHECK(gemm_efficiency(fast_hbm, 128 * 109, 128, 8192) == doctest::Approx(0.869 * 109.0 / 216.0));
  CHECK(gemm_efficiency(fast_hbm, 128, 128, 8192, 109) == doctest::Approx(0.869 * 109.0 / 216.0));
  // 109 x 8 = 872 tiles: 9 waves of 108 -> 872 / 972 (compute-bound: k = 8192).
  CHECK(gemm_efficiency(g, 128 * 109, 128 * 8, 8192) == doctest::Approx(0.869 * 872.0 / 972.0));
  // A partial tile: m = 129 needs two tile rows, 129/256 of them useful (one wave).
  CHECK(gemm_efficiency(g, 129, 128 * 9, 1 << 16) == doctest::Approx(0.869 * 129.0 * 9 / (108.0 * 128.0)));
  // Shallow k is memory-bound: time = (mk + kn + mn) * 2 bytes / (hbm * eff).
  const double m = 8192, n = 8192, k = 16;
  const double mem_s = (m * k + k * n + m * n) * 2 / (2039e9 * 0.8);
  CHECK(gemm_efficiency(g, 8192, 8192, 16) == doctest::Approx(2 * m * n * k / (312e12 * mem_s)));
  CHECK(static_cast<double>(gemm_time_ns(g, 8192, 8192, 16)) == doctest::Approx(mem_s * 1e9).epsilon(1e-6));
  // An fp32 read-modify-write of C (fused main_grad accumulation: 6 B more
  // per element of C) lengthens the memory side by its bytes.
  const double extra = 6 * m * n;
  CHECK(static_cast<double>(gemm_time_ns(g, 8192, 8192, 16, 1, extra)) ==
        doctest::Approx((mem_s + extra / (2039e9 * 0.8)) * 1e9).epsilon(1e-6));
  // Compute-bound time of the one-wave GEMM.
  const double flops = 2.0 * 1536 * 1152 * 8192;
  CHECK(std::abs(static_cast<double>(gemm_time_ns(g, 1536, 1152, 8192)) - flops / (312e12 * 0.869) * 1e9) <= 1.0);
}

TEST_CASE("memory-bound time is bytes over the achievable HBM bandwidth plus launch") {
  GpuProfile g = a100();
  g.kernel_launch_ns = 2000;
  CHECK(memory_bound_time_ns(g, 1.6312e9) == 1000000 + 2000);  // 1.6312 GB at 1631.2 GB/s
  CHECK(memory_bound_time_ns(g, 0) == 0);
  Op op;
  op.kind = OpKind::collective;
  op.comm_bytes = 1e9;
  CHECK(op_time_ns(g, op) == 0);  // comm ops are priced with their group's link
}

TEST_CASE("group link parameters by tier") {
  const Topology topo(dgx_a100(4, /*nodes_per_leaf=*/2, /*oversubscription=*/2.0));
  // Inside a node: NVSwitch busbw, all-reduce figure for all-reduce.
  LinkParams l = group_link_params(topo, Collective::all_reduce, {0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(l.busbw_Bps == doctest::Approx(230e9));
  CHECK(l.latency_ns == doctest::Approx(1000));
  l = group_link_params(topo, Collective::all_gather, {0, 1});
  CHECK(l.busbw_Bps == doctest::Approx(220e9));
  // A single GPU: free.
  CHECK(collective_time_ns(Collective::all_reduce, 1e9, 1, group_link_params(topo, Collective::all_reduce, {3})) == 0);
  // One GPU per node on two nodes under one leaf: one GPU's NIC share, 8 * 24 / 8.
  l = group_link_params(topo, Collective::all_reduce, {0, 8});
  CHECK(l.busbw_Bps == doctest::Approx(24e9));
  CHECK(l.latency_ns == doctest::Approx(3000));
  // Eight GPUs per node on two nodes: 8 rails = 192 GB/s (below NVLink's 230).
  std::vector<int> two_nodes;
  for (int r = 0; r < 16; ++r) two_nodes.push_back(r);
  l = group_link_params(topo, Collective::all_reduce, two_nodes);
  CHECK(l.busbw_Bps == doctest::Approx(192e9));
  // Rail-optimised: GPU 0 of node 0 and GPU 1 of node 1 sit on different
  // leaves, but NCCL keeps the traffic on one rail (PXN): still one leaf.
  l = group_link_params(topo, Collective::all_reduce, {0, 9});
  CHECK(l.busbw_Bps == doctest::Approx(24e9));
  // Across leaf groups (nodes 0 and 2): oversubscription 2 and two more switches.
  l = group_link_params(topo, Collective::all_reduce, {0, 16});
  CHECK(l.busbw_Bps == doctest::Approx(12e9));
  CHECK(l.latency_ns == doctest::Approx(3000 + 2 * 500));
}

TEST_CASE("layer forward FLOPs x tp equal flops.hpp's layer_forward_flops") {
  struct Case {
    ModelSpec model;
    int tp;
    int b;
    std::int64_t s;
    bool sp;
    bool flash;
  };
  const std::vector<Case> cases{
      {gpt(48, 6144, 64), 8, 4, 2048, false, false},
      {gpt(48, 6144, 64), 8, 4, 2048, true, true},
      {gpt(96, 12288, 96), 8, 1, 2048, true, false},
      {gpt(24, 1024, 16), 1, 8, 1024, false, true},
      {llama_gqa(), 4, 1, 8192, true, true},
      {llama_gqa(), 8, 2, 4096, false, false},
  };
  for (const Case& c : cases) {
    const ParallelPlan p = plan_of(c.tp, c.b, c.s, c.sp, c.flash, Recompute::none);
    const LayerOps ops = transformer_layer_ops(c.model, p);
    CAPTURE(c.tp);
    CAPTURE(c.flash);
    const double ref = layer_forward_flops(c.model, c.b, c.s);
    CHECK(sum_flops(ops.forward) * c.tp == doctest::Approx(ref).epsilon(1e-12));
    // Attention core alone matches too.
    double attn = 0;
    for (const Op& op : ops.forward) {
      if (op.kind == OpKind::attention_core || op.name.rfind("attn_", 0) == 0) attn += op.flops;
    }
    CHECK(attn * c.tp == doctest::Approx(attention_core_forward_flops(c.model, c.b, c.s)).epsilon(1e-12));
    // Backward GEMMs are 2x forward; flash's backward adds the recomputed QK^T.
    const double attn_extra = c.flash ? 0.5 * attn : 0.0;
    CHECK(sum_flops(ops.backward) == doctest::Approx(2 * sum_flops(ops.forward) + attn_extra).epsilon(1e-12));
  }
}

TEST_CASE("TP collectives: none at tp 1, all-reduce without SP, RS + AG with SP") {
  const ModelSpec m = gpt(48, 6144, 64);
  const double bytes = 2048.0 * 4 * 6144 * 2;
  {
    const LayerOps ops = transformer_layer_ops(m, plan_of(1, 4, 2048, false, true, Recompute::none));
    CHECK(count(ops.forward, Collective::all_reduce) + count(ops.backward, Collective::all_reduce) == 0);
  }
  {
    const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::none));
    CHECK(count(ops.forward, Collective::all_reduce) == 2);
    CHECK(count(ops.backward, Collective::all_reduce) == 2);
    CHECK(count(ops.forward, Collective::all_gather) == 0);
    for (const Op& op : ops.forward) {
      if (op.kind == OpKind::collective) CHECK(op.comm_bytes == doctest::Approx(bytes));
    }
  }
  {
    const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, true, false, Recompute::none));
    CHECK(count(ops.forward, Collective::all_reduce) == 0);
    CHECK(count(ops.forward, Collective::reduce_scatter) == 2);
    CHECK(count(ops.forward, Collective::all_gather) == 2);
    CHECK(count(ops.backward, Collective::reduce_scatter) == 2);
    CHECK(count(ops.backward, Collective::all_gather) == 2);
  }
}

TEST_CASE("recomputation: full repeats the forward, selective the unfused attention core") {
  const ModelSpec m = gpt(48, 6144, 64);
  const LayerOps full = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::full));
  CHECK(full.recompute.size() == full.forward.size());
  CHECK(count(full.recompute, Collective::all_reduce) == 2);
  const LayerOps sel = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::selective));
  CHECK(sel.recompute.size() == 4);  // QK^T, softmax + dropout, AV, the context's permute copy
  CHECK(sum_flops(sel.recompute) * 8 == doctest::Approx(attention_core_forward_flops(m, 4, 2048)));
  const LayerOps sel_flash = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::selective));
  CHECK(sel_flash.recompute.empty());
  const LayerOps none = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::none));
  CHECK(none.recompute.empty());
}

TEST_CASE("embedding, LM head and pipeline message") {
  const ModelSpec m = gpt(48, 6144, 64);
  const ParallelPlan p = plan_of(8, 4, 2048, false, false, Recompute::none);
  const LayerOps head = lm_head_ops(m, p);
  const std::int64_t vocab = padded_vocab_size(m.vocab_size, 8);
  CHECK(sum_flops(head.forward) * 8 == doctest::Approx(logit_forward_flops(m, 4, 2048, vocab)));
  CHECK(sum_flops(head.backward) == doctest::Approx(2 * sum_flops(head.forward)));
  CHECK(count(head.forward, Collective::all_reduce) == 3);  // vocab-parallel cross-entropy
  const LayerOps embed = embedding_ops(m, p);
  CHECK(count(embed.forward, Collective::all_reduce) == 1);
  CHECK(!embed.backward.empty());
  CHECK(pipeline_message_bytes(m, p) == doctest::Approx(2048.0 * 4 * 6144 * 2 / 8));
}

TEST_CASE("traffic between pods pays the core's oversubscription (Llama 3-style 1:7)") {
  const cuboid::Cluster c = cuboid::load_cluster("topologies/h100-roce-24k.json", 768);  // two pods of 384 nodes
  const cuboid::Topology topo(c);
  const int gpn = c.gpus_per_node;
  // Two nodes under one ToR, two nodes in one pod, two nodes in different pods.
  const auto same_leaf = cuboid::group_link_params(topo, cuboid::Collective::all_reduce, {0, gpn});
  const auto same_pod = cuboid::group_link_params(topo, cuboid::Collective::all_reduce, {0, 100 * gpn});
  const auto cross_pod = cuboid::group_link_params(topo, cuboid::Collective::all_reduce, {0, 500 * gpn});
  CHECK(topo.tier(0, 500 * gpn) == cuboid::Tier::core);
  // One GPU per node: its share of the node's NICs, 8 x 46 GB/s / 8 GPUs.
  CHECK(same_leaf.busbw_Bps == doctest::Approx(46e9));
  CHECK(same_pod.busbw_Bps == doctest::Approx(46e9));  // full bisection inside a pod
  CHECK(cross_pod.busbw_Bps == doctest::Approx(46e9 / 7.0));
  CHECK(cross_pod.latency_ns > same_pod.latency_ns);
}

TEST_CASE("an oversubscribed core slows a phase's rings only as far as their crossing edges exceed its uplinks") {
  // Two pods of 384 nodes (3,072 GPUs each). A pod's uplink: 192 ToRs x 2
  // nodes x 8 NICs x 46 GB/s / 7 = 20,187 GB/s.
  const cuboid::Cluster c = cuboid::load_cluster("topologies/h100-roce-24k.json", 768);
  const cuboid::Topology topo(c);
  const int gpn = c.gpus_per_node;
  using cuboid::Collective;
  CHECK(topo.pod_of(383 * gpn) == 0);
  CHECK(topo.pod_of(384 * gpn) == 1);
  CHECK(topo.leaf_of(3 * gpn + 5) == 1);  // ToR 1 holds nodes 2 and 3
  // DP rings of GPU t on nodes 0, 16, 32, ... (48 nodes, 24 per pod), as TP
  // 8 x PP 16 with the DP dimension outermost: 128 rings, each leaving each
  // pod once.
  std::vector<std::vector<int>> dp;
  for (int s = 0; s < 16; ++s)
    for (int t = 0; t < gpn; ++t) {
      std::vector<int> g;
      for (int d = 0; d < 48; ++d) g.push_back((d * 16 + s) * gpn + t);
      dp.push_back(g);
    }
  const cuboid::UplinkLoad dp_load = cuboid::uplink_load(topo, dp);
  CHECK(dp_load.pod_edges == 128);
  CHECK(dp_load.leaf_edges == 16);  // a ToR's 2 nodes x 8 GPUs, each ring leaving it once
  // 128 x 46 GB/s = 5,888 GB/s < 20,187: the rings run at their NIC share.
  CHECK(cuboid::group_link_params(topo, Collective::all_reduce, dp[0], dp_load).busbw_Bps == doctest::Approx(46e9));
  // Pipeline pairs across the pod boundary: all 3,072 GPUs of node 0-383
  // send to nodes 384-767 (and back): 3,072 x 46 = 141,312 GB/s against
  // 20,187 GB/s, 7.0 x oversubscribed: the full oversubscription.
  std::vector<std::vector<int>> pairs;
  for (int r = 0; r < 384 * gpn; ++r) pairs.push_back({r, r + 384 * gpn});
  const cuboid::UplinkLoad pp_load = cuboid::uplink_load(topo, pairs);
  CHECK(pp_load.pod_edges == 3072);
  CHECK(cuboid::group_link_params(topo, Collective::send_recv, pairs[0], pp_load).busbw_Bps ==
        doctest::Approx(46e9 / 7.0));
  // A third of them (one pipeline stage of 128 nodes): 1,024 x 46 / 20,187 = 2.33.
  pairs.resize(128 * gpn);
  const cuboid::UplinkLoad third = cuboid::uplink_load(topo, pairs);
  CHECK(cuboid::group_link_params(topo, Collective::send_recv, pairs[0], third).busbw_Bps ==
        doctest::Approx(46e9 / (1024 * 46.0 / (192 * 2 * 8 * 46.0 / 7))));
  // Without the phase's load: the full oversubscription, as before.
  CHECK(cuboid::group_link_params(topo, Collective::all_reduce, dp[0]).busbw_Bps == doctest::Approx(46e9 / 7.0));
}

namespace {

const Op* find_named(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

// The fused attention core's forward and backward kernels among a layer's ops.
std::pair<const Op*, const Op*> flash_ops(const LayerOps& ops) {
  const Op* fwd = find_named(ops.forward, "attn_flash");
  const Op* bwd = find_named(ops.backward, "attn_flash_bwd");
  REQUIRE(fwd != nullptr);
  REQUIRE(bwd != nullptr);
  return {fwd, bwd};
}

}  // namespace

TEST_CASE("Megatron's separate kernels: QKV bias add and its gradient, attention context copy, QKV gradient cat") {
  // Korthikanti's 22B layer (Table 4): TP 8, b 4, s 2048, h 6144, 64 heads
  // (96 per head, 8 heads per GPU), unfused attention. T = 8192 tokens; the
  // QKV output per GPU is 8192 x 2304 bf16, the context 8192 x 768.
  const ModelSpec m = gpt_22b();
  const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::selective));
  const Op* bias = find_named(ops.forward, "qkv_bias");
  const Op* bias_grad = find_named(ops.backward, "qkv_bias_grad");
  const Op* ctx = find_named(ops.forward, "attn_ctx_copy");
  const Op* cat = find_named(ops.backward, "attn_qkv_grad_cat");
  REQUIRE(bias != nullptr);
  REQUIRE(bias_grad != nullptr);
  REQUIRE(ctx != nullptr);
  REQUIRE(cat != nullptr);
  CHECK(bias->bytes == 8192.0 * 2304 * 4);       // read + write bf16: 75,497,472 B
  CHECK(bias_grad->bytes == 8192.0 * 2304 * 2);  // grad_output.sum(dim=0) reads it once
  CHECK(ctx->bytes == 8192.0 * 768 * 4);         // permute(2, 0, 1, 3).contiguous(): 25,165,824 B
  CHECK(cat->bytes == 8192.0 * 2304 * 4);
  // The bias add runs right after the QKV GEMM; its gradient after the
  // input-gradient all-reduce, so QKV dgrad, wgrad, all-reduce stay the
  // overlapped triple the simulator looks for.
  for (std::size_t i = 0; i + 1 < ops.forward.size(); ++i) {
    if (ops.forward[i].name == "qkv") CHECK(ops.forward[i + 1].name == "qkv_bias");
  }
  for (std::size_t i = 0; i + 2 < ops.backward.size(); ++i) {
    if (ops.backward[i].name == "qkv_wgrad") {
      CHECK(ops.backward[i + 1].name == "tp_ar_attn_bwd");
      CHECK(ops.backward[i + 2].name == "qkv_bias_grad");
    }
  }
  // Selective recomputation re-runs the whole core attention, copy included.
  CHECK(find_named(ops.recompute, "attn_ctx_copy") != nullptr);
  // Priced as memory-bound kernels: 75,497,472 B at 2039 GB/s x 0.8 = 46,283.4 ns.
  CHECK(op_time_ns(a100(), *bias) == 46283);

  // No linear biases (Llama): no bias kernels. Flash attention: no copy, no cat.
  const LayerOps llama = transformer_layer_ops(llama_gqa(), plan_of(8, 1, 8192, true, false, Recompute::none));
  CHECK(find_named(llama.forward, "qkv_bias") == nullptr);
  CHECK(find_named(llama.backward, "qkv_bias_grad") == nullptr);
  CHECK(find_named(llama.forward, "attn_ctx_copy") != nullptr);
  const LayerOps flash = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::none));
  CHECK(find_named(flash.forward, "attn_ctx_copy") == nullptr);
  CHECK(find_named(flash.backward, "attn_qkv_grad_cat") == nullptr);
  CHECK(find_named(flash.forward, "qkv_bias") != nullptr);
}

TEST_CASE("the causal attention core moves what Megatron-LM's 2022 kernels move") {
  // Korthikanti's 22B layer: TP 8, b 4, s 2048, 8 heads per GPU of 96:
  // 32 score matrices of 2048 x 2048 = 134,217,728 elements, of which
  // 32 x 2048 x 2049 / 2 = 67,141,632 on or below the diagonal.
  const ModelSpec m = gpt_22b();
  const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::selective));
  const Op* fwd = find_named(ops.forward, "attn_softmax");
  const Op* bwd = find_named(ops.backward, "attn_softmax_bwd");
  const Op* scale = find_named(ops.backward, "attn_qk_scale_bwd");
  REQUIRE(fwd != nullptr);
  REQUIRE(bwd != nullptr);
  REQUIRE(scale != nullptr);
  // Softmax reads the lower triangle (2 B) and writes every element (2 B);
  // dropout reads 2, writes 2 + a 1-byte mask:
  // 2 x 67,141,632 + (2 + 5) x 134,217,728 = 1,073,807,360 B.
  CHECK(fwd->bytes == 1073807360.0);
  // Dropout backward reads the gradient and the mask, writes the gradient
  // (5 B); the softmax backward reads gradient + output on the triangle
  // (4 B) and writes every element (2 B), in place:
  // (5 + 2) x 134,217,728 + 4 x 67,141,632 = 1,208,090,624 B (was 2x forward).
  CHECK(bwd->bytes == 1208090624.0);
  // baddbmm's alpha on dQ and dK: 2 x 32 x 2048 x 96 elements, read + write.
  CHECK(scale->bytes == 2.0 * 32 * 2048 * 96 * 4);
  // It follows the QK^T backward GEMMs.
  for (std::size_t i = 0; i + 1 < ops.backward.size(); ++i) {
    if (ops.backward[i].name == "attn_qk_wgrad") CHECK(ops.backward[i + 1].name == "attn_qk_scale_bwd");
  }
  // Selective recomputation repeats the forward kernels, same bytes.
  const Op* again = find_named(ops.recompute, "attn_softmax");
  REQUIRE(again != nullptr);
  CHECK(again->bytes == fwd->bytes);
  // 1,073,807,360 B at 2039 GB/s x 0.8 = 658,293.3 ns.
  CHECK(op_time_ns(a100(), *fwd) == 658293);
}

TEST_CASE("ALiBi without flash attention: the bias copied into the scores, read back by the score GEMM") {
  // The 22B layer's shape (32 score matrices of 2048 x 2048 = 134,217,728
  // elements per GPU) with ALiBi instead of learned positions.
  ModelSpec m = gpt_22b();
  m.learned_position_embeddings = false;
  const LayerOps plain = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::selective));
  m.alibi = true;
  const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::selective));
  const Op* bias = find_named(ops.forward, "attn_alibi_bias");
  const Op* qk = find_named(ops.forward, "attn_qk");
  const Op* qk_plain = find_named(plain.forward, "attn_qk");
  REQUIRE(bias != nullptr);
  REQUIRE(qk != nullptr);
  REQUIRE(qk_plain != nullptr);
  CHECK(find_named(plain.forward, "attn_alibi_bias") == nullptr);
  // The expanded copy writes 2 B per score, before the GEMM that reads it as C (2 B more).
  CHECK(bias->kind == OpKind::memory_bound);
  CHECK(bias->bytes == 2.0 * 134217728);
  CHECK(qk->bytes == qk_plain->bytes + 2.0 * 134217728);
  CHECK(qk->flops == qk_plain->flops);
  for (std::size_t i = 0; i + 1 < ops.forward.size(); ++i)
    if (ops.forward[i].name == "attn_alibi_bias") CHECK(ops.forward[i + 1].name == "attn_qk");
  // Selective recomputation repeats it; the backward has nothing of it (no gradient).
  CHECK(find_named(ops.recompute, "attn_alibi_bias") != nullptr);
  for (const Op& op : ops.backward) CHECK(op.name.find("alibi") == std::string::npos);
  CHECK(ops.backward.size() == plain.backward.size());
  // A streaming write at memory_bound_efficiency: 268,435,456 B at 2039 GB/s x 0.8 = 164,563.1 ns.
  CHECK(!bias->unfused_attention);
  CHECK(op_time_ns(a100(), *bias) == 164563);
  // Flash attention takes the slopes in its kernel: nothing added.
  const LayerOps flash = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::none));
  CHECK(find_named(flash.forward, "attn_alibi_bias") == nullptr);
}

TEST_CASE("cross-entropy over fp32 logits and the embedding lookup, per Megatron-LM 2022") {
  const ModelSpec m = gpt_22b();
  const ParallelPlan p = plan_of(8, 4, 2048, false, false, Recompute::none);
  // 8192 tokens x 6400 vocabulary entries per GPU = 52,428,800 logits.
  const LayerOps head = lm_head_ops(m, p);
  const Op* xent = find_named(head.forward, "xent");
  const Op* xent_bwd = find_named(head.backward, "xent_bwd");
  REQUIRE(xent != nullptr);
  REQUIRE(xent_bwd != nullptr);
  // .float() 2 + 4, max 4, sub_ 4 + 4, exp 4 + 4, sum 4, div_ 4 + 4 = 38 B.
  CHECK(xent->bytes == 38.0 * 52428800);
  // mul_ by the loss gradient 4 + 4, cast back to bf16 4 + 2 = 14 B.
  CHECK(xent_bwd->bytes == 14.0 * 52428800);
  // Embedding: 8192 x 6144 = 50,331,648 elements; lookup 2 + 2, zeroing the
  // 7/8 of rows outside the shard 1.75, learned positions 2 + 2 and their
  // add 2 + 2 + 2, the [b, s, h] -> [s, b, h] copy 2 + 2: 19.75 B each.
  const LayerOps embed = embedding_ops(m, p);
  const Op* lookup = find_named(embed.forward, "embed_lookup");
  REQUIRE(lookup != nullptr);
  CHECK(lookup->bytes == 19.75 * 50331648);
  // TP 1: no shard mask to zero.
  const LayerOps embed1 = embedding_ops(m, plan_of(1, 4, 2048, false, false, Recompute::none));
  const Op* lookup1 = find_named(embed1.forward, "embed_lookup");
  REQUIRE(lookup1 != nullptr);
  CHECK(lookup1->bytes == 18.0 * 50331648);
}

TEST_CASE("the unfused attention core's kernels at the profile's own HBM fraction") {
  // Korthikanti's 22B layer (TP 8, b 4, s 2048): QK^T and AV move
  // 293,601,280 B each on the roofline's memory side, softmax + dropout
  // 1,073,807,360 B, the context copy 25,165,824 B: 1,686,175,744 B.
  const ModelSpec m = gpt_22b();
  const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::selective));
  GpuProfile g = a100();  // 2039 GB/s, memory_bound_efficiency 0.8, no launch cost
  g.unfused_attention_efficiency = 0.646;
  double core_ns = 0;
  for (const char* name : {"attn_qk", "attn_softmax", "attn_av", "attn_ctx_copy"}) {
    const Op* op = find_named(ops.forward, name);
    REQUIRE(op != nullptr);
    CHECK(op->unfused_attention);
    core_ns += static_cast<double>(op_time_ns(g, *op));
  }
  // 1,686,175,744 B at 2039 GB/s x 0.646 = 1,280,144 ns; with the A100
  // card's four launches of 4.9 us, the 1.3 ms that selective recomputation
  // adds in Table 4.
  CHECK(std::abs(core_ns - 1686175744.0 / (2039e9 * 0.646) * 1e9) <= 4.0);
  // The backward's and the recomputation's core kernels carry the flag; the
  // layer's other kernels do not, and keep memory_bound_efficiency.
  for (const char* name : {"attn_av_dgrad", "attn_av_wgrad", "attn_softmax_bwd", "attn_qk_dgrad", "attn_qk_wgrad",
                           "attn_qk_scale_bwd", "attn_qkv_grad_cat"})
    CHECK_MESSAGE(find_named(ops.backward, name)->unfused_attention, name);
  for (const Op& op : ops.recompute) CHECK(op.unfused_attention);
  const Op* norm = find_named(ops.forward, "norm_in");
  const Op* qkv = find_named(ops.forward, "qkv");
  CHECK_FALSE(norm->unfused_attention);
  CHECK_FALSE(qkv->unfused_attention);
  GpuProfile plain = a100();
  CHECK(op_time_ns(g, *norm) == op_time_ns(plain, *norm));
  CHECK(op_time_ns(g, *qkv) == op_time_ns(plain, *qkv));
  // Without the field the core runs at memory_bound_efficiency (0.8 here).
  const Op* softmax = find_named(ops.forward, "attn_softmax");
  CHECK(op_time_ns(plain, *softmax) == std::llround(1073807360.0 / (2039e9 * 0.8) * 1e9));
  // Flash attention is one fused kernel, priced as before.
  const LayerOps flash = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::none));
  const Op* fused = find_named(flash.forward, "attn_flash");
  REQUIRE(fused != nullptr);
  CHECK_FALSE(fused->unfused_attention);
  CHECK(op_time_ns(g, *fused) == op_time_ns(plain, *fused));
}

TEST_CASE("the layer's backward element-wise kernels and main_grad hooks, per Megatron-LM 2022") {
  // Korthikanti's 22B layer: TP 8, b 4, s 2048: T = 8192 tokens, h 6144,
  // f 24576 (3072 per GPU); [T, h] = 50,331,648 elements per GPU without SP.
  // Megatron-LM 2022 at 02bb1f5c: no gradient-accumulation fusion.
  const ModelSpec m = gpt_22b();
  const LayerOps ops = transformer_layer_ops(m, unfused(plan_of(8, 4, 2048, false, false, Recompute::none)));
  auto bytes = [&](const std::string& name) {
    const Op* op = find_named(ops.backward, name);
    REQUIRE(op != nullptr);
    return op->bytes;
  };
  // Apex LayerNorm backward: dy + x for the gamma/beta partials, dy + x + dx
  // for the input gradient: 10 B per element.
  CHECK(bytes("norm_in_bwd") == 10.0 * 50331648);
  CHECK(bytes("norm_mlp_bwd") == 10.0 * 50331648);
  // Fused bias-dropout-add backward: dy 2 + mask 1 + dx 2 (was 2 x the
  // forward's 7 = 14 B).
  CHECK(bytes("drop_add_attn_bwd") == 5.0 * 50331648);
  CHECK(bytes("drop_add_mlp_bwd") == 5.0 * 50331648);
  // bias_gelu_back reads dy and the input and writes dx (6 B), and the bias
  // gradient reads dx once more: 8 B per [T, f/t] element.
  CHECK(bytes("act_bwd") == 8.0 * 8192 * 3072);
  // Two gradient sums at the residual forks, 2 + 2 + 2 B per element each.
  int sums = 0;
  for (const Op& op : ops.backward) {
    if (op.name != "residual_add_bwd") continue;
    ++sums;
    CHECK(op.bytes == 6.0 * 50331648);
  }
  CHECK(sums == 2);
  // main_grad.add_(grad) per parameter: bf16 read 2, fp32 read 4 + write 4.
  // QKV 6144 x 2304 + bias 2304; proj 768 x 6144 + the whole bias 6144;
  // FC1 6144 x 3072 + 3072; FC2 3072 x 6144 + 6144.
  CHECK(bytes("qkv_grad_accum") == 10.0 * (6144 * 2304 + 2304));   // 141,580,800 B
  CHECK(bytes("proj_grad_accum") == 10.0 * (768 * 6144 + 6144));   //  47,247,360 B
  CHECK(bytes("fc1_grad_accum") == 10.0 * (6144 * 3072 + 3072));   // 188,774,400 B
  CHECK(bytes("fc2_grad_accum") == 10.0 * (3072 * 6144 + 6144));   // 188,805,120 B
  // Each hook runs after its layer's backward returns: after the async
  // input-gradient all-reduce for the column-parallel QKV and FC1, so that
  // dgrad, wgrad, all-reduce stay the simulator's overlapped triple.
  auto next_of = [&](const std::string& name) {
    for (std::size_t i = 0; i + 1 < ops.backward.size(); ++i)
      if (ops.backward[i].name == name) return ops.backward[i + 1].name;
    return std::string("(none)");
  };
  CHECK(next_of("fc2_wgrad") == "fc2_grad_accum");
  CHECK(next_of("fc1_wgrad") == "tp_ar_mlp_bwd");
  CHECK(next_of("tp_ar_mlp_bwd") == "fc1_grad_accum");
  CHECK(next_of("proj_wgrad") == "proj_grad_accum");
  CHECK(next_of("qkv_bias_grad") == "qkv_grad_accum");
  CHECK(next_of("norm_in_bwd") == "residual_add_bwd");
  CHECK(next_of("norm_mlp_bwd") == "residual_add_bwd");
  // Megatron-LM of 2021 (fp16, no contiguous buffers): autograd adds the fp16
  // gradient to the fp16 .grad in place, read 2 + 2, write 2 = 6 B per parameter.
  {
    ParallelPlan p21 = unfused(plan_of(8, 4, 2048, false, false, Recompute::none));
    p21.trainer = find_trainer("megatron-2021")->settings;
    const LayerOps ops21 = transformer_layer_ops(m, p21);
    CHECK(find_named(ops21.backward, "qkv_grad_accum")->bytes == 6.0 * (6144 * 2304 + 2304));  // 84,948,480 B
    CHECK(find_named(ops21.backward, "fc2_grad_accum")->bytes == 6.0 * (3072 * 6144 + 6144));  // 113,283,072 B
  }
  // 141,580,800 B at 2039 GB/s x 0.8 = 86,795.0 ns.
  CHECK(op_time_ns(a100(), *find_named(ops.backward, "qkv_grad_accum")) == 86795);

  // Sequence parallelism splits the element-wise kernels by 8, not the hooks.
  const LayerOps sp = transformer_layer_ops(m, unfused(plan_of(8, 4, 2048, true, false, Recompute::none)));
  const Op* norm_sp = find_named(sp.backward, "norm_in_bwd");
  const Op* hook_sp = find_named(sp.backward, "qkv_grad_accum");
  REQUIRE(norm_sp != nullptr);
  REQUIRE(hook_sp != nullptr);
  CHECK(norm_sp->bytes == 10.0 * 6291456);
  CHECK(hook_sp->bytes == bytes("qkv_grad_accum"));
  // Llama (no biases, SwiGLU): weights only; SwiGLU backward reads dy and
  // both halves and writes both gradients, 10 B per [T, f/t] element.
  // TP 8, b 1, s 8192: QKV 4096 x (4096 + 2 x 1024) / 8 = 4096 x 768.
  const LayerOps llama = transformer_layer_ops(llama_gqa(), unfused(plan_of(8, 1, 8192, true, false, Recompute::none)));
  const Op* llama_qkv = find_named(llama.backward, "qkv_grad_accum");
  const Op* llama_act = find_named(llama.backward, "act_bwd");
  REQUIRE(llama_qkv != nullptr);
  REQUIRE(llama_act != nullptr);
  CHECK(llama_qkv->bytes == 10.0 * 4096 * 768);
  CHECK(llama_act->bytes == 10.0 * 8192 * (14336 / 8));

  // With gradient-accumulation fusion (the default) there are no hooks for
  // the linear layers; each wgrad GEMM reads and writes the fp32 main_grad
  // in its epilogue instead of writing bf16: 4 + 4 - 2 = 6 B per weight.
  const LayerOps fused = transformer_layer_ops(m, plan_of(8, 4, 2048, false, false, Recompute::none));
  for (const char* hook : {"qkv_grad_accum", "proj_grad_accum", "fc1_grad_accum", "fc2_grad_accum"})
    CHECK(find_named(fused.backward, hook) == nullptr);
  const Op* qkv_wgrad = find_named(fused.backward, "qkv_wgrad");
  const Op* av_wgrad = find_named(fused.backward, "attn_av_wgrad");
  REQUIRE(qkv_wgrad != nullptr);
  REQUIRE(av_wgrad != nullptr);
  CHECK(qkv_wgrad->bytes == 6.0 * 6144 * 2304);
  CHECK(av_wgrad->bytes == 0.0);  // not a weight
  // The QKV wgrad (6144 x 2304, k = 8192) stays compute-bound: 2.32e11 FLOP
  // at 312 x 0.869 TFLOP/s over 48 x 18 = 864 tiles on 108 SMs (8 full
  // waves) = 855.4 us, against (6144 x 8192 + 8192 x 2304 + 6144 x 2304) x
  // 2 B + 84.9 MB = 251.6 MB at 1631 GB/s = 154.3 us.
  CHECK(op_time_ns(a100(), *qkv_wgrad) == op_time_ns(a100(), *find_named(ops.backward, "qkv_wgrad")));
}

TEST_CASE("the embedding's and the LM head's weight gradients, per Megatron-LM 2022") {
  const ModelSpec m = gpt_22b();
  const ParallelPlan p = unfused(plan_of(8, 4, 2048, false, false, Recompute::none));
  // 6400 vocabulary rows per GPU x 6144 = 39,321,600 parameters; 2048
  // learned positions x 6144 = 12,582,912; [T, h] = 50,331,648 elements.
  const LayerOps embed = embedding_ops(m, p);
  const Op* grad = find_named(embed.backward, "embed_grad");
  const Op* drop = find_named(embed.backward, "embed_dropout_bwd");
  REQUIRE(grad != nullptr);
  REQUIRE(drop != nullptr);
  CHECK(drop->bytes == 5.0 * 50331648);
  // transpose copy 4 B + two scatter-adds 6 B each + the shard mask's
  // index_put backward 4 B + zeros over 7/8 of the rows 1.75 B, per [T, h]
  // element: 21.75 x 50,331,648 = 1,094,713,344; both tables zeroed (2 B)
  // and hooked (10 B): 12 x 51,904,512 = 622,854,144.
  CHECK(grad->bytes == 1094713344.0 + 622854144.0);
  const LayerOps head = lm_head_ops(m, p);
  const Op* head_hook = find_named(head.backward, "logits_grad_accum");
  REQUIRE(head_hook != nullptr);
  CHECK(head_hook->bytes == 10.0 * 39321600);
  // DeepSpeed's BF16Optimizer (megatron-deepspeed presets) accumulates
  // through an fp32 copy: cast (read 2, write 4), add (read 4 + 4, write 4),
  // 18 B per parameter for the head, the layers' weights and both tables:
  // 2 + 18 = 20 B per table element instead of 12.
  ParallelPlan ds = p;
  ds.trainer = find_trainer("megatron-deepspeed-2022")->settings;
  CHECK(find_named(lm_head_ops(m, ds).backward, "logits_grad_accum")->bytes == 18.0 * 39321600);
  CHECK(find_named(embedding_ops(m, ds).backward, "embed_grad")->bytes == 1094713344.0 + 20.0 * 51904512);
  CHECK(find_named(transformer_layer_ops(m, ds).backward, "qkv_grad_accum")->bytes == 18.0 * (6144 * 2304 + 2304));
  CHECK(find_trainer("megatron-deepspeed")->settings.grad_accum_bytes == 18);
  // DeepSpeed v0.5.4's fp16 pipeline engine (MT-NLG): autograd adds the fp16
  // gradient to the fp16 .grad, 6 B per parameter, 2 + 6 = 8 B per table element.
  ParallelPlan ds21 = p;
  ds21.trainer = find_trainer("megatron-deepspeed-2021")->settings;
  CHECK(find_named(lm_head_ops(m, ds21).backward, "logits_grad_accum")->bytes == 6.0 * 39321600);
  CHECK(find_named(embedding_ops(m, ds21).backward, "embed_grad")->bytes == 1094713344.0 + 8.0 * 51904512);
  CHECK(find_trainer("megatron-2022")->settings.grad_accum_bytes == 10);
  // Fused: the output layer's wgrad accumulates into main_grad itself (the
  // embedding table's F.embedding gradient is still hooked).
  const ParallelPlan fused = plan_of(8, 4, 2048, false, false, Recompute::none);
  CHECK(find_named(lm_head_ops(m, fused).backward, "logits_grad_accum") == nullptr);
  CHECK(find_named(embedding_ops(m, fused).backward, "embed_grad")->bytes == grad->bytes);
}

TEST_CASE("the optimizer step: Megatron-LM's kernels over the fp32 gradient buffer and the shard") {
  // 1e9 parameters on the GPU, no DP: grad_scale 8 B, grad_norm 4, Adam 28,
  // master -> bf16 copy 6, buffer zeroing 4: 50 B per parameter.
  const std::vector<Op> ops = optimizer_step_ops(1e9, 1, 0, OptimizerPrecision{});
  REQUIRE(ops.size() == 5);
  const std::vector<std::string> names{"grad_scale", "grad_norm", "adam", "param_copy", "grad_zero"};
  const std::vector<double> bytes{8e9, 4e9, 28e9, 6e9, 4e9};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    CHECK(ops[i].name == names[i]);
    CHECK(ops[i].kind == OpKind::memory_bound);
    CHECK(ops[i].bytes == bytes[i]);
  }
  CHECK(kAdamBytesPerParam == 28.0);
  // At 2039 GB/s x 0.8 = 1631.2 GB/s, no launch cost: 4,904,365 + 2,452,182 +
  // 17,165,277 + 3,678,274 + 2,452,182 ns (each rounded) = 30,652,280 ns.
  CHECK(optimizer_step_time_ns(a100(), 1e9, 1, 0, OptimizerPrecision{}) == 30652280);
  // ZeRO 1 (the distributed optimizer), DP 8: the buffer stays whole (scale
  // 8e9 B, zero 4e9 B), the norm, Adam and copy run on 1.25e8 parameters:
  // 4,904,365 + 306,523 + 2,145,660 + 459,784 + 2,452,182 = 10,268,514 ns.
  CHECK(optimizer_step_time_ns(a100(), 1e9, 8, 1, OptimizerPrecision{}) == 10268514);
  // ZeRO 2 shards the buffer too: every kernel on 1.25e8 parameters.
  const std::vector<Op> zero2 = optimizer_step_ops(1e9, 8, 2, OptimizerPrecision{});
  REQUIRE(zero2.size() == 5);
  for (std::size_t i = 0; i < zero2.size(); ++i) CHECK(zero2[i].bytes == doctest::Approx(bytes[i] / 8));
  // One launch per kernel on a profile that charges launches.
  GpuProfile g = a100();
  g.kernel_launch_ns = 5000;
  CHECK(optimizer_step_time_ns(g, 1e9, 1, 0, OptimizerPrecision{}) == 30652280 + 5 * 5000);
}

TEST_CASE("the optimizer step over a 16-bit gradient buffer: 2 B buffer passes and the shard's cast to fp32") {
  // Megatron-Core without grad_reduce_in_fp32, DP 8, ZeRO 1: grad_scale over
  // the bf16 buffer 1e9 x (2 + 2) = 4e9 B, grad_cast of the shard (read 2,
  // write 4) 1.25e8 x 6 = 7.5e8, grad_norm 5e8, Adam 3.5e9, param_copy
  // 7.5e8, grad_zero 1e9 x 2 = 2e9.
  ParallelPlan p;
  p.dp = 8;
  p.zero_stage = 1;
  p.trainer.dp_grad_bytes = 2;
  const OptimizerPrecision bf16_grads = optimizer_precision(p);
  CHECK(bf16_grads.cast_grads);
  const std::vector<Op> ops = optimizer_step_ops(1e9, 8, 1, bf16_grads);
  REQUIRE(ops.size() == 6);
  const std::vector<std::string> names{"grad_scale", "grad_cast", "grad_norm", "adam", "param_copy", "grad_zero"};
  const std::vector<double> bytes{4e9, 7.5e8, 5e8, 3.5e9, 7.5e8, 2e9};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    CHECK(ops[i].name == names[i]);
    CHECK(ops[i].bytes == doctest::Approx(bytes[i]));
  }
  // At 1631.2 GB/s: 2,452,182 + 459,784 + 306,523 + 2,145,660 + 459,784 +
  // 1,226,091 = 7,050,024 ns (fp32 gradients: 10,268,514).
  CHECK(optimizer_step_time_ns(a100(), 1e9, 8, 1, bf16_grads) == 7050024);
  // Megatron-FSDP (ZeRO 3) with bf16 gradients: the buffer is the shard.
  const std::vector<Op> fsdp = optimizer_step_ops(1e9, 8, 3, bf16_grads);
  REQUIRE(fsdp.size() == 6);
  CHECK(fsdp.front().bytes == doctest::Approx(1.25e8 * 4));
  CHECK(fsdp.back().bytes == doctest::Approx(1.25e8 * 2));
  // The precision-aware optimizer with bf16 moments on a bf16 plan:
  // FusedAdam reads the bf16 buffer (no cast; the norm 2 B), reads and
  // writes the master as weight + remainder (4 + 4) and the moments at 2 B
  // (2 x 2 + 2 x 2): Adam 2 + 8 + 8 = 18 B a parameter, and no param_copy.
  p.precision_aware_optimizer = true;
  p.adam_moment_bytes = 2;
  const OptimizerPrecision fused = optimizer_precision(p);
  CHECK(!fused.cast_grads);
  CHECK(!fused.copy_params);
  const std::vector<Op> te = optimizer_step_ops(1e9, 8, 1, fused);
  REQUIRE(te.size() == 4);
  const std::vector<std::string> te_names{"grad_scale", "grad_norm", "adam", "grad_zero"};
  const std::vector<double> te_bytes{4e9, 2.5e8, 2.25e9, 2e9};
  for (std::size_t i = 0; i < te.size(); ++i) {
    CHECK(te[i].name == te_names[i]);
    CHECK(te[i].bytes == doctest::Approx(te_bytes[i]));
  }
  // Under per-tensor FP8 Megatron-Core keeps the fp32 master weights: the
  // cast and the copy return, Adam 4 + 8 + 8 = 20 B.
  p.precision = Precision::fp8_current;
  const std::vector<Op> fp8 = optimizer_step_ops(1e9, 8, 1, optimizer_precision(p));
  REQUIRE(fp8.size() == 6);
  CHECK(fp8[3].name == std::string("adam"));
  CHECK(fp8[3].bytes == doctest::Approx(1.25e8 * 20));
}

TEST_CASE("a GEMM beside an NCCL collective: fewer SMs, by hand") {
  const GpuProfile g = a100();
  // 24 channels (DGX A100 NCCL, one CTA per channel) leave 84 of 108 SMs and
  // 84/108 of the peak.
  const GpuProfile r = with_sms_taken(g, 24);
  CHECK(r.sm_count == 84);
  CHECK(r.peak_bf16_flops == doctest::Approx(312e12 * 84.0 / 108.0));
  CHECK(r.hbm_bandwidth_Bps == g.hbm_bandwidth_Bps);
  CHECK(with_sms_taken(g, 0).sm_count == 108);
  CHECK(with_sms_taken(g, 108).sm_count == 108);  // nothing left: unchanged (the loader refuses it)
  // The 22B QKV wgrad at TP 8, b 4, s 2048: 6144 x 2304 x 8192, 48 x 18 =
  // 864 tiles of 128 x 128. All SMs: 864 / 108 = 8 full waves, quantisation
  // 1. On 84 SMs: ceil(864 / 84) = 11 waves, 864 / (11 x 84) = 864 / 924 of
  // the SM slots busy. Efficiency is relative to the full GPU's peak, so the
  // reduced GPU reaches 0.869 x 864/924 of its own (84/108 smaller) peak.
  CHECK(gemm_efficiency(g, 6144, 2304, 8192) == doctest::Approx(0.869));
  CHECK(gemm_efficiency(r, 6144, 2304, 8192) == doctest::Approx(0.869 * 864.0 / 924.0));
  const double flops = 2.0 * 6144 * 2304 * 8192;
  const double full_ns = flops / (312e12 * 0.869) * 1e9;                                  // 855.4 us
  const double reduced_ns = flops / (312e12 * 84.0 / 108.0 * 0.869 * 864.0 / 924.0) * 1e9;  // 1176.2 us
  CHECK(std::abs(static_cast<double>(gemm_time_ns(g, 6144, 2304, 8192)) - full_ns) <= 1.0);
  Op op;
  op.name = "qkv_wgrad";
  op.kind = OpKind::gemm;
  op.m = 6144;
  op.n = 2304;
  op.k = 8192;
  op.flops = flops;
  CHECK(std::abs(static_cast<double>(op_time_sms_taken_ns(g, op, 24)) - reduced_ns) <= 1.0);
  CHECK(op_time_sms_taken_ns(g, op, 0) == op_time_ns(g, op));
  // Memory-bound ops keep their time (HBM is not divided by SMs here).
  Op mb;
  mb.name = "act";
  mb.kind = OpKind::memory_bound;
  mb.bytes = 1e8;
  CHECK(op_time_sms_taken_ns(g, mb, 24) == op_time_ns(g, mb));
}

TEST_CASE("overlapped time: reduced pace while the collective runs, full pace after") {
  // The collective outlasts the GEMM at the reduced pace: the reduced time.
  CHECK(overlapped_time_ns(1000, 800, 600) == 800);
  CHECK(overlapped_time_ns(800, 800, 600) == 800);
  // It ends first: 400 ns at the reduced pace do 400/1000 of the work; the
  // other 600/1000 take 0.6 x 700 = 420 ns at full pace: 820 ns.
  CHECK(overlapped_time_ns(400, 1000, 700) == 820);
  // No collective (or none measured): the full-SM time.
  CHECK(overlapped_time_ns(0, 1000, 700) == 700);
  CHECK(overlapped_time_ns(-1, 1000, 700) == 700);
}

TEST_CASE("flash attention runs at the flash kernel's own published rate where the profile has it") {
  // The 22B layer of Korthikanti et al. (TP 8, b 4, s 2048) with flash attention on.
  const ModelSpec m = gpt_22b();
  const LayerOps flash = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::none));
  const auto [fwd, bwd] = flash_ops(flash);
  GpuProfile plain = a100();  // no flash fields: the best GEMM's rate
  GpuProfile g = plain;
  g.flash_attention_fwd_efficiency = 0.73;
  g.flash_attention_bwd_efficiency = 0.50;
  const double launch = plain.kernel_launch_ns;
  // Compute-bound at this shape: time minus launch scales as 1 / efficiency (to the ns it rounds to).
  const double plain_fwd = static_cast<double>(op_time_ns(plain, *fwd)) - launch;
  const double plain_bwd = static_cast<double>(op_time_ns(plain, *bwd)) - launch;
  CHECK(static_cast<double>(op_time_ns(g, *fwd)) - launch ==
        doctest::Approx(plain_fwd * plain.gemm_max_efficiency / 0.73).epsilon(1e-4));
  CHECK(static_cast<double>(op_time_ns(g, *bwd)) - launch ==
        doctest::Approx(plain_bwd * plain.gemm_max_efficiency / 0.50).epsilon(1e-4));
  // The shipped A100 card carries each kernel's table instead (below).
  const Cluster c = load_cluster("topologies/dgx-a100.json");
  CHECK(c.gpu.flash_attention_fwd_efficiency == 0.0);
  CHECK(c.gpu.attention_kernel == AttentionKernel::flash2);
}

TEST_CASE("a fused kernel's rates: the nearest head dimension, log2-interpolated in the sequence length") {
  // The A100 card's FlashAttention-2 row (FlashAttention-2 paper Fig. 4,
  // forward + backward with causal mask): head dim 128 at 512 ... 16k tokens
  // 99, 133, 155, 173, 182, 189 TFLOP/s over 312.
  const GpuProfile g = load_cluster("topologies/dgx-a100.json").gpu;
  const AttentionRates* fa2 = attention_rates_of(g, AttentionKernel::flash2);
  REQUIRE(fa2 != nullptr);
  CHECK(attention_rates_of(g, AttentionKernel::auto_) == fa2);  // the card's default
  CHECK(attention_rates_of(g, AttentionKernel::cudnn) == nullptr);
  CHECK(attention_rates_of(g, AttentionKernel::flash3) == nullptr);
  CHECK(attention_efficiency(*fa2, 128, 2048, false) == doctest::Approx(0.497));  // 155 / 312
  CHECK(attention_efficiency(*fa2, 128, 2048, true) == doctest::Approx(0.497));   // one rate for both passes
  CHECK(attention_efficiency(*fa2, 128, 16384, false) == doctest::Approx(0.606));  // 189 / 312
  CHECK(attention_efficiency(*fa2, 128, 131072, false) == doctest::Approx(0.606));  // clamped
  CHECK(attention_efficiency(*fa2, 128, 256, false) == doctest::Approx(0.317));    // 99 / 312, clamped
  // Between 2k and 4k: 0.497 + (log2(3000) - 11) x (0.554 - 0.497).
  CHECK(attention_efficiency(*fa2, 128, 3000, false) ==
        doctest::Approx(0.497 + (std::log2(3000.0) - 11.0) * (0.554 - 0.497)));
  // Head dim 64's row (88 ... 171); 96 is as near 64 as 128 and takes 128.
  CHECK(attention_efficiency(*fa2, 64, 2048, false) == doctest::Approx(0.449));  // 140 / 312
  CHECK(attention_efficiency(*fa2, 80, 2048, false) == doctest::Approx(0.449));
  CHECK(attention_efficiency(*fa2, 96, 2048, false) == doctest::Approx(0.497));
}

TEST_CASE("Blackwell's cuDNN attention: B200 at cuDNN 9.13's measured rates, GB200 and GB300 at cuDNN 9.18's") {
  // Llama 3 8B's layer (32 heads of 128, TP 1, b 2, s 8192), causal, cuDNN
  // (the cards' default). Forward FLOPs 4 s^2 d x (b heads = 64) / 2. Grid:
  // 8192/128 x 128/128 x 64 = 4096 tiles.
  const LayerOps ops = transformer_layer_ops(test::llama3_8b(), plan_of(1, 2, 8192, false, true, Recompute::none));
  const auto [fwd, bwd] = flash_ops(ops);
  const double flops = 4.0 * 8192 * 8192 * 128 * 64 / 2;
  // B200 (148 SMs: 28 waves, 4096 / 4144): cudnn-frontend's SDPA benchmark
  // on a B200 at 8k, cuDNN 9.13.1: 1384.2 and 994.9 TFLOP/s of 2250, 0.615
  // and 0.442 (it was FlashAttention-4's forward, 0.717, and a backward of
  // 0.619 from the H100's ratio: 40 % above cuDNN's measured backward); x the
  // B200's sustained fraction 0.853 (flashinfer PR #2899: 1237 of 1450
  // TFLOP/s once the power limit has pulled the clock down).
  const GpuProfile b200 = load_cluster("topologies/dgx-b200.json").gpu;
  CHECK(b200.gemm_sustained_fraction == 0.853);
  const double b_wave = 4096.0 / 4144.0;
  CHECK(static_cast<double>(op_time_ns(b200, *fwd)) ==
        doctest::Approx(flops / (2250e12 * 0.615 * 0.853 * b_wave) * 1e9 + b200.kernel_launch_ns).epsilon(1e-5));
  CHECK(static_cast<double>(op_time_ns(b200, *bwd)) ==
        doctest::Approx(2.5 * flops / (2250e12 * 0.442 * 0.853 * b_wave) * 1e9 + b200.kernel_launch_ns).epsilon(1e-5));
  // GB200 (152 SMs: 27 waves, 4096 / 4104): cudnn-frontend's Llama 3.1 SDPA
  // benchmark at 8k, cuDNN 9.18.1: 1563 and 1279 TFLOP/s of 2500, 0.625 and
  // 0.512 (it was 0.717 x 2500 = 1792 forward, the B200's FlashAttention-4
  // fraction of the GB200's higher peak), x the GB200's sustained fraction
  // 0.804 (Azure's cuBLASLt FP8 GEMM after 10,000 warm-up calls, 2906.9
  // TFLOP/s, over the card's burst FP8 rate 3615.6).
  const GpuProfile gb200 = load_cluster("topologies/gb200-nvl72.json").gpu;
  CHECK(gb200.gemm_sustained_fraction == 0.804);
  const double g_wave = 4096.0 / 4104.0;
  CHECK(static_cast<double>(op_time_ns(gb200, *fwd)) ==
        doctest::Approx(flops / (2500e12 * 0.625 * 0.804 * g_wave) * 1e9 + gb200.kernel_launch_ns).epsilon(1e-5));
  CHECK(static_cast<double>(op_time_ns(gb200, *bwd)) ==
        doctest::Approx(2.5 * flops / (2500e12 * 0.512 * 0.804 * g_wave) * 1e9 + gb200.kernel_launch_ns).epsilon(1e-5));
  // GB300 (152 SMs, as the device reports: 27 waves, 4096 / 4104): 1927 and
  // 1391 TFLOP/s, 0.771 and 0.556: Blackwell Ultra's doubled exponential unit
  // shows in the forward (1.23 x the GB200's), less in the backward (1.09 x);
  // x the GB300's sustained fraction 0.888 (Azure's 3308.5 TFLOP/s over the
  // card's burst FP8 rate 0.745 x 5000).
  const GpuProfile gb300 = load_cluster("topologies/gb300-nvl72.json").gpu;
  CHECK(gb300.sm_count == 152);
  CHECK(gb300.gemm_sustained_fraction == 0.888);
  const double u_wave = 4096.0 / 4104.0;
  CHECK(static_cast<double>(op_time_ns(gb300, *fwd)) ==
        doctest::Approx(flops / (2500e12 * 0.771 * 0.888 * u_wave) * 1e9 + gb300.kernel_launch_ns).epsilon(1e-5));
  CHECK(static_cast<double>(op_time_ns(gb300, *bwd)) ==
        doctest::Approx(2.5 * flops / (2500e12 * 0.556 * 0.888 * u_wave) * 1e9 + gb300.kernel_launch_ns).epsilon(1e-5));
  // Between the measured lengths the rate is log2-interpolated: at 12k on the
  // GB200, 0.625 + (log2(12288) - 13) x (0.658 - 0.625).
  const AttentionRates* cudnn = attention_rates_of(gb200, AttentionKernel::cudnn);
  REQUIRE(cudnn != nullptr);
  CHECK(attention_efficiency(*cudnn, 128, 12288, false) ==
        doctest::Approx(0.625 + (std::log2(12288.0) - 13.0) * (0.658 - 0.625)));
  CHECK(attention_efficiency(*cudnn, 128, 12288, true) ==
        doctest::Approx(0.512 + (std::log2(12288.0) - 13.0) * (0.548 - 0.512)));
}

TEST_CASE("FP8 attention: cuDNN's FP8 kernels at their measured rates, the quantize kernels around them") {
  // Llama 3 8B's layer (32 heads of 128, 8 K/V heads, TP 1, b 2, s 8192) on
  // the GB200 with --fp8-attention: the forward and backward kernels run at
  // the FP8 peak (5000) x cuDNN's measured fraction x the sustained fraction
  // 0.804, on the same grid (4096 tiles, 27 waves: 4096 / 4104).
  const ModelSpec m = test::llama3_8b();
  const GpuProfile gb200 = load_cluster("topologies/gb200-nvl72.json").gpu;
  const double flops = 4.0 * 8192 * 8192 * 128 * 64 / 2;
  const double wave = 4096.0 / 4104.0;
  ParallelPlan p = plan_of(1, 2, 8192, false, true, Recompute::none);
  p.fp8_attention = true;
  // Not under bf16: no format (plan_check refuses it).
  CHECK_FALSE(p.fp8_attention_format().has_value());
  // MXFP8 (cuDNN 9.22: 1902 and 1287 TFLOP/s at 8k, 0.380 and 0.257 of 5000).
  p.precision = Precision::mxfp8;
  REQUIRE(p.fp8_attention_format() == Fp8AttentionFormat::mxfp8);
  const LayerOps mx = transformer_layer_ops(m, p);
  const auto [fwd, bwd] = flash_ops(mx);
  CHECK(fwd->precision == Precision::mxfp8);
  CHECK(static_cast<double>(op_time_ns(gb200, *fwd)) ==
        doctest::Approx(flops / (5000e12 * 0.380 * 0.804 * wave) * 1e9 + gb200.kernel_launch_ns).epsilon(1e-5));
  CHECK(static_cast<double>(op_time_ns(gb200, *bwd)) ==
        doctest::Approx(2.5 * flops / (5000e12 * 0.257 * 0.804 * wave) * 1e9 + gb200.kernel_launch_ns).epsilon(1e-5));
  // Right before the forward kernel the cast of Q, K and V (tokens 16,384 x
  // (4096 + 2 x 1024)): read bf16, write the rowwise and columnwise MXFP8
  // copies with their scales, 2 + 2 x (1 + 1/32) bytes an element; before
  // the backward kernel the output gradient's (16,384 x 4096). No amax pass,
  // no dequantize: MXFP8 writes O and dQ, dK, dV in bf16.
  const auto before = [](const std::vector<Op>& ops, const char* name) -> const Op* {
    for (std::size_t i = 1; i < ops.size(); ++i)
      if (ops[i].name == name) return &ops[i - 1];
    return nullptr;
  };
  const double qkv = 16384.0 * (4096 + 2 * 1024), o = 16384.0 * 4096;
  const Op* cast = before(mx.forward, "attn_flash");
  REQUIRE(cast != nullptr);
  CHECK(cast->name == "fp8_cast");
  CHECK(cast->precision == Precision::mxfp8);
  CHECK(cast->bytes == doctest::Approx(qkv * (2 + 2 * (1 + 1.0 / 32))));
  const Op* grad_cast = before(mx.backward, "attn_flash_bwd");
  REQUIRE(grad_cast != nullptr);
  CHECK(grad_cast->name == "fp8_grad_cast");
  CHECK(grad_cast->bytes == doctest::Approx(o * (2 + 2 * (1 + 1.0 / 32))));
  CHECK(find_named(mx.forward, "fp8_dequantize") == nullptr);
  // Per-tensor current scaling (cuDNN 9.18.1: 1862 and 1485 at 8k, 0.372
  // and 0.297): an amax pass and the scale before a rowwise cast (2 + 1).
  p.precision = Precision::fp8_current;
  const LayerOps cs = transformer_layer_ops(m, p);
  const Op* cs_fwd = find_named(cs.forward, "attn_flash");
  REQUIRE(cs_fwd != nullptr);
  CHECK(static_cast<double>(op_time_ns(gb200, *cs_fwd)) ==
        doctest::Approx(flops / (5000e12 * 0.372 * 0.804 * wave) * 1e9 + gb200.kernel_launch_ns).epsilon(1e-5));
  const Op* cs_cast = before(cs.forward, "attn_flash");
  REQUIRE(cs_cast != nullptr);
  CHECK(cs_cast->bytes == doctest::Approx(qkv * (2 + 1)));
  const Op* scale = cs_cast - 1;
  CHECK(scale->name == "fp8_scale");
  CHECK((scale - 1)->name == "fp8_amax");
  CHECK((scale - 1)->bytes == doctest::Approx(qkv * 2));
  // Delayed scaling: the cast alone, and cuDNN's FP8 output and gradients
  // dequantized after each kernel (read 1, write 2): O after the forward,
  // dQ, dK, dV after the backward.
  p.precision = Precision::fp8_delayed;
  const LayerOps ds = transformer_layer_ops(m, p);
  const auto after = [](const std::vector<Op>& ops, const char* name) -> const Op* {
    for (std::size_t i = 0; i + 1 < ops.size(); ++i)
      if (ops[i].name == name) return &ops[i + 1];
    return nullptr;
  };
  const Op* o_deq = after(ds.forward, "attn_flash");
  REQUIRE(o_deq != nullptr);
  CHECK(o_deq->name == "fp8_dequantize");
  CHECK(o_deq->bytes == doctest::Approx(o * 3));
  const Op* g_deq = after(ds.backward, "attn_flash_bwd");
  REQUIRE(g_deq != nullptr);
  CHECK(g_deq->name == "fp8_dequantize");
  CHECK(g_deq->bytes == doctest::Approx(qkv * 3));
  CHECK(before(ds.forward, "attn_flash")->name == std::string("fp8_cast"));
  // Without --fp8-attention an FP8 plan's core stays bf16, at the bf16 rates.
  p.fp8_attention = false;
  const LayerOps plain = transformer_layer_ops(m, p);
  const Op* pf = find_named(plain.forward, "attn_flash");
  REQUIRE(pf != nullptr);
  CHECK(pf->precision == Precision::bf16);
  CHECK(before(plain.forward, "attn_flash")->name != std::string("fp8_cast"));
}

TEST_CASE("the attention core priced by its kernel: A100 FlashAttention-2, H100 cuDNN and FlashAttention-3") {
  // GPT-3 175B's layer (96 heads of 128, TP 8, b 4, s 2048) on the shipped
  // A100 card, flash on with the card's default kernel.
  const ModelSpec m = gpt3_175b();
  const Cluster a = load_cluster("topologies/dgx-a100.json");
  const LayerOps ops = transformer_layer_ops(m, plan_of(8, 4, 2048, false, true, Recompute::none));
  const auto [fwd, bwd] = flash_ops(ops);
  CHECK(fwd->attention_kernel == AttentionKernel::auto_);
  // Forward: 4 s^2 d x (b heads / TP = 48) / 2 (causal) FLOPs at 312 T x
  // 0.497 (FA2, head dim 128, 2k) x 0.948 (the card's sustained fraction) x
  // the grid's wave efficiency: 2048/128 x 128/128 x 48 = 768 tiles on 108
  // SMs, 8 waves, 768 / 864. Compute-bound (Q, K, V, O: 101 MB, 55 us).
  const double fwd_flops = 4.0 * 2048 * 2048 * 128 * 48 / 2;
  const double wave = 768.0 / 864.0;
  const double fwd_ns = fwd_flops / (312e12 * 0.497 * 0.948 * wave) * 1e9 + 4900;  // + launch
  CHECK(static_cast<double>(op_time_ns(a.gpu, *fwd)) == doctest::Approx(fwd_ns).epsilon(1e-5));
  // Backward: 2.5 x the FLOPs at the same rate.
  CHECK(static_cast<double>(op_time_ns(a.gpu, *bwd)) ==
        doctest::Approx(2.5 * fwd_flops / (312e12 * 0.497 * 0.948 * wave) * 1e9 + 4900).epsilon(1e-5));
  // The same layer at 8k tokens on the shipped H100 card: its default kernel
  // is cuDNN's (Transformer Engine on Hopper), forward 529 and backward 518
  // TFLOP/s at head dim 128, 8k (FlashAttention-3 paper Figs. 5d, 6b), over
  // 989; no sustained fraction on H100. Grid: 64 x 1 x 12 = 768 tiles on 132
  // SMs, 6 waves.
  const Cluster h = load_cluster("topologies/dgx-h100.json");
  ParallelPlan p = plan_of(8, 1, 8192, false, true, Recompute::none);
  const LayerOps hops = transformer_layer_ops(m, p);
  const auto [hf, hb] = flash_ops(hops);
  const double h_flops = 4.0 * 8192 * 8192 * 128 * 12 / 2;
  const double h_wave = 768.0 / 792.0;
  const double launch = h.gpu.kernel_launch_ns;
  CHECK(static_cast<double>(op_time_ns(h.gpu, *hf)) ==
        doctest::Approx(h_flops / (989e12 * 0.535 * h_wave) * 1e9 + launch).epsilon(1e-5));  // 529 / 989
  CHECK(static_cast<double>(op_time_ns(h.gpu, *hb)) ==
        doctest::Approx(2.5 * h_flops / (989e12 * 0.524 * h_wave) * 1e9 + launch).epsilon(1e-5));  // 518 / 989
  // --attention-kernel flash3: FlashAttention-3's 602 and 559 TFLOP/s.
  p.attention_kernel = AttentionKernel::flash3;
  const LayerOps f3 = transformer_layer_ops(m, p);
  const auto [f3f, f3b] = flash_ops(f3);
  CHECK(f3f->attention_kernel == AttentionKernel::flash3);
  CHECK(f3b->attention_kernel == AttentionKernel::flash3);
  CHECK(static_cast<double>(op_time_ns(h.gpu, *f3f)) ==
        doctest::Approx(h_flops / (989e12 * 0.609 * h_wave) * 1e9 + launch).epsilon(1e-5));  // 602 / 989
  CHECK(static_cast<double>(op_time_ns(h.gpu, *f3b)) ==
        doctest::Approx(2.5 * h_flops / (989e12 * 0.565 * h_wave) * 1e9 + launch).epsilon(1e-5));  // 559 / 989
  // A card without a table prices any fused kernel at its flash fields.
  GpuProfile plain = a100();
  plain.flash_attention_fwd_efficiency = 0.5;
  CHECK(op_time_ns(plain, *f3f) == op_time_ns(plain, *hf));
}

TEST_CASE("tensor-core work keeps the profile's sustained fraction of the burst rates (calibrated cards: test_calibration)") {
  const GpuProfile burst = a100();
  GpuProfile g = burst;
  g.gemm_sustained_fraction = 0.5;
  // The one-wave, compute-bound GEMM of the efficiency test: twice the time
  // at half the rate (launch cost 0 in the fixture).
  const double flops = 2.0 * 1536 * 1152 * 8192;
  CHECK(gemm_efficiency(g, 1536, 1152, 8192) == doctest::Approx(0.869 * 0.5));
  CHECK(std::abs(static_cast<double>(gemm_time_ns(g, 1536, 1152, 8192)) - flops / (312e12 * 0.869 * 0.5) * 1e9) <= 1.0);
  // A memory-bound GEMM (k = 16) is paced by HBM, not by the clock.
  CHECK(gemm_time_ns(g, 8192, 8192, 16) == gemm_time_ns(burst, 8192, 8192, 16));
  // The flash kernel's own published rate is a burst too.
  const LayerOps flash = transformer_layer_ops(gpt_22b(), plan_of(8, 4, 2048, false, true, Recompute::none));
  const Op* fwd = find_named(flash.forward, "attn_flash");
  REQUIRE(fwd != nullptr);
  GpuProfile fa = burst;
  fa.flash_attention_fwd_efficiency = 0.73;
  GpuProfile fa_sustained = fa;
  fa_sustained.gemm_sustained_fraction = 0.5;
  CHECK(static_cast<double>(op_time_ns(fa_sustained, *fwd)) == doctest::Approx(2.0 * static_cast<double>(op_time_ns(fa, *fwd))).epsilon(1e-4));
  // The shipped A100 card: 257 TFLOP/s sustained of the 271.2 burst (He 2024; MAMF).
  const Cluster c = load_cluster("topologies/dgx-a100.json");
  CHECK(c.gpu.gemm_sustained_fraction == doctest::Approx(257.0 / 271.2).epsilon(0.001));
  CHECK(c.gpu.gemm_max_efficiency * c.gpu.gemm_sustained_fraction == doctest::Approx(257.0 / 312).epsilon(0.001));
  // H100 and H200 have no such measurement: their burst rates stand.
  CHECK(load_cluster("topologies/dgx-h100.json").gpu.gemm_sustained_fraction == 1.0);
  // The B200: FlashAttention-4 run back to back falls from 1450 to 1237 TFLOP/s
  // (flashinfer PR #2899), 0.853. Llama 3 8B's FC1 at micro-batch 2, 8k (m =
  // 16384, n = 28672, k = 4096) in bf16: 128 x 224 = 28672 tiles on 148 SMs,
  // 194 waves (28712 slots), at 2250 x 0.776 (its MAMF row) x 0.853, plus the
  // launch; compute-bound (1.31 GB of A, B, C: 0.2 ms of HBM against 2.6 ms).
  const GpuProfile b200 = load_cluster("topologies/dgx-b200.json").gpu;
  CHECK(b200.gemm_sustained_fraction == 0.853);
  const double fc1 = 2.0 * 16384 * 28672 * 4096;
  const double b_wave = 28672.0 / (194.0 * 148);
  CHECK(static_cast<double>(gemm_time_ns(b200, 16384, 28672, 4096)) ==
        doctest::Approx(fc1 / (2250e12 * 0.776 * 0.853 * b_wave) * 1e9 + b200.kernel_launch_ns).epsilon(1e-5));
  // The GB200 and GB300 (1200 W, 1400 W): Azure's cuBLASLt FP8 GEMM after
  // 10,000 warm-up calls over the card's burst FP8 rate, 2906.9 / 3615.6 and
  // 3308.5 / (0.745 x 5000). The GB200's FC1 as above: 28672 tiles on 152
  // SMs, 189 waves (28728 slots), at 2500 x 0.729 x 0.804.
  const GpuProfile gb200 = load_cluster("topologies/gb200-nvl72.json").gpu;
  CHECK(gb200.gemm_sustained_fraction == 0.804);
  CHECK(load_cluster("topologies/gb300-nvl72.json").gpu.gemm_sustained_fraction == 0.888);
  const double g_wave = 28672.0 / (189.0 * 152);
  CHECK(static_cast<double>(gemm_time_ns(gb200, 16384, 28672, 4096)) ==
        doctest::Approx(fc1 / (2500e12 * 0.729 * 0.804 * g_wave) * 1e9 + gb200.kernel_launch_ns).epsilon(1e-5));
}

TEST_CASE("NCCL's channels, one SM each, for a group within a node and across nodes (search.cc, connect.cc)") {
  Cluster c = dgx_a100(4);
  // A card that does not model NCCL's SMs: none taken anywhere.
  c.intra.nccl_channels = 0;
  CHECK(nccl_ring_channels(c, 8, 4) == 0);
  c.intra.nccl_channels = 24;
  // Inside one node: the NVLink tier's figure.
  CHECK(nccl_ring_channels(c, 8, 1) == 24);
  CHECK(nccl_ring_channels(c, 2, 1) == 24);
  // HDR, 200 Gb/s = 25 GB/s wide: rings at 24 GB/s (below 25: no duplication
  // in the search), one per NIC the node's members reach, doubled by postset.
  CHECK(nccl_ring_channels(c, 8, 4) == 16);
  CHECK(nccl_ring_channels(c, 4, 4) == 8);
  CHECK(nccl_ring_channels(c, 1, 32) == 2);
  // By the group's ranks: 4 nodes with 8 members, 4 with 1 (rank 8 n + 3), one node.
  std::vector<int> tp1, tp8, one;
  for (int r = 0; r < 32; ++r) tp1.push_back(r);
  for (int n = 0; n < 4; ++n) tp8.push_back(8 * n + 3);
  for (int r = 8; r < 16; ++r) one.push_back(r);
  CHECK(nccl_ring_channels(c, tp1) == 16);
  CHECK(nccl_ring_channels(c, tp8) == 2);
  CHECK(nccl_ring_channels(c, one) == 24);
  // NDR, 400 Gb/s = 50 GB/s: rings at 48, duplicated in the search (16 at
  // most), then doubled (32 at most). Two members per node: 2 -> 4 -> 8, the
  // "8 coll channels" of a 2-GPU-per-node H20 log (NVIDIA/nccl#1189).
  c.inter.nic_bandwidth_Gbps = 400;
  CHECK(nccl_ring_channels(c, 2, 2) == 8);
  CHECK(nccl_ring_channels(c, 1, 2) == 4);
  CHECK(nccl_ring_channels(c, 8, 2) == 32);
  // Four 100 Gb/s NICs (12.5 GB/s: rings at 12): 8 members reach 4 NICs.
  c.inter.nic_bandwidth_Gbps = 100;
  c.inter.nics_per_node = 4;
  CHECK(nccl_ring_channels(c, 8, 4) == 8);
  // No NICs: nothing crosses nodes through NCCL's net rings.
  c.inter.nics_per_node = 0;
  CHECK(nccl_ring_channels(c, 8, 4) == 0);
}

TEST_CASE("compute beside a collective that holds SMs: slowed for the shorter of the two") {
  // A 100 ns collective beside 1,000 ns of compute that runs 1.25x slower
  // meanwhile: 80 ns of work done in those 100 ns, 20 ns later in all.
  CHECK(sm_contention_ns(100, 1000, 1.25) == doctest::Approx(20));
  // A 1,000 ns collective beside 100 ns of compute: all of it slowed, 25 ns.
  CHECK(sm_contention_ns(1000, 100, 1.25) == doctest::Approx(25));
  CHECK(sm_contention_ns(100, 1000, 1.0) == 0);
  CHECK(sm_contention_ns(0, 1000, 1.25) == 0);
  // The engine's pace change plays the same: overlapped_time_ns(C, held, full) - full.
  CHECK(static_cast<double>(overlapped_time_ns(100, 1250, 1000) - 1000) == doctest::Approx(sm_contention_ns(100, 1000, 1.25)));
}
