#pragma once
#ifndef CUBOID_LAYER_REPORT
#error "cuboid/report is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid plan --explain`: for every dimension (TP, PP, DP, micro-batch,
// virtual stages, ZeRO, recompute, SP, rank order), the best plan with that
// dimension forced to each value, so rules of thumb are checked on the
// user's own case, not assumed. TP beyond a node, which the search leaves out
// unless asked, is searched here.
#include <optional>
#include <string>
#include <vector>

#include "cuboid/core/model.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/search/planner.hpp"

namespace cuboid {

struct ExplainRow {
  std::string dimension;  // "TP", "micro-batch", "rank order", ...
  std::string value;      // "8", "full", "tp-dp-pp", ...
  std::optional<Estimate> best;  // the best plan with this value; none: `note` says why
  std::string note;
};

// Rows by dimension, values in ascending order; empty when nothing fits.
// `options` are the search's (the forced TP searches reuse them).
std::vector<ExplainRow> explain_choices(const ModelSpec& m, const Topology& topo, const PlannerOptions& options,
                                        const SearchResult& r);
// The text of `--explain`, each row against `winner`.
std::string format_explain(const std::vector<ExplainRow>& rows, const Estimate& winner);

}  // namespace cuboid
