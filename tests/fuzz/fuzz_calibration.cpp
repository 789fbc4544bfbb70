// Fuzzes the "calibration" section of a cluster card (cuboid.calibration/1)
// and the cost model's lookups into an accepted one; what the writer makes of
// an accepted calibration must load again.
#include <cstddef>
#include <cstdint>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/error.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  cuboid::Calibration cal;
  try {
    cal = cuboid::calibration_from_json(*j, cuboid::fuzz::kSource);
  } catch (const cuboid::InputError&) {
    return 0;
  }
  (void)cuboid::calibrated_gemm_ns(cal, 4096, 4096, 4096, 1);
  (void)cuboid::calibrated_gemm_ns(cal, 1, 7, 1 << 20, 3);
  for (const auto& g : cal.gemms) (void)cuboid::calibrated_gemm_ns(cal, g.m, g.n + 1, g.k, g.batch);
  for (const auto& [name, k] : cal.kernels) (void)cuboid::calibrated_kernel_ns(cal, name, 1e6);
  for (const auto& [key, c] : cal.collectives)
    (void)cuboid::calibrated_collective_ns(cal, key.collective, key.tier, key.group_size, 1 << 20);
  cuboid::fuzz::must_succeed("loading the calibration written from an accepted one", [&] {
    return cuboid::calibration_from_json(cuboid::calibration_to_json(cal), "round-trip");
  });
  return 0;
}
