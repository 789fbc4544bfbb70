// The report's breakdown bars: where each ranked plan's iteration goes.
#include <algorithm>
#include <array>
#include <string>

#include <fmt/format.h>

#include "html_parts.hpp"

namespace cuboid::html {

namespace {

constexpr double kWidth = 1200, kLeft = 400, kRight = 110, kPlot = kWidth - kLeft - kRight;
constexpr double kTop = 34, kBar = 16, kPitch = 24, kBottom = 8;

struct Part {
  const char* key;  // data-part
  const char* label;
  const char* fill;  // as the timeline's rows (html_timeline.cpp)
  double Breakdown::*seconds;
};
constexpr std::array<Part, 9> kParts{{
    {"compute", "compute", "#0072B2", &Breakdown::compute_s},
    {"tp", "exposed TP comm", "#CC79A7", &Breakdown::tp_comm_s},
    {"cp", "exposed CP comm", "#E69F00", &Breakdown::cp_comm_s},
    {"ep", "EP all-to-all", "#F0E442", &Breakdown::ep_comm_s},
    {"pp", "PP comm", "#56B4E9", &Breakdown::pp_comm_s},
    {"dp", "DP comm", "#D55E00", &Breakdown::dp_comm_s},
    {"offload", "host copy wait", "#999933", &Breakdown::offload_s},
    {"optimizer", "optimizer", "#009E73", &Breakdown::optimizer_s},
    {"bubble", "bubble", "#F6D5D5", &Breakdown::bubble_s},
}};

std::string plan_label(const ParallelPlan& p) {
  return fmt::format("TP {}{}{} PP {} DP {} mb {} v {} ZeRO {} {} SP {} {}", p.tp,
                     p.cp > 1 ? fmt::format(" CP {}", p.cp) : std::string(),
                     p.etp > 0 ? fmt::format(" EP {} ETP {}", p.ep, p.expert_tp()) : std::string(), p.pp, p.dp, p.micro_batch,
                     p.virtual_stages, p.zero_stage, to_string(p.recompute), p.sequence_parallel ? "on" : "off",
                     p.order.str());
}

}  // namespace

std::string breakdown_svg(std::span<const Estimate> rows) {
  double longest = 0;
  for (const Estimate& e : rows) longest = std::max(longest, e.breakdown.total());
  if (rows.empty() || longest <= 0) return "<p class=\"note\">No breakdown.</p>\n";
  const double height = kTop + kPitch * static_cast<double>(rows.size()) + kBottom;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"breakdown-svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-size=\"12\">\n",
      kWidth, height);
  double lx = kLeft;
  // CP's entry only where a plan has context parallelism.
  // EP's only where one has expert parallelism.
  // Offloading's only where a plan offloads activations.
  bool any_cp = false, any_ep = false, any_offload = false;
  for (const Estimate& e : rows) {
    any_cp = any_cp || e.plan.cp > 1;
    any_ep = any_ep || e.plan.ep > 1;
    any_offload = any_offload || e.plan.offloads_activations();
  }
  for (const Part& p : kParts) {
    if (p.seconds == &Breakdown::cp_comm_s && !any_cp) continue;
    if (p.seconds == &Breakdown::ep_comm_s && !any_ep) continue;
    if (p.seconds == &Breakdown::offload_s && !any_offload) continue;
    out += fmt::format("<rect x=\"{:.0f}\" y=\"10\" width=\"14\" height=\"12\" fill=\"{}\" stroke=\"#444\" stroke-width=\"0.5\"/>"
                       "<text x=\"{:.0f}\" y=\"20\">{}</text>\n",
                       lx, p.fill, lx + 19, p.label);
    lx += 19 + 7.2 * static_cast<double>(std::string_view(p.label).size()) + 18;
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Estimate& e = rows[i];
    const double total = e.breakdown.total();
    const double y = kTop + kPitch * static_cast<double>(i);
    out += fmt::format("<g class=\"bd-plan\" data-row=\"{}\" data-total-s=\"{:.6f}\">\n", i + 1, total);
    out += fmt::format("<text x=\"8\" y=\"{:.1f}\" font-size=\"11\">#{} {}</text>\n", y + 12, i + 1, escape(plan_label(e.plan)));
    double x = kLeft;
    for (const Part& p : kParts) {
      const double s = e.breakdown.*p.seconds;
      if (s <= 0) continue;
      const double w = kPlot * s / longest;
      out += fmt::format("<rect class=\"bd-seg\" data-part=\"{}\" data-s=\"{:.6f}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
                         "height=\"{:.0f}\" fill=\"{}\"><title>{}: {} ({:.1f}%)</title></rect>\n",
                         p.key, s, x, y, w, kBar, p.fill, p.label, format_seconds(s), total > 0 ? 100 * s / total : 0.0);
      x += w;
    }
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{} {}</text>\n</g>\n", x + 6, y + 12, format_seconds(total),
                       e.simulated ? "sim" : "est");
  }
  out += "</svg>\n";
  return out;
}

}  // namespace cuboid::html
