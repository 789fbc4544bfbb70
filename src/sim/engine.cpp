// The event loop: a 4-ary heap of (time, seq) events plus the network model,
// asked for its next flow completion (SimGrid's model boundary). Tasks that
// become ready are collected and started after each event, in the order they
// became ready, so a run is a pure function of the inputs.
#include "cuboid/sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace cuboid::sim {

std::string_view to_string(StreamKind k) {
  switch (k) {
    case StreamKind::compute: return "compute";
    case StreamKind::tp: return "tp";
    case StreamKind::pp: return "pp";
    case StreamKind::dp: return "dp";
    case StreamKind::other: return "other";
  }
  return "?";
}

namespace {

// (time, key) as one unsigned 128-bit number (the time stored with its sign
// bit flipped, so negative times order first too): its order is the
// lexicographic (time, sequence) order, and comparing it takes two
// flag-setting instructions instead of two unpredictable branches.
__extension__ typedef unsigned __int128 Order;

template <typename E>
[[gnu::always_inline]] inline Order order(const E& e) {
  return (static_cast<Order>(e.time_key) << 64) | e.key;
}

// A 4-ary min-heap: half the depth of a binary heap, and a node's children
// share a cache line or two. (time, seq) is a total order, so the pop order,
// and thus the run, is the same as with any other heap. Its n events are
// h[0, n); h[n, h.size()), at least kHeapArity slots, hold kSentinel.
constexpr std::size_t kHeapArity = 4;

// Orders after every event: an event's key has all bits set only with
// sequence number 2^31 - 1 *and* task 2^32 - 1 (and a time of kNever).
template <typename E>
constexpr E kSentinel{~std::uint64_t{0}, ~std::uint64_t{0}};

// Places `e` at the hole at `i`, moving it up past larger parents, but not
// above `top`.
template <typename H, typename E>
void heap_sift_up(H& h, std::size_t i, std::size_t top, const E& e) {
  const Order key = order(e);
  while (i > top) {
    const std::size_t parent = (i - 1) / kHeapArity;
    if (order(h[parent]) <= key) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = e;
}

template <typename H, typename E>
void heap_push(H& h, std::size_t& n, const E& e) {
  const std::size_t i = n++;
  if (h.size() < n + kHeapArity) h.resize(n + kHeapArity, kSentinel<E>);
  heap_sift_up(h, i, 0, e);
}

// Places `e` at the hole at `start` (a pop's root, or a replaced root).
// Floyd's bottom-up variant: the hole first moves down along the smallest
// children to a leaf without comparing them with `e`, then `e` rises from
// there; the elements placed here (a new end time, the last leaf) are
// nearly always among the latest, so they rise little, and each level
// costs one comparison fewer.
template <typename H, typename E>
void heap_sift_down(H& h, std::size_t n, std::size_t start, const E& e) {
  std::size_t i = start;
  while (true) {
    const std::size_t first = kHeapArity * i + 1;
    if (first >= n) break;
    // A tournament of two pairs, without branches on the comparisons; a
    // last node's missing children are sentinels, which never win. Only
    // indices are selected (the winners' keys are read again): selecting
    // 128-bit keys takes twice the registers and spills.
    static_assert(kHeapArity == 4);
    const std::size_t w01 = first + (order(h[first + 1]) < order(h[first]));
    const std::size_t w23 = first + 2 + (order(h[first + 3]) < order(h[first + 2]));
    const std::size_t best = order(h[w23]) < order(h[w01]) ? w23 : w01;
    h[i] = h[best];
    i = best;
  }
  heap_sift_up(h, i, start, e);
}

// Removes the root (already read by the caller).
template <typename H>
void heap_pop_root(H& h, std::size_t& n) {
  using E = typename H::value_type;
  const E last = h[--n];
  h[n] = kSentinel<E>;
  if (n > 0) heap_sift_down(h, n, 0, last);
}

[[noreturn, gnu::cold]] void throw_bad_dep(TaskId d) {
  throw std::out_of_range("Engine: dependency on task " + std::to_string(d) + " not yet added");
}

[[noreturn, gnu::cold]] void throw_bad_stream(StreamId s) {
  throw std::out_of_range("Engine: stream " + std::to_string(s) + " does not exist");
}

}  // namespace

StreamId Engine::add_stream(int gpu, StreamKind kind) {
  Stream s;
  s.info.gpu = gpu;
  s.info.kind = kind;
  streams_.push_back(std::move(s));
  return static_cast<StreamId>(streams_.size() - 1);
}

void Engine::reserve(std::size_t tasks, std::size_t dependencies) {
  tasks_.reserve(tasks);
  succ_.reserve(dependencies);
  heap_.reserve(std::min<std::size_t>(tasks, 1 << 16) + kHeapArity);
}

GroupId Engine::add_group(CommGroup group) {
  for (const auto& m : group.mirrors) {
    if (m.size() != group.ranks.size()) throw std::invalid_argument("Engine::add_group: a mirror group differs in size");
  }
  groups_.push_back(Group{std::move(group), {}});
  return static_cast<GroupId>(groups_.size() - 1);
}

// Called for every task end's stream successors and dependents (millions of
// times in a big iteration): inlined into its callers.
[[gnu::always_inline]] inline void Engine::maybe_start(TaskId t) {
  Task& task = tasks_[t];
  // Called right after a blocker went away (or on a new task), so zero
  // means it became ready just now: no state to check.
  if (task.blockers == 0) {
    task.state = State::running;  // claimed; started in drain_ready
    ready_.push_back(t);
  }
}

[[gnu::always_inline]] inline void Engine::check_deps(std::span<const TaskId> deps) const {
  const std::size_t n = tasks_.size();
  for (TaskId d : deps) {
    if (d >= n) throw_bad_dep(d);
  }
}

[[gnu::always_inline]] inline void Engine::set_user(TaskId id, std::uint64_t user) {
  // Stored only up to the last task given one (zero is every other task's).
  if (user == 0 && users_.size() <= id) return;
  if (users_.size() <= id) users_.resize(static_cast<std::size_t>(id) + 1, 0);
  users_[id] = user;
}

// Appends `id` to each unfinished dependency's successor list (FIFO: the
// order in which finish() releases them, and so the run, stays the order of
// the calls).
[[gnu::always_inline]] inline void Engine::link(TaskId id, std::span<const TaskId> deps) {
  std::uint32_t left = 0;
  for (TaskId d : deps) {
    Task& dep = tasks_[d];
    if (dep.state == State::done) continue;
    ++left;
    const auto e = static_cast<std::uint32_t>(succ_.size());
    succ_.push_back(Succ{id, kNone});
    if (dep.succ_tail == kNone) dep.succ_head = e;
    else succ_[dep.succ_tail].next = e;
    dep.succ_tail = e;
  }
  tasks_[id].blockers = left + tasks_[id].streams_len;
}

// The link after `t` on stream `s` (one of its streams).
std::uint32_t& Engine::next_on_stream(TaskId t, StreamId s) {
  Task& task = tasks_[t];
  std::uint32_t i = 0;
  if (task.streams_len > 1) {
    while (task_streams_[task.streams + i] != s) ++i;
  }
  return next_on(task, i);
}

// Queues the task on its streams and starts it if nothing holds it back.
[[gnu::always_inline]] inline void Engine::enqueue(TaskId id) {
  Task& t = tasks_[id];
  const StreamId* ss = streams_of(t);
  for (std::uint32_t i = 0; i < t.streams_len; ++i) {
    Stream& s = streams_[ss[i]];
    if (s.tail == kNone) {  // an empty stream: it arrives now
      s.arrival_ns = now_;
      --t.blockers;
    } else {
      next_on_stream(s.tail, ss[i]) = id;
    }
    s.tail = id;
  }
  maybe_start(id);
}

TaskId Engine::new_task(TaskKind kind, std::span<const StreamId> streams, std::span<const TaskId> deps,
                        std::uint64_t user) {
  const auto id = static_cast<TaskId>(tasks_.size());
  // Everything is checked before anything is added, so a throw leaves the engine unchanged.
  if (streams.size() > kMaxStreamsPerTask) {
    throw std::invalid_argument("Engine: a task may occupy at most " + std::to_string(kMaxStreamsPerTask) + " streams");
  }
  std::uint32_t n = 0;
  StreamId only = kNoStream;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const StreamId s = streams[i];
    if (s == kNoStream) continue;
    if (s >= streams_.size()) throw_bad_stream(s);
    for (std::size_t j = 0; j < i; ++j) {
      if (streams[j] == s) throw std::invalid_argument("Engine: a task lists stream " + std::to_string(s) + " twice");
    }
    ++n;
    only = s;
  }
  check_deps(deps);
  // Built in place: a million tasks, each a cache line.
  Task& t = tasks_.emplace_back();
  t.kind = kind;
  t.streams_len = static_cast<std::uint16_t>(n);
  if (n == 1) {
    t.streams = only;
  } else {
    t.streams = static_cast<std::uint32_t>(task_streams_.size());
    for (StreamId s : streams) {
      if (s == kNoStream) continue;
      task_streams_.push_back(s);
      task_stream_next_.push_back(kNone);
    }
  }
  set_user(id, user);
  link(id, deps);
  enqueue(id);
  return id;
}

