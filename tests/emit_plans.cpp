// Writes the fixture plan files (tests/plan_fixtures.hpp) into the directory
// given as the only argument, for tests/validate_plan_schema.py.
#include <cstdio>
#include <exception>
#include <filesystem>

#include "cuboid/io/planfile.hpp"
#include "plan_fixtures.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: emit_plans DIR\n");
    return 2;
  }
  try {
    for (const auto& f : cuboid::test::fixtures()) {
      const auto path = std::filesystem::path(argv[1]) / (f.name + ".plan.json");
      cuboid::write_output_file(path, cuboid::test::fixture_json(f).dump(2) + "\n");
      std::printf("%s\n", path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "emit_plans: %s\n", e.what());
    return 1;
  }
  return 0;
}
