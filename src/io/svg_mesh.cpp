// `cuboid mesh --svg`: the device cuboid of one plan as a grid of nodes x GPUs.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cuboid/io/svg.hpp"
#include "svg_text.hpp"

namespace cuboid {

namespace {

using svg_text::escape;
using svg_text::swatch;

// Meshes larger than this show only the first kNodesShownWhenLarge nodes so the
// file stays a few hundred kilobytes.
constexpr int kMaxNodesDrawn = 64;
constexpr int kNodesShownWhenLarge = 32;
// DP replicas cycle through this many hatch styles (none, /, \, x).
constexpr int kDpHatches = 4;

struct Layout {
  int cell_w = 0, cell_h = 46, gap_x = 10, gap_y = 14;
  int left = 84, top = 0;
  int x(int gpu) const { return left + gpu * (cell_w + gap_x); }
  int y(int node) const { return top + node * (cell_h + gap_y); }
};

std::string defs() {
  // One hatch per DP replica index mod 4; index 0 is left plain.
  std::string out = "<defs>\n";
  const char* angles[] = {"45", "-45"};
  for (int i = 0; i < 2; ++i)
    out += fmt::format(
        "<pattern id=\"dp{}\" patternUnits=\"userSpaceOnUse\" width=\"7\" height=\"7\" patternTransform=\"rotate({})\">"
        "<rect x=\"0\" y=\"0\" width=\"2\" height=\"7\" fill=\"#000000\" fill-opacity=\"0.2\"/></pattern>\n",
        i + 1, angles[i]);
  out += "<pattern id=\"dp3\" patternUnits=\"userSpaceOnUse\" width=\"7\" height=\"7\" patternTransform=\"rotate(45)\">"
         "<rect x=\"0\" y=\"0\" width=\"2\" height=\"7\" fill=\"#000000\" fill-opacity=\"0.2\"/>"
         "<rect x=\"2\" y=\"0\" width=\"5\" height=\"2\" fill=\"#000000\" fill-opacity=\"0.2\"/></pattern>\n";
  return out + "</defs>\n";
}

// "stage 3" or, when the palette cycles, "stages 3, 11, 19, ..." (at most 4 listed).
std::string cycle_label(const char* one, const char* many, int first, int count, int period) {
  if (count <= period) return fmt::format("{} {}", one, first);
  std::string out = fmt::format("{} {}", many, first);
  int listed = 1;
  for (int k = first + period; k < count; k += period) {
    if (listed == 4) return out + ", ...";
    out += fmt::format(", {}", k);
    ++listed;
  }
  return out;
}

// Contiguous runs (consecutive ranks on one node) of a TP group, restricted to the nodes drawn.
std::vector<std::pair<int, int>> runs_of(std::vector<int> ranks, int gpn, int nodes_drawn) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::pair<int, int>> runs;  // first rank, last rank
  for (int r : ranks) {
    if (r / gpn >= nodes_drawn) continue;
    if (!runs.empty() && runs.back().second + 1 == r && runs.back().second / gpn == r / gpn)
      runs.back().second = r;
    else
      runs.emplace_back(r, r);
  }
  return runs;
}

// Legend entries laid left to right in rows: a 28 x 16 key, then a label.
class Legend {
 public:
  // `key` is a format string drawing the key with its top-left corner at ({0}, {1}).
  void add(const std::string& key, const std::string& label) {
    out_ += fmt::format(fmt::runtime(key), x_, y_);
    out_ += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", x_ + 36, y_ + 13, escape(label));
    x_ += 36 + svg_text::text_width_px(label, 12) + 28;
    width_ = std::max(width_, x_);
  }
  void next_row() {
    if (x_ > kLeft) y_ += kRow;
    x_ = kLeft;
  }
  std::string svg(int top) const {
    return fmt::format("<g class=\"legend\" transform=\"translate(0 {})\">\n{}</g>\n", top, out_);
  }
  int width() const { return width_; }
  int height() const { return y_ + (x_ > kLeft ? kRow : 0); }

