// The report's timeline: the chosen plan's simulated iteration per stage.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "html_parts.hpp"

namespace cuboid::html {

namespace {

using sim::Timeline;
using sim::TimelineBlock;
using sim::TimelineRow;

constexpr double kWidth = 1200, kLeft = 150, kRight = 24, kPlot = kWidth - kLeft - kRight;
constexpr double kTop = 34, kComputeHeight = 20, kCommHeight = 9, kRowGap = 2, kStageGap = 12, kAxisHeight = 34;

// data-row values, by TimelineRow.
constexpr std::array<const char*, sim::kTimelineRows> kRowKeys{"compute", "tp", "pp-forward", "pp-backward", "dp",
                                                               "host-copy", "ep-a2a"};

struct Style {
  const char* css;  // class, for the page's script and tests
  const char* fill;
  const char* legend;
};
// Okabe & Ito's colour-blind-safe palette, as in the SVG pictures (io/svg).
constexpr Style kForward{"tl-forward", "#0072B2", "forward"};
constexpr Style kBackward{"tl-backward", "#E69F00", "backward"};
constexpr Style kOptimizer{"tl-optimizer", "#009E73", "optimizer"};
constexpr Style kOther{"tl-other", "#888888", "other compute"};
constexpr Style kTp{"tl-tp", "#CC79A7", "TP comm"};
constexpr Style kPp{"tl-pp", "#56B4E9", "PP send/recv"};
constexpr Style kDp{"tl-dp", "#D55E00", "DP comm"};
constexpr Style kHostCopy{"tl-host-copy", "#999933", "host copies"};
constexpr Style kEpA2a{"tl-ep-a2a", "#F0E442", "EP a2a (overlap)"};
constexpr const char* kIdleFill = "#F6D5D5";  // the compute row behind the blocks: what shows is the bubble

const Style& style_of(const TimelineBlock& b) {
  switch (b.row) {
    case TimelineRow::compute:
      if (b.category == "forward") return kForward;
      if (b.category == "backward") return kBackward;
      if (b.category == "optimizer") return kOptimizer;
      return kOther;
    case TimelineRow::tp: return kTp;
    case TimelineRow::pp_forward:
    case TimelineRow::pp_backward: return kPp;
    case TimelineRow::dp: return kDp;
    case TimelineRow::host_copy: return kHostCopy;
    case TimelineRow::ep_a2a: return kEpA2a;
  }
  return kOther;
}

// Blocks of one row closer than a pixel drawn as one (a 70B model's
// iteration has ~10^5 TP collectives per stage); data-count says how many.
struct Drawn {
  const TimelineBlock* first = nullptr;
  std::int64_t start_ns = 0, end_ns = 0;
  int count = 0;
};

std::vector<Drawn> merge_row(const std::vector<const TimelineBlock*>& row, double ns_per_px, bool merge) {
  std::vector<Drawn> out;
  for (const TimelineBlock* b : row) {
    if (merge && !out.empty() && static_cast<double>(b->start_ns - out.back().end_ns) < ns_per_px) {
      out.back().end_ns = std::max(out.back().end_ns, b->end_ns);
      ++out.back().count;
      continue;
    }
    out.push_back(Drawn{b, b->start_ns, b->end_ns, 1});
  }
  return out;
}

// Ticks at 1, 2 or 5 x 10^k seconds, about 10 of them.
double tick_step(double range_s) {
  const double raw = range_s / 10;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

// "0", "50 s", "2.5 ms": the tick step decides the unit and the decimals.
std::string tick_label(double t, double step_s) {
  if (t == 0) return "0";
  const double scale = step_s >= 1 ? 1 : step_s >= 1e-3 ? 1e-3 : 1e-6;
  const char* unit = step_s >= 1 ? "s" : step_s >= 1e-3 ? "ms" : "us";
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step_s / scale) + 1e-9)));
  return fmt::format("{:.{}f} {}", t / scale, decimals, unit);
}

std::string legend(bool host_copies, bool ep_a2a) {
  std::string out;
  double x = kLeft;
  auto item = [&](const char* fill, const char* label) {
    out += fmt::format("<rect x=\"{:.0f}\" y=\"10\" width=\"14\" height=\"12\" fill=\"{}\" stroke=\"#444\" stroke-width=\"0.5\"/>"
                       "<text x=\"{:.0f}\" y=\"20\">{}</text>\n",
                       x, fill, x + 19, label);
    x += 19 + 7.2 * static_cast<double>(std::string_view(label).size()) + 18;
  };
  for (const Style* s : {&kForward, &kBackward, &kOptimizer, &kTp, &kPp, &kDp}) item(s->fill, s->legend);
  if (host_copies) item(kHostCopy.fill, kHostCopy.legend);
  if (ep_a2a) item(kEpA2a.fill, kEpA2a.legend);
  item(kIdleFill, "idle (bubble)");
  return out;
}

}  // namespace

