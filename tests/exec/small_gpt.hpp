#pragma once
// A GPT small enough that a step of 32 ranks on the NCCL semantics model
// takes milliseconds (test_pipeline_model, test_calibrate_model).
#include <cstdint>

#include "cuboid/core/model.hpp"

namespace cuboid::exec::model {

inline ModelSpec small_gpt(std::int64_t layers) {
  ModelSpec m;
  m.name = "model-test";
  m.num_layers = layers;
  m.hidden_size = 16;
  m.num_attention_heads = 2;
  m.num_kv_heads = 2;
  m.head_dim = 8;
  m.ffn_hidden_size = 32;
  m.activation = Activation::gelu;
  m.normalization = Normalization::layernorm;
  m.vocab_size = 32;
  m.seq_length = 8;
  m.max_position_embeddings = 8;
  return m;
}

}  // namespace cuboid::exec::model