 private:
  static constexpr int kLeft = 20, kRow = 24;
  std::string out_;
  int x_ = kLeft, y_ = 0, width_ = 0;
};

Legend legend_of(const ParallelPlan& plan, bool any_whole, bool any_split, bool crossing) {
  Legend lg;
  const int colours = static_cast<int>(svg_text::kPalette.size());
  for (int s = 0; s < std::min(plan.pp, colours); ++s)
    lg.add(fmt::format("<rect x=\"{{0}}\" y=\"{{1}}\" width=\"28\" height=\"16\" fill=\"{}\"/>\n", swatch(s).fill),
           cycle_label("stage", "stages", s, plan.pp, colours));
  lg.next_row();
  for (int d = 0; d < std::min(plan.dp, kDpHatches) && plan.dp > 1; ++d)
    lg.add(fmt::format("<rect x=\"{{0}}\" y=\"{{1}}\" width=\"28\" height=\"16\" fill=\"{}\" stroke=\"#888888\"/>\n",
                       d == 0 ? "#FFFFFF" : fmt::format("url(#dp{})", d)),
           cycle_label("DP replica", "DP replicas", d, plan.dp, kDpHatches));
  lg.next_row();
  const std::string outline =
      "<rect x=\"{0}\" y=\"{1}\" width=\"28\" height=\"16\" rx=\"3\" fill=\"none\" stroke-width=\"3\" ";
  if (any_whole)
    lg.add(outline + "stroke=\"#000000\"/>\n", fmt::format("TP group ({} GPUs, contiguous in one node)", plan.tp));
  if (any_split)
    lg.add(outline + fmt::format("stroke=\"{}\" stroke-dasharray=\"8 4\"/>\n", crossing ? svg_text::kWarn : "#000000"),
           crossing ? "piece of a TP group that crosses nodes" : "piece of a TP group split inside a node");
  lg.next_row();
  return lg;
}

std::string cells_svg(const RankMapping& map, const Layout& lay, int gpn, int nodes_drawn) {
  std::string out;
  for (int n = 0; n < nodes_drawn; ++n) {
    for (int g = 0; g < gpn; ++g) {
      const int r = n * gpn + g;
      const int x = lay.x(g), y = lay.y(n);
      if (r >= map.world_size()) {
        out += fmt::format("<rect class=\"idle\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#F4F4F4\" "
                           "stroke=\"#BBBBBB\"/>\n",
                           x, y, lay.cell_w, lay.cell_h);
        continue;
      }
      const RankCoord k = map.coord(r);
      const auto& sw = swatch(k.pp);
      out += fmt::format("<rect class=\"gpu\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
                         "stroke=\"#FFFFFF\"/>\n",
                         x, y, lay.cell_w, lay.cell_h, sw.fill);
      if (k.dp % kDpHatches != 0)
        out += fmt::format("<rect class=\"dp-mark\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#dp{})\"/>\n",
                           x, y, lay.cell_w, lay.cell_h, k.dp % kDpHatches);
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-family=\"{}\" font-size=\"12\" "
                         "font-weight=\"bold\" fill=\"{}\">p{} d{} t{}</text>\n",
                         x + lay.cell_w / 2, y + 20, svg_text::kMonoFont, sw.text, k.pp, k.dp, k.tp);
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{}\">rank {}</text>\n",
                         x + lay.cell_w / 2, y + 37, sw.text, r);
    }
  }
  return out;
}

// TP groups: one thick rectangle when contiguous in a node, dashed segments
// (red when the group crosses nodes) otherwise.
std::string tp_groups_svg(const RankMapping& map, const std::vector<std::vector<int>>& groups, const Layout& lay,
                          int gpn, int nodes_drawn, bool& any_whole, bool& any_split) {
  std::string out;
  any_whole = any_split = false;
  for (const auto& group : groups) {
    const auto runs = runs_of(group, gpn, nodes_drawn);
    if (runs.empty()) continue;
    const bool whole = runs.size() == 1 && runs[0].second - runs[0].first + 1 == static_cast<int>(group.size());
    (whole ? any_whole : any_split) = true;
    const int spanned = map.nodes_spanned(group);
    const RankCoord first = map.coord(group.front());
    out += fmt::format("<g><title>TP group of stage {}, DP replica {}: {} GPUs on {} node(s)</title>\n", first.pp,
                       first.dp, group.size(), spanned);
    for (const auto& [a, b] : runs)
      out += fmt::format("<rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"4\" fill=\"none\" "
                         "stroke=\"{}\" stroke-width=\"3\"{}/>\n",
                         whole ? "tp" : "tp-seg", lay.x(a % gpn) - 3, lay.y(a / gpn) - 3,
                         (b - a) * (lay.cell_w + lay.gap_x) + lay.cell_w + 6, lay.cell_h + 6,
                         spanned > 1 ? svg_text::kWarn : "#000000", whole ? "" : " stroke-dasharray=\"8 4\"");
    out += "</g>\n";
  }
  return out;
}

}  // namespace

