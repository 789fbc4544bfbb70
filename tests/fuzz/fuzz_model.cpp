// Fuzzes the model card loader (models/*.json; HF keys are routed to the HF
// importer as `cuboid plan --model` does) and what the planner derives from
// a loaded model first: parameter counts and the card written back.
#include <cstddef>
#include <cstdint>

#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  try {
    const cuboid::ModelSpec m = cuboid::model_from_json(*j, cuboid::fuzz::kSource);
    (void)m.parameter_count(1);
    (void)m.parameter_count(8);
    (void)m.active_parameter_count(8);
    // A loaded model written back as a card must load again.
    cuboid::fuzz::must_succeed("loading the card written from a loaded model",
                               [&] { return cuboid::model_from_json(cuboid::model_to_json(m), "round-trip"); });
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
