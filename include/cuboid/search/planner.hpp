#pragma once
#ifndef CUBOID_LAYER_SEARCH
#error "cuboid/search is not below this layer in the build (docs/architecture.md)"
#endif
// The planner: enumerate every TP x CP x PP x DP factorisation of the cluster
// with micro-batch, virtual stages, rank order, ZeRO stage, recomputation,
// sequence parallelism and the experts' EP/ETP, one axis each; drop what
// check_plan refuses (counted as values) or does not fit in memory; score the
// rest with the analytical estimator; rank by throughput.
#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/plan_check.hpp"
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
  // The MoE token dispatcher (default: each the trainer has, searched where
  // EP > 1; else its first).
  std::optional<MoeDispatcher> moe_dispatcher;
  // The flex dispatcher's backend and SMs (ParallelPlan::moe_flex; default
  // DeepEP and its backend's SMs).
  std::optional<FlexBackend> moe_flex_backend;
  std::optional<int> moe_flex_sms;
  // HybridEP's static receive budget and the paged stash (FlexSetting;
  // default dropless, no stash, Megatron-Core's buffer factor 1.10).
  std::optional<double> moe_rank_capacity_factor;
  std::optional<bool> moe_paged_stash;
  std::optional<double> moe_paged_stash_buffer_factor;
  // The EP all-to-all overlap of the combined 1F1B schedule (default: the
  // trainer's default_moe_ep_overlap; an MoE model's plans only).
  std::optional<bool> moe_ep_overlap;
  std::optional<bool> moe_delay_wgrad;  // with the EP overlap (default on, the export's --delay-wgrad-compute)
  std::optional<Recompute> recompute;
  std::optional<std::uint8_t> recompute_modules;  // RecomputeModule bits (default 0: the attention core)
  // With recompute full: Megatron-Core's method and layer count (default
  // uniform 1); fixed, not searched.
  std::optional<RecomputeMethod> recompute_method;
  std::optional<int> recompute_num_layers;
  std::optional<int> offload_layers;  // decoder layers whose activations go to host memory (default 0)
  std::optional<std::uint8_t> offload_modules;  // OffloadModule bits: fine-grained offloading (default 0: none)
  std::optional<bool> sequence_parallel;
  std::optional<Schedule> schedule;
  std::optional<bool> flash_attention;       // default: the device's (GpuProfile::flash_attention)
  // The attention kernel (unfused = flash off); default: the trainer's, then the GPU's.
  std::optional<AttentionKernel> attention_kernel;
  std::optional<bool> grad_accum_fusion;     // default: the trainer's
  // The linear layers' GEMM format (default bf16): fixed, not searched.
  std::optional<Precision> precision;
  std::optional<bool> fp8_param_gather;      // default off
  std::optional<bool> precision_aware_optimizer;  // default off (not searched: it changes the numerics)
  std::optional<bool> fp8_attention;         // default off (not searched: it changes the numerics)
  std::optional<int> adam_moment_bytes;      // default 4, fp32 (not searched)
  std::optional<OptimizerKind> optimizer;    // default Adam (not searched)
  // The trainer preset (cuboid/core/trainer.hpp): what it can run and how.
  // Default: megatron-core. Settings set here must be ones it can run.
  std::optional<std::string> trainer;
  std::optional<bool> dp_overlap;            // default: the trainer's
  std::optional<int> dp_grad_bytes;          // default: the trainer's (not searched: it changes the numerics)
  std::optional<int> fsdp_grad_bytes;        // Megatron-FSDP's; default: the trainer's (not searched)
  std::optional<CudaGraphs> cuda_graphs;     // default: the trainer's
  std::optional<bool> tp_comm_overlap;       // default: the trainer's
  std::optional<bool> overlap_param_gather;  // default: the trainer's
  std::optional<bool> overlap_param_gather_with_optimizer_step;  // default: the trainer's
  std::optional<bool> align_param_gather;                        // default: the trainer's
  std::optional<std::int64_t> ddp_bucket_params;                 // default: the trainer's rule (0)
  std::optional<std::int64_t> global_batch;  // default: default_global_batch()
  std::optional<std::int64_t> seq_length;    // default: the model's
  std::optional<RankOrder> order;   // default: Megatron's tp-dp-pp (or searched with search_rank_order)
  bool search_rank_order = true;   // try every rank order that places the groups differently
  bool uneven_stages = false;       // allow PP that does not divide the layers (first/last stage shorter)
  std::optional<int> first_stage_layers, last_stage_layers;  // explicit uneven split (simulate, mesh)
  // Megatron-Core's pipeline layout, fixed (never searched): the embedding /
  // the loss counted as layers in the split, or a layout (with PP fixed and
  // the virtual stages it names).
  bool embedding_in_split = false, loss_in_split = false;
  PipelineLayout pipeline_layout;
  int max_micro_batch = 16;
  int threads = 0;                  // 0: all cores
  int simulate_top = 32;            // re-rank the best K (analytical) plans with the discrete-event simulator
  // Only plans this accepts are scored (e.g. what an export target can
  // express); the others are counted as Rejection::Kind::not_accepted.
  std::function<bool(const ParallelPlan&)> accept;
  // Called from a helper thread about every 100 ms while scoring, and once at the end.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// The search tries CP sizes that leave each rank at least this many tokens
