#pragma once
// The flags that describe a plan (shared by plan, simulate, mesh and later
// commands) and the loading of the model and cluster they name.
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/core/topology.hpp"

namespace cuboid::cli {

// Everything the plan-describing flags can say; strings are parsed after CLI11
// so that errors name the flag and list the choices.
struct PlanFlags {
  std::string model_path;
  std::string cluster_path;
  std::optional<int> nodes;
  std::optional<int> gpus_per_node;              // --gpus-per-node: G of each node's GPUs
  std::optional<std::int64_t> global_batch, seq_length;
  std::optional<int> tp, pp, dp, cp, micro_batch, vpp, zero;
  std::optional<std::string> cp_comm;            // --cp-comm-type p2p|a2a
  std::optional<int> ep, etp;                    // --ep, --etp (MoE models)
  std::optional<std::string> moe_dispatcher;     // --moe-dispatcher alltoall|allgather|flex
  std::optional<std::string> moe_ep_overlap;     // --moe-ep-overlap on|off
  std::optional<std::string> moe_delay_wgrad;    // --moe-delay-wgrad on|off
  std::optional<std::string> moe_flex_backend;   // --moe-flex-backend deepep|hybridep
  std::optional<int> moe_flex_sms;               // --moe-flex-sms N
  std::optional<double> moe_rank_capacity_factor;       // --moe-rank-capacity-factor X (HybridEP)
  std::optional<std::string> moe_paged_stash;           // --moe-paged-stash on|off
  std::optional<double> moe_paged_stash_buffer_factor;  // --moe-paged-stash-buffer-factor X
  std::optional<std::string> recompute, sequence_parallel, schedule, flash_attention, attention_kernel, rank_order;
  std::optional<std::string> recompute_modules;  // --recompute-modules core_attn,mlp,...
  std::optional<std::string> recompute_method;   // --recompute-method uniform|block
  std::optional<int> recompute_num_layers;       // --recompute-num-layers N
  std::optional<int> offload_activations;        // --offload-activations N (decoder layers)
  std::optional<std::string> offload_modules;    // --offload-modules LIST (fine-grained activation offloading)
  std::optional<std::string> grad_accum_fusion;  // on|off
  std::optional<std::string> precision;          // --precision bf16|fp8-delayed|...
  bool fp8_param_gather = false;                 // --fp8-param-gather
  bool precision_aware_optimizer = false;        // --precision-aware-optimizer
  bool fp8_attention = false;                    // --fp8-attention
  std::optional<std::string> adam_moments;       // --adam-moments fp32|bf16
  std::optional<std::string> optimizer;          // --optimizer adam|muon
  std::optional<std::string> trainer;            // --trainer preset
  std::optional<std::string> dp_overlap;         // on|off
  std::optional<std::string> grad_reduce_dtype;  // fp32|bf16
  std::optional<std::string> fsdp_grad_dtype;    // fp32|bf16
  std::optional<std::string> cuda_graphs;        // --cuda-graphs none|full_iteration|local[:attn,mlp]|...
  std::optional<std::string> tp_comm_overlap;    // on|off
  std::optional<std::string> overlap_param_gather;  // on|off
  std::optional<std::string> overlap_param_gather_with_optimizer_step;  // on|off
  std::optional<std::string> align_param_gather;                        // on|off
  std::optional<std::int64_t> ddp_bucket_size;                          // --ddp-bucket-size N (parameters)
  std::optional<int> first_stage_layers, last_stage_layers;
  bool embedding_in_split = false, loss_in_split = false;  // --account-for-{embedding,loss}-in-pipeline-split
  std::optional<std::string> pipeline_layout;             // --pipeline-model-parallel-layout
  std::optional<double> gpu_spread;      // overrides the GPU profile's speed_spread
  std::optional<double> moe_imbalance;   // --moe-imbalance: overrides the card's moe.router_load_imbalance
  bool uneven_stages = false;
  bool explain = false;
  int threads = 0;
  std::optional<std::string> plan_path;  // --plan plan.json (simulate, mesh)
  std::optional<std::string> out_path;   // --out (plan)
  std::optional<std::string> svg_path;   // --svg (plan, mesh)
  std::optional<std::string> report_path;  // --report (plan, simulate): the HTML report
  bool analytical = false;               // simulate: the analytical estimate instead of the DES
  std::vector<std::string> ablate;       // simulate --ablate MECHANISM (fidelity studies)
  std::optional<std::string> trace_path;
  std::optional<std::string> trace_ranks;
  bool trace_per_rank = false;
  int simulate_top = 32;                 // plan: re-rank the best K with the DES (0: none)
  std::optional<std::string> for_target;  // plan --for TARGET (an export target)
  int top = 10;
  bool json = false;
  bool verbose = false;
};

// search: the flags fix dimensions of a search (plan) rather than set them.
// with_plan_file: also accept --plan FILE instead of --model/--cluster and the dimensions.
void add_plan_flags(CLI::App* cmd, PlanFlags& f, bool search, bool with_plan_file = false);

// The card a plan file runs on: `nodes` of it, and `gpus_per_node` of each
// node's GPUs when given, else the plan's own where the plan used fewer than
// the card has (a plan made with --gpus-per-node).
Cluster load_cluster_for_plan(const std::string& cluster_path, int nodes, std::optional<int> gpus_per_node,
                              int plan_gpus_per_node);
bool parse_on_off(const std::string& v, const std::string& flag);
// The output paths given by flags ({"--out", &f.out_path}, ...; absent ones
// skipped), checked by cuboid/core/files.hpp's rules once the inputs are read
// and before any work: a bad path never costs a search or a simulation, never
// replaces an input, a read-only file or another output.
void check_outputs(std::initializer_list<std::pair<const char*, const std::optional<std::string>*>> flags);
// InputError for a flag given to `command` ("plan", "simulate", "mesh") that
// would have no effect there whatever its value (mesh --json: the mesh is a
// table), before any work. Settings that have no effect in a combination of
// values (the a2a exchange with CP 1) are check_plan's.
void refuse_flags_without_effect(const PlanFlags& f, std::string_view command);
// Validates the flags' values (positive sizes, known enum spellings).
PlannerOptions planner_options(const PlanFlags& f);

struct Loaded {
  ModelSpec model;
  Cluster cluster;
  std::unique_ptr<Topology> topology;
  std::optional<ParallelPlan> plan;  // from --plan
};
Loaded load(const PlanFlags& f);

// Why --for's target refused the search's candidates: the plan-file key each
// refusal names, how often, and the first refusal's words.
struct TargetRefusals {
  struct Seen {
    std::int64_t count = 0;
    std::string problem, fix;
  };
  std::string target;
  std::map<std::string, Seen> by_key;
};

// --for TARGET: search only plans that the export target can express (asking
// the exporter itself) and price them as its trainer runs them; InputError for
// an unknown target or a --trainer that contradicts it. The refusals are
// counted in the returned record while the search runs.
std::shared_ptr<const TargetRefusals> restrict_to_target(PlannerOptions& o, const Loaded& l,
                                                         const std::string& target);

// After a search with no valid plan: InputError naming the fixed flag (e.g.
// --cp 2) whose setting the target refused most often, if the target refused
// any; nothing otherwise (the command reports the search's reasons).
void refuse_fixed_flag_for_target(const PlannerOptions& o, const TargetRefusals& refusals);

}  // namespace cuboid::cli
