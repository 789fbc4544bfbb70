// SVG pictures: the device mesh of a plan and the step-time / memory scatter.
// Parse-level checks: well-formed XML, one cell per GPU, stage colours, TP
// outlines and the crossing warning, nice axis ticks, the chosen plan and the
// Pareto front, bounded size, determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cuboid/io/svg.hpp"

using namespace cuboid;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

bool valid_entities(const std::string& s, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    if (s[i] == '<') return false;
    if (s[i] != '&') continue;
    const std::size_t semi = s.find(';', i);
    if (semi == std::string::npos || semi >= to || semi == i + 1) return false;
    for (std::size_t j = i + 1; j < semi; ++j)
      if (!std::isalnum(static_cast<unsigned char>(s[j])) && s[j] != '#') return false;
    i = semi;
  }
  return true;
}

// A small XML well-formedness check: balanced, properly nested tags, quoted
// attributes, escaped text, one <svg> root. Returns "" or what is wrong.
std::string xml_problem(const std::string& s) {
  std::size_t pos = 0;
  if (s.rfind("<?xml", 0) == 0) pos = s.find("?>") + 2;
  std::vector<std::string> stack;
  int roots = 0;
  while (pos < s.size()) {
    const std::size_t lt = s.find('<', pos);
    const std::size_t text_end = lt == std::string::npos ? s.size() : lt;
    if (!valid_entities(s, pos, text_end)) return "bad text near offset " + std::to_string(pos);
    if (stack.empty() && s.find_first_not_of(" \n\t", pos) < text_end) return "text outside the root";
    if (lt == std::string::npos) break;
    if (s.compare(lt, 4, "<!--") == 0) {
      const std::size_t end = s.find("-->", lt);
      if (end == std::string::npos) return "unterminated comment";
      pos = end + 3;
      continue;
    }
    // Find the tag's '>' outside quotes.
    std::size_t i = lt + 1;
    char quote = 0;
    for (; i < s.size(); ++i) {
      if (quote) {
        if (s[i] == quote) quote = 0;
        else if (s[i] == '<') return "'<' in an attribute";
      } else if (s[i] == '"' || s[i] == '\'') {
        quote = s[i];
      } else if (s[i] == '>') {
        break;
      }
    }
    if (i >= s.size()) return "unterminated tag";
    const std::string tag = s.substr(lt + 1, i - lt - 1);
    if (!valid_entities(s, lt + 1, i)) return "bad attribute text in <" + tag + ">";
    pos = i + 1;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \n\t/"));
    if (name.empty()) return "empty tag name";
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return "unbalanced quotes in <" + name + ">";
    if (stack.empty()) {
      ++roots;
      if (name != "svg") return "root is <" + name + ">";
    }
    if (tag.back() != '/') stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "expected one root, found " + std::to_string(roots);
  return "";
}

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size())) ++n;
  return n;
}

// Every element starting with `open` (e.g. "<rect class=\"gpu\""), up to its '>' or closing tag.
std::vector<std::string> elements(const std::string& s, const std::string& open, const std::string& close = ">") {
  std::vector<std::string> out;
  for (std::size_t p = s.find(open); p != std::string::npos; p = s.find(open, p + 1))
    out.push_back(s.substr(p, s.find(close, p) + close.size() - p));
  return out;
}

std::string attr(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const std::size_t p = tag.find(key);
  if (p == std::string::npos) return "";
  const std::size_t b = p + key.size();
  return tag.substr(b, tag.find('"', b) - b);
}

// Inner texts of <text class="cls" ...>value</text>.
std::vector<double> tick_values(const std::string& s, const std::string& cls) {
  std::vector<double> out;
  for (const auto& e : elements(s, "<text class=\"" + cls + "\"", "</text>")) {
    const std::size_t b = e.find('>') + 1;
    out.push_back(std::stod(e.substr(b, e.find('<', b) - b)));
  }
  return out;
}

