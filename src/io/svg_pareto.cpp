// `cuboid plan --svg`: step time vs peak memory of every feasible candidate.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cuboid/io/svg.hpp"
#include "svg_text.hpp"

namespace cuboid {

namespace {

using svg_text::escape;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Beyond this many points the scatter is thinned (file size stays around 1 MB).
constexpr std::size_t kMaxPoints = 20000;

constexpr int kWidth = 960, kHeight = 620;
constexpr int kPlotLeft = 90, kPlotRight = 930, kPlotTop = 78, kPlotBottom = 530;

// An axis from lo to hi in steps of 1, 2 or 5 x 10^k, about `target` ticks.
struct Axis {
  double lo = 0, hi = 1, step = 1;
  int decimals = 0;
  double frac(double v) const { return (v - lo) / (hi - lo); }
  std::string label(double v) const { return fmt::format("{:.{}f}", v + 0.0, decimals); }
};

Axis nice_axis(double lo, double hi, int target = 6) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (!(hi > lo)) {
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  Axis a;
  a.step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  if (!(a.hi > a.lo)) a.hi = a.lo + a.step;
  a.decimals = std::max(0, -static_cast<int>(std::floor(std::log10(a.step) + 1e-9)));
  return a;
}

struct Point {
  double time_s, mem_GiB;
  std::size_t index;  // into feasible
};

std::string plan_label(const ParallelPlan& p) {
  return fmt::format("TP {} PP {} DP {} mb {} v {} ZeRO {} recompute {} SP {}", p.tp, p.pp, p.dp, p.micro_batch,
                     p.virtual_stages, p.zero_stage, to_string(p.recompute), p.sequence_parallel ? "on" : "off");
}

std::string point_label(const Estimate& e) {
  return fmt::format("{}: {:.3f} s, {:.1f} GiB", plan_label(e.plan), e.iteration_time_s, e.memory.total_bytes / kGiB);
}

// Indices of the points not beaten on both time and memory, by memory ascending
// (so time descending): the least step time for each memory budget.
std::vector<std::size_t> pareto_front(const std::vector<Point>& pts) {
  std::vector<std::size_t> order(pts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (pts[a].mem_GiB != pts[b].mem_GiB) return pts[a].mem_GiB < pts[b].mem_GiB;
    if (pts[a].time_s != pts[b].time_s) return pts[a].time_s < pts[b].time_s;
    return a < b;
  });
  std::vector<std::size_t> front;
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t i : order)
    if (pts[i].time_s < best) {
      best = pts[i].time_s;
      front.push_back(i);
    }
  return front;
}

// Estimates with a finite time and memory, in input order.
std::vector<Point> finite_points(const std::vector<Estimate>& feasible) {
  std::vector<Point> pts;
  pts.reserve(feasible.size());
  for (std::size_t i = 0; i < feasible.size(); ++i) {
    const double t = feasible[i].iteration_time_s, m = feasible[i].memory.total_bytes / kGiB;
    if (std::isfinite(t) && std::isfinite(m)) pts.push_back({t, m, i});
  }
  return pts;
}

// The GPU's memory in GiB, if the estimate knows it.
std::optional<double> capacity_GiB(const Estimate& chosen) {
  const double cap_GiB = chosen.memory.capacity_bytes / kGiB;
  if (std::isfinite(cap_GiB) && cap_GiB > 0) return cap_GiB;
  return std::nullopt;
}

// The plot area: step time on x, memory on y, in pixels.
struct Plot {
  Axis ax, ay;
  double x(double t) const { return kPlotLeft + ax.frac(t) * (kPlotRight - kPlotLeft); }
  double y(double m) const { return kPlotBottom - ay.frac(m) * (kPlotBottom - kPlotTop); }
};

// Axes holding every point, the chosen plan and the capacity line.
Plot fit_plot(const std::vector<Point>& pts, const Point& chosen, std::optional<double> cap_GiB) {
  double tmin = chosen.time_s, tmax = chosen.time_s, mmin = chosen.mem_GiB, mmax = chosen.mem_GiB;
  for (const Point& p : pts) {
    tmin = std::min(tmin, p.time_s), tmax = std::max(tmax, p.time_s);
    mmin = std::min(mmin, p.mem_GiB), mmax = std::max(mmax, p.mem_GiB);
  }
  if (cap_GiB) mmax = std::max(mmax, *cap_GiB);
  // A little padding so no point (or the capacity line) sits on the frame.
  const double pad_t = (tmax - tmin) * 0.03, pad_m = (mmax - mmin) * 0.03;
  return {nice_axis(std::max(0.0, tmin - pad_t), tmax + pad_t), nice_axis(std::max(0.0, mmin - pad_m), mmax + pad_m)};
}

