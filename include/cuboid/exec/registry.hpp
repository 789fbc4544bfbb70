#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The backends this build has, made by name: "cpu" always; "cuda" when built
// with the gpu feature, from the module cuboid-cuda.so that the first request
// loads (src/exec/cuda_module.hpp).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/exec/backend.hpp"

namespace cuboid::exec {

struct BackendOptions {
  int device = 0;  // CUDA device ordinal (usually LOCAL_RANK); ignored by cpu
  // cpu: OpenBLAS threads per rank (0 = OpenBLAS's default, all cores; with
  // several ranks per node pass cores / ranks to avoid oversubscription).
  int threads = 0;
};

// CUDA devices this process sees (cudaGetDeviceCount after
// CUDA_VISIBLE_DEVICES); 0 without the cuda backend or a GPU. Loads the CUDA
// backend's module (InputError when it cannot).
int visible_cuda_devices();

struct BackendInfo {
  std::string name;
  std::string description;
};

// The backends this build has, for `--backend` help and `cuboid list backends`.
std::vector<BackendInfo> backend_list();
// Throws InputError (field "--backend", listing the choices) for an unknown name.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});

}  // namespace cuboid::exec
