#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// One exception type for bad input. It carries where the problem is (a file or
// a command-line flag), which field, what is wrong and how to fix it; the CLI
// turns it into exit code 2 and one line on stderr.
#include <stdexcept>
#include <string>
#include <string_view>

namespace cuboid {

class InputError : public std::runtime_error {
 public:
  // source: a file path or "command line"; field: a JSON path ("hidden_size",
  // "inter_node.nic_bandwidth_Gbps") or a flag ("--tp"); problem: what is wrong;
  // fix: what the user should do instead.
  InputError(std::string source, std::string field, std::string problem, std::string fix);

  const std::string& source() const noexcept { return source_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& problem() const noexcept { return problem_; }
  const std::string& fix() const noexcept { return fix_; }

 private:
  std::string source_;
  std::string field_;
  std::string problem_;
  std::string fix_;
};

// The one-line message: "<source>: <field>: <problem> (fix: <fix>)". Each part
// is kept on one line (control characters escaped) and clipped to a bounded
// length, so a message never spills a user's huge value or a newline.

std::string format_input_error(const std::string& source, const std::string& field,
                               const std::string& problem, const std::string& fix);

// A user's string as a message quotes it: JSON-quoted (control characters
// escaped), at most `max` characters of it, and its length when clipped:
// "abc..." (50000000 characters).
std::string quote_value(std::string_view value, std::size_t max = 40);

}  // namespace cuboid
