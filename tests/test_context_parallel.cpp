// Context parallelism: the causal balance of Megatron's 2 x CP chunks, the
// rank mapping (CP next to TP), the plan's rules, memory, the ring's and the
// a2a exchange's ops and bytes, the ring shift on the network, and the
// estimate against the simulation. Numbers by hand in the comments.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/sim/engine.hpp"
#include "cuboid/sim/simulator.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {

// Llama-3-70B on 4 DGX A100 (32 GPUs), s 8192, b 1: TP 4 x CP x PP 8 / CP
// x DP 1 (CP 2: PP 4).
ParallelPlan cp_plan(int cp = 2, CpComm comm = CpComm::p2p) {
  ParallelPlan p;
  p.tp = 4;
  p.cp = cp;
  p.cp_comm = comm;
  p.pp = 8 / cp;
  p.dp = 1;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_length = 8192;
  p.sequence_parallel = true;
  p.recompute = Recompute::none;
  return p;
}

std::vector<const Op*> named(const std::vector<Op>& ops, std::string_view name) {
  std::vector<const Op*> out;
  for (const Op& op : ops)
    if (op.name == name) out.push_back(&op);
  return out;
}

double attention_flops(const std::vector<Op>& ops) {
  double f = 0;
  for (const Op& op : ops)
    if (op.kind == OpKind::attention_core) f += op.flops;
  return f;
}

}  // namespace

TEST_CASE("CP's causal balance: chunks r and 2cp - 1 - r give every rank the same (query, key) pairs") {
  // 16 tokens on CP 2: chunks of 4. Rank 0 holds chunks 0 and 3: queries
  // 0-3 see 1 + 2 + 3 + 4 = 10 keys, queries 12-15 see 13 + 14 + 15 + 16 =
  // 58: 68. Rank 1 holds chunks 1 and 2: 26 + 42 = 68. Half of 16 x 17 / 2 =
  // 136 each; a contiguous split would give 36 and 100.
  CHECK(cp_chunks(2, 0) == std::array<int, 2>{0, 3});
  CHECK(cp_chunks(2, 1) == std::array<int, 2>{1, 2});
  CHECK(cp_causal_pairs(16, 2, 0) == 68);
  CHECK(cp_causal_pairs(16, 2, 1) == 68);
  for (int cp : {2, 4, 8, 16}) {
    const std::int64_t s = 2 * cp * 64;
    std::int64_t total = 0;
    for (int r = 0; r < cp; ++r) {
      // Each rank: s^2 / (2 cp) pairs plus its share of the diagonal, s / (2 cp).
      CHECK(cp_causal_pairs(s, cp, r) == s * s / (2 * cp) + s / (2 * cp));
      total += cp_causal_pairs(s, cp, r);
    }
    CHECK(total == s * (s + 1) / 2);
  }
}

TEST_CASE("the workload's ring: CP - 1 K/V sends under the attention, equal steps, all the attention's FLOPs") {
  const ModelSpec m = llama3_70b();
  ParallelPlan whole = cp_plan();
  whole.cp = 1;
  const double full = attention_flops(transformer_layer_ops(m, whole).forward);
  for (int cp : {2, 4}) {
    CAPTURE(cp);
    const LayerOps ops = transformer_layer_ops(m, cp_plan(cp));
    // Each rank computes 1/cp of the causal attention, in cp steps of equal work.
    CHECK(attention_flops(ops.forward) == doctest::Approx(full / cp).epsilon(1e-12));
    const auto blocks = named(ops.forward, op::attn_flash);
    REQUIRE(blocks.size() == static_cast<std::size_t>(cp));
    for (const Op* b : blocks) CHECK(b->flops == doctest::Approx(full / cp / cp).epsilon(1e-12));
    // One K/V chunk per send: s / cp tokens x 2 x 8 KV heads x 128 / TP 4 x 2 B.
    const double kv = 8192.0 / cp * 2 * 1024 / 4 * 2;  // cp 2: 4,194,304 B; cp 4: 2,097,152 B
    const auto sends = named(ops.forward, op::cp_kv_p2p);
    REQUIRE(sends.size() == static_cast<std::size_t>(cp - 1));
    for (const Op* s : sends) {
      CHECK(s->comm_bytes == kv);
      CHECK(s->collective == Collective::send_recv);
      CHECK(s->group == Group::cp);
      CHECK(s->overlaps_next);
    }
    // Each send is followed by the block it runs under.
    for (std::size_t i = 0; i + 1 < ops.forward.size(); ++i)
      if (ops.forward[i].name == op::cp_kv_p2p) CHECK(ops.forward[i + 1].name == std::string(op::attn_flash));
    // Backward: K/V first, K/V + dK/dV in the middle, dK/dV last (Transformer Engine).
    const auto back = named(ops.backward, op::cp_kv_dkv_p2p_bwd);
    REQUIRE(back.size() == static_cast<std::size_t>(cp));
    for (std::size_t i = 0; i < back.size(); ++i)
      CHECK(back[i]->comm_bytes == (i == 0 || i + 1 == back.size() ? kv : 2 * kv));
    CHECK(attention_flops(ops.backward) == doctest::Approx(2.5 * full / cp).epsilon(1e-12));
  }
  CHECK(attention_flops(transformer_layer_ops(m, cp_plan(1)).forward) == doctest::Approx(full));
}

