#pragma once
// The plans the plan-file and export tests share: the seed plan (Llama-3-70B,
// TP4 PP4 DP2 on topologies/dgx-a100-4node.json, mb 1, global batch 64,
// ZeRO 1, full recompute, SP on, 1F1B), an interleaved GPT-3 175B plan, the
// seed with ZeRO-3, and a Llama-3-8B pipeline without TP that DeepSpeed can run
// (priced as Megatron-DeepSpeed on DeepSpeed's pipeline engine), and
// Mixtral-8x7B at TP 2 x PP 2 x DP 8 with its experts as EP 8 x ETP 1.
// Each is turned into a plan file with plan_to_json and read back with
// plan_file_from_json, so the tests go through the real file format.
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"
#include "fixtures.hpp"

namespace cuboid::test {

struct Fixture {
  std::string name;  // also the golden file stem
  std::string model_card;
  ParallelPlan plan;
};

inline ParallelPlan make_plan(int tp, int pp, int dp, int vpp, int zero, Recompute rc, bool sp, Schedule s,
                              std::int64_t seq_length) {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_length = seq_length;
  p.virtual_stages = vpp;
  p.zero_stage = zero;
  p.recompute = rc;
  p.sequence_parallel = sp;
  p.schedule = s;
  return p;
}

// DeepSpeed and torchtitan plans are priced without Megatron's fused
// gradient accumulation (their exporters refuse fused plans).
inline ParallelPlan unfused(ParallelPlan p) {
  p.grad_accum_fusion = false;
  return p;
}

// Priced as the named trainer preset runs it (plan --trainer NAME).
inline ParallelPlan run_as(ParallelPlan p, const char* trainer) {
  p.trainer = find_trainer(trainer)->settings;
  return p;
}

// An MoE plan's experts: EP x ETP.
inline ParallelPlan experts(ParallelPlan p, int ep, int etp) {
  p.ep = ep;
  p.etp = etp;
  return p;
}

inline std::vector<Fixture> fixtures() {
  return {
      {"seed", "models/llama3-70b.json",
       make_plan(4, 4, 2, 1, 1, Recompute::full, true, Schedule::one_f_one_b, 8192)},
      {"gpt3-interleaved", "models/gpt3-175b.json",
       unfused(make_plan(8, 4, 1, 3, 0, Recompute::selective, true, Schedule::interleaved, 2048))},
      {"seed-zero3", "models/llama3-70b.json",
       unfused(make_plan(4, 4, 2, 1, 3, Recompute::full, true, Schedule::one_f_one_b, 8192))},
      {"llama8b-pp4", "models/llama3-8b.json",
       run_as(unfused(make_plan(1, 4, 8, 1, 1, Recompute::full, false, Schedule::one_f_one_b, 8192)),
              "megatron-deepspeed")},
      {"mixtral-ep8", "models/mixtral-8x7b.json", experts(make_plan(2, 2, 8, 1, 1, Recompute::none, true,
                                                                    Schedule::one_f_one_b, 4096), 8, 1)},
  };
}

// `pf` (the "seed" fixture: TP 4 x PP 4 x DP 2, ZeRO-1) interleaved over 2
// virtual stages with the parameter gather in the next forward (aligned, as
// the preset has it).
inline PlanFile with_gather_in_forward(PlanFile pf) {
  pf.plan.schedule = Schedule::interleaved;
  pf.plan.virtual_stages = 2;
  pf.plan.trainer.overlap_param_gather = true;
  pf.plan.trainer.align_param_gather = true;
  return pf;
}
// ... and the first chunk's gather under the optimizer step.
inline PlanFile with_gather_in_step(PlanFile pf) {
  pf = with_gather_in_forward(std::move(pf));
  pf.plan.trainer.overlap_param_gather_with_optimizer_step = true;
  return pf;
}

// (source_root() is fixtures.hpp's.)
inline Cluster four_dgx_a100() { return load_cluster(source_root() / "topologies/dgx-a100-4node.json"); }

// The trainer preset `plan --for TARGET` prices a target's plans with
// (src/cli/plan_flags.cpp restrict_to_target: each target's first preset).
inline std::string for_target_trainer(const std::string& target) {
  static const std::map<std::string, std::string> kTrainer = {
      {"megatron", "megatron-core"}, {"megatron-bridge", "megatron-core"}, {"deepspeed", "megatron-deepspeed"},
      {"torchtitan", "torchtitan"},  {"torchtitan-main", "torchtitan"},    {"nemo", "megatron-core"}};
  return kTrainer.at(target);
}

// A plan file for `model` on `cluster` with no plan in it yet.
inline PlanFile plan_file_on(const ModelSpec& model, const Cluster& cluster, std::string source) {
  PlanFile pf;
  pf.source = std::move(source);
  pf.model = model;
  pf.cluster_name = cluster.name;
  pf.gpu_name = cluster.gpu.name;
  pf.nodes = cluster.nodes;
  pf.gpus_per_node = cluster.gpus_per_node;
  return pf;
}

// The plan file cuboid writes for a fixture.
inline nlohmann::json fixture_json(const Fixture& f) {
  const ModelSpec model = load_model(source_root() / f.model_card);
  const Cluster cluster = four_dgx_a100();
  if (const auto bad = check_plan(f.plan, model, cluster)) throw std::invalid_argument(describe(*bad, model, cluster));
  const Topology topo(cluster);
  return plan_to_json(model, cluster, estimate(model, topo, f.plan));
}

// Read back; `source` stands in for the file name in messages.
inline PlanFile fixture_plan_file(const Fixture& f) {
  return plan_file_from_json(fixture_json(f), f.name + ".plan.json");
}

}  // namespace cuboid::test
