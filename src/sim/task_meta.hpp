#pragma once
// Private to the simulator: what the breakdown and the trace need of each task.
#include <cstdint>

namespace cuboid::sim::detail {

// What a task counts as in the breakdown, in priority order.
enum class Category : std::uint8_t { optimizer, compute, tp, pp, dp, cp, ep, offload, none };
// The trace thread (row) a task is drawn on, per rank.
enum TraceThread : std::uint8_t {
  kThreadCompute = 0, kThreadTp = 1, kThreadPpFwd = 2, kThreadPpBwd = 3, kThreadDp = 4, kThreadHostCopy = 5,
  kThreadA2a = 6  // the EP overlap's a2a stream
};
inline constexpr std::uint16_t kNoStage = 0xFFFF;

struct TaskMeta {
  Category category = Category::none;
  std::uint8_t thread = 0;  // TraceThread
  std::uint16_t stage = kNoStage;
  std::uint16_t stage2 = kNoStage;  // the other side of a p2p / embedding all-reduce
};

}  // namespace cuboid::sim::detail
