#include "number_flags.hpp"

#include <cmath>
#include <cstdlib>
#include <string>

#include "cuboid/core/error.hpp"

namespace cuboid::cli {

void require_finite_numbers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    // The type name starts with FLOAT for float and double options (then any range check's words).
    if (opt->get_type_name().rfind("FLOAT", 0) != 0 || opt->get_lnames().empty()) continue;
    const std::string flag = "--" + opt->get_lnames().front();
    opt->check(CLI::Validator(
        [flag](std::string& text) -> std::string {
          char* end = nullptr;
          const double v = std::strtod(text.c_str(), &end);
          // Text that is no number at all is left to CLI11's conversion error.
          if (end != text.c_str() && *end == '\0' && !std::isfinite(v))
            throw InputError("command line", flag, "is not a finite number: " + text.substr(0, 20),
                             "give a finite number");
          return {};
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) require_finite_numbers(*sub);
}

}  // namespace cuboid::cli
