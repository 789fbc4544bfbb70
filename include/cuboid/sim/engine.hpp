#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// Discrete-event engine: integer-nanosecond time, a heap keyed by
// (time, sequence number) so ties run in the order they were scheduled and
// every run is deterministic; no globals (engines are plain objects).
//
// Resources are streams: FIFO queues, like CUDA streams (per GPU a compute
// stream and comm streams for TP, PP and DP). Tasks are queued on streams in
// the order they are added and carry dependencies on earlier tasks. A task
// *arrives* on a stream when every earlier task of that stream has finished;
// it *starts* when it has arrived on all its streams and all its dependencies
// have finished (NCCL's implicit synchronisation: a collective starts when the
// last member arrives; early members' streams are blocked meanwhile, counted
// as wait). Kinds:
//   compute    - occupies one stream for a duration known up front, or one
//                of two paces (hold_sms: slower while a collective holds
//                SMs of its GPU);
//   collective - NCCL collective over a CommGroup (collective.hpp), its phases
//                played as flows on the Network;
//   send_recv  - p2p between two GPUs, on the sender's and receiver's streams;
//   flow       - a raw flow over given links (tests, custom traffic).
// A task may sit on no stream (kNoStream / empty list): it then starts as soon
// as its dependencies are done (a timer or a join point).
// Dependencies point to earlier tasks and streams queue in the order tasks are
// added, so the earliest unfinished task can always start: no deadlock is
// possible (a real NCCL program that orders collectives differently on two
// ranks cannot be expressed, by design).
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory_resource>
#include <span>
#include <tuple>
#include <vector>

#include "cuboid/sim/collective.hpp"
#include "cuboid/sim/huge_pages.hpp"
#include "cuboid/sim/network.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::sim {

using TaskId = std::uint32_t;
using StreamId = std::uint32_t;
using GroupId = std::uint32_t;
inline constexpr StreamId kNoStream = std::numeric_limits<StreamId>::max();
inline constexpr std::size_t kMaxStreamsPerTask = std::numeric_limits<std::uint16_t>::max();

enum class StreamKind : std::uint8_t { compute, tp, pp, dp, other };
std::string_view to_string(StreamKind k);

enum class TaskKind : std::uint8_t { compute, collective, send_recv, flow };

struct StreamInfo {
  int gpu = -1;
  StreamKind kind = StreamKind::compute;
  TimeNs busy_ns = 0;  // sum of (end - start) of its tasks
  TimeNs wait_ns = 0;  // sum of (start - arrival): blocked waiting for peers / deps
  std::uint32_t tasks = 0;
};

struct RunStats {
  TimeNs end_ns = 0;                // time of the last event
  std::uint64_t events = 0;         // heap events + flow completions processed
  std::uint64_t tasks_done = 0;
  std::uint64_t tasks_unfinished = 0;  // > 0 only if run(until) stopped early or a flow has no bandwidth
  std::uint64_t flows = 0;          // flows started on the network
  std::uint64_t solves = 0;         // max-min component re-solves
};

