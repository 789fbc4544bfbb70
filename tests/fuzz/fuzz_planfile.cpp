// Fuzzes the plan file reader (cuboid.plan/1: inline model, cluster shape,
// parallel settings, rank mapping).
#include <cstddef>
#include <cstdint>

#include "cuboid/core/error.hpp"
#include "cuboid/io/planfile.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  try {
    const cuboid::PlanFile pf = cuboid::plan_file_from_json(*j, cuboid::fuzz::kSource);
    (void)pf.plan.world_size();
    (void)pf.plan.tokens_per_iteration();
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
