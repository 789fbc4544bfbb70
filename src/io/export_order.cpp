#include "cuboid/io/export_order.hpp"

#include <cmath>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/io/export.hpp"

namespace cuboid {

namespace {

constexpr std::string_view kOrderField = "parallel.rank_order";

}  // namespace

ExportResult export_in_expressible_order(const PlanFile& pf, std::string_view target) {
  try {
    return export_plan(pf, target);
  } catch (const InputError& refused) {
    if (refused.field() != kOrderField) throw;
    const double planned_s = pf.prediction.value("iteration_time_s", 0.0);
    for (const Estimate::OtherOrder& alt : pf.other_orders) {
      PlanFile other = pf;
      other.plan.order = alt.order;
      ExportResult result;
      try {
        result = export_plan(other, target);
      } catch (const InputError& again) {
        if (again.field() == kOrderField) continue;
        throw;
      }
      const double slower = planned_s > 0 ? alt.iteration_time_s / planned_s - 1.0 : 0.0;
      std::string note = fmt::format("rank order {} instead of the planned {}: {}", alt.order.str(),
                                     pf.plan.order.str(), refused.problem());
      note += std::abs(slower) <= kRankOrderTie
                  ? fmt::format("; the two tied (within {:g} %)", 100 * kRankOrderTie)
                  : fmt::format("; cuboid predicts {:.3f} s per iteration in this order instead of {:.3f} s ({:+.1f} %, "
                                "{})",
                                alt.iteration_time_s, planned_s, 100 * slower,
                                alt.simulated ? "simulated" : "analytical estimate");
      result.notes = note + "\n" + result.notes;
      return result;
    }
    throw;
  }
}

}  // namespace cuboid
