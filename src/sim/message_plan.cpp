// The pipeline's p2p messages and their points (message_plan.hpp).
#include "message_plan.hpp"

#include <limits>

namespace cuboid::sim::detail {

// Where Megatron-LM communicates (schedules.py): 1F1B after every pass
// (send_forward_recv_backward after a forward, send_backward_recv_forward
// after a backward); the interleaved schedule after every warm-up forward and
// cool-down backward but, in the steady state, once per forward/backward pair
// (send_forward_backward_recv_forward_backward after the backward). A pass's
// output is sent at the first point at or after it; its input is received at
// the last point before it (or before the first pass).
void MessagePlan::plan(const std::vector<StageOrder>& order, Schedule schedule, int pp, int mbs, int v,
                       bool ep_overlap) {
  const int vs_count = pp * v;
  point_base_.assign(static_cast<std::size_t>(pp), 0);
  std::size_t points = 0;
  std::vector<std::vector<int>> send_pos(static_cast<std::size_t>(pp)), recv_pos(static_cast<std::size_t>(pp));
  std::vector<std::vector<int>> pos_of(static_cast<std::size_t>(pp));  // (dir, mb, chunk) -> position
  for (int s = 0; s < pp; ++s) {
    const auto us = static_cast<std::size_t>(s);
    const StageOrder& o = order[us];
    const int n = static_cast<int>(o.size());
    const int w = warmup_steps(schedule, pp, s, mbs, v, ep_overlap);
    std::vector<bool> is_point(static_cast<std::size_t>(n), true);
    if (schedule == Schedule::interleaved) {
      const int steady = n / 2 - w;  // forward/backward pairs
      for (int k = 0; k < steady; ++k) is_point[static_cast<std::size_t>(w + 2 * k)] = false;
    }
    send_pos[us].assign(static_cast<std::size_t>(n), n - 1);
    recv_pos[us].assign(static_cast<std::size_t>(n), -1);
    int next = n - 1;
    for (int i = n - 1; i >= 0; --i) {
      if (is_point[static_cast<std::size_t>(i)]) next = i;
      send_pos[us][static_cast<std::size_t>(i)] = next;
    }
    int last = -1;
    for (int i = 0; i < n; ++i) {
      recv_pos[us][static_cast<std::size_t>(i)] = last;
      if (is_point[static_cast<std::size_t>(i)]) last = i;
    }
    pos_of[us].assign(static_cast<std::size_t>(2 * mbs * v), 0);
    for (int i = 0; i < n; ++i) {
      const ScheduleStep& st = o[static_cast<std::size_t>(i)];
      pos_of[us][static_cast<std::size_t>(((st.dir == Direction::forward ? 0 : 1) * mbs + st.micro_batch) * v + st.chunk)] = i;
    }
    point_base_[us] = points;
    points += static_cast<std::size_t>(n + 1);
  }
  messages_.reserve(points);  // at most one per pass (the arena keeps a regrown vector's old blocks)
  for (int r = 0; r < pp; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    for (int i = 0; i < static_cast<int>(order[ur].size()); ++i) {
      const ScheduleStep& st = order[ur][static_cast<std::size_t>(i)];
      const bool fwd = st.dir == Direction::forward;
      const int vs = st.chunk * pp + r;
      const int from_vs = fwd ? vs - 1 : vs + 1;
      if (from_vs < 0 || from_vs >= vs_count || from_vs % pp == r) continue;
      Message msg;
      msg.from = from_vs % pp;
      msg.to = r;
      const auto uf = static_cast<std::size_t>(msg.from);
      const int producer = pos_of[uf][static_cast<std::size_t>(((fwd ? 0 : 1) * mbs + st.micro_batch) * v + from_vs / pp)];
      msg.send_pos = send_pos[uf][static_cast<std::size_t>(producer)];
      msg.recv_pos = recv_pos[ur][static_cast<std::size_t>(i)];
      msg.producer = static_cast<std::uint32_t>(pass_index(st.dir, st.micro_batch, from_vs, mbs, vs_count));
      msg.consumer = st;
      messages_.push_back(msg);
    }
  }
  // Each point's messages in creation order (counted, then placed).
  point_off_.assign(points + 1, 0);
  for (const Message& msg : messages_) {
    ++point_off_[point(msg.from, msg.send_pos) + 1];
    ++point_off_[point(msg.to, msg.recv_pos) + 1];
  }
  for (std::size_t p = 0; p < points; ++p) point_off_[p + 1] += point_off_[p];
  point_msgs_.assign(point_off_[points], 0);
  block_.assign(point_off_[points], std::numeric_limits<TaskId>::max());
  block_len_.assign(points, 0);
  std::vector<std::uint32_t> fill(point_off_.begin(), point_off_.end() - 1);
  for (std::uint32_t id = 0; id < messages_.size(); ++id) {
    const Message& msg = messages_[id];
    point_msgs_[fill[point(msg.from, msg.send_pos)]++] = id;
    point_msgs_[fill[point(msg.to, msg.recv_pos)]++] = id;
  }
}

}  // namespace cuboid::sim::detail
