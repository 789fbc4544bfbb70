#pragma once
// Small helpers shared by the SVG writers (svg_mesh.cpp, svg_pareto.cpp):
// XML escaping, the colour palette and the document frame. Private to src/.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cuboid/io/svg.hpp"

namespace cuboid::svg_text {

// Text and attribute values (svg.hpp's xml_escape).
inline std::string escape(std::string_view s) { return xml_escape(s); }

// Okabe & Ito (2008), "Color Universal Design": eight colours told apart with
// every common colour-vision deficiency. Text colour chosen per fill for contrast.
struct Swatch {
  const char* fill;
  const char* text;
};
inline constexpr std::array<Swatch, 8> kPalette{{
    {"#E69F00", "#000000"},  // orange
    {"#56B4E9", "#000000"},  // sky blue
    {"#009E73", "#FFFFFF"},  // bluish green
    {"#F0E442", "#000000"},  // yellow
    {"#0072B2", "#FFFFFF"},  // blue
    {"#D55E00", "#FFFFFF"},  // vermillion
    {"#CC79A7", "#000000"},  // reddish purple
    {"#BBBBBB", "#000000"},  // grey (Okabe-Ito black, lightened so the labels stay readable)
}};
inline const Swatch& swatch(int i) { return kPalette[static_cast<std::size_t>(i) % kPalette.size()]; }

inline constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";
inline constexpr const char* kMonoFont = "DejaVu Sans Mono, Menlo, Consolas, monospace";
inline constexpr const char* kWarn = "#C00000";

inline std::string open_svg(int width, int height) {
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"{2}\" font-size=\"12\">\n"
      "<rect class=\"background\" x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#FFFFFF\"/>\n",
      width, height, kFont);
}

// Rough advance width of text in the sans font, for layout only.
inline int text_width_px(std::string_view s, double font_px) {
  return static_cast<int>(static_cast<double>(s.size()) * font_px * 0.6 + 0.5);
}

}  // namespace cuboid::svg_text
