#pragma once
// The option checks the search's walk shares with plan_from_options (private
// to src/search).
#include <optional>

#include "cuboid/search/planner.hpp"

namespace cuboid {

// Uneven stages, and uneven stages in interleaved chunks, where the trainer
// builds them: trainer_even_stages / trainer_even_chunks, or none.
std::optional<Rejection> check_uneven_trainer(const TrainerPreset& trainer, const ParallelPlan& plan);

// Fixed dimensions checked before the walk, so that a fixed TP 3 fails with
// its reason instead of "no candidates": PlanRejected.
void check_fixed_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& options);

}  // namespace cuboid