TEST_CASE("the workload's a2a exchange: Q, K, V to the head layout and the output back") {
  const ModelSpec m = llama3_70b();
  const LayerOps ops = transformer_layer_ops(m, cp_plan(2, CpComm::a2a));
  // 4096 tokens x (8192 + 2 x 1024) / TP 4 x 2 B = 20,971,520 B; the output 4096 x 8192 / 4 x 2 = 16,777,216 B.
  const auto qkv = named(ops.forward, op::cp_a2a_qkv);
  const auto out = named(ops.forward, op::cp_a2a_out);
  REQUIRE(qkv.size() == 1);
  REQUIRE(out.size() == 1);
  CHECK(qkv[0]->comm_bytes == 20'971'520.0);
  CHECK(out[0]->comm_bytes == 16'777'216.0);
  CHECK(qkv[0]->collective == Collective::all_to_all);
  CHECK_FALSE(qkv[0]->overlaps_next);
  CHECK(named(ops.backward, op::cp_a2a_out_bwd).at(0)->comm_bytes == 16'777'216.0);
  CHECK(named(ops.backward, op::cp_a2a_qkv_bwd).at(0)->comm_bytes == 20'971'520.0);
  // One kernel over the whole sequence for 16 / 2 = 8 heads per rank.
  const auto blocks = named(ops.forward, op::attn_flash);
  REQUIRE(blocks.size() == 1);
  CHECK(blocks[0]->m == 8192);
  CHECK(blocks[0]->batch == 8);
}

TEST_CASE("the rank mapping puts CP next to TP: tp-cp-dp-pp, Megatron's order") {
  ParallelPlan p = cp_plan();
  p.cp = 2;
  p.dp = 1;
  p.pp = 2;
  p.tp = 2;
  p.dp = 4;  // TP 2 x CP 2 x PP 2 x DP 4 = 32
  const RankMapping map(p, 8);
  CHECK(map.world_size() == 32);
  // rank = t + 2 (c + 2 d) + 16 s
  CHECK(map.rank_of(1, 1, 3, 1) == 1 + 2 * (1 + 2 * 3) + 16);
  CHECK(map.cp_group(0, 0, 0) == std::vector<int>{0, 2});
  CHECK(map.cp_group(1, 1, 2) == std::vector<int>{25, 27});
  // The gradient group is DP x CP.
  CHECK(map.dp_group(0, 0) == std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14});
  const RankCoord c = map.coord(27);
  CHECK(c.tp == 1);
  CHECK(c.cp == 1);
  CHECK(c.dp == 2);
  CHECK(c.pp == 1);
  CHECK(map.cp_groups().size() == 16);
  CHECK(map.tp_groups().size() == 16);
}

TEST_CASE("plan rules for CP: 2 x CP chunks, fused attention, a2a's heads, the GPU count") {
  const ModelSpec m = llama3_70b();
  Cluster c;
  c.name = "four";
  c.nodes = 4;
  c.gpus_per_node = 8;
  CHECK_FALSE(check_plan(cp_plan(), m, c).has_value());
  ParallelPlan p = cp_plan();
  p.seq_length = 8190;
  REQUIRE(check_plan(p, m, c).has_value());
  CHECK(check_plan(p, m, c)->field == PlanField::cp);
  CHECK(describe(*check_plan(p, m, c), m, c).find("2 x CP = 4 chunks") != std::string::npos);
  p = cp_plan();
  p.flash_attention = false;
  CHECK(describe(*check_plan(p, m, c), m, c).find("fused (flash) attention") != std::string::npos);
  // a2a: 8 KV heads / TP 4 = 2 per rank, which CP 4 does not divide.
  p = cp_plan(4, CpComm::a2a);
  REQUIRE(check_plan(p, m, c).has_value());
  CHECK(check_plan(p, m, c)->field == PlanField::cp_comm);
  CHECK_FALSE(check_plan(cp_plan(2, CpComm::a2a), m, c).has_value());
  p = cp_plan();
  p.dp = 2;
  CHECK(describe(*check_plan(p, m, c), m, c).find("TP x CP x PP x DP = 64") != std::string::npos);
  CHECK_THROWS_WITH(parse_cp_comm("allgather", "x", "--cp-comm-type"), doctest::Contains("not modelled"));
}

TEST_CASE("memory with CP: a rank's activations are those of s / cp tokens; ZeRO shards over DP x CP") {
  const ModelSpec m = llama3_70b();
  // s 4096 per rank, b 1, h 8192, SP over TP 4, no recompute:
  // (10 sbh + 2 s (q + 2kv + q) + 6 s f) / t
  // = (335,544,320 + 150,994,944 + 704,643,072) / 4 = 297,795,584 B.
  CHECK(activation_bytes_per_layer(m, cp_plan()) == 297'795'584.0);
  ParallelPlan half = cp_plan();
  half.cp = 1;
  half.seq_length = 4096;
  CHECK(activation_bytes_per_layer(m, cp_plan()) == activation_bytes_per_layer(m, half));
  // ZeRO-1 at DP 2 x CP 2: 6 + 12 / 4 bytes per parameter.
  ParallelPlan z = cp_plan();
  z.pp = 2;
  z.dp = 2;
  z.zero_stage = 1;
  const MemoryReport mem = memory_per_gpu(m, z, a100());
  CHECK(mem.weight_and_optimizer_bytes == doctest::Approx(mem.parameters * (6 + 12.0 / 4)));
}

