// Fuzzes the measurements reader (cuboid.measurements/1, what `cuboid run
// --out` writes and `cuboid validate` / calibration read back).
#include <cstddef>
#include <cstdint>

#include "cuboid/core/error.hpp"
#include "cuboid/io/measurements.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  try {
    const cuboid::Measurements m = cuboid::measurements_from_json(*j, cuboid::fuzz::kSource);
    const cuboid::MeasuredRank& slowest = m.slowest_rank();
    for (const cuboid::MeasuredOp& op : slowest.ops) (void)slowest.find(op.name);
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
