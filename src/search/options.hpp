#pragma once
// The option checks the search's walk shares with plan_from_options (private
// to src/search).
#include <optional>

#include "cuboid/search/planner.hpp"

namespace cuboid {

// Fixed dimensions checked before the walk, so that a fixed TP 3 fails with
// its reason instead of "no candidates": PlanRejected.
void check_fixed_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& options);

}  // namespace cuboid