void Engine::hold_sms(StreamId comm, StreamId compute) {
  if (comm >= streams_.size()) throw_bad_stream(comm);
  if (compute >= streams_.size()) throw_bad_stream(compute);
  streams_[comm].sm_of = compute;
  holds_sms_ = true;
}

// The common task (a million in a big iteration): one stream or none, so
// none of new_task's checks across streams.
TaskId Engine::add_compute(StreamId stream, TimeNs duration_ns, std::span<const TaskId> deps, std::uint64_t user,
                           TimeNs held_ns) {
  if (duration_ns < 0) throw std::invalid_argument("Engine::add_compute: negative duration");
  if (stream != kNoStream && stream >= streams_.size()) throw_bad_stream(stream);
  check_deps(deps);
  const auto id = static_cast<TaskId>(tasks_.size());
  Task& t = tasks_.emplace_back();
  t.kind = TaskKind::compute;
  t.duration_ns = duration_ns;
  if (held_ns > duration_ns && stream != kNoStream) t.held_ns = static_cast<double>(held_ns);
  t.streams = stream;
  t.streams_len = stream == kNoStream ? 0 : 1;
  if (user != 0) set_user(id, user);  // users_ never reaches past the tasks: a zero leaves it as it is
  link(id, deps);
  enqueue(id);
  return id;
}

