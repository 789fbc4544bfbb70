// cuboid validate's report: text tables and JSON.
#include <fmt/format.h>

#include "cuboid/io/planfile.hpp"
#include "cuboid/report/validate.hpp"

namespace cuboid {

namespace {

// From this many page faults per measured step (1 MiB of fresh 4 KiB pages)
// the text report says so.
constexpr std::int64_t kPageFaultNote = 256;

std::string error_cell(const ComponentRow& r) {
  return r.predicted_only ? std::string("-") : fmt::format("{:+.1f}%", 100 * r.error());
}

std::string component_line(const std::string& label, const ComponentRow& r, int width = 22) {
  return fmt::format("{:<{}} {:>13.4f} {:>12.4f} {:>9}\n", label, width, r.predicted_s, r.measured_s, error_cell(r));
}

nlohmann::json row_json(const ComponentRow& r) {
  nlohmann::json j = {{"component", r.component}, {"predicted_s", r.predicted_s}, {"measured_s", r.measured_s}};
  j["error"] = r.predicted_only ? nlohmann::json() : nlohmann::json(r.error());
  return j;
}

}  // namespace

std::string format_validation(const ValidationReport& r, bool with_ops) {
  std::string out;
  out += fmt::format("plan          {}\n", r.plan_source);
  out += fmt::format("measurements  {} (backend {}; slowest rank {}; {} of the measured steps)\n",
                     r.measurements_source, r.backend, r.measured_rank,
                     r.statistic == Statistic::min ? "fastest" : "median");
  out += fmt::format("cluster card  {} (simulated with the executor's semantics: DP reduction after the last "
                     "backward, no TP{} overlap; critical GPU rank {})\n\n",
                     r.cluster_name, r.context_parallel ? " or CP" : "", r.critical_rank);
  if (!r.card_pools_bytes.empty()) {
    std::string pools;
    for (const double b : r.card_pools_bytes) pools += fmt::format("{}{:.1f}", pools.empty() ? "" : ", ", b / (1 << 20));
    out += fmt::format("operand pool  {:.1f} MiB of the card's {} MiB: the GEMMs and kernels measured in the cache "
                       "state nearest this plan's step working set\n\n",
                       r.priced_pool_bytes / (1 << 20), pools);
  }
  if (r.ranks_per_core > 1)
    out += fmt::format("shared cores  {:g} ranks per core: the prediction charges each compute op {:g} x its "
                       "one-rank time; in the run the ranks of a core take turns at their waits, so a rank's ops "
                       "run at full speed and its partner's turn shows up as TP / PP wait. Compare stage times and "
                       "the iteration, not compute against tp_comm.\n\n",
                       r.ranks_per_core, r.ranks_per_core);
  if (r.page_faults_per_step >= kPageFaultNote)
    out += fmt::format("page faults   rank {} took {} minor page faults per measured step: first touches of host "
                       "memory that a run holding its memory does not take after the warm-up, and that the cost "
                       "model does not price (docs/calibration.md)\n\n",
                       r.page_fault_rank, r.page_faults_per_step);
  out += fmt::format("{:<22} {:>13} {:>12} {:>9}\n", "component", "predicted(s)", "measured(s)", "error");
  for (const ComponentRow& c : r.components) out += component_line(c.component, c);
  if (r.stages.size() > 1) {
    out += "\nper pipeline stage (the simulated GPU vs the stage's slowest rank; measured pp_comm includes waits):\n";
    out += fmt::format("{:<32} {:>13} {:>12} {:>9}\n", "stage (rank) component", "predicted(s)", "measured(s)", "error");
    for (const StageRow& s : r.stages)
      for (const ComponentRow& c : s.rows)
        out += component_line(fmt::format("{} (rank {}) {}", s.stage, s.measured_rank, c.component), c, 32);
  }
  if (with_ops) {
    out += "\nper op (cost model per call x calls per step vs the stage's slowest rank; PP and DP: see above):\n";
    out += fmt::format("{:>5} {:<20} {:<13} {:>6} {:>13} {:>12} {:>9}\n", "stage", "op", "kind", "calls",
                       "predicted(s)", "measured(s)", "error");
    for (const OpRow& o : r.ops)
      out += fmt::format("{:>5} {:<20} {:<13} {:>6} {:>13.5f} {:>12.5f} {:>9}\n", o.stage, o.name, o.kind,
                         o.calls_per_step, o.predicted_s, o.measured_s,
                         o.measured_s > 0 ? fmt::format("{:+.1f}%", 100 * o.error()) : std::string("-"));
  }
  out += "\n";
  if (r.interval.known)
    out += fmt::format("interval: a measurement would likely fall in {:.4f}-{:.4f} s ({}); measured {:.4f} s is {}\n",
                       r.interval.low_s, r.interval.high_s, r.interval.basis, r.measured_iteration_s,
                       r.measured_inside() ? "inside" : "outside");
  else
    out += fmt::format("interval: unknown ({})\n", r.interval.basis);
  if (r.within_tolerance())
    out += fmt::format("PASS: end-to-end error {:+.1f}% (predicted {:.4f} s, measured {:.4f} s) is within the "
                       "tolerance of {:.1f}%\n",
                       100 * r.error(), r.predicted_iteration_s, r.measured_iteration_s, 100 * r.tolerance);
  else
    out += fmt::format("FAIL: end-to-end error {:+.1f}% (predicted {:.4f} s, measured {:.4f} s) exceeds the "
                       "tolerance of {:.1f}%\n",
                       100 * r.error(), r.predicted_iteration_s, r.measured_iteration_s, 100 * r.tolerance);
  return out;
}

nlohmann::json validation_to_json(const ValidationReport& r) {
  nlohmann::json j;
  j["plan"] = r.plan_source;
  j["measurements"] = r.measurements_source;
  j["cluster"] = r.cluster_name;
  j["backend"] = r.backend;
  j["measured_rank"] = r.measured_rank;
  j["critical_rank"] = r.critical_rank;
  j["ranks_per_core"] = r.ranks_per_core;
  if (!r.card_pools_bytes.empty()) {
    j["card_operand_pools_bytes"] = r.card_pools_bytes;
    j["priced_operand_pool_bytes"] = r.priced_pool_bytes;
  }
  j["page_faults_per_step"] = r.page_faults_per_step >= 0 ? nlohmann::json(r.page_faults_per_step) : nlohmann::json();
  j["page_fault_rank"] = r.page_fault_rank >= 0 ? nlohmann::json(r.page_fault_rank) : nlohmann::json();
  j["statistic"] = std::string(to_string(r.statistic));
  j["predicted_iteration_s"] = r.predicted_iteration_s;
  j["measured_iteration_s"] = r.measured_iteration_s;
  j["error"] = r.error();
  j["tolerance"] = r.tolerance;
  j["within_tolerance"] = r.within_tolerance();
  j["prediction_interval"] = interval_to_json(r.interval);
  if (r.interval.known) j["prediction_interval"]["measured_inside"] = r.measured_inside();
  j["components"] = nlohmann::json::array();
  for (const ComponentRow& c : r.components) j["components"].push_back(row_json(c));
  j["stages"] = nlohmann::json::array();
  for (const StageRow& s : r.stages) {
    nlohmann::json rows = nlohmann::json::array();
    for (const ComponentRow& c : s.rows) rows.push_back(row_json(c));
    j["stages"].push_back({{"stage", s.stage}, {"measured_rank", s.measured_rank}, {"components", rows}});
  }
  j["ops"] = nlohmann::json::array();
  for (const OpRow& o : r.ops)
    j["ops"].push_back({{"stage", o.stage},
                        {"name", o.name},
                        {"kind", o.kind},
                        {"calls_per_step", o.calls_per_step},
                        {"predicted_s", o.predicted_s},
                        {"measured_s", o.measured_s},
                        {"error", o.measured_s > 0 ? nlohmann::json(o.error()) : nlohmann::json()}});
  return j;
}

}  // namespace cuboid
