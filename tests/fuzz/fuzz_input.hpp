#pragma once
// Shared by the libFuzzer harnesses: the contract is that bad input throws
// cuboid::InputError (exit code 2 in the CLI) and nothing else. Any other
// exception escapes the harness, and libFuzzer reports it as a crash, as it
// does sanitizer reports, aborts and timeouts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"

namespace cuboid::fuzz {

inline constexpr const char* kSource = "fuzz.json";

inline std::string as_text(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The bytes as the loaders see a file: parsed by the same function
// read_json_file uses; nullopt when that rejects it (with InputError).
inline std::optional<nlohmann::json> parse(const std::uint8_t* data, std::size_t size) {
  try {
    return parse_json_text(as_text(data, size), kSource);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// For what must not fail on a value a loader accepted (e.g. loading back what
// was written from it): an InputError here is a bug, so it aborts.
template <typename F>
auto must_succeed(const char* what, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    std::cerr << "fuzz: " << what << " failed on an accepted input: " << e.what() << "\n";
    std::abort();
  }
}

}  // namespace cuboid::fuzz
