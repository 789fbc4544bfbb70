#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// The plan file (schema "cuboid.plan/1"): the chosen plan as a documented,
// versioned JSON document that `cuboid simulate --plan`, `cuboid export` and
// the executor read back. The JSON Schema is schemas/cuboid.plan.1.schema.json.
//
//   {"schema": "cuboid.plan/1", "generator": "cuboid 0.1.0",
//    "model": {... the model card, inline ...},
//    "cluster": {"name", "source_file", "nodes", "gpus_per_node", "gpus_per_host" (optional), "gpu"},
//    "parallel": {"tp", "pp", "dp", "cp", "micro_batch", "global_batch", "seq_length",
//                 "num_micro_batches", "virtual_stages", "first_stage_layers",
//                 "last_stage_layers", "zero_stage", "recompute", "sequence_parallel",
//                 "schedule", "flash_attention", "rank_order", "world_size"},
//    "rank_mapping": [{"rank", "node", "gpu", "tp", "pp", "dp"}, ...],
//    "prediction": {"score", "iteration_time_s", "tokens_per_s", "model_tflops_per_gpu",
//                   "hardware_tflops_per_gpu", "mfu", "hfu", "memory": {...}, "breakdown": {...}}}
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

inline constexpr const char* kPlanSchema = "cuboid.plan/1";

nlohmann::json plan_to_json(const ModelSpec& model, const Cluster& cluster, const Estimate& estimate);
// The pieces of a plan file that other JSON outputs share: the trainer's
// ZeRO-3 settings and a prediction's interval.
nlohmann::json zero3_to_json(const TrainerSettings& trainer);
nlohmann::json interval_to_json(const PredictionInterval& interval);

struct PlanFile {
  std::string source;             // the file it was read from (error messages)
  ModelSpec model;
  std::string cluster_name;
  std::string cluster_source_file;
  std::string gpu_name;
  int nodes = 0;
  int gpus_per_node = 0;
  // "cluster.gpus_per_host": the GPUs of one host where a node has several
  // (Cluster::gpus_per_host; absent, 0: the node is one host).
  int gpus_per_host = 0;
  ParallelPlan plan;
  int host_gpus() const { return gpus_per_host > 0 ? gpus_per_host : gpus_per_node; }
  int hosts() const { return (nodes * gpus_per_node + host_gpus() - 1) / host_gpus(); }
  nlohmann::json prediction;      // the "prediction" object as written
  // The same plan in other rank orders as the planner scored them, fastest
  // first ("prediction.other_rank_orders"; empty when absent).
  std::vector<Estimate::OtherOrder> other_orders;
};

// Reads a plan file strictly: unknown fields, wrong types, another schema
// version, a rank mapping that disagrees with the parallel settings or a plan
// that is invalid for its own inline model all throw InputError naming the
// file, the field and the fix.
PlanFile read_plan_file(const std::filesystem::path& path);
PlanFile plan_file_from_json(const nlohmann::json& j, const std::string& source);

// InputError when the plan was made for another cluster shape (nodes, GPUs per
// node, world size) or GPU type than `cluster`.
void check_plan_matches_cluster(const PlanFile& plan_file, const Cluster& cluster);

}  // namespace cuboid