// The points off the front to draw. Beyond kMaxPoints: drop points landing on
// an already drawn pixel, then keep every k-th of the rest, in input order.
std::vector<std::size_t> thin(const std::vector<Point>& pts, const std::vector<std::size_t>& front, const Plot& plot) {
  std::vector<char> on_front(pts.size(), 0);
  for (std::size_t i : front) on_front[i] = 1;
  std::vector<std::size_t> shown;
  if (pts.size() <= kMaxPoints) {
    for (std::size_t i = 0; i < pts.size(); ++i)
      if (!on_front[i]) shown.push_back(i);
    return shown;
  }
  std::set<std::pair<long, long>> pixels;
  for (std::size_t i = 0; i < pts.size(); ++i)
    if (!on_front[i] && pixels.emplace(std::lround(plot.x(pts[i].time_s)), std::lround(plot.y(pts[i].mem_GiB))).second)
      shown.push_back(i);
  const std::size_t budget = kMaxPoints > front.size() ? kMaxPoints - front.size() : 0;
  if (shown.size() > budget) {
    const std::size_t stride = budget == 0 ? shown.size() + 1 : (shown.size() + budget - 1) / budget;
    std::vector<std::size_t> kept;
    for (std::size_t j = 0; j < shown.size(); j += stride) kept.push_back(shown[j]);
    shown.swap(kept);
  }
  return shown;
}

// Grid, ticks and tick labels, the frame and the axis labels.
std::string axes_svg(const Plot& plot) {
  const Axis &ax = plot.ax, &ay = plot.ay;
  std::string out = "<g class=\"grid\" stroke=\"#E4E4E4\" stroke-width=\"1\">\n";
  std::string labels;
  const long nx = std::lround((ax.hi - ax.lo) / ax.step), ny = std::lround((ay.hi - ay.lo) / ay.step);
  for (long k = 0; k <= nx; ++k) {
    const double v = ax.lo + static_cast<double>(k) * ax.step, x = plot.x(v);
    out += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", x, kPlotTop, kPlotBottom);
    labels += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#000000\"/>\n"
                          "<text class=\"xtick\" x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                          x, kPlotBottom, kPlotBottom + 5, kPlotBottom + 20, ax.label(v));
  }
  for (long k = 0; k <= ny; ++k) {
    const double v = ay.lo + static_cast<double>(k) * ay.step, y = plot.y(v);
    out += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"/>\n", y, kPlotLeft, kPlotRight);
    labels += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#000000\"/>\n"
                          "<text class=\"ytick\" x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                          y, kPlotLeft - 5, kPlotLeft, kPlotLeft - 8, y + 4, ay.label(v));
  }
  out += "</g>\n" + labels;
  out += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                     "stroke=\"#000000\"/>\n",
                     kPlotLeft, kPlotTop, kPlotRight - kPlotLeft, kPlotBottom - kPlotTop);
  out += fmt::format("<text class=\"xlabel\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">step time per iteration (s)</text>\n",
                     (kPlotLeft + kPlotRight) / 2, kPlotBottom + 42);
  out += fmt::format("<text class=\"ylabel\" x=\"0\" y=\"0\" text-anchor=\"middle\" "
                     "transform=\"translate(28 {}) rotate(-90)\">peak memory per GPU (GiB)</text>\n",
                     (kPlotTop + kPlotBottom) / 2);
  return out;
}

std::string capacity_svg(const Plot& plot, double cap_GiB) {
  const double y = plot.y(cap_GiB);
  return fmt::format("<line class=\"capacity\" x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" "
                     "stroke=\"{3}\" stroke-width=\"1.5\" stroke-dasharray=\"8 5\"/>\n"
                     "<text x=\"{4}\" y=\"{5:.1f}\" text-anchor=\"end\" fill=\"{3}\">GPU memory {6:.1f} GiB</text>\n",
                     y, kPlotLeft, kPlotRight, svg_text::kWarn, kPlotRight - 6, y - 6, cap_GiB);
}

// The candidates, then the front as a step line with its points.
std::string points_svg(const Plot& plot, const std::vector<Point>& pts, const std::vector<std::size_t>& shown,
                       const std::vector<std::size_t>& front, const std::vector<Estimate>& feasible) {
  std::string out = "<g class=\"points\" fill=\"#0072B2\" fill-opacity=\"0.35\">\n";
  for (std::size_t i : shown)
    out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\"/>\n", plot.x(pts[i].time_s),
                       plot.y(pts[i].mem_GiB));
  out += "</g>\n";
  if (front.empty()) return out;
  std::string path = fmt::format("M {:.1f} {:.1f}", plot.x(pts[front[0]].time_s), plot.y(pts[front[0]].mem_GiB));
  for (std::size_t j = 1; j < front.size(); ++j)
    path += fmt::format(" V {:.1f} H {:.1f}", plot.y(pts[front[j]].mem_GiB), plot.x(pts[front[j]].time_s));
  path += fmt::format(" V {}", kPlotTop);
  out += fmt::format("<path class=\"front-line\" d=\"{}\" fill=\"none\" stroke=\"#000000\" stroke-width=\"1.5\"/>\n",
                     path);
  out += "<g class=\"front-points\" fill=\"#000000\">\n";
  for (std::size_t i : front)
    out += fmt::format("<circle class=\"front\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\"><title>{}</title></circle>\n",
                       plot.x(pts[i].time_s), plot.y(pts[i].mem_GiB), escape(point_label(feasible[pts[i].index])));
  out += "</g>\n";
  return out;
}

