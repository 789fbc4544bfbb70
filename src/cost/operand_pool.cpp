#include "cuboid/cost/operand_pool.hpp"

#include <algorithm>
#include <cmath>

#include "cuboid/core/calibration.hpp"
#include "cuboid/cost/memory.hpp"

namespace cuboid {

double step_working_set_bytes(const ModelSpec& model, const ParallelPlan& plan, const GpuProfile& gpu,
                              int element_bytes) {
  constexpr double kGradientBytes = 4;     // the executor accumulates fp32 gradients
  constexpr double kMemoryModelBytes = 2;  // memory_per_gpu counts bf16 activations
  const MemoryReport mem = memory_per_gpu(model, plan, gpu);
  return mem.parameters * (element_bytes + kGradientBytes) +
         mem.activation_bytes * element_bytes / kMemoryModelBytes;
}

double step_memory_bytes(const ModelSpec& model, const ParallelPlan& plan, const GpuProfile& gpu, int element_bytes) {
  constexpr double kAdamMomentBytes = 2 * 4;
  return step_working_set_bytes(model, plan, gpu, element_bytes) +
         memory_per_gpu(model, plan, gpu).parameters * kAdamMomentBytes;
}

std::size_t operand_pool_bytes(double footprint_bytes, double ranks_per_core, bool quick) {
  constexpr std::size_t kMinPool = std::size_t{1} << 20;
  const std::size_t most = (quick ? std::size_t{64} : std::size_t{512}) << 20;
  return std::clamp(static_cast<std::size_t>(std::ceil(footprint_bytes * ranks_per_core)), kMinPool, most);
}

const Topology& topology_for_plan(const Topology& topo, const ModelSpec& model, const ParallelPlan& plan) {
  if (!topo.has_operand_pool_views()) return topo;
  const Calibration& cal = *topo.cluster().calibration;
  const double ws = step_working_set_bytes(model, plan, topo.cluster().gpu, cal.activation_bytes_per_element);
  return topo.for_operand_pool(static_cast<double>(operand_pool_bytes(ws, cal.ranks_per_core)));
}

}  // namespace cuboid