std::string timeline_svg(const Timeline& tl) {
  const std::size_t stages = tl.stage_ranks.size();
  if (stages == 0 || tl.end_ns <= 0) return "<p class=\"note\">No simulated timeline.</p>\n";
  // Rows any stage uses, so every stage has the same rows.
  std::array<bool, sim::kTimelineRows> used{};
  used[0] = true;
  std::vector<std::array<std::vector<const TimelineBlock*>, sim::kTimelineRows>> rows(stages);
  for (const TimelineBlock& b : tl.blocks) {
    const auto r = static_cast<std::size_t>(b.row);
    used[r] = true;
    rows[static_cast<std::size_t>(b.stage)][r].push_back(&b);
  }
  double stage_height = kComputeHeight;
  for (std::size_t r = 1; r < used.size(); ++r) stage_height += used[r] ? kCommHeight + kRowGap : 0;
  const double height = kTop + static_cast<double>(stages) * (stage_height + kStageGap) + kAxisHeight;
  const double end = static_cast<double>(tl.end_ns);
  const double ns_per_px = end / kPlot;
  auto x_of = [&](std::int64_t ns) { return kLeft + kPlot * static_cast<double>(ns) / end; };

  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"timeline-svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-size=\"12\" data-end-ns=\"{2}\" data-stages=\"{3}\">\n",
      kWidth, height, tl.end_ns, stages);
  out += legend(used[static_cast<std::size_t>(TimelineRow::host_copy)], used[static_cast<std::size_t>(TimelineRow::ep_a2a)]);
  double y = kTop;
  for (std::size_t s = 0; s < stages; ++s) {
    out += fmt::format("<g class=\"tl-stage\" data-stage=\"{}\" data-rank=\"{}\">\n", s, tl.stage_ranks[s]);
    out += fmt::format("<text x=\"8\" y=\"{:.1f}\" font-weight=\"bold\">stage {}</text>"
                       "<text x=\"66\" y=\"{:.1f}\" fill=\"#555\">rank {}</text>\n",
                       y + 14, s, y + 14, tl.stage_ranks[s]);
    out += fmt::format("<rect class=\"tl-idle\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\"/>\n",
                       kLeft, y, kPlot, kComputeHeight, kIdleFill);
    double row_y = y;
    for (std::size_t r = 0; r < sim::kTimelineRows; ++r) {
      if (!used[r]) continue;
      const double h = r == 0 ? kComputeHeight : kCommHeight;
      if (r > 0)
        out += fmt::format("<text x=\"20\" y=\"{:.1f}\" font-size=\"9\" fill=\"#555\">{}</text>"
                           "<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#DDD\"/>\n",
                           row_y + 8, sim::kTimelineRowNames[r], kLeft, kLeft + kPlot, row_y + h / 2, row_y + h / 2);
      // Compute blocks are the schedule's steps: each drawn, never merged.
      for (const Drawn& d : merge_row(rows[s][r], ns_per_px, r != 0)) {
        const Style& st = style_of(*d.first);
        const double x = x_of(d.start_ns);
        const double w = std::max(x_of(d.end_ns) - x, 0.4);
        const std::string what = d.count == 1 ? escape(d.first->name)
                                              : fmt::format("{} blocks from {}", d.count, escape(d.first->name));
        out += fmt::format(
            "<rect class=\"tl-block {}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\"{} "
            "data-stage=\"{}\" data-row=\"{}\" data-name=\"{}\" data-category=\"{}\" data-start-ns=\"{}\" "
            "data-end-ns=\"{}\" data-count=\"{}\"><title>stage {} {}: {}, {} to {}</title></rect>\n",
            st.css, x, row_y, w, h, st.fill, r == 0 ? " stroke=\"#FFFFFF\" stroke-width=\"0.6\"" : "", s, kRowKeys[r], escape(d.first->name), escape(d.first->category),
            d.start_ns, d.end_ns, d.count, s, sim::kTimelineRowNames[r], what,
            format_seconds(static_cast<double>(d.start_ns) * 1e-9), format_seconds(static_cast<double>(d.end_ns) * 1e-9));
      }
      row_y += h + kRowGap;
    }
    out += "</g>\n";
    y += stage_height + kStageGap;
  }
  // The time axis, and the iteration's end.
  const double step_s = tick_step(end * 1e-9);
  out += fmt::format("<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000\"/>\n", kLeft, kLeft + kPlot, y,
                     y);
  for (int k = 0; k * step_s <= end * 1e-9 * (1 + 1e-9); ++k) {
    const double t = k * step_s;
    const double x = x_of(std::llround(t * 1e9));
    out += fmt::format("<line x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#000\"/>"
                       "<text x=\"{0:.2f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
                       x, y, y + 5, y + 18, tick_label(t, step_s));
  }
  out += fmt::format("<line class=\"tl-end\" x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.0f}\" y2=\"{2:.1f}\" stroke=\"#C00000\" "
                     "stroke-dasharray=\"4 3\"><title>iteration ends at {3}</title></line>\n",
                     kLeft + kPlot, kTop - 4, y, format_seconds(end * 1e-9));
  out += "</svg>\n";
  return out;
}

}  // namespace cuboid::html
