#pragma once
// The command line's words for the planner's refusals: each setting named by
// its flag, each problem with a fix that says which flags to change. The
// core and the search describe a refusal in the plan's terms; only here do
// flags appear (a plan file names its keys instead: io/planfile).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "cuboid/core/error.hpp"
#include "cuboid/core/plan_check.hpp"
#include "cuboid/search/planner.hpp"

namespace cuboid::cli {

// "--tp", ..., "--tp/--pp/--dp" for the GPU count.
std::string_view flag_of(PlanField field);
// The fix of check_plan's refusal, in flags.
std::string flag_fix(const PlanRejection& rejection);
// The planner's refusal of its options with the flag and the fix.
InputError worded(const PlanRejected& refused);
// The search's skip counts as the lines `cuboid plan` prints ("invalid for
// --tp: ..."), in their order; for_target: --for's target.
std::map<std::string, std::int64_t> skip_reasons(const SearchResult& result, const ModelSpec& model,
                                                 const Cluster& cluster, const PlannerOptions& options,
                                                 const std::optional<std::string>& for_target);

}  // namespace cuboid::cli
