#include "cuboid/core/error.hpp"

#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace cuboid {

namespace {

// Limits on each part of a message: a path, a JSON field path or flag, and
// the problem or fix text (cuboid's own longest is a few hundred characters).
constexpr std::size_t kMaxSource = 400;
constexpr std::size_t kMaxField = 200;
constexpr std::size_t kMaxText = 2000;

// Cuts `s` to at most `max` bytes without splitting a UTF-8 character.
std::string_view utf8_prefix(std::string_view s, std::size_t max) {
  if (s.size() <= max) return s;
  std::size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

// `s` on one line (control characters as \n, \t or \xHH) and at most `max`
// bytes, with the original length when clipped.
std::string one_line(std::string_view s, std::size_t max) {
  std::string out;
  for (char ch : utf8_prefix(s, max)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += ch;
  }
  if (s.size() > max) out += fmt::format("... ({} characters)", s.size());
  return out;
}

}  // namespace

std::string quote_value(std::string_view value, std::size_t max) {
  const std::string_view kept = utf8_prefix(value, max);
  std::string out = nlohmann::json(std::string(kept)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (kept.size() < value.size()) out.insert(out.size() - 1, "...").append(fmt::format(" ({} characters)", value.size()));
  return out;
}

std::string format_input_error(const std::string& source, const std::string& field,
                               const std::string& problem, const std::string& fix) {
  std::string msg = one_line(source, kMaxSource);
  if (!field.empty()) msg += ": " + one_line(field, kMaxField);
  msg += ": " + one_line(problem, kMaxText);
  if (!fix.empty()) msg += " (fix: " + one_line(fix, kMaxText) + ")";
  return msg;
}

InputError::InputError(std::string source, std::string field, std::string problem, std::string fix)
    : std::runtime_error(format_input_error(source, field, problem, fix)),
      source_(std::move(source)),
      field_(std::move(field)),
      problem_(std::move(problem)),
      fix_(std::move(fix)) {}

}  // namespace cuboid