// of a sequence (a fixed CP may go below): Llama 3 405B's 128K stage ran
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

// Why the planner drops a candidate or refuses its options: a kind and the
// numbers it names. Words are the boundary's: describe() gives the problem
// in the plan's terms, the command line (src/cli) adds flags and fixes.
struct Rejection {
  enum class Kind : std::uint8_t {
    plan,                        // check_plan refused it: `plan`
    // The trainer the options name is not a preset (the plan's own limits are
    // check_trainer's, under `plan`).
    unknown_trainer,             // -
    // A fixed size (field) that does not divide the GPUs: the size, the GPUs.
    fixed_not_dividing_gpus,
    // No proposed first/last-stage split: layers, PP, virtual stages.
    no_uneven_split,
    // The walk's own skips.
    pp_not_dividing_layers,      // without uneven stages
    batch_not_divisible,         // by micro-batch x DP
    no_uneven_chunk_split,       // of the layers into the virtual stages
    interleave_micro_batches,    // micro-batches not divisible by PP
    not_accepted,                // PlannerOptions::accept refused it
  };
  Kind kind = Kind::plan;
  PlanField field = PlanField::world_size;
  std::array<std::int64_t, 3> values{};
  PlanRejection plan{};
  friend auto operator<=>(const Rejection&, const Rejection&) = default;
};

// The problem, in the plan's terms (no flag, no fix). The options name the
// trainer (and an unknown one); not_accepted has no words here.
std::string describe(const Rejection& rejection, const ModelSpec& model, const Cluster& cluster,
                     const PlannerOptions& options);

// Options the planner refuses, thrown once per run by check_trainer_options,
// search_plans, enumerate_plans and plan_from_options: an InputError whose
// field and fix are empty until the command line words them (src/cli).
class PlanRejected : public InputError {
 public:
  PlanRejected(const Rejection& rejection, std::string problem)
      : InputError("command line", "", std::move(problem), ""), rejection_(rejection) {}
  const Rejection& rejection() const noexcept { return rejection_; }

 private:
  Rejection rejection_;
};

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
  std::map<Rejection, std::int64_t> skips;  // why -> how many
};

// e.other_orders: the rows of r (and the orders folded into them) that are e's
// plan in another rank order, fastest first.
void attach_other_orders(Estimate& e, const SearchResult& r);

// The options' trainer preset; PlanRejected (unknown_trainer) when unknown.
const TrainerPreset& trainer_of(const PlannerOptions& options);
// PlanRejected when an option asks for what the trainer cannot run (e.g.
// sequence parallelism with megatron-2021): check_trainer of the options'
// plan (complete_plan), where a given CP exchange asks for CP.
void check_trainer_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& options);
// The trainer settings every plan of these options gets.
TrainerSettings trainer_settings(const PlannerOptions& options);

// Every valid candidate of the search space, in a deterministic order; fills
// result's global_batch, seq_length and skip counts. search_plans scores them.
std::vector<ParallelPlan> enumerate_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& options,
                                          SearchResult& result);

// Throws PlanRejected when a fixed dimension is itself invalid (e.g. TP 3
// for 64 heads).
SearchResult search_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& options);

// The plan the options describe, every unset setting at its default: TP, PP,
// CP, EP 1, ETP = TP (MoE), DP the rest of the GPUs, micro-batch 1, v 1, the
// model's sequence, default_global_batch, 1F1B (interleaved with v > 1), the
// trainer's first ZeRO stage, selective recomputation where the trainer has
// it (else full), SP with TP > 1 where it has it, flash attention where both
// the GPU and the trainer have it, the trainer's accumulation fusion and
// settings, Megatron's rank order, the first/last stage layers given (else
// an even split). Not checked. The one place defaults are decided: the
// search's candidates start from it too.
ParallelPlan complete_plan(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& options);

// complete_plan with the uneven split proposed (uneven_stages), checked
// (PlanRejected): the plan of cuboid simulate.
ParallelPlan plan_from_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& options);

}  // namespace cuboid