void check_nice_ticks(const std::vector<double>& ticks, double lo, double hi) {
  REQUIRE(ticks.size() >= 3);
  CHECK(ticks.size() <= 12);
  const double step = ticks[1] - ticks[0];
  REQUIRE(step > 0);
  for (std::size_t i = 1; i < ticks.size(); ++i) CHECK(ticks[i] - ticks[i - 1] == doctest::Approx(step));
  const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  CHECK((mantissa == doctest::Approx(1) || mantissa == doctest::Approx(2) || mantissa == doctest::Approx(5)));
  for (double t : ticks) CHECK(std::abs(t / step - std::round(t / step)) < 1e-6);  // multiples of the step
  CHECK(ticks.front() <= lo);
  CHECK(ticks.back() >= hi);
}

Cluster nodes_of_8(int nodes) {
  Cluster c;
  c.name = "dgx-a100";
  c.nodes = nodes;
  c.gpus_per_node = 8;
  return c;
}

ParallelPlan plan_of(int tp, int pp, int dp, const char* order = "tp-dp-pp") {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = 64;
  p.seq_length = 8192;
  p.sequence_parallel = tp > 1;
  p.order = RankOrder::parse(order, "test", "order");
  return p;
}

Estimate candidate(int tp, int pp, int dp, int mb, double time_s, double mem_GiB) {
  Estimate e;
  e.plan = plan_of(tp, pp, dp);
  e.plan.micro_batch = mb;
  e.iteration_time_s = time_s;
  e.memory.total_bytes = mem_GiB * kGiB;
  e.memory.capacity_bytes = 80 * kGiB;
  return e;
}

// A search-like cloud: faster plans need more memory, with scatter.
std::vector<Estimate> cloud() {
  std::vector<Estimate> out;
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 4})
      for (int mb = 1; mb <= 4; ++mb) {
        const double mem = 30 + 40.0 / (tp * pp) + 3.0 * mb + tp;
        const double time = 270 + 8.0 * pp + 12.0 / mb + 5.0 * (tp == 1 ? 4 : tp / 2) + (tp * 7 + pp * 3 + mb) % 11;
        out.push_back(candidate(tp, pp, 32 / (tp * pp), mb, time, mem));
      }
  return out;
}

}  // namespace

TEST_CASE("the seed mesh: Llama-3-70B shape, TP 4 x PP 4 x DP 2 on 4 x 8 GPUs") {
  const std::string svg = mesh_svg(plan_of(4, 4, 2), nodes_of_8(4), "llama3-70b on DGX A100 x4");
  CHECK(xml_problem(svg) == "");
  const auto cells = elements(svg, "<rect class=\"gpu\"");
  CHECK(cells.size() == 32);
  std::set<std::string> fills;
  for (const auto& c : cells) fills.insert(attr(c, "fill"));
  CHECK(fills.size() == 4);
  CHECK(count(svg, "class=\"tp\"") == 8);
  CHECK(count(svg, "class=\"tp-seg\"") == 0);
  CHECK(count(svg, "TP group crosses nodes") == 0);
  // One text per GPU with its coordinates: stage = node, TP innermost.
  CHECK(count(svg, ">p0 d0 t0<") == 1);
  CHECK(count(svg, ">p3 d1 t3<") == 1);
  CHECK(svg.find("TP 4 x PP 4 x DP 2 = 32 GPUs") != std::string::npos);
  CHECK(svg.find("rank order tp-dp-pp") != std::string::npos);
  for (int s = 0; s < 4; ++s) CHECK(svg.find(">stage " + std::to_string(s) + "<") != std::string::npos);
  // The second DP replica is hatched; the first is plain.
  CHECK(count(svg, "class=\"dp-mark\"") == 16);
  CHECK(count(svg, "class=\"idle\"") == 0);
}

TEST_CASE("TP 8 with DP innermost (dp-tp-pp) on 8-GPU nodes crosses nodes") {
  const std::string svg = mesh_svg(plan_of(8, 1, 4, "dp-tp-pp"), nodes_of_8(4), "crossing");
  CHECK(xml_problem(svg) == "");
  CHECK(elements(svg, "<rect class=\"gpu\"").size() == 32);
  CHECK(svg.find("TP group crosses nodes") != std::string::npos);
  CHECK(svg.find("4 of 4 TP groups") != std::string::npos);
  // Ranks 0, 4, 8, ... form a TP group: 8 single-GPU segments per group, none whole.
  CHECK(count(svg, "class=\"tp\"") == 0);
  CHECK(count(svg, "class=\"tp-seg\"") == 32);
}

