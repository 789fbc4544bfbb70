// CPU activation offloading: which layers, their bytes, the copies' time and
// what of it the compute stream waits for (offload.hpp).
#include "cuboid/cost/offload.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuboid/cost/memory.hpp"

namespace cuboid {

ActivationOffload activation_offload(const ModelSpec& m, const ParallelPlan& plan) {
  return ActivationOffload{static_cast<int>(m.num_layers), plan.offload_layers};
}

double offloaded_layer_bytes(const ModelSpec& m, const ParallelPlan& plan, int layer) {
  const bool moe = m.moe.enabled() && m.moe.moe_layers[static_cast<std::size_t>(layer)];
  return layer_activation_bytes(m, plan, moe);
}

double offloaded_host_bytes(const ModelSpec& m, const ParallelPlan& plan) {
  double bytes = 0;
  const auto layers = static_cast<int>(std::min<std::int64_t>(plan.offload_layers, m.num_layers));
  for (int i = 0; i < layers; ++i) bytes += offloaded_layer_bytes(m, plan, i);
  return bytes;
}

TimeNs host_copy_ns(const HostLink& link, double bytes, bool to_host) {
  const double GBps = to_host ? link.d2h_GBps : link.h2d_GBps;
  return static_cast<TimeNs>(std::llround(bytes / GBps));  // bytes / (GB/s) = ns
}

OffloadExposure offload_exposure(const ActivationOffload& off, std::span<const TimeNs> fwd_ns,
                                 std::span<const TimeNs> bwd_ns, std::span<const TimeNs> to_host_ns,
                                 std::span<const TimeNs> from_host_ns) {
  OffloadExposure e;
  std::vector<TimeNs> done(static_cast<std::size_t>(off.offloaded), 0);
  // Forward: layer j waits for the copies due before it, then runs; an
  // offloaded layer's copies start once it ends and the stream is free.
  TimeNs t = 0, stream_free = 0;
  for (int j = 0; j < off.layers; ++j) {
    if (const int i = off.due_before(j); i >= 0 && done[static_cast<std::size_t>(i)] > t) {
      e.forward_ns += done[static_cast<std::size_t>(i)] - t;
      t = done[static_cast<std::size_t>(i)];
    }
    t += fwd_ns[static_cast<std::size_t>(j)];
    if (off.offloads(j)) {
      stream_free = std::max(stream_free, t) + to_host_ns[static_cast<std::size_t>(j)];
      done[static_cast<std::size_t>(j)] = stream_free;
    }
  }
  // Backward, last layer first: the copies were all done before the last
  // layer's forward, so the stream starts free.
  t = 0;
  stream_free = 0;
  for (int j = off.layers - 1; j >= 0; --j) {
    if (const int i = off.reload_issued_at(j); i >= 0) {
      stream_free = std::max(stream_free, t) + from_host_ns[static_cast<std::size_t>(i)];
      done[static_cast<std::size_t>(i)] = stream_free;
    }
    if (off.offloads(j) && done[static_cast<std::size_t>(j)] > t) {
      e.backward_ns += done[static_cast<std::size_t>(j)] - t;
      t = done[static_cast<std::size_t>(j)];
    }
    t += bwd_ns[static_cast<std::size_t>(j)];
  }
  return e;
}

}  // namespace cuboid
