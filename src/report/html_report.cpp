// `--report`: the plan report as one self-contained HTML page (html_report.hpp).
#include "cuboid/report/html_report.hpp"

#include <algorithm>

#include <string>

#include <fmt/format.h>

#include "cuboid/io/svg.hpp"
#include "cuboid/report/report.hpp"
#include "html_parts.hpp"

namespace cuboid {

namespace {

using html::escape;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A table cell; `sort` is the value the page's script sorts by (data-v).
std::string cell(const std::string& text, const std::string& sort) {
  return fmt::format("<td data-v=\"{}\">{}</td>", escape(sort), escape(text));
}
std::string cell(const std::string& text) { return cell(text, text); }
std::string number(double v, int decimals, const std::string& suffix = "") {
  return cell(fmt::format("{:.{}f}{}", v, decimals, suffix), fmt::format("{:.9g}", v));
}

// Column headings: data-type tells the script how to sort.
std::string heading(const char* label, bool numeric, const std::string& tip = "") {
  return fmt::format("<th data-type=\"{}\"{}>{}</th>", numeric ? "num" : "text",
                     tip.empty() ? "" : " title=\"" + escape(tip) + "\"", escape(label));
}

std::string section(const char* id, const char* heading, const std::string& caption, const std::string& body) {
  return fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n{}{}</section>\n", id, heading,
                     caption.empty() ? "" : "<p class=\"caption\">" + caption + "</p>\n", body);
}

std::string ranked_table(const ReportPage& page) {
  const std::string basis = !page.ranked.empty() && page.ranked.front().interval ? page.ranked.front().interval->basis : "";
  std::string out = "<table class=\"sortable\" id=\"ranked-table\">\n<thead><tr>";
  // EP and ETP for a mixture-of-experts model's plans (they name their ETP).
  bool experts = false;
  for (const Estimate& e : page.ranked) experts = experts || e.plan.etp > 0;
  out += heading("#", true) + heading("TP", true) + heading("CP", true) +
         (experts ? heading("EP", true) + heading("ETP", true) : std::string()) + heading("PP", true) + heading("DP", true) + heading("mb", true) +
         heading("v", true) + heading("ZeRO", true) + heading("recompute", false) + heading("SP", false) +
         heading("order", false) + heading("step (s)", true) +
         heading("likely (s)", true, "where a measured step would likely fall: " + basis) + heading("score", false) +
         heading("tokens/s", true) + heading("TFLOP/s", true) + heading("MFU", true) + heading("mem/GPU", true) +
         heading("headroom", true);
  out += "</tr></thead>\n<tbody>\n";
  for (std::size_t i = 0; i < page.ranked.size(); ++i) {
    const Estimate& e = page.ranked[i];
    const ParallelPlan& p = e.plan;
    const std::string likely = format_interval(e);
    const double likely_low = e.interval && e.interval->known ? e.interval->low_s : e.iteration_time_s;
    out += fmt::format("<tr data-row=\"{}\">", i + 1);
    out += cell(std::to_string(i + 1)) + cell(std::to_string(p.tp)) + cell(std::to_string(p.cp)) +
           (experts ? cell(std::to_string(p.ep)) + cell(std::to_string(p.expert_tp())) : std::string()) +
           cell(std::to_string(p.pp)) +
           cell(std::to_string(p.dp)) + cell(std::to_string(p.micro_batch)) + cell(std::to_string(p.virtual_stages)) +
           cell(std::to_string(p.zero_stage)) + cell(std::string(to_string(p.recompute))) + cell(p.sequence_parallel ? "on" : "off") +
           cell(p.order.str() + (e.tied_orders.empty() ? "" : "*")) + number(e.iteration_time_s, 3) + cell(likely, fmt::format("{:.9g}", likely_low)) +
           cell(e.simulated ? "sim" : "est") + number(e.tokens_per_s, 0) + number(e.model_tflops_per_gpu, 1) +
           number(100 * e.mfu, 1, "%") + number(e.memory.total_bytes / kGiB, 1, " GiB") +
           number(e.memory.headroom_bytes() / kGiB, 1, " GiB");
    out += "</tr>\n";
  }
  out += "</tbody>\n</table>\n";
  std::vector<std::string> tied;  // other rank orders folded into the rows shown
  for (const Estimate& e : page.ranked)
    for (const RankOrder& o : e.tied_orders)
      if (std::find(tied.begin(), tied.end(), o.str()) == tied.end()) tied.push_back(o.str());
  if (!tied.empty())
    out += fmt::format("<p class=\"note\">* the same plan in rank order {} scores within {:g} % (one row; the "
                       "trainers' tp-dp-pp where it ties)</p>\n",
                       escape(fmt::format("{}", fmt::join(tied, " or "))), 100 * kRankOrderTie);
  if (!basis.empty()) out += "<p class=\"note\">likely (s): where a measured step would likely fall: " + escape(basis) + "</p>\n";
  return out;
}

std::string explain_table(const ReportPage& page) {
  std::string out = "<table class=\"sortable\" id=\"explain-table\">\n<thead><tr>";
  out += heading("dimension", false) + heading("value", false) + heading("step (s)", true) + heading("score", false) +
         heading("vs the winner", true) + heading("best plan with this value", false) + heading("mem/GPU", true);
  out += "</tr></thead>\n<tbody>\n";
  for (const ExplainRow& row : page.explain) {
    out += "<tr>" + cell(row.dimension) + cell(row.value);
    if (!row.best) {
      out += "<td colspan=\"5\" class=\"note\">" + escape(row.note) + "</td></tr>\n";
      continue;
    }
    const Estimate& e = *row.best;
    const ParallelPlan& p = e.plan;
    out += number(e.iteration_time_s, 3) + cell(e.simulated ? "sim" : "est") +
           number(100.0 * (e.iteration_time_s / page.chosen.iteration_time_s - 1.0), 1, "%") +
           cell(fmt::format("TP {} CP {}{} PP {} DP {} mb {} v {} ZeRO {} {} SP {} {}", p.tp, p.cp,
                            p.etp > 0 ? fmt::format(" EP {} ETP {}", p.ep, p.expert_tp()) : std::string(), p.pp, p.dp,
                            p.micro_batch, p.virtual_stages, p.zero_stage, to_string(p.recompute), p.sequence_parallel ? "on" : "off",
                            p.order.str())) +
           number(e.memory.total_bytes / kGiB, 1, " GiB") + "</tr>\n";
  }
  out += "</tbody>\n</table>\n<p class=\"note\">Values not listed have no plan that fits.</p>\n";
  return out;
}

std::string timeline_caption(const ReportPage& page) {
  const double simulated_s = static_cast<double>(page.timeline.end_ns) * 1e-9;
  std::string out = fmt::format(
      "The chosen plan's iteration as the discrete-event simulator plays it: one group of rows per pipeline stage "
      "(the GPU simulated for it), its forward and backward steps on the compute row and its communication on the "
      "rows below. Shaded: the compute stream idle, the bubble. <code>cuboid simulate --trace</code> of this plan "
      "writes the same blocks with every kernel inside them. Simulated iteration: {}",
      html::format_seconds(simulated_s));
  if (!page.chosen.simulated)
    out += fmt::format(" (the table's analytical estimate: {})", html::format_seconds(page.chosen.iteration_time_s));
  return out + ".";
}

std::string navigation(const ReportPage& page) {
  std::string out = "<nav>";
  auto link = [&](const char* id, const char* label) { out += fmt::format("<a href=\"#{}\">{}</a> ", id, label); };
  link("header", "setup");
  if (!page.ranked.empty()) link("ranked", "ranked plans");
  if (!page.fitting.empty()) link("pareto", "time vs memory");
  link("mesh", "device mesh");
  link("timeline", "timeline");
  link("breakdown", "breakdown");
  if (!page.explain.empty()) link("explain", "what each choice costs");
  return out + "</nav>\n";
}

}  // namespace

