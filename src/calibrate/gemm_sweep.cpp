// GEMM microbenchmark: warm-up, rotating operands, median per call.
#include "cuboid/calibrate/gemm_sweep.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "cuboid/exec/op_timer.hpp"

namespace cuboid::calibrate {

namespace {

// Hands out consecutive slices of one pool, wrapping at its end, so a slice
// is reused only after the whole pool (> the cache) has been touched since.
class OperandRing {
 public:
  OperandRing(exec::Backend& be, std::size_t elements) : pool_(be.alloc(elements)) {
    be.fill_random(pool_, 42, 1.0f);
  }
  std::size_t size() const { return pool_.size(); }
  exec::DeviceSpan take(std::size_t n) {
    if (next_ + n > pool_.size()) next_ = 0;
    exec::DeviceSpan s = pool_.subspan(next_, n);
    next_ += n;
    return s;
  }

 private:
  exec::DeviceBuffer pool_;
  std::size_t next_ = 0;
};

struct Operands {
  exec::DeviceSpan a, b, c;
};

void call_gemm(exec::Backend& be, const GemmProblem& p, const Operands& o) {
  if (p.batch == 1) {
    be.gemm(exec::Trans::no, exec::Trans::no, p.m, p.n, p.k, 1.0f, o.a, o.b, 0.0f, o.c);
  } else {
    be.gemm_strided_batched(exec::Trans::no, exec::Trans::no, p.m, p.n, p.k, 1.0f, o.a, p.m * p.k, o.b, p.k * p.n,
                            0.0f, o.c, p.m * p.n, p.batch);
  }
}

}  // namespace

std::vector<GemmSample> run_gemm_sweep(exec::Backend& be, exec::Communicator& world,
                                       const std::vector<GemmProblem>& shapes, const GemmSweepOptions& o,
                                       exec::Watchdog* watchdog) {
  const std::size_t esz = exec::dtype_bytes(be.compute_dtype());
  OperandRing ring(be, o.pool_bytes / esz);
  exec::TimerEvent start = be.create_event(), stop = be.create_event();
  std::vector<GemmSample> out;
  out.reserve(shapes.size());
  for (const GemmProblem& p : shapes) {
    const auto elems = [&](std::int64_t r, std::int64_t c) { return static_cast<std::size_t>(r * c * p.batch); };
    const std::size_t na = elems(p.m, p.k), nb = elems(p.k, p.n), nc = elems(p.m, p.n);
    // A shape too big to rotate gets its own operands: they exceed the cache anyway.
    exec::DeviceBuffer own;
    const bool rotate = 2 * (na + nb + nc) <= ring.size();
    if (!rotate) {
      own = be.alloc(na + nb + nc);
      be.fill_random(own, 7, 1.0f);
    }
    auto next = [&]() -> Operands {
      if (!rotate) return {own.subspan(0, na), own.subspan(na, nb), own.subspan(na + nb, nc)};
      return {ring.take(na), ring.take(nb), ring.take(nc)};
    };
    const std::string label = fmt::format("gemm {}x{}x{} batch {}", p.m, p.n, p.k, p.batch);
    auto measure = [&]() {
      if (watchdog != nullptr) watchdog->enter(label.c_str());
      auto timed = [&]() {
        if (o.lead_call) call_gemm(be, p, next());
        const Operands ops = next();
        be.record(start);
        call_gemm(be, p, ops);
        be.record(stop);
        return static_cast<double>(be.elapsed_ns(start, stop));
      };
      double last = 0;
      for (int i = 0; i < o.warmup_calls; ++i) last = timed();
      const double per_call_ms = std::max(last, 1.0) * 1e-6;
      const int calls =
          std::clamp(static_cast<int>(std::lround(o.target_ms / per_call_ms)), o.min_calls, o.max_calls);
      std::vector<double> times;
      times.reserve(static_cast<std::size_t>(calls));
      for (int i = 0; i < calls; ++i) times.push_back(timed());
      if (watchdog != nullptr) watchdog->leave();
      out.push_back(GemmSample{p.m, p.n, p.k, p.batch, median_of(std::move(times))});
    };
    // Every rank of a turn runs this shape at the same time; ranks sharing a
    // core wait for their turn, so a sample is a whole core's speed.
    for (int t = 0; t < o.turns; ++t) {
      world.barrier();
      if (t == o.turn) measure();
    }
  }
  return out;
}

std::vector<GemmSample> run_fp8_gemm_sweep(exec::Backend& be, exec::Communicator& world,
                                           const std::vector<GemmProblem>& shapes, const GemmSweepOptions& o,
                                           exec::Watchdog* watchdog) {
  std::vector<GemmSample> out;
  if (!be.native_fp8_gemm()) return out;
  for (const GemmProblem& p : shapes) {
    if (!fp8_gemm_shape(p)) continue;
    const std::string label = fmt::format("fp8 gemm {}x{}x{}", p.m, p.n, p.k);
    auto measure = [&]() {
      if (watchdog != nullptr) watchdog->enter(label.c_str());
      const std::vector<double> first = be.time_fp8_gemm(p.m, p.n, p.k, o.warmup_calls, 1, o.lead_call);
      const double per_call_ms = std::max(first.front(), 1.0) * 1e-6;
      const int calls =
          std::clamp(static_cast<int>(std::lround(o.target_ms / per_call_ms)), o.min_calls, o.max_calls);
      std::vector<double> times = be.time_fp8_gemm(p.m, p.n, p.k, 0, calls, o.lead_call);
      if (watchdog != nullptr) watchdog->leave();
      GemmSample s{p.m, p.n, p.k, 1, median_of(std::move(times))};
      s.format = GemmFormat::fp8;
      out.push_back(s);
    };
    for (int t = 0; t < o.turns; ++t) {
      world.barrier();
      if (t == o.turn) measure();
    }
  }
  return out;
}

}  // namespace cuboid::calibrate
