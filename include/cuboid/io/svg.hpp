#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// Pictures as plain SVG text, written by cuboid itself (no plotting
// dependency): the device mesh of one plan (`cuboid mesh --svg`) and the step
// time vs peak memory scatter of a search (`cuboid plan --svg`). Output is
// deterministic (same input, same bytes) and bounded in size.
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

// Text for XML and HTML (text and attribute values): the five specials
// escaped, control characters (not allowed in XML 1.0) dropped.
std::string xml_escape(std::string_view s);

// One row per node used, one cell per GPU, filled by pipeline stage and
// labelled "p{stage} d{DP replica} t{TP rank}"; each TP group outlined (dashed
// per-row segments plus a red warning when a group crosses nodes); DP replicas
// hatched by replica index. Meshes over 64 nodes show the first 32.
std::string mesh_svg(const ParallelPlan& plan, const Cluster& cluster, const std::string& title);

// Step time (x, seconds) vs peak memory per GPU (y, GiB) of every feasible
// candidate, the Pareto front (least time for the memory) as a step line, the
// chosen plan marked and labelled, and the GPU capacity
// (chosen.memory.capacity_bytes) as a dashed line. Over 20000 distinct points
// are thinned deterministically, keeping the front and the chosen plan.
std::string pareto_svg(const std::vector<Estimate>& feasible, const Estimate& chosen, const std::string& title);

}  // namespace cuboid
