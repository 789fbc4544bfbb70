// Pipeline schedules as per-stage step orders (see schedule.hpp). The orders
// follow Megatron-LM's schedules.py (forward_backward_pipelining_without_
// interleaving / _with_interleaving) step for step, so the simulator's bubble
// is Megatron's.
#include "cuboid/core/schedule.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace cuboid {

namespace {

constexpr std::array kSchedules{
    ScheduleInfo{Schedule::gpipe, "gpipe",
                 "GPipe: all forward passes, then all backward passes (every micro-batch's activations in flight)"},
    ScheduleInfo{Schedule::one_f_one_b, "1f1b",
                 "1F1B / PipeDream-flush: pp - stage - 1 warm-up forwards, then alternate one forward and one backward"},
    ScheduleInfo{Schedule::interleaved, "interleaved",
                 "Megatron's interleaved 1F1B: v model chunks per stage, micro-batches in groups of pp, bubble / v"},
};

void check_sizes(Schedule schedule, int pp, int m, int v) {
  if (pp < 1 || m < 1 || v < 1) {
    throw std::invalid_argument("pipeline_order: pp, micro-batches and virtual stages must be >= 1 (got pp " +
                                std::to_string(pp) + ", m " + std::to_string(m) + ", v " + std::to_string(v) + ")");
  }
  if (schedule == Schedule::one_f_one_b && v != 1) {
    throw std::invalid_argument("pipeline_order: 1f1b runs one model chunk per stage; use interleaved for v > 1");
  }
  if (schedule == Schedule::interleaved && m % pp != 0) {
    throw std::invalid_argument("pipeline_order: the interleaved schedule needs micro-batches (" + std::to_string(m) +
                                ") divisible by pp (" + std::to_string(pp) + "), as Megatron-LM asserts");
  }
}

// Megatron's get_model_chunk_id and the micro-batch the k-th step of a chunk
// works on: steps come in groups of pp * v; inside a group, pp consecutive
// steps per chunk.
ScheduleStep interleaved_step(int k, Direction dir, int pp, int v) {
  const int group = k / (pp * v);
  const int in_group = k % (pp * v);
  int chunk = in_group / pp;
  if (dir == Direction::backward) chunk = v - 1 - chunk;
  return ScheduleStep{dir, group * pp + in_group % pp, chunk};
}

StageOrder interleaved_stage(int pp, int stage, int m, int v, bool ep_overlap) {
  const int total = m * v;
  const int warmup = warmup_steps(Schedule::interleaved, pp, stage, m, v, ep_overlap);
  StageOrder order;
  order.reserve(static_cast<std::size_t>(2 * total));
  for (int k = 0; k < warmup; ++k) order.push_back(interleaved_step(k, Direction::forward, pp, v));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(interleaved_step(k + warmup, Direction::forward, pp, v));
    order.push_back(interleaved_step(k, Direction::backward, pp, v));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(interleaved_step(k, Direction::backward, pp, v));
  return order;
}

StageOrder one_f_one_b_stage(int pp, int stage, int m) {
  const int warmup = warmup_steps(Schedule::one_f_one_b, pp, stage, m, 1);
  StageOrder order;
  order.reserve(static_cast<std::size_t>(2 * m));
  for (int i = 0; i < warmup; ++i) order.push_back({Direction::forward, i, 0});
  for (int i = 0; i < m - warmup; ++i) {
    order.push_back({Direction::forward, i + warmup, 0});
    order.push_back({Direction::backward, i, 0});
  }
  for (int i = m - warmup; i < m; ++i) order.push_back({Direction::backward, i, 0});
  return order;
}

StageOrder gpipe_stage(int m, int v) {
  StageOrder order;
  order.reserve(static_cast<std::size_t>(2 * m * v));
  for (int c = 0; c < v; ++c) {
    for (int i = 0; i < m; ++i) order.push_back({Direction::forward, i, c});
  }
  for (int c = v - 1; c >= 0; --c) {
    for (int i = 0; i < m; ++i) order.push_back({Direction::backward, i, c});
  }
  return order;
}

}  // namespace

std::span<const ScheduleInfo> pipeline_schedules() { return kSchedules; }

int warmup_steps(Schedule schedule, int pp, int stage, int m, int v, bool ep_overlap) {
  switch (schedule) {
    case Schedule::gpipe:
      return m * v;
    case Schedule::one_f_one_b:
      return std::min(pp - stage - 1, m);
    case Schedule::interleaved: {
      const int total = m * v;
      // Megatron: with exactly pp micro-batches every forward runs first.
      if (m == pp) return total;
      return std::min((pp - stage - 1) * 2 + (v - 1) * pp + (ep_overlap ? 1 : 0), total);
    }
  }
  return 0;
}

std::vector<StageOrder> pipeline_order(Schedule schedule, int pp, int m, int v, bool ep_overlap) {
  check_sizes(schedule, pp, m, v);
  std::vector<StageOrder> stages;
  stages.reserve(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    switch (schedule) {
      case Schedule::gpipe: stages.push_back(gpipe_stage(m, v)); break;
      case Schedule::one_f_one_b: stages.push_back(one_f_one_b_stage(pp, s, m)); break;
      case Schedule::interleaved: stages.push_back(interleaved_stage(pp, s, m, v, ep_overlap)); break;
    }
  }
  return stages;
}

}  // namespace cuboid
