// Fuzzes the trainer preset loader (trainers/*.json, embedded in the binary).
// The file is named after the preset it holds, as the shipped ones are, so
// the fuzzer reaches the fields past the name; what the loader accepts must
// hold what the planner relies on.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuboid/core/error.hpp"
#include "cuboid/core/trainer.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  const auto name = j->find("name");
  const std::string file = name != j->end() && name->is_string() ? name->get<std::string>() : "fuzz";
  try {
    const cuboid::TrainerPreset t =
        cuboid::parse_trainer(cuboid::fuzz::as_text(data, size), "trainers/" + file + ".json");
    const bool stages_ok = !t.zero_stages.empty() && std::is_sorted(t.zero_stages.begin(), t.zero_stages.end()) &&
                           t.zero_stages.front() >= 0 && t.zero_stages.back() <= 3;
    const bool sourced =
        std::all_of(t.sources.begin(), t.sources.end(), [](const auto& s) { return !s.source.empty(); });
    if (!stages_ok || !sourced || t.settings.preset != t.name) std::abort();
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
