#include "cuboid/exec/registry.hpp"

#include <string>

#include "cuboid/core/error.hpp"
#include "cuboid/exec/cpu_backend.hpp"
#if defined(CUBOID_EXEC_HAVE_CUDA) && CUBOID_EXEC_HAVE_CUDA
#include "cuda_module.hpp"
#endif

namespace cuboid::exec {

int visible_cuda_devices() {
#if defined(CUBOID_EXEC_HAVE_CUDA) && CUBOID_EXEC_HAVE_CUDA
  return cuda_module().device_count();
#else
  return 0;
#endif
}

std::vector<BackendInfo> backend_list() {
  std::vector<BackendInfo> list{
      {"cpu", "fp32 on the host: OpenBLAS GEMMs, MPI collectives"}};
#if defined(CUBOID_EXEC_HAVE_CUDA) && CUBOID_EXEC_HAVE_CUDA
  list.push_back({"cuda", "bf16 on NVIDIA GPUs: cuBLAS GEMMs, NCCL collectives"});
#endif
  return list;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return make_cpu_backend(options);
#if defined(CUBOID_EXEC_HAVE_CUDA) && CUBOID_EXEC_HAVE_CUDA
  if (name == "cuda") return cuda_module().make_backend(options);
#else
  if (name == "cuda") {
    throw InputError("command line", "--backend", "this build has no CUDA backend",
                     "use --backend cpu, or rebuild with -Dgpu=enabled (CUDA toolkit, cuBLAS, NCCL)");
  }
#endif
  std::string choices;
  for (const BackendInfo& info : backend_list()) {
    if (!choices.empty()) choices += ", ";
    choices += info.name;
  }
  throw InputError("command line", "--backend", "unknown backend '" + std::string(name) + "'",
                   "use one of: " + choices);
}

}  // namespace cuboid::exec
