#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Trainer presets: what a trainer of a given version can run and how it runs
// it (`--trainer`). A user knows which trainer they run, not which of its
// internals are fused; a preset turns that into the plan's settings, each with
// the file and commit it was read from. The presets are data, one file each
// in trainers/ (schemas/cuboid.trainer.1.schema.json), embedded in the binary
// at build time and read on first use (docs/cli.md#trainers).
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/core/plan.hpp"

namespace cuboid {

struct TrainerSource {
  std::string setting;  // "dp_overlap", "sequence_parallel", "zero3_sync", ...
  std::string source;   // "Megatron-LM de7dc40f megatron/model/distributed.py: ..."
};

// A field a preset file leaves out keeps the default below (Megatron-Core's
// behaviour); every field a file gives has its source.
struct TrainerPreset {
  std::string name;         // "megatron-core"
  std::string description;  // one line: trainer, version, precision
  // What the trainer can run at all.
  bool pipeline = true;            // PP > 1
  bool sequence_parallel = true;
  bool selective_recompute = true;
  bool interleaved = true;
  bool flash_attention = true;
  bool grad_accum_fusion = true;   // the fused wgrad + main_grad accumulation exists
  bool uneven_stages = true;       // first / last stage with other layer counts than the middle ones
  bool uneven_interleaved = false;  // ... also in interleaved chunks (every stage's layers / virtual stages)
  // The embedding and the loss counted as layers, and a layout string
  // (Megatron-Core's --account-for-*-in-pipeline-split, --pipeline-model-parallel-layout).
  bool pipeline_layout = false;
  bool context_parallel = false;   // CP > 1 with the p2p ring
  bool context_parallel_a2a = false;  // ... and with the a2a exchange too
  bool expert_parallel = false;    // EP > 1 and an ETP of its own for MoE models (else EP 1, ETP = TP)
  bool fp8 = false;                // quantized linear layers (--precision), Transformer Engine's recipes
  bool recompute_modules = false;  // selective recomputation of other modules than the attention core (--recompute-modules)
  bool recompute_layers = false;   // full recomputation of some layers or in groups (--recompute-method, --recompute-num-layers)
  bool cuda_graphs = true;           // captured CUDA graphs (--cuda-graphs)
  bool tp_comm_overlap = true;       // Transformer Engine's userbuffers TP overlap (--tp-comm-overlap)
  bool overlap_param_gather = true;  // the distributed optimizer's gather in the next forward (--overlap-param-gather)
  bool overlap_param_gather_with_optimizer_step = false;  // the first chunk's gather under the optimizer step
  bool ddp_bucket_size = false;  // a DDP bucket size of the plan's own (--ddp-bucket-size)
  bool activation_offloading = false;  // decoder layers' activations to host memory (--offload-activations)
  bool precision_aware_optimizer = false;  // Transformer Engine's FusedAdam holding the optimizer's states (--precision-aware-optimizer)
  bool fp8_attention = false;  // the attention core in cuDNN's FP8 kernels (--fp8-attention)
  bool muon = false;           // the Muon optimizer (--optimizer muon)
  std::vector<int> zero_stages{0, 1, 2, 3};
  // The attention kernels its code can call (unfused: the QK^T, softmax, AV
  // path); a plan's kernel must be one of them.
  std::vector<AttentionKernel> attention_kernels{AttentionKernel::unfused, AttentionKernel::flash1,
                                                 AttentionKernel::flash2, AttentionKernel::flash3,
                                                 AttentionKernel::cudnn};
  // The MoE token dispatchers it has, the first its default (a preset that
  // names none has Megatron-Core's alltoall, the one cuboid priced first).
  std::vector<MoeDispatcher> moe_dispatchers{MoeDispatcher::alltoall};
  bool moe_ep_overlap = false;     // the combined 1F1B EP overlap (--overlap-moe-expert-parallel-comm)
  // The bytes per gradient element its DP reduction runs at (--grad-reduce-dtype:
  // 2 the parameters' 16-bit dtype, 4 fp32); a file that lists none runs only
  // its settings' dp_grad_bytes.
  std::vector<int> dp_grad_bytes;
  bool runs_dp_grad_bytes(int bytes) const;
  // The bytes per gradient element its Megatron-FSDP can keep and reduce
  // (--fsdp-grad-dtype; TrainerSettings::fsdp_grad_bytes); empty: no
  // Megatron-FSDP, the settings' fsdp_grad_bytes 0. Every trainer runs 0.
  std::vector<int> fsdp_grad_bytes;
  bool runs_fsdp_grad_bytes(int bytes) const;
  // How it runs it by default. A trainer that has the fused accumulation runs
  // it (the files give grad_accum_fusion once).
  bool default_grad_accum_fusion = true;
  // The attention kernel it runs by default: unfused (flash off), a fused
  // kernel, or auto (the GPU profile's default, e.g. Transformer Engine's
  // choice by compute capability).
  AttentionKernel attention_kernel = AttentionKernel::auto_;
  // Whether its MoE plans overlap the EP exchanges by default (Megatron-Core: off).
  bool default_moe_ep_overlap = false;
  TrainerSettings settings;
  std::vector<TrainerSource> sources;
};

// Every preset, the default (megatron-core) first, in the order src/core/meson.build lists the files.
std::span<const TrainerPreset> trainer_presets();
const TrainerPreset& default_trainer();
// nullptr when unknown.
const TrainerPreset* find_trainer(std::string_view name);
// "megatron-core, megatron-2022, ..." for messages and --help.
std::string trainer_names();

// Reads one preset file's text; InputError naming `source`, the field and a
// fix for a bad one. `source` is the file's path, and a preset is named as its
// file ("trainers/torchtitan.json" holds "torchtitan").
TrainerPreset parse_trainer(const std::string& text, const std::string& source);

}  // namespace cuboid
