// `cuboid plan --explain`: the best plan with one dimension forced.
#include "cuboid/report/explain.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <utility>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/report/report.hpp"

namespace cuboid {

namespace {

struct Dimension {
  const char* name;
  std::function<std::string(const ParallelPlan&)> value;
};

const std::vector<Dimension>& dimensions() {
  static const std::vector<Dimension> dims = {
      {"TP", [](const ParallelPlan& p) { return std::to_string(p.tp); }},
      {"CP", [](const ParallelPlan& p) { return std::to_string(p.cp); }},
      {"EP", [](const ParallelPlan& p) { return std::to_string(p.ep); }},
      {"ETP", [](const ParallelPlan& p) { return std::to_string(p.expert_tp()); }},
      {"dispatcher", [](const ParallelPlan& p) { return std::string(to_string(p.moe_dispatcher)); }},
      {"EP overlap", [](const ParallelPlan& p) { return std::string(p.moe_ep_overlap ? "on" : "off"); }},
      {"PP", [](const ParallelPlan& p) { return std::to_string(p.pp); }},
      {"DP", [](const ParallelPlan& p) { return std::to_string(p.dp); }},
      {"micro-batch", [](const ParallelPlan& p) { return std::to_string(p.micro_batch); }},
      {"virtual stages", [](const ParallelPlan& p) { return std::to_string(p.virtual_stages); }},
      {"ZeRO", [](const ParallelPlan& p) { return std::to_string(p.zero_stage); }},
      {"recompute", [](const ParallelPlan& p) { return std::string(to_string(p.recompute)); }},
      {"sequence parallel", [](const ParallelPlan& p) { return std::string(p.sequence_parallel ? "on" : "off"); }},
      {"rank order", [](const ParallelPlan& p) { return p.order.str(); }},
  };
  return dims;
}

// Numbers by value, words alphabetically.
bool value_less(const std::string& a, const std::string& b) {
  const bool an = !a.empty() && std::isdigit(static_cast<unsigned char>(a[0]));
  const bool bn = !b.empty() && std::isdigit(static_cast<unsigned char>(b[0]));
  if (an && bn) return std::stoi(a) < std::stoi(b);
  return a < b;
}

// One row of the explanation: the best plan the search finds with `forced`
// (a dimension or setting fixed to the row's value), or why there is none.
ExplainRow searched_row(std::string dimension, std::string value, const ModelSpec& m, const Topology& topo,
                        PlannerOptions forced) {
  forced.progress = {};
  ExplainRow row{std::move(dimension), std::move(value), std::nullopt, ""};
  try {
    SearchResult rt = search_plans(m, topo, forced);
    if (rt.fitting.empty())
      row.note = "no plan fits";
    else
      row.best = rt.fitting.front();
  } catch (const InputError& e) {
    row.note = e.problem();
  }
  return row;
}

// TP beyond a node is not searched by default: price it here so the "TP
// inside a node" rule is checked, not assumed.
void add_tp_beyond_a_node(std::vector<ExplainRow>& rows, const ModelSpec& m, const Topology& topo,
                          const PlannerOptions& options) {
  const Cluster& c = topo.cluster();
  for (int tp = c.gpus_per_node * 2; tp <= c.total_gpus() && tp <= 64; tp *= 2) {
    if (m.num_attention_heads % tp != 0 || m.num_kv_heads % tp != 0) continue;
    PlannerOptions forced = options;
    forced.tp = tp;
    rows.push_back(searched_row("TP", std::to_string(tp), m, topo, std::move(forced)));
  }
}

// The search keeps the trainer's EP overlap setting: the best plan with the
// other one (on: EP > 1 with alltoall or flex, PP 1, Megatron-Core's and
// cuboid's conditions, check_plan).
void add_other_ep_overlap(std::vector<ExplainRow>& rows, const ModelSpec& m, const Topology& topo,
                          const PlannerOptions& options, const SearchResult& r) {
  const bool on = !r.fitting.front().plan.moe_ep_overlap;
  PlannerOptions forced = options;
  forced.moe_ep_overlap = on;
  rows.push_back(searched_row("EP overlap", on ? "on" : "off", m, topo, std::move(forced)));
}

}  // namespace

std::vector<ExplainRow> explain_choices(const ModelSpec& m, const Topology& topo, const PlannerOptions& options,
                                        const SearchResult& r) {
  std::vector<ExplainRow> rows;
  if (r.fitting.empty()) return rows;
  const bool experts = r.fitting.front().plan.etp > 0;  // a mixture-of-experts model's plans
  for (const Dimension& d : dimensions()) {
    const std::string name = d.name;
    if (!experts && (name == "EP" || name == "ETP" || name == "dispatcher" || name == "EP overlap")) continue;
    std::vector<std::pair<std::string, const Estimate*>> seen;  // the first (best) plan of each value
    const bool orders = std::string(d.name) == "rank order";
    for (const Estimate& e : r.fitting) {
      std::vector<std::string> values{d.value(e.plan)};
      if (orders)  // a row folds the orders that tied with it
        for (const RankOrder& o : e.tied_orders) values.push_back(o.str());
      for (const std::string& v : values) {
        const bool known = std::any_of(seen.begin(), seen.end(), [&](const auto& s) { return s.first == v; });
        if (!known) seen.emplace_back(v, &e);
      }
    }
    std::sort(seen.begin(), seen.end(), [](const auto& a, const auto& b) { return value_less(a.first, b.first); });
    for (const auto& [v, e] : seen) {
      ExplainRow row{d.name, v, *e, ""};
      if (orders) row.best->plan.order = RankOrder::parse(v, "explain", "rank order");  // a tie, in its own order
      rows.push_back(std::move(row));
    }
    if (std::string(d.name) == "TP" && !options.tp) add_tp_beyond_a_node(rows, m, topo, options);
    if (name == "EP overlap" && !options.moe_ep_overlap) add_other_ep_overlap(rows, m, topo, options, r);
  }
  return rows;
}

std::string format_explain(const std::vector<ExplainRow>& rows, const Estimate& winner) {
  std::string out =
      "\nWhat each choice costs (best plan with one dimension forced; vs the winner; sim = simulated, est = analytical):\n";
  for (const ExplainRow& row : rows) {
    if (!row.best) {
      out += fmt::format("  {:<18} {:<9} {}\n", row.dimension, row.value, row.note);
      continue;
    }
    const Estimate& e = *row.best;
    const double slower = 100.0 * (e.iteration_time_s / winner.iteration_time_s - 1.0);
    out += fmt::format("  {:<18} {:<9} {:>9.3f} s {} {:>+7.1f}%   TP {} CP {}{} PP {} DP {} mb {} v {} ZeRO {} {} SP {} {}, {}\n",
                       row.dimension, row.value, e.iteration_time_s, e.simulated ? "sim" : "est", slower, e.plan.tp,
                       e.plan.cp,
                       e.plan.etp > 0 ? fmt::format(" EP {} ETP {}{}{}", e.plan.ep, e.plan.expert_tp(),
                                                    e.plan.ep > 1 ? " " + std::string(to_string(e.plan.moe_dispatcher))
                                                                  : std::string(),
                                                    e.plan.moe_ep_overlap ? " overlap" : "")
                                      : std::string(),
                       e.plan.pp, e.plan.dp, e.plan.micro_batch, e.plan.virtual_stages, e.plan.zero_stage,
                       to_string(e.plan.recompute), e.plan.sequence_parallel ? "on" : "off", e.plan.order.str(),
                       format_bytes_GiB(e.memory.total_bytes));
  }
  out += "  (values not listed have no plan that fits)\n";
  return out;
}

}  // namespace cuboid
