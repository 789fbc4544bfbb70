// Collective microbenchmark on one process group (nccl-tests' method: the
// buffer sizes, the bus factors and the result check).
#include "cuboid/calibrate/collective_sweep.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "cuboid/calibrate/gemm_sweep.hpp"
#include "cuboid/calibrate/step_cache.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::calibrate {

CollectiveCount collective_count(Collective c, std::int64_t size_bytes, std::int64_t element_bytes, int group_size) {
  const std::int64_t n = std::max(1, group_size);
  std::int64_t total = std::max<std::int64_t>(1, size_bytes / element_bytes);
  if (c == Collective::reduce_scatter || c == Collective::all_gather || c == Collective::all_to_all) {
    total = std::max(n, total / n * n);
    return {total, c == Collective::all_to_all ? total : total / n};
  }
  return {total, total};
}

namespace {

constexpr std::int64_t kLargeBytes = std::int64_t{16} << 20;

using exec::ConstDeviceSpan;
using exec::DeviceSpan;

struct Buffers {
  exec::DeviceBuffer send, recv;
};

// One call of `c` on `total` elements (the size buffer).
void call(exec::Communicator& g, Collective c, Buffers& b, std::size_t total) {
  const int n = g.size(), r = g.rank();
  const std::size_t per_rank = total / static_cast<std::size_t>(n);
  switch (c) {
    case Collective::all_reduce: g.all_reduce_sum(b.recv.subspan(0, total), total); break;
    case Collective::reduce_scatter:
      g.reduce_scatter_sum(b.send.subspan(0, total), b.recv.subspan(0, per_rank), per_rank);
      break;
    case Collective::all_gather: g.all_gather(b.send.subspan(0, per_rank), b.recv.subspan(0, total), per_rank); break;
    case Collective::broadcast: g.broadcast(b.recv.subspan(0, total), total, 0); break;
    case Collective::all_to_all: g.all_to_all(b.send.subspan(0, total), b.recv.subspan(0, total), per_rank); break;
    case Collective::send_recv:
      g.send_recv(b.send.subspan(0, total), total, (r + 1) % n, b.recv.subspan(0, total), total, (r + n - 1) % n, 77);
      break;
  }
}

// Sets the inputs so that every expected output is a small integer (exact
// in bf16 too): rank r contributes r + 1.
void fill_inputs(exec::Backend& be, exec::Communicator& g, Collective c, Buffers& b, std::size_t total) {
  const float mine = static_cast<float>(g.rank() + 1);
  be.fill(b.send.subspan(0, total), mine);
  be.fill(b.recv.subspan(0, total), c == Collective::all_reduce || c == Collective::broadcast ? mine : -1.0f);
}

std::int64_t count_wrong(exec::Backend& be, exec::Communicator& g, Collective c, Buffers& b, std::size_t total) {
  const int n = g.size(), r = g.rank();
  const std::size_t per_rank = total / static_cast<std::size_t>(n);
  const std::size_t out = c == Collective::reduce_scatter ? per_rank : total;
  const std::vector<float> got = be.download(b.recv.subspan(0, out));
  const float sum = static_cast<float>(n * (n + 1) / 2);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < out; ++i) {
    float want = 0;
    switch (c) {
      case Collective::all_reduce:
      case Collective::reduce_scatter: want = sum; break;
      case Collective::all_gather:
      case Collective::all_to_all: want = static_cast<float>(i / per_rank + 1); break;  // block s from rank s
      case Collective::broadcast: want = 1.0f; break;  // root 0 sent 0 + 1
      case Collective::send_recv: want = static_cast<float>((r + n - 1) % n + 1); break;
    }
    wrong += got[i] != want ? 1 : 0;
  }
  return wrong;
}

}  // namespace

std::vector<CollectiveMeasurement> run_collective_sweep(exec::Backend& be, exec::Communicator& g,
                                                        const std::vector<std::int64_t>& sizes,
                                                        const CollectiveSweepOptions& o, exec::Watchdog* watchdog) {
  const auto esz = static_cast<std::int64_t>(exec::dtype_bytes(be.compute_dtype()));
  const std::int64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  const auto max_elems = static_cast<std::size_t>(std::max<std::int64_t>(1, largest / esz) + g.size());
  Buffers b{be.alloc(max_elems), be.alloc(max_elems)};
  exec::TimerEvent start = be.create_event(), stop = be.create_event();
  CacheEvictor evict(be, o.evict_bytes);
  std::vector<CollectiveMeasurement> out;
  for (Collective c : kSweptCollectives) {
    for (std::int64_t size : sizes) {
      const CollectiveCount cnt = collective_count(c, size, esz, g.size());
      const auto total = static_cast<std::size_t>(cnt.total);
      // Deterministic in the size, so that every member makes the same calls.
      const int calls = static_cast<int>(
          std::clamp<std::int64_t>(o.bytes_per_size / std::max<std::int64_t>(size, 1), o.min_calls, o.max_calls));
      const std::string label = fmt::format("{} of {} bytes", to_string(c), cnt.total * esz);
      if (watchdog != nullptr) watchdog->enter(label.c_str());
      fill_inputs(be, g, c, b, total);
      // One warm-up is enough once a call takes milliseconds (the largest sizes dominate the sweep's time).
      const int warmup = size >= kLargeBytes ? std::min(o.warmup_calls, 1) : o.warmup_calls;
      for (int i = 0; i < warmup; ++i) call(g, c, b, total);
      std::vector<double> times;
      for (int i = 0; i < calls; ++i) {
        evict();
        g.barrier();  // start together: the time is the collective's, not the skew's
        be.record(start);
        call(g, c, b, total);
        be.record(stop);
        times.push_back(static_cast<double>(be.elapsed_ns(start, stop)));
      }
      // The out-of-place collectives' outputs (and broadcast's) are already
      // the expected ones; the in-place all-reduce has summed repeatedly: redo it once.
      if (c == Collective::all_reduce) {
        fill_inputs(be, g, c, b, total);
        call(g, c, b, total);
      }
      const std::int64_t wrong = count_wrong(be, g, c, b, total);
      if (watchdog != nullptr) watchdog->leave();
      out.push_back(
          CollectiveMeasurement{c, cnt.total * esz, cnt.column, median_of(std::move(times)), wrong});
    }
  }
  return out;
}

}  // namespace cuboid::calibrate
