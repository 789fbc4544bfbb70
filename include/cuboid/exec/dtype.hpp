#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The element types of backend memory: storage is f32 (cpu) or bf16 (cuda)
// for activations, weights and gradients; i32 for token ids and labels.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cuboid::exec {

enum class DType : std::uint8_t { f32, bf16, i32 };
std::string_view to_string(DType d);
constexpr std::size_t dtype_bytes(DType d) { return d == DType::bf16 ? 2 : 4; }

}  // namespace cuboid::exec
