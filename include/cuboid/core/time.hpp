#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Simulated and estimated time: integer nanoseconds, as ns-3 keeps time
// (src/core/model/nstime.h), so sums and orderings are exact and every run
// is deterministic. The cost layer prices in it and the simulator runs in it.
#include <cstdint>
#include <limits>

namespace cuboid {

using TimeNs = std::int64_t;
// Not yet known, or never (the engine's start and end of a task not run).
inline constexpr TimeNs kNever = std::numeric_limits<TimeNs>::max();

}  // namespace cuboid