// The chosen plan's marker and its label, on the side with room.
std::string chosen_svg(const Plot& plot, const Estimate& chosen, const Point& at) {
  const double cx = plot.x(at.time_s), cy = plot.y(at.mem_GiB);
  const bool right_half = cx > (kPlotLeft + kPlotRight) / 2.0;
  const double lx = right_half ? cx - 12 : cx + 12;
  const double ly = cy - 12 < kPlotTop + 30 ? cy + 22 : cy - 24;
  std::string out =
      fmt::format("<circle class=\"chosen\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"7\" fill=\"#D55E00\" stroke=\"#000000\" "
                  "stroke-width=\"1.5\"><title>{}</title></circle>\n",
                  cx, cy, escape(point_label(chosen)));
  out += fmt::format("<text class=\"chosen-label\" x=\"{0:.1f}\" y=\"{1:.1f}\" text-anchor=\"{2}\" font-weight=\"bold\" "
                     "paint-order=\"stroke\" stroke=\"#FFFFFF\" stroke-width=\"4\" stroke-linejoin=\"round\">"
                     "<tspan x=\"{0:.1f}\">chosen: {3}</tspan>"
                     "<tspan x=\"{0:.1f}\" dy=\"15\">{4:.3f} s per iteration, {5:.1f} GiB per GPU</tspan></text>\n",
                     lx, ly, right_half ? "end" : "start", escape(plan_label(chosen.plan)), at.time_s, at.mem_GiB);
  return out;
}

// The legend under the x-axis label.
std::string legend_svg(bool has_cap) {
  const int ly0 = kHeight - 22;
  std::string out = "<g class=\"legend\">\n";
  out += fmt::format("<circle cx=\"{0}\" cy=\"{1}\" r=\"3\" fill=\"#0072B2\" fill-opacity=\"0.5\"/>"
                     "<text x=\"{2}\" y=\"{3}\">candidate that fits</text>\n"
                     "<line x1=\"{4}\" y1=\"{1}\" x2=\"{5}\" y2=\"{1}\" stroke=\"#000000\" stroke-width=\"1.5\"/>"
                     "<circle cx=\"{6}\" cy=\"{1}\" r=\"3.5\"/><text x=\"{7}\" y=\"{3}\">Pareto front</text>\n"
                     "<circle cx=\"{8}\" cy=\"{1}\" r=\"6\" fill=\"#D55E00\" stroke=\"#000000\"/>"
                     "<text x=\"{9}\" y=\"{3}\">chosen plan</text>\n",
                     kPlotLeft + 6, ly0, kPlotLeft + 16, ly0 + 4, kPlotLeft + 170, kPlotLeft + 200, kPlotLeft + 185,
                     kPlotLeft + 208, kPlotLeft + 330, kPlotLeft + 342);
  if (has_cap)
    out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"1.5\" "
                       "stroke-dasharray=\"8 5\"/><text x=\"{4}\" y=\"{5}\">GPU memory capacity</text>\n",
                       kPlotLeft + 460, ly0, kPlotLeft + 490, svg_text::kWarn, kPlotLeft + 498, ly0 + 4);
  return out + "</g>\n";
}

}  // namespace

std::string pareto_svg(const std::vector<Estimate>& feasible, const Estimate& chosen, const std::string& title) {
  const std::vector<Point> pts = finite_points(feasible);
  const Point at = {chosen.iteration_time_s, chosen.memory.total_bytes / kGiB, 0};
  const std::optional<double> cap_GiB = capacity_GiB(chosen);
  const Plot plot = fit_plot(pts, at, cap_GiB);
  const std::vector<std::size_t> front = pareto_front(pts);
  const std::vector<std::size_t> shown = thin(pts, front, plot);
  const std::size_t rest = pts.size() - front.size();

  std::string out = svg_text::open_svg(kWidth, kHeight);
  out += fmt::format("<text class=\"title\" x=\"20\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                     escape(title));
  std::string sub = fmt::format("{} feasible candidates, {} on the Pareto front (least step time for the memory)",
                                pts.size(), front.size());
  if (shown.size() < rest) sub += fmt::format("; {} others drawn of {} (thinned)", shown.size(), rest);
  out += fmt::format("<text class=\"subtitle\" x=\"20\" y=\"48\">{}</text>\n", escape(sub));
  out += axes_svg(plot);
  if (cap_GiB) out += capacity_svg(plot, *cap_GiB);
  // The chosen plan on top.
  out += points_svg(plot, pts, shown, front, feasible) + chosen_svg(plot, chosen, at) + legend_svg(cap_GiB.has_value());
  return out + "</svg>\n";
}

}  // namespace cuboid
