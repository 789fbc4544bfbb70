#pragma once
// Private to the simulator: the tasks of one pass, recorded once per (stage,
// chunk, direction, gradient reduction or not) and stamped out for every
// micro-batch. The builder makes the same engine calls for each, only the
// entry dependencies (the previous pass, the received messages) and the task
// ids differ.
#include <algorithm>
#include <cstdint>
#include <memory_resource>
#include <span>
#include <stdexcept>
#include <vector>

#include "cuboid/sim/engine.hpp"
#include "task_meta.hpp"

namespace cuboid::sim::detail {

struct PassTemplate {
  // While a pass is recorded, the builder sees stand-in task ids: the entry
  // dependencies as one kEntryRef, the pass's own tasks as kLocalRef + index.
  static constexpr TaskId kEntryRef = 0x7FFFFFFF;
  static constexpr TaskId kLocalRef = 0x80000000;
  struct Task {
    bool compute = true;         // else a collective on `stream` (Algorithm::automatic)
    bool dp_reduction = false;   // a gradient reduction (the builder's dp_tasks_)
    Collective op = Collective::all_reduce;
    StreamId stream = 0;
    GroupId group = 0;
    TimeNs duration_ns = 0;
    TimeNs held_ns = 0;          // compute: Engine::add_compute's held_ns
    double bytes = 0;
    std::uint32_t deps_begin = 0, deps_end = 0;  // its range in refs
    TaskMeta meta;
  };
  explicit PassTemplate(std::pmr::memory_resource* mem) : tasks(mem), refs(mem), end(mem) {}

  // Records a compute task (a collective's fields are the caller's to set)
  // after `deps`, stand-in ids; returns its own stand-in id.
  TaskId record(StreamId stream, TimeNs ns, const std::vector<TaskId>& deps, const TaskMeta& mt) {
    Task& t = tasks.emplace_back();
    t.stream = stream;
    t.duration_ns = ns;
    t.meta = mt;
    t.deps_begin = static_cast<std::uint32_t>(refs.size());
    to_refs(deps, refs);
    t.deps_end = static_cast<std::uint32_t>(refs.size());
    max_refs = std::max(max_refs, t.deps_end - t.deps_begin);
    return kLocalRef + static_cast<TaskId>(tasks.size() - 1);
  }
  // Stand-in ids as references: kEntryRef stays, kLocalRef + i becomes i.
  static void to_refs(const std::vector<TaskId>& ids, std::pmr::vector<TaskId>& out) {
    for (TaskId id : ids) {
      if (id < kEntryRef) throw std::logic_error("simulate: a recorded pass depends on a task outside it");
      out.push_back(id == kEntryRef ? kEntryRef : id - kLocalRef);
    }
  }
  // Calls add(task, deps) -> id for every task in order, its references
  // expanded (`entry` for kEntryRef, base + i for i, where base is the id the
  // first task gets); returns the pass's end dependencies. Both spans point
  // into `buf`, sized here once for the largest list.
  template <typename Add>
  std::span<const TaskId> stamp(TaskId base, const std::vector<TaskId>& entry, std::vector<TaskId>& buf, Add&& add) const {
    if (static_cast<std::size_t>(base) + tasks.size() >= kEntryRef) {
      throw std::length_error("simulate: more than 2^31 tasks in one iteration");
    }
    const std::size_t most = std::max<std::size_t>(max_refs, end.size()) * std::max<std::size_t>(1, entry.size());
    if (buf.size() < most) buf.resize(most);
    auto expand = [&](const TaskId* first, const TaskId* last) {
      TaskId* out = buf.data();
      for (const TaskId* r = first; r != last; ++r) {
        if (*r == kEntryRef) out = std::copy(entry.begin(), entry.end(), out);
        else *out++ = base + *r;
      }
      return std::span<const TaskId>(buf.data(), out);
    };
    for (const Task& t : tasks) add(t, expand(refs.data() + t.deps_begin, refs.data() + t.deps_end));
    return expand(end.data(), end.data() + end.size());
  }

  bool recorded = false;
  std::pmr::vector<Task> tasks;
  std::pmr::vector<TaskId> refs;  // kEntryRef (all entry dependencies, in order) or a task's index in the pass
  std::uint32_t max_refs = 0;     // the most refs one task has
  std::pmr::vector<TaskId> end;   // refs of the pass's end (the builder's PassState::end)
};

}  // namespace cuboid::sim::detail
