// Linked into binaries that carry the CUDA backend themselves (the kernel
// tests): make_backend("cuda") then uses it instead of loading cuboid-cuda.so.
#include "../cuda_module.hpp"

namespace {

[[maybe_unused]] const bool kLinked = (cuboid::exec::use_linked_cuda_module(*cuboid_cuda_module()), true);

}  // namespace