TEST_CASE("the CP ring's send/recv on the network: one connection per GPU, as the closed form prices it") {
  const double S = 64.0 * (1 << 20);
  SUBCASE("4 GPUs of one node: NVSwitch busbw") {
    const Topology topo(dgx_a100(1));
    const std::vector<int> ranks{0, 2, 4, 6};
    const LinkParams link = group_link_params(topo, Collective::send_recv, ranks);
    // 67,108,864 B / 220 GB/s + 1 us = 305,040 + 1,000 ns.
    CHECK(collective_time_ns(Collective::send_recv, S, 4, link) == 306'040);
    sim::Network net(topo);
    sim::Engine e(net);
    const sim::GroupId g = e.add_group(sim::CommGroup{ranks, {}});
    e.add_collective(Collective::send_recv, g, S, {}, {});
    const sim::RunStats st = e.run();
    CHECK(std::abs(static_cast<double>(st.end_ns) - 306'040.0) / 306'040.0 < 0.01);
  }
  SUBCASE("4 GPUs, one per node: each GPU's own NIC") {
    const Topology topo(dgx_a100(4));
    const std::vector<int> ranks{0, 8, 16, 24};
    const LinkParams link = group_link_params(topo, Collective::send_recv, ranks);
    CHECK(link.busbw_Bps == doctest::Approx(24e9));  // 8 NICs x 24 GB/s / 8 GPUs
    const std::int64_t t = collective_time_ns(Collective::send_recv, S, 4, link);
    // 67,108,864 / 24 GB/s = 2,796,203 ns, + 3 us + two switch hops inside the leaf (none: one leaf)
    CHECK(t == doctest::Approx(2'796'203 + link.latency_ns).epsilon(1e-6));
    sim::Network net(topo);
    sim::Engine e(net);
    const sim::GroupId g = e.add_group(sim::CommGroup{ranks, {}});
    e.add_collective(Collective::send_recv, g, S, {}, {});
    const sim::RunStats st = e.run();
    CHECK(std::abs(static_cast<double>(st.end_ns - t)) / static_cast<double>(t) < 0.01);
  }
}

TEST_CASE("the estimate and the simulation agree on CP plans; the ring hides under attention on NVLink") {
  const ModelSpec m = llama3_70b();
  const Topology topo(dgx_a100(4));
  for (CpComm comm : {CpComm::p2p, CpComm::a2a}) {
    CAPTURE(to_string(comm));
    const ParallelPlan p = cp_plan(2, comm);
    const Estimate est = estimate(m, topo, p);
    const Estimate sim = simulate(m, topo, p);
    CHECK(est.breakdown.total() == doctest::Approx(est.iteration_time_s));
    CHECK(std::abs(sim.iteration_time_s / est.iteration_time_s - 1) < 0.05);
    if (comm == CpComm::p2p) {
      // 4 MiB over NVSwitch (~20 us) under each attention block (~ms): hidden.
      CHECK(est.breakdown.cp_comm_s == 0.0);
      CHECK(sim.breakdown.cp_comm_s < 0.01 * sim.iteration_time_s);
    } else {
      CHECK(est.breakdown.cp_comm_s > 0.0);
      CHECK(sim.breakdown.cp_comm_s > 0.0);
    }
  }
}

TEST_CASE("the planner searches CP where the trainer has it, and only there") {
  const ModelSpec m = llama3_70b();
  const Topology topo(dgx_a100(4));
  PlannerOptions o;
  o.simulate_top = 0;
  o.global_batch = 64;
  o.tp = 4;
  o.pp = 4;
  const SearchResult r = search_plans(m, topo, o);
  bool with_cp = false;
  for (const Estimate& e : r.fitting) with_cp = with_cp || e.plan.cp == 2;
  CHECK(with_cp);
  o.trainer = "megatron-2022";
  const SearchResult old = search_plans(m, topo, o);
  for (const Estimate& e : old.fitting) CHECK(e.plan.cp == 1);
  o.cp = 2;
  CHECK_THROWS_WITH(search_plans(m, topo, o), doctest::Contains("has no context parallelism"));
  // torchtitan runs the ring (PyTorch's ring attention), not the a2a exchange.
  o.trainer = "torchtitan";
  o.zero_stage = 3;
  for (const Estimate& e : search_plans(m, topo, o).fitting) CHECK(e.plan.cp_comm == CpComm::p2p);
  o.cp_comm = CpComm::a2a;
  CHECK_THROWS_WITH(search_plans(m, topo, o), doctest::Contains("torchtitan exchanges K/V around the ring only"));
}
