// Finding and loading cuboid-cuda.so (see cuda_module.hpp).
#include "cuda_module.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "cuboid/core/error.hpp"

namespace cuboid::exec {

namespace {

namespace fs = std::filesystem;

// Set by use_linked_cuda_module before main (a static initialiser), read after.
const CudaModule* linked_module = nullptr;

[[noreturn]] void refuse(const std::string& problem) {
  throw InputError("command line", "--backend", problem,
                   "keep " CUBOID_CUDA_MODULE_FILE " beside the cuboid binary (ninja builds it there, tools/gpu-bundle "
                   "packs it there; meson install puts it in " CUBOID_CUDA_MODULE_FROM_BINDIR " from the binary's "
                   "folder), or use --backend cpu");
}

const CudaModule& load() {
  std::error_code ec;
  const fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) refuse(std::string("cannot find this binary (/proc/self/exe: ") + ec.message() + ") to load its CUDA backend");
  // Beside the binary (the build tree, gpu-bundle's bin/), then where meson installs it.
  const fs::path candidates[] = {dir / CUBOID_CUDA_MODULE_FILE,
                                 (dir / CUBOID_CUDA_MODULE_FROM_BINDIR / CUBOID_CUDA_MODULE_FILE).lexically_normal()};
  std::string looked;
  for (const fs::path& path : candidates) {
    if (!fs::exists(path, ec)) {
      looked += (looked.empty() ? "" : ", ") + path.string();
      continue;
    }
    // Never closed: the backend's code must outlive every object it makes.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) refuse("the CUDA backend " + path.string() + " does not load: " + dlerror());
    using Entry = const CudaModule* (*)() noexcept;
    const auto entry = reinterpret_cast<Entry>(dlsym(handle, "cuboid_cuda_module"));
    if (entry == nullptr) refuse(path.string() + " is not a CUDA backend module (no cuboid_cuda_module)");
    const CudaModule* module = entry();
    if (module == nullptr || module->abi != kCudaModuleAbi)
      refuse(path.string() + " belongs to another version of cuboid (module ABI " +
             std::to_string(module == nullptr ? 0 : module->abi) + ", binary " + std::to_string(kCudaModuleAbi) + ")");
    return *module;
  }
  refuse("this build's CUDA backend " CUBOID_CUDA_MODULE_FILE " is missing (looked for " + looked + ")");
}

}  // namespace

void use_linked_cuda_module(const CudaModule& linked) noexcept { linked_module = &linked; }

const CudaModule& cuda_module() {
  if (linked_module != nullptr) return *linked_module;
  // A throw leaves it unset, so a later call tries again.
  static const CudaModule& loaded = load();
  return loaded;
}

}  // namespace cuboid::exec
