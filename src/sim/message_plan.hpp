#pragma once
// Private to the simulator: where the pipeline's p2p messages happen. Each
// stage communicates at points after some of its passes (schedule-dependent,
// see plan()); a point's batched sends and receives must finish before the
// stage's next pass (Megatron's p2p is synchronous).
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <span>
#include <vector>

#include "cuboid/core/schedule.hpp"
#include "cuboid/sim/engine.hpp"

namespace cuboid::sim::detail {

// A pass (direction, micro-batch, virtual stage) as one index: what the
// builder's pass table and a message's producer are numbered by.
inline std::size_t pass_index(Direction d, int mb, int vs, int micro_batches, int virtual_stages) {
  const int dir = d == Direction::forward ? 0 : 1;
  return static_cast<std::size_t>((dir * micro_batches + mb) * virtual_stages + vs);
}

struct Message {
  int from = 0, to = 0;            // stages
  int send_pos = 0, recv_pos = 0;  // passes after which sender / receiver reach the point (recv -1: start)
  std::uint32_t producer = 0;      // the producer's pass (pass_index)
  ScheduleStep consumer;
  bool created = false;
};

class MessagePlan {
 public:
  // `mem` holds the tables (the simulation's arena); not owned.
  explicit MessagePlan(std::pmr::memory_resource* mem)
      : messages_(mem), point_off_(mem), point_msgs_(mem), block_(mem), block_len_(mem) {}
  // Every message between stages of `order` (pp stages, v virtual stages
  // each; `ep_overlap`: the EP overlap's order, pipeline_order's) and the
  // points they happen at.
  void plan(const std::vector<StageOrder>& order, Schedule schedule, int pp, int micro_batches, int v,
            bool ep_overlap = false);

  Message& message(std::uint32_t id) { return messages_[id]; }
  std::size_t num_messages() const { return messages_.size(); }
  // The communication points, flat: point(stage, pos) is after the stage's
  // pass `pos` (-1: before its first).
  std::size_t point(int stage, int pos) const {
    return point_base_[static_cast<std::size_t>(stage)] + static_cast<std::size_t>(pos + 1);
  }
  // The messages touching point `pt`, in creation order.
  std::span<const std::uint32_t> messages_at(std::size_t pt) const {
    return {point_msgs_.data() + point_off_[pt], point_off_[pt + 1] - point_off_[pt]};
  }
  // Each message at a point adds one task to the point's block once created
  // (its send at the sender's point, its arrival at the receiver's), so a
  // point's messages and its block share one range.
  void add_to_block(std::size_t pt, TaskId t) { block_[point_off_[pt] + block_len_[pt]++] = t; }
  // The tasks of point `pt`'s messages created so far.
  std::span<const TaskId> block_of(std::size_t pt) const { return {block_.data() + point_off_[pt], block_len_[pt]}; }
  // Are all of point `pt`'s messages created?
  bool complete(std::size_t pt) const { return block_len_[pt] == point_off_[pt + 1] - point_off_[pt]; }

 private:
  std::pmr::vector<Message> messages_;
  std::vector<std::size_t> point_base_;      // [stage] -> its first point
  std::pmr::vector<std::uint32_t> point_off_;   // [point] -> its range in point_msgs_ and block_ (one more entry)
  std::pmr::vector<std::uint32_t> point_msgs_;  // messages touching each point, in creation order
  std::pmr::vector<TaskId> block_;              // the tasks created for them, in creation order
  std::pmr::vector<std::uint32_t> block_len_;   // [point] -> how many are created
};

}  // namespace cuboid::sim::detail
