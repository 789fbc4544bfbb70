#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// ZeRO-3's gather schedule for one pass (TrainerSettings::zero3_*): which
// units a trainer gathers, where it issues each gather and where its host
// waits for the device. The simulator plays it as tasks, the analytical
// estimate as a recurrence; both take it from here, so they agree on it.
#include <cstdint>
#include <span>
#include <vector>

#include "cuboid/core/plan.hpp"

namespace cuboid {

// One unit of a pass, in execution order: a block, or one weight tensor's ops.
struct Zero3Use {
  double params = 0;         // elements it gathers on one rank (0: all resident)
  std::int64_t tensor = -1;  // the same id on every use of one tensor in the pass; -1: used once
};

struct Zero3PassPlan {
  // Per use: its parameters are gathered for it (else resident, or still
  // gathered since the tensor's previous use).
  std::vector<std::uint8_t> gathered;
  // Per use: the host waits for the device before running it (zero3_sync,
  // with a gather of its own to wait for).
  std::vector<std::uint8_t> waits;
  // The gathers issued when a use is reached, in issue order: use u issues
  // issued[issue_begin[u] .. issue_begin[u + 1]) (itself first when it was
  // not prefetched).
  std::vector<std::uint32_t> issue_begin;
  std::vector<std::uint32_t> issued;
  std::span<const std::uint32_t> issued_at(std::size_t u) const {
    return {issued.data() + issue_begin[u], issued.data() + issue_begin[u + 1]};
  }
};

// The plan of one pass. Without zero3_sync, reaching a use issues the
// gathers of the prefetch window after it (those not yet issued); with it
// (DeepSpeed v0.5.4), the host waits at each use whose gather is in flight,
// which completes every gather in flight, and issues the next window only
// when none is in flight.
Zero3PassPlan plan_zero3_pass(std::span<const Zero3Use> uses, const TrainerSettings& s);

}  // namespace cuboid