std::uint32_t Engine::plan_for(GroupId g, Collective op, Algorithm algo) {
  Group& grp = groups_[g];
  for (const auto& [c, a, idx] : grp.plans) {
    if (c == op && a == algo) return idx;
  }
  plans_.push_back(plan_collective(*net_, op, grp.group, algo));
  const auto idx = static_cast<std::uint32_t>(plans_.size() - 1);
  // Each phase's links registered once (plan_collective); every task of the plan reuses them.
  plan_sets_.push_back(static_cast<std::uint32_t>(phase_sets_.size()));
  for (const CommPhase& ph : plans_.back().phases) phase_sets_.push_back(ph.set);
  grp.plans.emplace_back(op, algo, idx);
  return idx;
}

TaskId Engine::add_collective(Collective op, GroupId group, double size_bytes, std::span<const StreamId> streams,
                              std::span<const TaskId> deps, Algorithm algo, std::uint64_t user) {
  if (net_ == nullptr) throw std::logic_error("Engine: communication tasks need a Network");
  if (group >= groups_.size()) throw std::out_of_range("Engine: group " + std::to_string(group) + " does not exist");
  if (algo == Algorithm::automatic) algo = choose_algorithm(*net_, op, groups_[group].group, size_bytes);
  const std::uint32_t plan = plan_for(group, op, algo);
  // Validate before queuing anything, so a throw leaves the engine unchanged.
  const TaskId id = new_task(op == Collective::send_recv ? TaskKind::send_recv : TaskKind::collective, streams, deps, user);
  Task& t = tasks_[id];
  t.size_bytes = size_bytes;
  t.plan = plan;
  t.algo = plans_[plan].algorithm;
  return id;
}

TaskId Engine::add_send_recv(int src_gpu, int dst_gpu, double bytes, std::span<const StreamId> streams,
                             std::span<const TaskId> deps, std::span<const Route> mirrors, std::uint64_t user) {
  if (net_ == nullptr) throw std::logic_error("Engine: communication tasks need a Network");
  std::vector<int> key{src_gpu, dst_gpu};
  for (const Route& m : mirrors) {
    // A mirror of weight w stands for round(w) identical pairs.
    for (long i = 0; i < std::lround(m.weight); ++i) {
      key.push_back(m.src_gpu);
      key.push_back(m.dst_gpu);
    }
  }
  auto it = p2p_groups_.find(key);
  if (it == p2p_groups_.end()) {
    CommGroup g;
    g.ranks = {src_gpu, dst_gpu};
    for (std::size_t i = 2; i < key.size(); i += 2) g.mirrors.push_back({key[i], key[i + 1]});
    it = p2p_groups_.emplace(std::move(key), add_group(std::move(g))).first;
  }
  return add_collective(Collective::send_recv, it->second, bytes, streams, deps, Algorithm::ring, user);
}

