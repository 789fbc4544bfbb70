#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// CPU activation offloading as Megatron-Core runs it (--cpu-offloading
// --cpu-offloading-num-layers K, Megatron-LM d98e8a64
// transformer_block.py: Transformer Engine's get_cpu_offload_context around
// each decoder layer), with Transformer Engine's DefaultOffloadSynchronizer
// (transformer_engine/pytorch/cpu_offload.py, TE 2.14 to d0067d0d) of a
// model of L layers:
//  - the activations layers 0 .. K-1 save for the backward are copied to
//    pinned host memory on one offload stream, each tensor once it is
//    computed (modelled: once the layer's forward ends);
//  - the compute stream waits for layer i's copies before the forward of
//    layer L - K + i (release_activation_forward_gpu_memory), so at most
//    L - K layers' activations are on the GPU at any time;
//  - layer i's reload is issued on the same stream when the backward of
//    layer L - 1 - K + i starts, after all the compute stream issued before
//    (wait_stream), and layer i's backward waits for it (pop_tensor).
// The copies are the copy engines' DMA: nothing runs on the compute stream.
// The one description the simulator plays (a copy stream per GPU) and the
// estimator folds (offload_exposure).
//
// Megatron-Core's fine-grained activation offloading (--offload-modules,
// megatron/core/pipeline_parallel/fine_grained_activation_offload.py at
// Megatron-LM d98e8a64) runs on the same description, per model chunk of a
// pipeline stage, with `fine` set:
//  - each named module of each layer is an offload group: the tensors it
//    saves for the backward (each of at least min_offloaded_tensor_size =
//    1 Mi elements, transformer_config.py:1343) are copied to pinned host
//    memory on a D2H stream once the module's forward ends (the stream waits
//    for the compute stream, on_group_commit_forward :1262-1269) and freed
//    on the GPU when the copy is done (record_stream); the compute stream
//    never waits for these copies (no fine_grained_offloading_max_inflight_
//    offloads, the default);
//  - the last layer's groups of a chunk whose backward follows its forward
//    stay on the GPU (should_bulk_offload :1206-1227), as do the first
//    backward chunk's (the offload margin, post_warmup_callback :609-639):
//    modelled as every chunk's last layer kept;
//  - a reload goes on the H2D stream when a group's backward ends
//    (on_group_start_backward :1332-1343, bulk_reload :1271-1286), one for
//    each group, so with one layer's groups kept the reload of layer i's
//    group is issued as the same group of layer i + 1 finishes its
//    backward, and the group's backward waits for it
//    (on_group_commit_backward :1288-1308): modelled at layer granularity,
//    layer i's reloads issued as layer i + 1's backward starts.
// Both directions are played on one copy stream (Megatron-Core has a D2H and
// an H2D stream; the reload waits for its group's offload event,
// bulk_reload_group :1176-1196, which comes to the same where a
// micro-batch's copies to host end before its reloads begin).
#include <span>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/time.hpp"

namespace cuboid {

struct ActivationOffload {
  int layers = 0;     // L: the model's decoder layers (CPU offloading runs with PP 1)
  int offloaded = 0;  // K: layers 0 .. K-1 go to host memory (fine-grained: L)
  // Fine-grained offloading: per layer, whether its modules go to host
  // memory (every layer but the last of its chunk); empty for CPU offloading.
  std::vector<char> fine;
  bool offloads(int layer) const {
    if (!fine.empty()) return layer >= 0 && layer < layers && fine[static_cast<std::size_t>(layer)] != 0;
    return layer >= 0 && layer < offloaded;
  }
  // The offloaded layer whose copies the forward of `layer` waits for, or -1.
  int due_before(int layer) const { return fine.empty() ? offloaded_index(layer - (layers - offloaded)) : -1; }
  // The offloaded layer whose reload the backward of `layer` issues as it starts, or -1.
  int reload_issued_at(int layer) const {
    if (!fine.empty()) return offloads(layer - 1) ? layer - 1 : -1;
    return offloaded_index(layer - (layers - 1 - offloaded));
  }

 private:
  int offloaded_index(int i) const { return i >= 0 && i < offloaded ? i : -1; }
};

// The plan's offloading over the model's layers: CPU offloading's first K,
// or fine-grained offloading's layers, each chunk's last kept.
ActivationOffload activation_offload(const ModelSpec& m, const ParallelPlan& plan);
// Fine-grained offloading over one chunk of `layers` layers: all but the last.
ActivationOffload fine_offload_chunk(int layers);

// Fine-grained offloading of one module of a decoder layer (MoE or dense),
// per micro-batch and GPU: the bytes its offload group copies to host memory
// and the bytes of the activations memory.cpp counts that leave the GPU with
// them (they differ where a tensor is saved twice or counted otherwise:
// docs/cost-model.md#fine-grained-activation-offloading).
struct ModuleOffload {
  double copied = 0;
  double freed = 0;
};
ModuleOffload module_offload(const ModelSpec& m, const ParallelPlan& plan, OffloadModule module, bool moe_layer);
// The plan's modules together for one layer.
ModuleOffload layer_module_offload(const ModelSpec& m, const ParallelPlan& plan, bool moe_layer);

// What decoder layer `layer` sends to host memory per micro-batch and GPU:
// every tensor it saves for the backward (its stored activations,
// layer_activation_bytes; Transformer Engine leaves tensors under 256 Ki
// elements on the GPU, which this ignores); with fine-grained offloading,
// its modules' copies (0 for a layer kept on the GPU).
double offloaded_layer_bytes(const ModelSpec& m, const ParallelPlan& plan, int layer);
// The pinned host memory one GPU's offloaded layers take (one micro-batch's;
// CPU offloading only: fine-grained offloading's is memory.cpp's, per stage).
double offloaded_host_bytes(const ModelSpec& m, const ParallelPlan& plan);

// One copy of `bytes` over the card's host link: to host (offload) or back.
TimeNs host_copy_ns(const HostLink& link, double bytes, bool to_host);

// How long one micro-batch's forward and backward wait for the copies, from
// the layers' own times (forward and backward of each decoder layer, the
// copies of each offloaded layer), as the synchronizer above orders them on
// one copy stream.
struct OffloadExposure {
  TimeNs forward_ns = 0;
  TimeNs backward_ns = 0;
  TimeNs total() const { return forward_ns + backward_ns; }
};
OffloadExposure offload_exposure(const ActivationOffload& off, std::span<const TimeNs> fwd_ns,
                                 std::span<const TimeNs> bwd_ns, std::span<const TimeNs> to_host_ns,
                                 std::span<const TimeNs> from_host_ns);

}  // namespace cuboid
