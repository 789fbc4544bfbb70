#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Megatron-Core's pipeline layout string (--pipeline-model-parallel-layout),
// read as megatron/core/transformer/pipeline_parallel_layer_layout.py does at
// d98e8a64: "E" the embedding, "L" the loss, "t" a decoder layer, "m" a
// multi-token prediction module; "|" ends a virtual stage (the list is in
// virtual-stage order, chunk c of stage s at c x PP + s); "(...)*n" and
// "x*n" repeat; commas are cosmetic. "Et*2|(t*3|)*30,t*2L" is 94 layers
// with the embedding and the loss on PP 8 x v 4.
#include <string>
#include <string_view>

#include "cuboid/core/plan.hpp"

namespace cuboid {

// The layout of `text`, with Megatron's checks that need no model
// (validate_layer_layout): the embedding first and the loss last, once each;
// the MTP modules after every decoder layer, and (cuboid prices them on the
// last stage) all in the last virtual stage. InputError(source, field, ...)
// otherwise. The decoder and MTP counts against the model, and the count of
// virtual stages against PP, are check_plan's.
PipelineLayout parse_pipeline_layout(std::string_view text, const std::string& source, const std::string& field);

// The layout in Megatron's grammar, runs of equal virtual stages folded:
// parse_pipeline_layout reads it back to the same layout.
std::string pipeline_layout_string(const PipelineLayout& layout);

}  // namespace cuboid