TaskId Engine::add_flow(std::span<const LinkUse> uses, double bytes, TimeNs latency_ns, std::span<const StreamId> streams,
                        std::span<const TaskId> deps, std::uint64_t user) {
  if (net_ == nullptr) throw std::logic_error("Engine: communication tasks need a Network");
  std::vector<LinkUse> merged(uses.begin(), uses.end());
  Network::merge_uses(merged);
  // Validate the streams and dependencies before registering the links.
  for (StreamId s : streams) {
    if (s != kNoStream && s >= streams_.size()) throw_bad_stream(s);
  }
  check_deps(deps);
  const LinkSetId set = net_->add_link_set(merged);
  const TaskId id = new_task(TaskKind::flow, streams, deps, user);
  Task& t = tasks_[id];
  t.size_bytes = bytes;
  t.duration_ns = latency_ns;
  t.link_set = set;
  return id;
}

// push_event, start and finish run once per task (millions of times): inlined
// into the event loop.
[[gnu::always_inline]] inline void Engine::push_event(TimeNs t, TaskId task, EventType type) {
  // The key's order is the sequence number's only while it fits its 31 bits.
  if (seq_ >= kMaxEvents) throw std::length_error("Engine: more than 2^31 events scheduled in one run");
  const Event e{Event::time_key_of(t), Event::key_of(seq_++, task, type)};
  if (root_popped_) {
    root_popped_ = false;
    heap_sift_down(heap_, heap_size_, 0, e);
  } else {
    heap_push(heap_, heap_size_, e);
  }
}

[[gnu::always_inline]] inline void Engine::start(TaskId id) {
  Task& t = tasks_[id];
  t.start_ns = now_;
  const StreamId* ss = streams_of(t);
  for (std::uint32_t i = 0; i < t.streams_len; ++i) {
    Stream& s = streams_[ss[i]];
    s.info.wait_ns += now_ - s.arrival_ns;
    // finish() will touch the stream's next task and the successor list:
    // tasks built long ago, likely out of cache. Fetch them while this one runs.
    const std::uint32_t next = next_on(t, i);
    if (next != kNone) __builtin_prefetch(&tasks_[next], 1);
  }
  if (t.succ_head != kNone) __builtin_prefetch(&succ_[t.succ_head]);
  switch (t.kind) {
    case TaskKind::compute:
      if (t.held_ns > 0) {  // a held pace: its end moves with the holders (repace)
        Stream& s = streams_[t.streams];
        s.paced = id;
        s.left = 1.0;
        s.pace_since = now_;
        t.live_seq = static_cast<std::uint32_t>(seq_);
        push_event(now_ + (s.holders > 0 ? static_cast<TimeNs>(t.held_ns) : t.duration_ns), id, EventType::task_end);
        return;
      }
      push_event(now_ + t.duration_ns, id, EventType::task_end);
      return;
    case TaskKind::flow:
      net_->start_flow(t.link_set, t.size_bytes, now_, id);
      return;
    case TaskKind::collective:
      if (holds_sms_) change_holders(id, +1);
      [[fallthrough]];
    case TaskKind::send_recv:
      t.phase = 0;
      if (t.size_bytes <= 0 || plans_[t.plan].phases.empty()) {
        push_event(now_, id, EventType::task_end);
        return;
      }
      start_phase(id);
      return;
  }
}

[[gnu::always_inline]] inline void Engine::drain_ready() {
  // Index loop: starting a task never makes another ready, but keep it robust.
  for (std::size_t i = 0; i < ready_.size(); ++i) start(ready_[i]);
  ready_.clear();
}

// A collective starts (+1) or ends (-1) on its streams: the compute streams
// whose SMs they hold change pace when their first holder starts or their
// last ends.
void Engine::change_holders(TaskId collective, int delta) {
  const Task& t = tasks_[collective];
  const StreamId* ss = streams_of(t);
  for (std::uint32_t i = 0; i < t.streams_len; ++i) {
    const StreamId c = streams_[ss[i]].sm_of;
    if (c == kNoStream) continue;
    Stream& s = streams_[c];
    const bool was_held = s.holders > 0;
    s.holders = static_cast<std::uint32_t>(static_cast<int>(s.holders) + delta);
    if (was_held != (s.holders > 0)) repace(c, was_held);
  }
}

