#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// Timing of the executor's ops, for the step runner and cuboid calibrate.
// Every op of a step is bracketed by two backend timer events; at the end of
// the step the events are resolved and summed per op name, so a measured step
// costs two event records per op and no allocation once the pools are warm.
// A watchdog thread aborts the job when one op runs longer than the configured
// timeout.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::exec {

// What one op is, for the measurements (shapes, FLOPs, bytes, group).
struct OpDesc {
  const char* name = "";
  OpKind kind = OpKind::gemm;
  Pass pass = Pass::forward;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  double flops = 0;       // executed FLOPs (2 per MAC)
  double bytes = 0;       // memory-bound: elements touched x element size
  Group group = Group::none;
  Collective collective = Collective::all_reduce;
  double comm_bytes = 0;  // collective: buffer bytes per rank; p2p: bytes sent or received
  int group_size = 1;
};

OpDesc gemm_desc(const char* name, Pass pass, std::int64_t m, std::int64_t n, std::int64_t k,
                 std::int64_t batch = 1);
// One block of the fused attention core: nq queries against nk keys of
// head_dim for `batch` (sequence x head) pairs, the causal half on a
// diagonal block; attn_flash_bwd counts 2.5x the forward's
// FLOPs, as the workload does.
OpDesc attention_desc(const char* name, Pass pass, std::int64_t nq, std::int64_t nk, std::int64_t head_dim,
                      std::int64_t batch, bool causal);
OpDesc mem_desc(const char* name, Pass pass, double bytes);
OpDesc comm_desc(const char* name, Pass pass, Collective c, Group g, double bytes, int group_size);

// Aborts the whole job when an op has not finished after `timeout_s`. While
// one is alive, SIGTERM (how mpirun and torchrun stop the other ranks when
// one has died) prints which op this rank was in before the process ends, so
// a killed job still says where each survivor was.
class Watchdog {
 public:
  // `rank`: the launcher's, so that the watchdog can exist before the
  // communicators and watch their creation.
  Watchdog(int rank, double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void enter(const char* op) noexcept;
  void leave() noexcept;

 private:
  void loop();

  int rank_;
  std::chrono::nanoseconds timeout_;
  std::atomic<const char*> op_{nullptr};
  std::atomic<std::int64_t> since_ns_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

struct OpStats {
  OpDesc desc;
  std::int64_t calls_per_step = 0;
  std::vector<double> step_seconds;  // sum over the op's calls, one entry per measured step
};

class OpTimer {
 public:
  OpTimer(Backend& backend, Watchdog* watchdog) : backend_(backend), watchdog_(watchdog) {}

  template <class F>
  void run(const OpDesc& desc, F&& body) {
    begin(desc);
    body();
    end();
  }

  // The bytes of the collective running now, where they are known only
  // part way through it (the flex dispatcher's forwarded rows).
  void set_comm_bytes(double bytes) {
    if (!pending_.empty()) pending_.back().desc.comm_bytes = bytes;
  }

  void begin_step(bool measured);
  // Waits for the device, sums this step's ops; returns the step's time in seconds.
  double end_step();

  const std::map<std::string, OpStats>& stats() const { return stats_; }
  const std::vector<double>& step_seconds() const { return steps_; }
  // Minor page faults of the process during each measured step.
  const std::vector<std::int64_t>& step_page_faults() const { return step_faults_; }

 private:
  void begin(const OpDesc& desc);
  void end();
  TimerEvent& event(std::size_t i);

  struct Pending {
    OpDesc desc;
    std::size_t start = 0;
  };
  Backend& backend_;
  Watchdog* watchdog_;
  std::vector<TimerEvent> events_;
  std::vector<Pending> pending_;
  std::size_t next_event_ = 0;
  bool measured_ = false;
  std::map<std::string, OpStats> stats_;
  std::vector<double> steps_;
  std::int64_t faults_at_begin_ = 0;
  std::vector<std::int64_t> step_faults_;
};

}  // namespace cuboid::exec
