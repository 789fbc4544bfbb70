// ParallelPlan validation and the rank <-> (node, gpu) <-> (tp, pp, dp) mapping.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "cuboid/core/error.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/search/planner.hpp"
#include "fixtures.hpp"
#include "plan_words.hpp"

using namespace cuboid;
using namespace cuboid::test;
using cuboid::cli::flag_fix;
using cuboid::cli::flag_of;
using cuboid::cli::flag_fix;
using cuboid::cli::flag_of;

namespace {

Cluster four_dgx() {
  Cluster c;
  c.name = "dgx-a100-4node";
  c.nodes = 4;
  c.gpus_per_node = 8;
  return c;
}

ParallelPlan seed_plan() {
  ParallelPlan p;
  p.tp = 4;
  p.pp = 4;
  p.dp = 2;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_length = 8192;
  p.sequence_parallel = true;
  return p;
}

std::string error_of(const ParallelPlan& p, const ModelSpec& m = llama3_70b(), const Cluster& c = four_dgx()) {
  // As the command line words check_plan's refusal: the flag, the problem and the flag's fix.
  if (auto r = check_plan(p, m, c))
    return InputError("command line", std::string(flag_of(r->field)), describe(*r, m, c), flag_fix(*r)).what();
  return "";
}

}  // namespace

TEST_CASE("the seed's TP 4 x PP 4 x DP 2 on 4 x 8 GPUs, Megatron order tp-dp-pp") {
  ParallelPlan p = seed_plan();
  CHECK(error_of(p).empty());
  RankMapping map(p, 8);
  CHECK(map.world_size() == 32);
  // TP innermost: ranks 0-3 are one TP group; the second DP replica is ranks 4-7 of the same node.
  CHECK(map.tp_group(0, 0) == std::vector<int>{0, 1, 2, 3});
  CHECK(map.dp_group(0, 0) == std::vector<int>{0, 4});
  // PP outermost: stage s lives on node s.
  CHECK(map.pp_group(0, 0) == std::vector<int>{0, 8, 16, 24});
  CHECK(map.pp_group(3, 1) == std::vector<int>{7, 15, 23, 31});
  for (int r = 0; r < 32; ++r) {
    RankCoord c = map.coord(r);
    CHECK(c.node == r / 8);
    CHECK(c.gpu == r % 8);
    CHECK(c.pp == c.node);
    CHECK(map.rank_of(c.tp, c.pp, c.dp) == r);
  }
  CHECK_FALSE(map.tp_crosses_nodes());
  CHECK(map.nodes_spanned(map.pp_group(0, 0)) == 4);
  CHECK(map.nodes_spanned(map.dp_group(0, 0)) == 1);
}

TEST_CASE("groups partition the ranks for every order") {
  for (const char* order : {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp"}) {
    ParallelPlan p = seed_plan();
    p.order = RankOrder::parse(order, "test", "order");
    CHECK(p.order.str() == order);
    RankMapping map(p, 8);
    for (const auto& groups : {map.tp_groups(), map.pp_groups(), map.dp_groups()}) {
      std::set<int> seen;
      for (const auto& g : groups)
        for (int r : g) CHECK(seen.insert(r).second);
      CHECK(seen.size() == 32);
    }
    CHECK(map.tp_groups().size() == 8);
    CHECK(map.pp_groups().size() == 8);
    CHECK(map.dp_groups().size() == 16);
  }
}

TEST_CASE("TP 16 across two nodes is flagged") {
  ParallelPlan p = seed_plan();
  p.tp = 8;
  p.pp = 2;
  p.dp = 2;
  p.order = RankOrder::parse("dp-tp-pp", "test", "order");
  RankMapping map(p, 8);
  // DP innermost puts TP ranks 2 apart: a TP group of 8 spans two nodes.
  CHECK(map.tp_group(0, 0) == std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14});
  CHECK(map.tp_crosses_nodes());
}

namespace {

using Groups = std::vector<std::vector<int>>;

// Megatron-Core lists its groups in its own order; cuboid in (pp, dp, cp, tp)
// loops. Both list each group's ranks in increasing order: compare the sets.
Groups sorted(Groups g) {
  std::sort(g.begin(), g.end());
  return g;
}

// TP 2 x CP 2 x PP 2 x DP 2 on 16 GPUs (8 per node), with experts EP x ETP.
ParallelPlan sixteen(const char* order, int ep = 1, int etp = 0) {
  ParallelPlan p = seed_plan();
  p.tp = 2;
  p.cp = 2;
  p.pp = 2;
  p.dp = 2;
  p.ep = ep;
  p.etp = etp;
  p.order = RankOrder::parse(order, "test", "order");
  return p;
}

}  // namespace