class Engine {
 public:
  // Compute-only engine (communication tasks throw std::logic_error).
  // `mem` holds the per-task tables and the event heap (not owned; must
  // outlive the engine): by default huge_page_resource(); a simulation
  // passes its SimArena (huge_pages.hpp).
  explicit Engine(std::pmr::memory_resource* mem = huge_page_resource()) : Engine(nullptr, mem) {}
  // Communication goes through `net` (not owned; must outlive the engine).
  explicit Engine(Network& net, std::pmr::memory_resource* mem = huge_page_resource()) : Engine(&net, mem) {}

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&&) noexcept = default;
  // Not noexcept: the tables are std::pmr vectors, and moving into one on
  // another memory resource copies element by element (allocating).
  Engine& operator=(Engine&&) = default;

  Network* network() const { return net_; }

  StreamId add_stream(int gpu, StreamKind kind);
  // Optional: pre-sizes the task tables (avoids regrowth for large graphs).
  void reserve(std::size_t tasks, std::size_t dependencies = 0);
  // Registers a communicator once; collectives reference it by id so that its
  // decomposition is computed once per (collective, algorithm) and reused.
  GroupId add_group(CommGroup group);

  // All add_* take dependencies on already added tasks (so the graph is a
  // DAG) and an opaque `user` value for the caller (e.g. an index into its op
  // table). Tasks may be added before run() or from the completion callback.
  // `held_ns` (> duration_ns): its duration while a collective holds SMs of
  // its GPU (hold_sms); it then runs at duration / held_ns of its pace, and
  // its end moves whenever a holder starts or ends. Otherwise fixed.
  TaskId add_compute(StreamId stream, TimeNs duration_ns, std::span<const TaskId> deps = {},
                     std::uint64_t user = 0, TimeNs held_ns = 0);
  // Every collective queued on `comm` holds SMs of the GPU whose compute
  // stream is `compute` while it runs (NCCL's kernel: one CTA per channel),
  // slowing the compute task running there to its held_ns pace.
  void hold_sms(StreamId comm, StreamId compute);
  // `streams`: the streams it occupies, one per *simulated* member (a subset of
  // the group when symmetry leaves members out; the group's full geometry, and
  // its mirrors, still load the links). Algorithm::automatic resolves per call.
  TaskId add_collective(Collective op, GroupId group, double size_bytes, std::span<const StreamId> streams,
                        std::span<const TaskId> deps = {}, Algorithm algo = Algorithm::automatic,
                        std::uint64_t user = 0);
  // p2p send of `bytes` from src_gpu to dst_gpu; `streams` usually {sender's
  // pp stream, receiver's pp stream} (or just one when only one side is
  // simulated). `mirrors`: other (src, dst) pairs sending the same at the same time.
  TaskId add_send_recv(int src_gpu, int dst_gpu, double bytes, std::span<const StreamId> streams,
                       std::span<const TaskId> deps = {}, std::span<const Route> mirrors = {},
                       std::uint64_t user = 0);
  // A raw flow: `bytes` per route over `uses` (merged or not), then latency_ns.
  // Its links become a link set of the network now (an unknown link throws here).
  TaskId add_flow(std::span<const LinkUse> uses, double bytes, TimeNs latency_ns,
                  std::span<const StreamId> streams = {}, std::span<const TaskId> deps = {},
                  std::uint64_t user = 0);

  // Called when a task finishes (after its stream successors were released).
  void set_on_complete(std::function<void(TaskId, TimeNs)> fn) { on_complete_ = std::move(fn); }

  // Processes events until none is left or the next is after `until_ns`.
  RunStats run(TimeNs until_ns = kNever);
  TimeNs now() const { return now_; }

  // Queries. start/end are kNever until known.
  std::size_t num_tasks() const { return tasks_.size(); }
  std::size_t num_streams() const { return streams_.size(); }
  TaskKind kind(TaskId t) const { return tasks_[t].kind; }
  TimeNs start_ns(TaskId t) const { return tasks_[t].start_ns; }
  TimeNs end_ns(TaskId t) const { return tasks_[t].end_ns; }
  bool done(TaskId t) const { return tasks_[t].end_ns != kNever && tasks_[t].state == State::done; }
  std::uint64_t user(TaskId t) const { return t < users_.size() ? users_[t] : 0; }
  // The algorithm a collective task resolved to (ring for send_recv / flow).
  Algorithm algorithm(TaskId t) const { return tasks_[t].algo; }
  const StreamInfo& stream(StreamId s) const { return streams_[s].info; }
  std::uint64_t events() const { return events_; }

 private:
  Engine(Network* net, std::pmr::memory_resource* mem)
      : net_(net), heap_(mem), tasks_(mem), users_(mem), task_streams_(mem), task_stream_next_(mem), succ_(mem) {}

  enum class State : std::uint8_t { waiting, running, done };
  enum class EventType : std::uint8_t { task_end, phase_end };
  // 16 bytes, so a 4-ary heap node's children share a cache line: the
  // sequence number, task and type packed in one word whose order is the
  // sequence number's (unique), so (time, key) orders like (time, seq).
  // (ns-3's EventKey in src/core/model/scheduler.h, packed.)
  struct Event {
    // The time with its sign bit flipped: unsigned, it orders like the
    // signed time, so the heap compares (time_key, key) as one number.
    std::uint64_t time_key = 0;
    // seq << kSeqShift | task << kTaskShift | type: bit 0 the type, bits
    // 1-32 the task, bits 33-63 the sequence number.
    std::uint64_t key = 0;
    static constexpr unsigned kTaskShift = 1;
    static constexpr unsigned kSeqShift = 33;
    static std::uint64_t time_key_of(TimeNs t) { return static_cast<std::uint64_t>(t) ^ (std::uint64_t{1} << 63); }
    static std::uint64_t key_of(std::uint64_t seq, TaskId task, EventType type) {
      return (seq << kSeqShift) | (std::uint64_t{task} << kTaskShift) | static_cast<std::uint64_t>(type);
    }
    TimeNs time() const { return static_cast<TimeNs>(time_key ^ (std::uint64_t{1} << 63)); }
    std::uint64_t seq() const { return key >> kSeqShift; }
    TaskId task() const { return static_cast<TaskId>(key >> kTaskShift); }
    EventType type() const { return static_cast<EventType>(key & 1); }
  };
  static constexpr std::uint64_t kMaxEvents = std::uint64_t{1} << (64 - Event::kSeqShift);
  // One cache line: the run touches tasks in time order, not in the order
  // they were added, so each access is a likely cache miss; what only the
  // caller needs (the user value) lives apart.
  struct alignas(64) Task {
    TimeNs duration_ns = 0;       // compute: the duration; flow: latency
    TimeNs start_ns = kNever;
    TimeNs end_ns = kNever;
    // One slot per task, read by its kind (fmt's `class value`, one member
    // per reading); a task reads only the member its kind writes (the
    // defaults are compute's: no held pace, no live end event).
    union {
      double held_ns = 0;  // compute: its duration while its SMs are held (0: no held pace)
      double size_bytes;   // collective, send_recv: the message; flow: bytes per route
    };
    union {
      std::uint32_t plan = 0;  // collective, send_recv: index into plans_
      LinkSetId link_set;      // flow: its links on the network
      // compute with a held pace, once started: the sequence number of its
      // live end event (the others went stale when its pace changed).
      std::uint32_t live_seq;
    };
    // streams_len == 1 (nearly every task): the stream itself, kept inline;
    // otherwise where its streams start in task_streams_ (streams_of).
    std::uint32_t streams = 0;
    // What still holds it back: unfinished dependencies plus streams at whose
    // head it is not yet. It reaches zero once, when the task becomes ready.
    std::uint32_t blockers = 0;
    std::uint32_t succ_head = kNone;  // FIFO linked list in succ_
    std::uint32_t succ_tail = kNone;  // its last entry, where the next successor is appended
    // streams_len == 1: the task queued after it on its stream (kNone: none
    // yet); otherwise in task_stream_next_, one per stream (next_on).
    std::uint32_t stream_next = kNone;
    std::uint16_t streams_len = 0;  // at most kMaxStreamsPerTask
    std::uint16_t phase = 0;
    TaskKind kind = TaskKind::compute;
    Algorithm algo = Algorithm::ring;
    State state = State::waiting;
  };
  static_assert(sizeof(Task) == 64);
  // A stream's queue is a list threaded through its tasks (Task::stream_next):
  // no per-stream vector to grow, and a finishing task holds its successor.
  struct Stream {
    StreamInfo info;
    TaskId tail = kNone;          // its last queued task (kNone: every queued task finished)
    TimeNs arrival_ns = 0;        // when the current head arrived
    // hold_sms: a comm stream's compute stream (kNoStream: none); on a
    // compute stream, the collectives holding its SMs now and its running
    // task with a held pace (kNone: none), that task's share of its work
    // still to do and since when it runs at its current pace.
    StreamId sm_of = kNoStream;
    std::uint32_t holders = 0;
    TaskId paced = kNone;
    double left = 1.0;
    TimeNs pace_since = 0;
  };
  struct Succ {
    TaskId task = 0;
    std::uint32_t next = kNone;
  };
  struct Group {
    CommGroup group;
    // (collective, algorithm) -> index into plans_
    std::vector<std::tuple<Collective, Algorithm, std::uint32_t>> plans;
  };
  static constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

  TaskId new_task(TaskKind kind, std::span<const StreamId> streams, std::span<const TaskId> deps, std::uint64_t user);
  void check_deps(std::span<const TaskId> deps) const;
  void link(TaskId id, std::span<const TaskId> deps);
  void enqueue(TaskId id);
  void set_user(TaskId id, std::uint64_t user);
  const StreamId* streams_of(const Task& t) const {
    return t.streams_len == 1 ? &t.streams : task_streams_.data() + t.streams;
  }
  // Where the task queued after `t` on its i-th stream is recorded.
  std::uint32_t& next_on(Task& t, std::uint32_t i) {
    return t.streams_len == 1 ? t.stream_next : task_stream_next_[t.streams + i];
  }
  std::uint32_t& next_on_stream(TaskId t, StreamId s);
  std::uint32_t plan_for(GroupId g, Collective op, Algorithm algo);
  void push_event(TimeNs t, TaskId task, EventType type);
  void maybe_start(TaskId t);
  void start(TaskId t);
  void start_phase(TaskId t);
  void finish(TaskId t);
  void drain_ready();
  void change_holders(TaskId collective, int delta);
  void repace(StreamId compute, bool was_held);

  Network* net_ = nullptr;
  TimeNs now_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t events_ = 0;
  std::uint64_t tasks_done_ = 0;
  // The heap's events are heap_[0, heap_size_); the slots after them, four
  // or more, hold sentinels that order after every event, so a node with any
  // child has four to compare (the sift-down has no partial case).
  std::pmr::vector<Event> heap_;
  std::size_t heap_size_ = 0;
  // run() leaves the event it is processing at the heap's root until the
  // first event that processing schedules replaces it (one sift-down instead
  // of a pop and a push; (time, seq) is a total order, so the pop order is
  // the same). Set only while an event is being processed.
  bool root_popped_ = false;
  // The per-task tables, from the memory resource given (huge_pages.hpp).
  template <typename T>
  using Table = std::pmr::vector<T>;
  Table<Task> tasks_;
  Table<std::uint64_t> users_;     // per task up to the last one given a nonzero user value
  std::vector<Stream> streams_;
  Table<StreamId> task_streams_;
  Table<TaskId> task_stream_next_;  // parallel to task_streams_ (multi-stream tasks)
  Table<Succ> succ_;
  std::vector<Group> groups_;
  std::vector<CollectivePlan> plans_;
  std::vector<std::uint32_t> plan_sets_;  // per plan: its first phase's entry in phase_sets_
  std::vector<LinkSetId> phase_sets_;     // per phase of each plan: its links on the network
  std::map<std::vector<int>, GroupId> p2p_groups_;  // (src, dst, mirror pairs...) -> group
  std::vector<TaskId> ready_;
  std::vector<std::uint64_t> completed_;
  std::function<void(TaskId, TimeNs)> on_complete_;
  bool holds_sms_ = false;  // some stream has hold_sms
};

}  // namespace cuboid::sim
