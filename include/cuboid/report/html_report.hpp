#pragma once
#ifndef CUBOID_LAYER_REPORT
#error "cuboid/report is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid plan --report` and `cuboid simulate --report`: one self-contained
// HTML page (inline CSS, inline SVG, a little plain JavaScript; a Content-
// Security-Policy that forbids every network request) to mail before a run.
// Sections, each an element with a fixed id (docs/report.md):
//   header     the command's header lines
//   ranked     the ranked plans, a sortable table with the prediction interval
//   pareto     step time against memory of every plan that fits (pareto_svg)
//   mesh       the chosen plan's device mesh (mesh_svg)
//   timeline   the chosen plan's simulated iteration per stage: forward and
//              backward steps, communication on their own rows, idle time
//              (the bubble) shaded
//   breakdown  the critical-path breakdown of each ranked plan as bars
//   explain    the --explain table, sortable
// A section without data (simulate has no ranking) is left out. The page is
// deterministic: the same inputs give the same bytes.
#include <span>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/report/explain.hpp"
#include "cuboid/sim/timeline.hpp"

namespace cuboid {

struct ReportPage {
  std::string title;                  // "llama3-70b on DGX A100 x4 (32 GPUs)"
  std::string command;                // "plan" or "simulate"
  std::string header;                 // the command's header lines, as printed
  std::string generator;              // "cuboid 0.9.0"
  Cluster cluster;
  Estimate chosen;                    // the plan the mesh, timeline and summary show
  std::vector<Estimate> ranked;       // best first (the table and the bars); empty: the chosen plan only
  std::span<const Estimate> fitting;  // every plan that fits (the Pareto picture); empty: none
  sim::Timeline timeline;             // the chosen plan's simulated iteration
  std::vector<ExplainRow> explain;    // empty: no --explain section
};

std::string html_report(const ReportPage& page);

}  // namespace cuboid
