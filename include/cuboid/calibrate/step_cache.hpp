#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// The cache state a training step leaves for the work it does once per step.
// A layer's ops find their operands where the op before left them, but the
// optimizer's kernels (Adam, the gradient buffer's scaling and zeroing) and
// the data-parallel collectives on the gradient and parameter buffers run
// after the whole step's working set (weights, gradients, activations) has
// passed through the caches since they last touched their buffers. A sweep
// reproduces that by writing a buffer of the working set's size before each
// timed call (untimed). With 0 bytes it does nothing (operands stay hot).
#include <cstddef>

#include "cuboid/exec/backend.hpp"

namespace cuboid::calibrate {

class CacheEvictor {
 public:
  CacheEvictor(exec::Backend& backend, std::size_t bytes)
      : backend_(backend),
        pool_(bytes == 0 ? exec::DeviceBuffer{}
                         : backend.alloc(bytes / exec::dtype_bytes(exec::DType::f32) + 1, exec::DType::f32)) {}
  void operator()() {
    if (pool_.size() == 0) return;
    backend_.fill(pool_, static_cast<float>(++passes_ % 3));
  }

 private:
  exec::Backend& backend_;
  exec::DeviceBuffer pool_;
  int passes_ = 0;
};

}  // namespace cuboid::calibrate
