#pragma once
#ifndef CUBOID_LAYER_REPORT
#error "cuboid/report is not below this layer in the build (docs/architecture.md)"
#endif
// Presentation: JSON documents (the contract in DESIGN.md, "Contracts other
// tools rely on") and human-readable tables for plans, estimates and meshes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/cost/estimator.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/core/topology.hpp"

namespace cuboid {

// One candidate / one simulated plan with the contract's fields.
nlohmann::json estimate_to_json(const Estimate& e);

// `cuboid plan --json`: {"model", "cluster", "gpus", "global_batch", "seq_length",
// "candidates": [... best first ...], "not_fitting": [...], "skipped": {line: count}}.
// skipped: the search's skip counts in the caller's words.
nlohmann::json search_to_json(const ModelSpec& m, const Cluster& c, const SearchResult& r,
                              const std::map<std::string, std::int64_t>& skipped, int top_k);

// The ranked table of `cuboid plan`.
// "12.31-13.40" (a prediction's interval), "?" (no validation data near), "" (none attached).
std::string format_interval(const Estimate& e);
std::string format_plan_table(const std::vector<Estimate>& rows, std::size_t top_k);
// The per-component report of `cuboid simulate`.
std::string format_estimate(const ModelSpec& m, const Cluster& c, const Estimate& e);
// The EP overlap of e's plan (plan.moe_ep_overlap) in a line: the schedule,
// and for an analytical estimate what it hid and what the compute lost.
std::string ep_overlap_words(const Estimate& e);
// `cuboid mesh`: which GPU (node, gpu) holds which TP group, stage and DP group.
std::string format_mesh(const ParallelPlan& plan, const Cluster& c);

std::string format_bytes_GiB(double bytes);

}  // namespace cuboid
