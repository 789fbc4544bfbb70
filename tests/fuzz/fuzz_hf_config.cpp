// Fuzzes the HuggingFace config.json importer (LLaMA- and GPT-2-style keys).
#include <cstddef>
#include <cstdint>

#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  try {
    const cuboid::ModelSpec m = cuboid::model_from_hf_config(*j, "fuzz/config.json");
    (void)m.parameter_count(1);
    cuboid::fuzz::must_succeed("loading the card written from an imported config",
                               [&] { return cuboid::model_from_json(cuboid::model_to_json(m), "round-trip"); });
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
