#pragma once
#ifndef CUBOID_LAYER_SEARCH
#error "cuboid/search is not below this layer in the build (docs/architecture.md)"
#endif
// The planner: enumerate every TP x PP x DP factorisation of the cluster with
// micro-batch, virtual stages, ZeRO stage, recomputation and sequence
// parallelism; drop what does not divide or does not fit in memory; score the
// rest with the analytical estimator; rank by throughput.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/trainer.hpp"

namespace cuboid {

// Every dimension left empty is searched; a set one is fixed.
struct PlannerOptions {
  std::optional<int> tp, pp, dp, micro_batch, virtual_stages, zero_stage;
  // Context parallel size (default: searched where the trainer has it, else
  // 1) and its exchange (default: the p2p ring, Megatron's default).
  std::optional<int> cp;
  std::optional<CpComm> cp_comm;
  // Expert parallelism of an MoE model (default: searched where the trainer
  // has it: EP dividing the experts, ETP 1 or TP; else EP 1, ETP = TP).
  std::optional<int> ep, etp;
  std::optional<Recompute> recompute;
  std::optional<bool> sequence_parallel;
  std::optional<Schedule> schedule;
  std::optional<bool> flash_attention;       // default: the device's (GpuProfile::flash_attention)
  std::optional<bool> grad_accum_fusion;     // default: the trainer's
  // The trainer preset (cuboid/core/trainer.hpp): what it can run and how.
  // Default: megatron-core. Settings set here must be ones it can run.
  std::optional<std::string> trainer;
  std::optional<bool> dp_overlap;            // default: the trainer's
  std::optional<std::int64_t> global_batch;  // default: default_global_batch()
  std::optional<std::int64_t> seq_length;    // default: the model's
  std::optional<RankOrder> order;   // default: Megatron's tp-dp-pp (or searched with search_rank_order)
  bool search_rank_order = true;   // try every rank order that places the groups differently
  bool uneven_stages = false;       // allow PP that does not divide the layers (first/last stage shorter)
  std::optional<int> first_stage_layers, last_stage_layers;  // explicit uneven split (simulate, mesh)
  int max_micro_batch = 16;
  int threads = 0;                  // 0: all cores
  int simulate_top = 32;            // re-rank the best K (analytical) plans with the discrete-event simulator
  // Only plans this accepts are scored (e.g. what an export target can express);
  // the rejected count under `reason` in skip_reasons.
  std::function<bool(const ParallelPlan&)> accept;
  std::string accept_reason;
  // Called from a helper thread about every 100 ms while scoring, and once at the end.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// The search tries CP sizes that leave each rank at least this many tokens
// of a sequence (a fixed --cp may go below): Llama 3 405B's 128K stage ran
// CP 16, 8K tokens per rank (Dubey et al. 2024, Table 4); below 1K the GEMMs
// and attention blocks shrink towards launch-bound sizes, and each CP size
// multiplies the candidates.
inline constexpr std::int64_t kMinCpTokens = 1024;

// The default global batch: about 4M tokens, but no more than
// kDefaultSequencesPerGpu sequences per GPU, so that small clusters get small
// batches. Chosen as (odd part of the GPU count) x a power of two so that every
// DP size that divides the GPU count with a power-of-two factor up to that
// power also divides the batch.
inline constexpr int kDefaultSequencesPerGpu = 16;
std::int64_t default_global_batch(std::int64_t seq_length, int total_gpus);

struct SearchResult {
  std::int64_t global_batch = 0;
  std::int64_t seq_length = 0;
  // Fit in memory, best first: the rows scored by the discrete-event
  // simulator (Estimate::simulated), then those of the analytical estimate.
  // Plans that differ only in a tied rank order are one row (kRankOrderTie).
  std::vector<Estimate> fitting;
  std::size_t simulated = 0;           // plans the simulator scored (before folding ties)
  std::int64_t fitting_plans = 0;      // plans that fit in memory (before folding ties)
  std::vector<Estimate> not_fitting;   // valid but over memory, smallest memory first (at most 16)
  std::int64_t candidates = 0;         // valid plans scored (fitting + not fitting)
  std::int64_t skipped = 0;            // factorisations rejected before scoring
  std::map<std::string, std::int64_t> skip_reasons;  // reason -> count
};

// e.other_orders: the rows of r (and the orders folded into them) that are e's
// plan in another rank order, fastest first.
void attach_other_orders(Estimate& e, const SearchResult& r);

// The planner's options are the command line's flags, so it names plan
// problems by flag. flag_of: "--tp", ..., "--tp/--pp/--dp" for the GPU count.
std::string_view flag_of(PlanField field);
// The problem's fix with the flags spelled out (PlanProblem::fix names
// settings, not flags).
std::string flag_fix(const PlanProblem& problem);
// check_plan, thrown as InputError(source, flag, problem, flag fix).
void validate_plan(const ParallelPlan& plan, const ModelSpec& model, const Cluster& cluster,
                   const std::string& source = "command line");

// The options' trainer preset; InputError (naming --trainer) when unknown.
const TrainerPreset& trainer_of(const PlannerOptions& options);
// InputError naming the flag when an option asks for what the trainer
// cannot run (e.g. --sequence-parallel on with megatron-2021).
void check_trainer_options(const PlannerOptions& options);
// The trainer settings every plan of these options gets.
TrainerSettings trainer_settings(const PlannerOptions& options);

// Every valid candidate of the search space, in a deterministic order; fills
// result's global_batch, seq_length and skip counts. search_plans scores them.
std::vector<ParallelPlan> enumerate_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& options,
                                          SearchResult& result);

// Throws InputError when a fixed dimension is itself invalid (e.g. --tp 3 for
// 64 heads), with the same messages as validate_plan.
SearchResult search_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& options);

// The plan that the options describe when every dimension is fixed (cuboid
// simulate); unset dimensions take Megatron-like defaults (mb 1, v 1, ZeRO 0,
// selective recompute, SP on when TP > 1, 1F1B). Validated.
ParallelPlan plan_from_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& options);

}  // namespace cuboid