TEST_CASE("mesh: idle GPUs, escaping, many stages, large meshes, determinism") {
  SUBCASE("a world smaller than the nodes it uses leaves idle cells") {
    const std::string svg = mesh_svg(plan_of(4, 3, 1), nodes_of_8(2), "idle");
    CHECK(xml_problem(svg) == "");
    CHECK(elements(svg, "<rect class=\"gpu\"").size() == 12);
    CHECK(count(svg, "class=\"idle\"") == 4);
  }
  SUBCASE("the title is escaped") {
    const std::string svg = mesh_svg(plan_of(4, 4, 2), nodes_of_8(4), "a<b & \"c\" 'd'");
    CHECK(xml_problem(svg) == "");
    CHECK(svg.find("a&lt;b &amp; &quot;c&quot; &apos;d&apos;") != std::string::npos);
  }
  SUBCASE("more than 8 stages cycle the palette and say so in the legend") {
    const std::string svg = mesh_svg(plan_of(2, 16, 1), nodes_of_8(4), "pp16");
    CHECK(xml_problem(svg) == "");
    std::set<std::string> fills;
    for (const auto& c : elements(svg, "<rect class=\"gpu\"")) fills.insert(attr(c, "fill"));
    CHECK(fills.size() == 8);
    CHECK(svg.find(">stages 0, 8<") != std::string::npos);
  }
  SUBCASE("over 64 nodes: the first 32 drawn, the rest counted, size bounded") {
    const std::string svg = mesh_svg(plan_of(8, 4, 32), nodes_of_8(128), "big");
    CHECK(xml_problem(svg) == "");
    CHECK(elements(svg, "<rect class=\"gpu\"").size() == 32 * 8);
    CHECK(svg.find("... 96 more nodes") != std::string::npos);
    CHECK(svg.size() < 300 * 1024);
    CHECK(mesh_svg(plan_of(8, 16, 512), nodes_of_8(8192), "huge").size() < 300 * 1024);
  }
  SUBCASE("64 nodes are drawn in full") {
    const std::string svg = mesh_svg(plan_of(8, 8, 8), nodes_of_8(64), "64");
    CHECK(elements(svg, "<rect class=\"gpu\"").size() == 512);
    CHECK(svg.find("more nodes") == std::string::npos);
  }
  SUBCASE("deterministic") {
    CHECK(mesh_svg(plan_of(4, 4, 2), nodes_of_8(4), "t") == mesh_svg(plan_of(4, 4, 2), nodes_of_8(4), "t"));
  }
}

