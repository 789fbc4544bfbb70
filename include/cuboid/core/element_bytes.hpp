#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Bytes per element of the dtypes a training step moves: the one definition
// every formula of bytes (workload, memory, optimizer, step traffic, the
// executor's buffers) reads.

namespace cuboid {

inline constexpr double kBf16Bytes = 2.0;  // bf16 / fp16 weights, activations, gradients
inline constexpr double kFp32Bytes = 4.0;  // fp32 master weights, Adam moments, main_grad
inline constexpr double kMaskBytes = 1.0;  // a dropout mask or routing flag: one byte per element

}  // namespace cuboid