// The paced task of compute stream `c` (if any) has run at the held pace
// (was_held) or the free one since pace_since; its share left shrinks by
// what it did, and its end is scheduled again at the new pace (the earlier
// end event goes stale: run() skips events whose sequence number is not
// the task's live_seq).
void Engine::repace(StreamId c, bool was_held) {
  Stream& s = streams_[c];
  if (s.paced == kNone) return;
  Task& t = tasks_[s.paced];
  const double old_ns = was_held ? t.held_ns : static_cast<double>(t.duration_ns);
  s.left = std::max(0.0, s.left - static_cast<double>(now_ - s.pace_since) / old_ns);
  s.pace_since = now_;
  const double new_ns = was_held ? static_cast<double>(t.duration_ns) : t.held_ns;
  t.live_seq = static_cast<std::uint32_t>(seq_);
  push_event(now_ + static_cast<TimeNs>(std::llround(s.left * new_ns)), s.paced, EventType::task_end);
}

void Engine::start_phase(TaskId id) {
  const Task& t = tasks_[id];
  const CommPhase& ph = plans_[t.plan].phases[t.phase];
  net_->start_flow(phase_sets_[plan_sets_[t.plan] + t.phase], phase_flow_bytes(ph, t.size_bytes), now_, id);
}

[[gnu::always_inline]] inline void Engine::finish(TaskId id) {
  Task& t = tasks_[id];
  t.state = State::done;
  t.end_ns = now_;
  ++tasks_done_;
  if (t.kind == TaskKind::compute) {
    if (t.held_ns > 0) streams_[t.streams].paced = kNone;
  } else if (holds_sms_ && t.kind == TaskKind::collective) {
    change_holders(id, -1);
  }
  const StreamId* ss = streams_of(t);
  for (std::uint32_t i = 0; i < t.streams_len; ++i) {
    Stream& s = streams_[ss[i]];
    s.info.busy_ns += t.end_ns - t.start_ns;
    ++s.info.tasks;
    const TaskId next = next_on(t, i);
    if (next != kNone) {
      s.arrival_ns = now_;
      --tasks_[next].blockers;
      maybe_start(next);
    } else {
      s.tail = kNone;  // empty
    }
  }
  for (std::uint32_t e = t.succ_head; e != kNone; e = succ_[e].next) {
    const TaskId s = succ_[e].task;
    --tasks_[s].blockers;
    maybe_start(s);
  }
  if (on_complete_) on_complete_(id, now_);
}

RunStats Engine::run(TimeNs until_ns) {
  if (root_popped_) {  // a completion callback threw while its event was at the root
    root_popped_ = false;
    heap_pop_root(heap_, heap_size_);
  }
  drain_ready();
  while (true) {
    const TimeNs th = heap_size_ == 0 ? kNever : heap_.front().time();
    // Events at the current instant run before the network is asked (and
    // re-solved), so flows started together share one max-min solve.
    // (No running flow: nothing can drain, and nothing waits to be solved.)
    const TimeNs tn = net_ != nullptr && th != now_ && net_->active_flows() > 0 ? net_->next_completion() : kNever;
    const TimeNs t = std::min(th, tn);
    if (t == kNever || t > until_ns) break;
    now_ = t;
    if (tn <= th) {
      // Flows drain first at equal times; their latency follows as an event.
      completed_.clear();
      net_->advance_to(t, completed_);
      for (std::uint64_t tag : completed_) {
        ++events_;
        const auto id = static_cast<TaskId>(tag);
        const Task& task = tasks_[id];
        const TimeNs lat = task.kind == TaskKind::flow
                               ? task.duration_ns
                               : phase_latency_ns(plans_[task.plan].phases[task.phase], task.size_bytes);
        push_event(t + lat, id, EventType::phase_end);
      }
      continue;
    }
    const Event ev = heap_.front();
    root_popped_ = true;  // refilled by the first event scheduled below, or removed
    ++events_;
    const TaskId id = ev.task();
    Task& task = tasks_[id];
    if (task.kind == TaskKind::compute && task.held_ns > 0 && ev.seq() != task.live_seq) {
      // A paced task's end moved (repace): this event is stale.
    } else if (ev.type() == EventType::phase_end && task.kind != TaskKind::flow &&
        static_cast<std::size_t>(task.phase) + 1 < plans_[task.plan].phases.size()) {
      ++task.phase;
      start_phase(id);
    } else {
      finish(id);
    }
    drain_ready();
    if (root_popped_) {
      root_popped_ = false;
      heap_pop_root(heap_, heap_size_);
    }
  }
  RunStats st;
  st.end_ns = now_;
  st.events = events_;
  st.tasks_done = tasks_done_;
  st.tasks_unfinished = tasks_.size() - tasks_done_;
  if (net_ != nullptr) {
    st.flows = net_->flows_started();
    st.solves = net_->solves();
  }
  return st;
}

}  // namespace cuboid::sim
