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
#include <span>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/time.hpp"

namespace cuboid {

struct ActivationOffload {
  int layers = 0;     // L: the model's decoder layers (offloading runs with PP 1)
  int offloaded = 0;  // K: layers 0 .. K-1 go to host memory
  bool offloads(int layer) const { return layer >= 0 && layer < offloaded; }
  // The offloaded layer whose copies the forward of `layer` waits for, or -1.
  int due_before(int layer) const { return offloaded_index(layer - (layers - offloaded)); }
  // The offloaded layer whose reload the backward of `layer` issues as it starts, or -1.
  int reload_issued_at(int layer) const { return offloaded_index(layer - (layers - 1 - offloaded)); }

 private:
  int offloaded_index(int i) const { return i >= 0 && i < offloaded ? i : -1; }
};

ActivationOffload activation_offload(const ModelSpec& m, const ParallelPlan& plan);

// What decoder layer `layer` sends to host memory per micro-batch and GPU:
// every tensor it saves for the backward (its stored activations,
// layer_activation_bytes; Transformer Engine leaves tensors under 256 Ki
// elements on the GPU, which this ignores).
double offloaded_layer_bytes(const ModelSpec& m, const ParallelPlan& plan, int layer);
// The pinned host memory one GPU's offloaded layers take (one micro-batch's).
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
