#include "cuboid/core/error.hpp"

#include <utility>

namespace cuboid {

std::string format_input_error(const std::string& source, const std::string& field,
                               const std::string& problem, const std::string& fix) {
  std::string msg = source;
  if (!field.empty()) msg += ": " + field;
  msg += ": " + problem;
  if (!fix.empty()) msg += " (fix: " + fix + ")";
  return msg;
}

InputError::InputError(std::string source, std::string field, std::string problem, std::string fix)
    : std::runtime_error(format_input_error(source, field, problem, fix)),
      source_(std::move(source)),
      field_(std::move(field)),
      problem_(std::move(problem)),
      fix_(std::move(fix)) {}

}  // namespace cuboid
