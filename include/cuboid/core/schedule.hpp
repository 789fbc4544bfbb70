#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Pipeline schedules: the order in which each pipeline stage runs the forward
// and backward passes of its micro-batches and model chunks. A schedule is a
// pure function of (pp, micro-batches, virtual stages); the simulator plays
// the order with the real dependencies between stages, so the bubble comes
// out of the replay, never from a formula.
//
// Conventions: stage s in [0, pp), micro-batch in [0, m), chunk in [0, v).
// Model chunk c of stage s holds the layers of virtual stage c * pp + s (as in
// Megatron's interleaved schedule), so a micro-batch's forward visits
// (s0,c0), (s1,c0), ..., (s_{p-1},c0), (s0,c1), ... and its backward the reverse.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cuboid/core/plan.hpp"

namespace cuboid {

enum class Direction : std::uint8_t { forward, backward };

struct ScheduleStep {
  Direction dir = Direction::forward;
  int micro_batch = 0;
  int chunk = 0;
  friend bool operator==(const ScheduleStep&, const ScheduleStep&) = default;
};

// One stage's steps in execution order; one entry per stage.
using StageOrder = std::vector<ScheduleStep>;

struct ScheduleInfo {
  Schedule schedule;
  std::string_view name;         // as on the command line (--schedule NAME)
  std::string_view description;  // one line for `cuboid list schedules`
};

// The registry, in a stable order.
std::span<const ScheduleInfo> pipeline_schedules();

// Per-stage orders.
// * gpipe: every forward (chunk-major, then micro-batch), then every backward
//   in the reverse chunk order, micro-batches ascending.
// * 1f1b (PipeDream-flush, Megatron's forward_backward_pipelining_without_
//   interleaving): min(pp - s - 1, m) warm-up forwards, then one forward /
//   one backward alternating, then the cool-down backwards. v must be 1.
// * interleaved (Megatron's forward_backward_pipelining_with_interleaving):
//   forward step k runs chunk (k mod (pp v)) / pp of micro-batch
//   (k / (pp v)) pp + k mod pp (backward: the chunk mirrored, v - 1 - c);
//   warm-up (pp - s - 1) * 2 + (v - 1) * pp steps (all m v when m == pp, as
//   Megatron does), then 1F1B over steps, then cool-down. Needs m % pp == 0.
//   `ep_overlap` (--overlap-moe-expert-parallel-comm): one more warm-up
//   step, so that each steady-state forward is independent of the backward
//   it is combined with (get_pp_rank_microbatches, schedules.py:966-970 at
//   d98e8a64); other schedules ignore it.
// Throws std::invalid_argument on sizes the schedule does not support.
std::vector<StageOrder> pipeline_order(Schedule schedule, int pp, int micro_batches, int virtual_stages = 1,
                                       bool ep_overlap = false);

// Forward steps each stage runs before its first backward (the warm-up), as
// the schedule defines it; activations in flight peak at about this + 1.
int warmup_steps(Schedule schedule, int pp, int stage, int micro_batches, int virtual_stages = 1,
                 bool ep_overlap = false);

}  // namespace cuboid
