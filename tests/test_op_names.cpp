// Op names: every op the workload and the optimizer step list is one of
// op_names.hpp's constants, and the constants are distinct.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <string_view>

#include "cuboid/core/op_names.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "fixtures.hpp"

using namespace cuboid;
using namespace cuboid::test;

namespace {
bool known(const std::string& name) { return std::find(op::all.begin(), op::all.end(), name) != op::all.end(); }

void check_all_known(const LayerOps& ops) {
  for (const auto* list : {&ops.forward, &ops.backward, &ops.recompute})
    for (const Op& o : *list) {
      CAPTURE(o.name);
      CHECK(known(o.name));
    }
}
}  // namespace

TEST_CASE("op names: distinct") {
  const std::set<std::string_view> unique(op::all.begin(), op::all.end());
  CHECK(unique.size() == op::all.size());
}

TEST_CASE("op names: a GEMM's backward is its name + the dgrad / wgrad suffix") {
  CHECK(std::string(op::fc2) + op::dgrad_suffix == op::fc2_dgrad);
  CHECK(std::string(op::qkv) + op::wgrad_suffix == op::qkv_wgrad);
  CHECK(std::string(op::attn_av) + op::dgrad_suffix == op::attn_av_dgrad);
  CHECK(std::string(op::logits) + op::wgrad_suffix == op::logits_wgrad);
}

TEST_CASE("op names: the workload lists only known names") {
  for (const ModelSpec& m : {gpt_22b(), llama3_8b()}) {
    for (int tp : {1, 2}) {
      for (bool sp : {false, true}) {
        for (bool flash : {false, true}) {
          for (bool fusion : {false, true}) {
            ParallelPlan p;
            p.tp = tp;
            p.pp = 2;
            p.seq_length = 2048;
            p.sequence_parallel = sp && tp > 1;
            p.flash_attention = flash;
            p.grad_accum_fusion = fusion;
            CAPTURE(m.name);
            CAPTURE(tp);
            CAPTURE(sp);
            CAPTURE(flash);
            check_all_known(transformer_layer_ops(m, p));
            check_all_known(embedding_ops(m, p));
            check_all_known(lm_head_ops(m, p));
          }
        }
      }
    }
  }
  ParallelPlan bf16_grads;
  bf16_grads.trainer.dp_grad_bytes = 2;
  for (const Op& o : optimizer_step_ops(1e9, 2, 1, optimizer_precision(bf16_grads))) {
    CAPTURE(o.name);
    CHECK(known(o.name));
  }
}

TEST_CASE("op names: an MoE layer lists only known names, with and without EP, ETP and shared experts") {
  ModelSpec m = llama3_8b();
  m.moe.num_experts = 8;
  m.moe.experts_per_token = 2;
  m.moe.expert_ffn_hidden_size = 1024;
  m.moe.shared_expert_ffn_hidden_size = 2048;
  m.moe.shared_expert_gate = true;
  m.moe.moe_layers.assign(static_cast<std::size_t>(m.num_layers), true);
  ModelSpec mla = m;
  mla.mla.kv_lora_rank = 128;
  mla.mla.qk_head_dim = 64;
  mla.mla.qk_rope_head_dim = 32;
  mla.mla.v_head_dim = 64;
  for (int q_lora : {0, 256})
    for (bool sp : {false, true}) {
      mla.mla.q_lora_rank = q_lora;
      ParallelPlan p;
      p.tp = 2;
      p.dp = 4;
      p.seq_length = 2048;
      p.sequence_parallel = sp;
      p.grad_accum_fusion = sp;
      CAPTURE(q_lora);
      check_all_known(transformer_layer_ops(mla, p));
    }
  for (int ep : {1, 4}) {
    for (int etp : {1, 2}) {
      for (bool fusion : {false, true}) {
        ParallelPlan p;
        p.tp = 2;
        p.ep = ep;
        p.etp = etp;
        p.dp = 4;
        p.seq_length = 2048;
        p.sequence_parallel = true;
        p.grad_accum_fusion = fusion;
        p.recompute = Recompute::full;
        CAPTURE(ep);
        CAPTURE(etp);
        for (MoeDispatcher d : {MoeDispatcher::alltoall, MoeDispatcher::allgather, MoeDispatcher::flex}) {
          p.moe_dispatcher = d;
          CAPTURE(to_string(d));
          check_all_known(transformer_layer_ops(m, p));
        }
      }
    }
  }
}