std::string html_report(const ReportPage& page) {
  const ParallelPlan& p = page.chosen.plan;
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // Self-contained: the page may load nothing, from anywhere.
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
         "script-src 'unsafe-inline'; img-src data:\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += fmt::format("<title>cuboid {}: {}</title>\n", escape(page.command), escape(page.title));
  out += fmt::format("<style>\n{}</style>\n<script>\n{}</script>\n</head>\n", html::kStyle, html::kErrorHook);
  out += fmt::format("<body data-command=\"{}\">\n", escape(page.command));
  out += "<div id=\"report-status\" data-state=\"loading\" hidden></div>\n"
         "<ul id=\"report-errors\" hidden></ul>\n";
  out += fmt::format("<h1>{}</h1>\n<p class=\"subtitle\">TP {}{}{} &times; PP {} &times; DP {}, micro-batch {}, ZeRO {}, recompute "
                     "{}, SP {}, rank order {}: {} per iteration ({}), MFU {:.1f}%</p>\n",
                     escape(page.title), p.tp, p.cp > 1 ? fmt::format(" &times; CP {}", p.cp) : std::string(),
                     p.etp > 0 ? fmt::format(" (experts EP {} &times; ETP {})", p.ep, p.expert_tp()) : std::string(), p.pp, p.dp, p.micro_batch, p.zero_stage, to_string(p.recompute),
                     p.sequence_parallel ? "on" : "off", escape(p.order.str()),
                     html::format_seconds(page.chosen.iteration_time_s), page.chosen.simulated ? "simulated" : "estimated",
                     100 * page.chosen.mfu);
  out += navigation(page);
  out += section("header", "Setup", "", "<pre>" + escape(page.header) + "</pre>\n");
  if (!page.ranked.empty())
    out += section("ranked", "Ranked plans",
                   "Fastest first; <em>sim</em> rows are scored by the discrete-event simulator, <em>est</em> rows "
                   "analytically. Click a heading to sort.",
                   ranked_table(page));
  // The two pictures side by side where the window is wide enough.
  out += "<div class=\"pair\">\n";
  if (!page.fitting.empty()) {
    const std::string title = fmt::format("step time vs memory of {} plans that fit (rank-order ties as one)", page.fitting.size());
    out += section("pareto", "Step time against memory",
                   "Every plan that fits; the line is the Pareto front (the least step time for each memory "
                   "budget), the chosen plan is marked.",
                   "<div class=\"figure\">" + html::inline_svg(pareto_svg({page.fitting.begin(), page.fitting.end()},
                                                                           page.chosen, title)) +
                       "</div>\n");
  }
  const std::string mesh_title = fmt::format("TP {}{} x PP {} x DP {}, rank order {}", p.tp,
                                             p.cp > 1 ? fmt::format(" x CP {}", p.cp) : std::string(), p.pp, p.dp,
                                             p.order.str());
  out += section("mesh", "Device mesh",
                 "Which GPU holds which pipeline stage (p), DP replica (d) and TP rank (t); TP groups outlined.",
                 "<div class=\"figure\">" + html::inline_svg(mesh_svg(p, page.cluster, mesh_title)) + "</div>\n");
  out += "</div>\n";
  out += section("timeline", "Timeline of one iteration", timeline_caption(page),
                 "<div class=\"figure\">" + html::timeline_svg(page.timeline) + "</div>\n");
  const std::span<const Estimate> bars =
      page.ranked.empty() ? std::span<const Estimate>(&page.chosen, 1) : std::span<const Estimate>(page.ranked);
  out += section("breakdown", "Where the time goes",
                 "The critical path of each plan's iteration: compute, the communication no compute hides, the "
                 "optimizer step and the bubble, on one time scale.",
                 "<div class=\"figure\">" + html::breakdown_svg(bars) + "</div>\n");
  if (!page.explain.empty())
    out += section("explain", "What each choice costs",
                   "For every dimension, the best plan with that dimension forced to each value, against the "
                   "winner. Click a heading to sort.",
                   explain_table(page));
  out += fmt::format("<footer>Written by {}. Self-contained: no network, no external files.</footer>\n",
                     escape(page.generator));
  out += fmt::format("<script>\n{}</script>\n</body>\n</html>\n", html::kScript);
  return out;
}

}  // namespace cuboid