std::string mesh_svg(const ParallelPlan& plan, const Cluster& cluster, const std::string& title) {
  const RankMapping map(plan, cluster.gpus_per_node);
  const int gpn = cluster.gpus_per_node;
  const int world = map.world_size();
  const int nodes_used = (world + gpn - 1) / gpn;
  const int nodes_drawn = nodes_used > kMaxNodesDrawn ? kNodesShownWhenLarge : nodes_used;

  const auto groups = map.tp_groups();
  int crossing = 0;
  for (const auto& g : groups) crossing += map.nodes_spanned(g) > 1 ? 1 : 0;

  const std::string heading = escape(title);
  const std::string shape = fmt::format(
      "TP {} x PP {} x DP {} = {} GPUs on {} of {} node(s) x {} GPUs, rank order {} (first named = innermost)",
      plan.tp, plan.pp, plan.dp, world, nodes_used, cluster.nodes, gpn, plan.order.str());
  const std::string warning =
      crossing == 0 ? std::string()
                    : fmt::format("TP group crosses nodes: {} of {} TP groups span more than one node, "
                                  "so their all-reduces leave NVLink for the inter-node fabric",
                                  crossing, groups.size());

  Layout lay;
  const std::string widest = fmt::format("p{} d{} t{}", plan.pp - 1, plan.dp - 1, plan.tp - 1);
  lay.cell_w = std::max(84, static_cast<int>(static_cast<double>(widest.size()) * 7.3) + 16);
  lay.top = (warning.empty() ? 64 : 84) + 20;

  bool any_whole = false, any_split = false;
  const std::string cells = cells_svg(map, lay, gpn, nodes_drawn);
  const std::string outlines = tp_groups_svg(map, groups, lay, gpn, nodes_drawn, any_whole, any_split);
  const Legend legend = legend_of(plan, any_whole, any_split, crossing > 0);

  const int grid_bottom = lay.y(nodes_drawn) - lay.gap_y;
  const int legend_top = grid_bottom + (nodes_drawn < nodes_used ? 44 : 20);
  const int height = legend_top + legend.height() + 8;
  const int width = std::max({lay.x(gpn) + 20, svg_text::text_width_px(shape, 12) + 40,
                              svg_text::text_width_px(warning, 12) + 40, svg_text::text_width_px(title, 16) + 40,
                              legend.width(), 720});

  std::string out = svg_text::open_svg(width, height);
  out += defs();
  out += fmt::format("<text class=\"title\" x=\"20\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                     heading);
  out += fmt::format("<text class=\"subtitle\" x=\"20\" y=\"48\">{}</text>\n", escape(shape));
  if (!warning.empty())
    out += fmt::format("<text class=\"warning\" x=\"20\" y=\"70\" fill=\"{}\" font-weight=\"bold\">{}</text>\n",
                       svg_text::kWarn, escape(warning));
  for (int g = 0; g < gpn; ++g)
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#444444\">gpu{}</text>\n",
                       lay.x(g) + lay.cell_w / 2, lay.top - 10, g);
  for (int n = 0; n < nodes_drawn; ++n)
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#444444\">node {}</text>\n",
                       lay.left - 12, lay.y(n) + lay.cell_h / 2 + 4, n);
  out += cells;
  out += outlines;
  if (nodes_drawn < nodes_used)
    out += fmt::format("<text class=\"more\" x=\"{}\" y=\"{}\" font-style=\"italic\">... {} more nodes</text>\n",
                       lay.left, grid_bottom + 22, nodes_used - nodes_drawn);
  out += legend.svg(legend_top);
  out += "</svg>\n";
  return out;
}

}  // namespace cuboid
