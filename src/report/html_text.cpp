// The HTML report's text helpers.
#include <string>

#include <fmt/format.h>

#include "cuboid/io/svg.hpp"
#include "html_parts.hpp"

namespace cuboid::html {

std::string escape(std::string_view s) { return xml_escape(s); }

std::string inline_svg(std::string_view svg) {
  const std::size_t at = svg.find("<svg");
  return std::string(at == std::string_view::npos ? svg : svg.substr(at));
}

std::string format_seconds(double s) {
  if (s == 0) return "0 s";
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace cuboid::html
