#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// What each --precision stores per element and which kernels its quantizer
// runs, from Transformer Engine d0067d0d (transformer_engine/pytorch/csrc/
// quantizer.cpp, the quantizers' quantize / quantize_impl; tensor/*.py for
// the scale layouts) as Megatron-Core d98e8a64 runs it (--fp8-format hybrid:
// E4M3 forward, E5M2 gradients, both 1 byte). docs/cost-model.md "FP8".
#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

inline constexpr double kFp8Bytes = 1.0;
inline constexpr double kFp4Bytes = 0.5;

// Bytes per element of a quantized GEMM operand, its scales included:
// per-tensor FP8 one fp32 scale per tensor (nothing per element); blockwise
// an fp32 scale per 1 x 128 activation block (Float8BlockQuantizer; the
// weights' 128 x 128 blocks add less, counted the same); MXFP8 an E8M0 byte
// per 1 x 32 block; NVFP4 4-bit elements and an E4M3 byte per 1 x 16 block.
constexpr double quantized_element_bytes(Precision p) {
  switch (p) {
    case Precision::bf16: return kBf16Bytes;
    case Precision::fp8_delayed:
    case Precision::fp8_current: return kFp8Bytes;
    case Precision::fp8_blockwise: return kFp8Bytes + kFp32Bytes / 128.0;
    case Precision::mxfp8: return kFp8Bytes + 1.0 / 32.0;
    case Precision::nvfp4: return kFp4Bytes + 1.0 / 16.0;
  }
  return kBf16Bytes;
}

// The quantizer computes the tensor's amax in a kernel of its own (read the
// bf16 tensor once), then the scale, then casts (Float8CurrentScaling-
// Quantizer::quantize_impl: nvte_compute_amax_with_config,
// nvte_compute_scale_from_amax, nvte_quantize_v2; NVFP4's per-tensor fp32
// scale likewise); delayed scaling takes its scale from the amax history and
// the cast kernel records the amax as it goes; blockwise and MX scales come
// out of the cast kernel itself.
constexpr bool separate_amax(Precision p) { return p == Precision::fp8_current || p == Precision::nvfp4; }

// The GEMMs run in 4-bit rather than 8-bit elements.
constexpr bool fp4_gemms(Precision p) { return p == Precision::nvfp4; }

}  // namespace cuboid