// The groups below are worked by hand from megatron/core/parallel_state.py at
// Megatron-LM d98e8a64 (the same at cd4afffa): initialize_model_parallel
// builds RankGenerator(tp, ep=1, dp, pp, cp, order) for the layers and
// RankGenerator(etp, ep, edp, pp, cp=1, order) for the experts, each with
// rank = sum of coordinate x the product of the sizes named before it in the
// order (generate_masked_orthogonal_rank_groups), and a group of token X =
// the ranks that differ in X only. (Running that RankGenerator on these sizes
// lists the same groups.)
TEST_CASE("Megatron-Core's tp-cp-ep-dp-pp (tp-dp-pp): TP 2 x CP 2 x PP 2 x DP 2 as parallel_state builds it") {
  for (const char* name : {"tp-dp-pp", "tp-cp-ep-dp-pp"}) {
    CAPTURE(name);
    const ParallelPlan p = sixteen(name);
    CHECK(p.order.str() == "tp-dp-pp");
    CHECK(p.order.megatron_name() == "tp-cp-ep-dp-pp");
    const RankMapping map(p, 8);
    // rank = t + 2 c + 4 d + 8 p
    CHECK(map.rank_of(1, 1, 1, 1) == 1 + 2 + 4 + 8);
    CHECK(sorted(map.tp_groups()) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
    CHECK(sorted(map.cp_groups()) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
    CHECK(sorted(map.pp_groups()) == Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
    // cuboid's gradient group is Megatron's dp-cp group.
    CHECK(sorted(map.dp_groups()) == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  }
}

TEST_CASE("Megatron-Core's tp-cp-ep-pp-dp (tp-pp-dp, --use-tp-pp-dp-mapping): CP next to TP, then PP, then DP") {
  for (const char* name : {"tp-pp-dp", "tp-cp-ep-pp-dp"}) {
    CAPTURE(name);
    const ParallelPlan p = sixteen(name);
    CHECK(p.order.str() == "tp-pp-dp");
    CHECK(p.order.megatron_name() == "tp-cp-ep-pp-dp");
    const RankMapping map(p, 8);
    // rank = t + 2 c + 4 p + 8 d (cuboid's map had t + 2 p + 4 (c + 2 d): CP 4 apart)
    CHECK(map.rank_of(1, 1, 0, 1) == 1 + 2 + 4);
    CHECK(sorted(map.tp_groups()) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
    CHECK(sorted(map.cp_groups()) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
    CHECK(sorted(map.pp_groups()) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
    CHECK(sorted(map.dp_groups()) == Groups{{0, 2, 8, 10}, {1, 3, 9, 11}, {4, 6, 12, 14}, {5, 7, 13, 15}});
    // Every CP group stays inside a node; each gradient group spans both.
    for (const auto& g : map.cp_groups()) CHECK(map.nodes_spanned(g) == 1);
    for (const auto& g : map.dp_groups()) CHECK(map.nodes_spanned(g) == 2);
  }
}

TEST_CASE("the experts' groups as Megatron-Core's expert RankGenerator builds them, in both of its orders") {
  SUBCASE("EP 2 x ETP 2 (expert-DP 2 = DP): both orders") {
    // Experts: rank = et + 2 e + 4 edp + 8 p (tp-ep-dp-pp) or et + 2 e + 4 p + 8 edp (tp-ep-pp-dp).
    const Groups ep{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}};
    const RankMapping dp_pp(sixteen("tp-dp-pp", 2, 2), 8);
    CHECK(sorted(dp_pp.ep_groups()) == ep);
    CHECK(sorted(dp_pp.expert_dp_groups()) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
    const RankMapping pp_dp(sixteen("tp-pp-dp", 2, 2), 8);
    CHECK(sorted(pp_dp.ep_groups()) == ep);
    CHECK(sorted(pp_dp.expert_dp_groups()) == Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
    // The experts' pipelines are the layers' (parallel_state asserts it): a
    // rank's expert-DP peers hold its stage.
    for (const auto& g : pp_dp.expert_dp_groups())
      for (int r : g) CHECK(pp_dp.coord(r).pp == pp_dp.coord(g.front()).pp);
  }
  SUBCASE("EP 2 x ETP 1 (expert-DP 4), tp-cp-ep-dp-pp: EP over the TP pair") {
    // rank = e + 2 edp + 8 p
    const RankMapping map(sixteen("tp-dp-pp", 2, 1), 8);
    CHECK(sorted(map.ep_groups()) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
    CHECK(sorted(map.expert_dp_groups()) == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  }
  SUBCASE("TP 4 x PP 2 x DP 2, EP 4 x ETP 1, both orders") {
    for (const char* name : {"tp-dp-pp", "tp-pp-dp"}) {
      CAPTURE(name);
      ParallelPlan p = sixteen(name, 4, 1);
      p.tp = 4;
      p.cp = 1;
      const RankMapping map(p, 8);
      const bool pp_last = p.order.str() == "tp-dp-pp";
      CHECK(sorted(map.ep_groups()) == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
      CHECK(sorted(map.expert_dp_groups()) ==
            (pp_last ? Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}
                     : Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
    }
  }
}

TEST_CASE("cuboid's own orders keep CP as the innermost part of DP") {
  // dp-tp-pp: rank = c + 2 d + 4 t + 8 p.
  const ParallelPlan p = sixteen("dp-tp-pp");
  CHECK(p.order.megatron_name().empty());
  CHECK_FALSE(p.order.cp_next_to_tp());
  const RankMapping map(p, 8);
  CHECK(sorted(map.cp_groups()) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(sorted(map.tp_groups()) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(sorted(map.dp_groups()) == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  for (int r = 0; r < 16; ++r) {
    const RankCoord c = map.coord(r);
    CHECK(map.rank_of(c.tp, c.pp, c.dp, c.cp) == r);
  }
}

TEST_CASE("rank order parsing errors") {
  CHECK_THROWS_WITH_AS(RankOrder::parse("tp-dp", "command line", "--rank-order"),
                       "command line: --rank-order: rank order \"tp-dp\" must name tp, dp and pp once each "
                       "(fix: give the three dimensions innermost first, e.g. tp-dp-pp (Megatron's default) or tp-pp-dp, "
                       "or Megatron-Core's tp-cp-ep-dp-pp or tp-cp-ep-pp-dp)",
                       InputError);
  CHECK_THROWS_AS(RankOrder::parse("tp-tp-pp", "c", "f"), InputError);
  CHECK_THROWS_AS(RankOrder::parse("tp-ep-pp", "c", "f"), InputError);
  // Megatron-Core's names are its two orders; CP and EP elsewhere are not.
  CHECK(RankOrder::parse("tp-cp-ep-dp-pp", "c", "f") == RankOrder{});
  CHECK(RankOrder::parse("tp-cp-ep-pp-dp", "c", "f") == RankOrder::parse("tp-pp-dp", "c", "f"));
  CHECK_THROWS_WITH_AS(RankOrder::parse("dp-cp-ep-tp-pp", "command line", "--rank-order"),
                       doctest::Contains("rank order \"dp-cp-ep-tp-pp\" names cp: cuboid places CP and EP as "
                                         "Megatron-Core does, in its orders tp-cp-ep-dp-pp and tp-cp-ep-pp-dp only"),
                       InputError);
  CHECK_THROWS_AS(parse_recompute("some", "c", "f"), InputError);
  CHECK(parse_schedule("1f1b", "c", "f") == Schedule::one_f_one_b);
}

TEST_CASE("check_plan's refusals, worded for the command line, name the flag and the fix") {
  ParallelPlan p = seed_plan();
  SUBCASE("heads not divisible by TP") {
    p.tp = 3;
    CHECK(error_of(p) ==
          "command line: --tp: TP 3 does not divide the 64 attention heads of llama3-70b "
          "(fix: choose a TP that divides the number of heads)");
  }
  SUBCASE("KV heads not divisible by TP") {
    p.tp = 16;
    p.pp = 2;
    p.dp = 1;
    CHECK(error_of(p) ==
          "command line: --tp: TP 16 does not divide the 8 key/value heads of llama3-70b (Megatron-LM requires "
          "num_query_groups % TP == 0) (fix: choose a TP that divides the number of key/value heads)");
  }
  SUBCASE("layers not divisible by PP x virtual stages") {
    p.pp = 4;
    p.virtual_stages = 3;
    p.schedule = Schedule::interleaved;
    CHECK(error_of(p) ==
          "command line: --vpp: PP 4 x virtual stages 3 = 12 does not divide the 80 layers of llama3-70b "
          "(Megatron-LM once trained a silently smaller model here) "
          "(fix: choose PP x virtual stages that divides the number of layers)");
    p.virtual_stages = 1;
    p.schedule = Schedule::one_f_one_b;
    p.pp = 3;
    CHECK(error_of(p).find("--pp: PP 3 x virtual stages 1 = 3 does not divide the 80 layers") != std::string::npos);
  }
  SUBCASE("GPUs not divisible by TP x PP") {
    p.dp = 1;
    CHECK(error_of(p) ==
          "command line: --tp/--pp/--dp: TP x PP x DP = 16 does not use all 32 GPUs of dgx-a100-4node "
          "(fix: make TP x PP x DP equal the GPU count, or set --nodes so the cluster has exactly that many GPUs)");
    p.dp = 4;
    CHECK(error_of(p) ==
          "command line: --tp/--pp/--dp: TP x PP x DP = 64 GPUs but cluster dgx-a100-4node has 32 "
          "(fix: use fewer GPUs or more nodes (--nodes N))");
    // With CP the dimensions are four, and the fix names --nodes too.
    p.dp = 1;
    p.pp = 2;
    p.cp = 2;
    CHECK(error_of(p) ==
          "command line: --tp/--pp/--dp: TP x CP x PP x DP = 16 does not use all 32 GPUs of dgx-a100-4node "
          "(fix: make TP x CP x PP x DP equal the GPU count, or set --nodes so the cluster has exactly that many GPUs)");
  }
  SUBCASE("global batch not divisible by micro-batch x DP") {
    p.global_batch = 63;
    CHECK(error_of(p) ==
          "command line: --global-batch: global batch 63 is not divisible by micro-batch x DP = 2 "
          "(fix: choose a global batch that is a multiple of 2)");
  }
  SUBCASE("interleaving needs micro-batches divisible by PP") {
    p.virtual_stages = 2;
    p.schedule = Schedule::interleaved;
    p.global_batch = 12;  // 6 micro-batches, PP 4
    CHECK(error_of(p) ==
          "command line: --global-batch: the interleaved schedule needs the number of micro-batches (6) to be a "
          "multiple of PP 4 (fix: choose a global batch that is a multiple of micro-batch x DP x PP = 8)");
  }
  SUBCASE("non-positive sizes and bad ZeRO stage") {
    p.micro_batch = 0;
    CHECK(error_of(p) == "command line: --micro-batch: must be positive, got 0 (fix: give a value >= 1)");
    p.micro_batch = 1;
    p.zero_stage = 4;
    CHECK(error_of(p) == "command line: --zero: ZeRO stage must be 0, 1, 2 or 3, got 4 (fix: use 0, 1, 2 or 3)");
  }
  SUBCASE("sequence longer than the model supports") {
    p.seq_length = 16384;
    CHECK(error_of(p).find("--seq-length: sequence length 16384 exceeds the model's max_position_embeddings 8192") !=
          std::string::npos);
  }
  SUBCASE("sequence parallel needs TP") {
    p.tp = 1;
    p.dp = 8;
    CHECK(error_of(p) == "command line: --sequence-parallel: sequence parallelism needs TP > 1 "
                         "(fix: use --sequence-parallel off with TP 1)");
  }
  SUBCASE("derived quantities") {
    CHECK(p.world_size() == 32);
    CHECK(p.num_micro_batches() == 32);
    CHECK(p.tokens_per_iteration() == 64 * 8192);
  }
}

TEST_CASE("plans compare equal field by field") {
  const ParallelPlan a;
  ParallelPlan b;
  CHECK(a == b);
  b.global_batch = 2;
  CHECK(a != b);
  b = a;
  b.flash_attention = !a.flash_attention;
  CHECK(a != b);
  b = a;
  b.order.inner_to_outer = {Dim::dp, Dim::tp, Dim::pp};
  CHECK(a != b);
}

TEST_CASE("check_plan returns a kind and its numbers; core describes it, the command line names the flags") {
  ParallelPlan p = seed_plan();
  p.sequence_parallel = true;
  p.tp = 1;
  p.dp = 8;
  auto problem = check_plan(p, llama3_70b(), four_dgx());
  REQUIRE(problem);
  CHECK(problem->kind == PlanCheck::sp_needs_tp);
  CHECK(problem->field == PlanField::sequence_parallel);
  CHECK(describe(*problem, llama3_70b(), four_dgx()) == "sequence parallelism needs TP > 1");
  CHECK(flag_of(problem->field) == "--sequence-parallel");
  CHECK(flag_fix(*problem) == "use --sequence-parallel off with TP 1");

  p = seed_plan();
  p.seq_length = 1 << 20;
  problem = check_plan(p, llama3_70b(), four_dgx());
  REQUIRE(problem);
  CHECK(problem->kind == PlanCheck::seq_over_max);
  CHECK(problem->field == PlanField::seq_length);
  CHECK(problem->values[0] == (1 << 20));
  CHECK(problem->values[1] == 8192);
  CHECK(describe(*problem, llama3_70b(), four_dgx()).find("--") == std::string::npos);
  CHECK(flag_fix(*problem) == "use --seq-length <= 8192");

  // Equal refusals are equal values: the planner counts them without words.
  p = seed_plan();
  p.tp = 3;
  problem = check_plan(p, llama3_70b(), four_dgx());
  REQUIRE(problem);
  CHECK(*problem == *check_plan(p, llama3_70b(), four_dgx()));
  CHECK(flag_fix(*problem) == "choose a TP that divides the number of heads");
  CHECK(!check_plan(seed_plan(), llama3_70b(), four_dgx()));
}

TEST_CASE("check_plan holds a plan to its trainer preset's limits, whoever made the plan") {
  const ModelSpec m = llama3_70b();
  const Cluster c = four_dgx();
  // Megatron-LM of 2021: no SP, unfused attention and accumulation, full recomputation, ZeRO 0.
  ParallelPlan p = seed_plan();
  p.trainer = find_trainer("megatron-2021")->settings;
  p.sequence_parallel = p.flash_attention = p.grad_accum_fusion = false;
  p.recompute = Recompute::full;
  p.zero_stage = 0;
  CHECK_FALSE(check_plan(p, m, c));

  p.zero_stage = 1;
  const auto zero = check_plan(p, m, c);
  REQUIRE(zero);
  CHECK(zero->kind == PlanCheck::trainer_no_zero_stage);
  CHECK(zero->field == PlanField::zero_stage);
  CHECK(zero->values[1] == 1);
  CHECK(zero->values[2] == 1);  // the stages it runs, as a mask: ZeRO 0 only
  CHECK(error_of(p) ==
        "command line: --zero: megatron-2021 cannot run ZeRO stage 1 (Megatron-LM of 2021 (Narayanan et al. SC'21 "
        "scripts), fp16) (fix: use --zero 0)");
  // check_trainer is the rule check_plan applies: the same refusal.
  CHECK(check_trainer(p, *find_trainer("megatron-2021")) == zero);
  // A preset read from elsewhere than the registry is named as the plan's trainer.
  const TrainerPreset copy = *find_trainer("megatron-2021");
  CHECK(describe(*check_trainer(p, copy), m, c).rfind("the plan's trainer cannot run ZeRO stage 1", 0) == 0);
  p.zero_stage = 0;

  p.sequence_parallel = true;
  CHECK(check_plan(p, m, c)->kind == PlanCheck::trainer_no_sp);
  p.sequence_parallel = false;
  p.recompute = Recompute::selective;
  CHECK(check_plan(p, m, c)->field == PlanField::recompute);
  p.recompute = Recompute::full;
  p.first_stage_layers = p.last_stage_layers = 18;
  CHECK(check_plan(p, m, c)->kind == PlanCheck::trainer_even_stages);
  p.first_stage_layers = p.last_stage_layers = 0;

  // torchtitan rotates K/V around the ring only.
  ParallelPlan t = seed_plan();
  t.trainer = find_trainer("torchtitan")->settings;
  t.grad_accum_fusion = false;
  t.dp = 1;
  t.cp = 2;
  t.zero_stage = 3;
  CHECK_FALSE(check_plan(t, m, c));
  t.cp_comm = CpComm::a2a;
  CHECK(check_plan(t, m, c)->kind == PlanCheck::trainer_no_cp_a2a);
  CHECK(error_of(t).rfind("command line: --cp-comm-type: torchtitan exchanges K/V around the ring only", 0) == 0);

  ParallelPlan unknown = seed_plan();
  unknown.trainer.preset = "megatron-1999";
  CHECK(check_plan(unknown, m, c)->kind == PlanCheck::trainer_unknown);
}

TEST_CASE("settings that would have no effect are refused: the a2a exchange without CP, an ETP on a dense model") {
  ParallelPlan p = seed_plan();
  p.cp_comm = CpComm::a2a;
  CHECK(error_of(p) ==
        "command line: --cp-comm-type: the a2a exchange is context parallelism's; with CP 1 there is nothing to "
        "exchange and it has no effect (fix: use --cp 2 (or more), or drop --cp-comm-type)");
  p.cp_comm = CpComm::p2p;  // the default: nothing asked for
  CHECK(error_of(p).empty());
  p.etp = p.tp;
  CHECK(check_plan(p, llama3_70b(), four_dgx())->kind == PlanCheck::ep_needs_moe);
  CHECK(check_plan(p, llama3_70b(), four_dgx())->field == PlanField::etp);
}