TEST_CASE("pareto: chosen marked, front holds the fastest and the leanest, nice ticks") {
  const auto feasible = cloud();
  const auto fastest = *std::min_element(feasible.begin(), feasible.end(), [](const Estimate& a, const Estimate& b) {
    return a.iteration_time_s < b.iteration_time_s;
  });
  const auto leanest = *std::min_element(feasible.begin(), feasible.end(), [](const Estimate& a, const Estimate& b) {
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  const Estimate& chosen = feasible[5];
  const std::string svg = pareto_svg(feasible, chosen, "llama3-70b: step time vs memory");
  CHECK(xml_problem(svg) == "");

  CHECK(count(svg, "class=\"chosen\"") == 1);
  const auto label = elements(svg, "<text class=\"chosen-label\"", "</text>");
  REQUIRE(label.size() == 1);
  const auto& p = chosen.plan;
  CHECK(label[0].find("TP " + std::to_string(p.tp) + " PP " + std::to_string(p.pp) + " DP " + std::to_string(p.dp) +
                      " mb " + std::to_string(p.micro_batch)) != std::string::npos);

  auto key = [](const Estimate& e) {
    return "TP " + std::to_string(e.plan.tp) + " PP " + std::to_string(e.plan.pp) + " DP " + std::to_string(e.plan.dp) +
           " mb " + std::to_string(e.plan.micro_batch) + " ";
  };
  const auto front = elements(svg, "<circle class=\"front\"", "</circle>");
  CHECK(front.size() >= 2);
  CHECK(front.size() < feasible.size());
  auto on_front = [&](const Estimate& e) {
    return std::any_of(front.begin(), front.end(), [&](const std::string& f) { return f.find(key(e)) != std::string::npos; });
  };
  CHECK(on_front(fastest));
  CHECK(on_front(leanest));
  CHECK(count(svg, "class=\"front-line\"") == 1);
  CHECK(count(svg, "<circle cx=") + front.size() + 1 >= feasible.size() + 1);

  double tmin = 1e300, tmax = 0, mmin = 1e300, mmax = 80;
  for (const auto& e : feasible) {
    tmin = std::min(tmin, e.iteration_time_s), tmax = std::max(tmax, e.iteration_time_s);
    mmin = std::min(mmin, e.memory.total_bytes / kGiB), mmax = std::max(mmax, e.memory.total_bytes / kGiB);
  }
  check_nice_ticks(tick_values(svg, "xtick"), tmin, tmax);
  check_nice_ticks(tick_values(svg, "ytick"), mmin, mmax);  // includes the 80 GiB capacity line
  CHECK(count(svg, "class=\"capacity\"") == 1);
  CHECK(svg.find("GPU memory 80.0 GiB") != std::string::npos);

  CHECK(pareto_svg(feasible, chosen, "t") == pareto_svg(feasible, chosen, "t"));
}

TEST_CASE("pareto: small ranges, one point, no points") {
  SUBCASE("sub-second times get decimal ticks") {
    std::vector<Estimate> v{candidate(1, 1, 8, 1, 0.81, 12.2), candidate(2, 1, 4, 1, 0.93, 11.4),
                            candidate(4, 1, 2, 1, 1.37, 10.9)};
    const std::string svg = pareto_svg(v, v[0], "small");
    CHECK(xml_problem(svg) == "");
    check_nice_ticks(tick_values(svg, "xtick"), 0.81, 1.37);
    CHECK(svg.find(">0.8<") != std::string::npos);
  }
  SUBCASE("a single candidate still gets an axis") {
    std::vector<Estimate> v{candidate(8, 1, 4, 1, 275.9, 74.0)};
    const std::string svg = pareto_svg(v, v[0], "one");
    CHECK(xml_problem(svg) == "");
    check_nice_ticks(tick_values(svg, "xtick"), 275.9, 275.9);
    CHECK(count(svg, "class=\"front\"") == 1);
  }
  SUBCASE("no feasible candidates") {
    const std::string svg = pareto_svg({}, candidate(8, 1, 4, 1, 275.9, 74.0), "none");
    CHECK(xml_problem(svg) == "");
    CHECK(count(svg, "class=\"chosen\"") == 1);
  }
}

TEST_CASE("pareto: 60000 candidates are thinned deterministically, the front and the chosen kept") {
  std::vector<Estimate> v;
  std::uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(x >> 11) / 9007199254740992.0;
  };
  for (int i = 0; i < 60000; ++i) {
    const double a = next(), b = next();
    v.push_back(candidate(1 << (i % 4), 1 + i % 3, 1, 1 + i % 16, 200 + 300 * a * a, 20 + 60 * b));
    v.back().plan.global_batch = i;  // distinct plans
  }
  const std::string svg = pareto_svg(v, v[777], "thinned");
  CHECK(xml_problem(svg) == "");
  CHECK(svg.find("(thinned)") != std::string::npos);
  CHECK(count(svg, "<circle cx=") <= 20000);
  CHECK(count(svg, "class=\"chosen\"") == 1);
  // The front computed here, independently: every point not beaten on both axes.
  std::vector<std::pair<double, double>> pts;
  for (const auto& e : v) pts.emplace_back(e.memory.total_bytes, e.iteration_time_s);
  std::sort(pts.begin(), pts.end());
  std::size_t front = 0;
  double best = 1e300;
  for (const auto& [m, t] : pts)
    if (t < best) best = t, ++front;
  CHECK(count(svg, "class=\"front\"") == front);
  CHECK(svg.size() < 2 * 1024 * 1024);
  CHECK(svg == pareto_svg(v, v[777], "thinned"));
}
