#pragma once
// The CUDA backend as a module of its own (cuboid-cuda.so), loaded the first
// time a run asks for the cuda backend, so that the commands that never touch
// a GPU (plan, simulate, export, --help) do not load and initialise the CUDA
// runtime, cuBLAS(Lt) and NCCL. Only built with the `gpu` feature.
//
// The module holds cuda_backend.cpp, nccl_comm.cpp and kernels/; it takes the
// rest of the executor (Backend, Communicator, ExecError, InputError) from the
// binary that loads it, which exports its symbols for that (-rdynamic).
#include <memory>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/exec/host_exchange.hpp"
#include "cuboid/exec/registry.hpp"

namespace cuboid::exec {

// What the module offers: the backend's three entry points. A binary and a
// module built from different sources refuse each other by `abi`.
struct CudaModule {
  int abi = 0;
  int (*device_count)() noexcept = nullptr;  // cudaGetDeviceCount, 0 without a GPU or driver
  std::unique_ptr<Backend> (*make_backend)(const BackendOptions& options) = nullptr;
  // The NCCL world of a cuda backend: rank 0 makes the ncclUniqueId,
  // `exchange` hands it to every rank, all call ncclCommInitRank.
  std::unique_ptr<Communicator> (*make_world)(HostExchange& exchange, Backend& backend) = nullptr;
};

// Bump when CudaModule or a type it passes changes layout.
inline constexpr int kCudaModuleAbi = 1;

// The loaded module (dlopen'ed on the first call from next to the running
// binary, then from its install directory). InputError on --backend when it
// is missing or does not load.
const CudaModule& cuda_module();

// For binaries that link the CUDA backend in (its kernel tests): cuda_module()
// then returns `linked` instead of loading the module.
void use_linked_cuda_module(const CudaModule& linked) noexcept;

}  // namespace cuboid::exec

// The module's one exported symbol (a C name, for dlsym).
extern "C" const cuboid::exec::CudaModule* cuboid_cuda_module() noexcept;
