#pragma once
// Private to the HTML report (html_report.cpp): its pictures, its text
// helpers, its stylesheet and script.
#include <span>
#include <string>
#include <string_view>

#include "cuboid/cost/estimator.hpp"
#include "cuboid/sim/timeline.hpp"

namespace cuboid::html {

// Text and attribute values: the five specials escaped, control characters dropped.
std::string escape(std::string_view s);
// An SVG document as an element inside HTML: the XML declaration dropped.
std::string inline_svg(std::string_view svg);
// A duration with a unit fitting its size: "294.325 s", "1.063 ms", "85 us".
std::string format_seconds(double s);

// The chosen plan's iteration, one group of rows per stage (html_timeline.cpp).
std::string timeline_svg(const sim::Timeline& timeline);
// One stacked bar per plan, best first, on one time scale (html_breakdown.cpp).
std::string breakdown_svg(std::span<const Estimate> rows);

// The page's stylesheet, its error hook (first in <head>, so it also sees a
// broken main script) and its main script (html_assets.cpp).
extern const std::string_view kStyle;
extern const std::string_view kErrorHook;
extern const std::string_view kScript;

}  // namespace cuboid::html
