#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// The simulated iteration as blocks per stage and row, for pictures
// (SimOptions::timeline): on the compute row each forward and backward step
// of the schedule and whatever else runs on the compute stream outside the
// steps (the optimizer step); on the other rows every TP collective, PP
// send/recv and DP collective. These are the trace's events (trace.hpp)
// without the kernels nested in the steps: the same names, rows and times.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cuboid::sim {

// The streams of a simulated GPU, in the trace's thread order.
// ep_a2a: the EP overlap's all-to-all stream (--moe-ep-overlap), beside the TP stream.
enum class TimelineRow : std::uint8_t { compute, tp, pp_forward, pp_backward, dp, host_copy, ep_a2a };
inline constexpr std::size_t kTimelineRows = 7;
// The trace's thread names, by TimelineRow.
inline constexpr std::array<std::string_view, kTimelineRows> kTimelineRowNames{
    "compute", "tp comm", "pp send/recv (activations)", "pp send/recv (gradients)", "dp comm",
    "host copies (offload)", "ep a2a (overlap)"};

struct TimelineBlock {
  int stage = 0;
  TimelineRow row = TimelineRow::compute;
  std::string name;      // "F3", "B0.1", "optimizer step", "grad bucket B7", ...
  std::string category;  // "forward", "backward", "optimizer", "tp", "pp", "dp", ...
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

struct Timeline {
  std::vector<int> stage_ranks;       // the simulated GPU of each stage (the trace's pid)
  std::vector<TimelineBlock> blocks;  // by stage, then row, then start
  std::int64_t end_ns = 0;            // the iteration's end
};

}  // namespace cuboid::sim
