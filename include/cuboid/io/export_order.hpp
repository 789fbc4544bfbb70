#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// An export in the plan's own rank order or, when the target cannot express
// that order, in the fastest other order the planner scored that it can (the
// plan file's prediction.other_rank_orders), with a note that says so and what
// the planner predicted for it.
#include <string>
#include <string_view>

#include "cuboid/io/export.hpp"
#include "cuboid/io/planfile.hpp"

namespace cuboid {

// export_plan's result; in another order, its notes begin with the line
// "rank order X instead of the planned Y: ...". The refusal of the plan's own
// order is rethrown when no other order works.
ExportResult export_in_expressible_order(const PlanFile& plan_file, std::string_view target);

}  // namespace cuboid
