#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The step runner: one training iteration of the plan on one rank. It holds
// this rank's shard of the weights (its pipeline stage's model chunks, its TP
// shard of every matrix), runs the forward and backward passes of every
// micro-batch in the order pipeline_order gives for the plan's schedule
// (GPipe, 1F1B, interleaved), moves activations and gradients between stages
// with point-to-point messages, reduces gradients over DP in buckets
// (all-reduce, or reduce-scatter + all-gather with ZeRO / the distributed
// optimizer) and takes an Adam step on its shard. Every op is timed.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/launch.hpp"
#include "cuboid/exec/layer.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/schedule.hpp"

namespace cuboid::exec {

class OpTimer;

struct StepOptions {
  float dropout = 0.1f;
  std::int64_t dp_bucket_elements = 40'000'000;  // Megatron's default DDP bucket (parameters)
  std::uint64_t seed = 1234;
};

class StepRunner {
 public:
  StepRunner(Backend& backend, ProcessGroups& groups, const ModelSpec& model, const ParallelPlan& plan,
             OpTimer& timer, const StepOptions& options = {});
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // One iteration (every micro-batch forward and backward, DP reduction,
  // Adam). Returns the mean loss over the micro-batches on ranks of the last
  // pipeline stage, NaN elsewhere.
  double step(std::int64_t index, bool measured);

  // After steps: how far this rank's weights are from the mean of the ranks
  // that must hold the same values (max |w - mean| / max |mean|): the norms'
  // weights across the TP group, and every weight across the DP replicas.
  // Collective over the TP and DP groups.
  struct ReplicaDrift {
    double tp_norms = 0;
    double dp_weights = 0;
  };
  ReplicaDrift replica_drift();

  std::size_t parameter_count() const { return dense_.count; }  // on this rank
  int layers_on_rank() const;
  const LayerDims& dims() const { return runner_->dims(); }

 private:
  struct Chunk {
    int virtual_stage = 0;
    int first_layer = 0;  // global index of its first layer
    int num_layers = 0;
    bool has_embedding = false, has_head = false;
    DeviceSpan embedding, embedding_grad;  // [vocab shard, h]
    std::vector<LayerParams> layers, layer_grads;
    DeviceSpan final_gamma, final_beta, w_out;  // [h], [h], [h, vocab shard]
    DeviceSpan final_gamma_grad, final_beta_grad, w_out_grad;
  };
  struct InFlight;  // activations of one (micro-batch, chunk)
  // A flat set of weights with its gradients and optimizer state: the
  // dense weights (over DP x CP), or this rank's experts (over expert-DP).
  struct WeightState {
    std::size_t count = 0;   // parameters in use
    std::size_t padded = 0;  // count rounded up to the group size when sharded
    DeviceBuffer params, grads;  // grads: fp32
    DeviceBuffer master_buf, m, v;  // fp32 master (unless `params` serve) and Adam's moments
    DeviceBuffer grad_shard, param_shard;  // ZeRO >= 1: this rank's block of each bucket
    DeviceSpan master;  // master_buf, or params themselves
  };
  // The micro-batches' inputs and what the loss reads.
  struct BatchBuffers {
    std::vector<DeviceBuffer> ids, labels;  // per micro-batch, [T] i32
    DeviceBuffer losses;                    // [micro_batches] f32
    DeviceBuffer vocab_stats;               // [T] f32: the vocab-parallel cross-entropy's all-reduces
  };
  // Buffers a pass reuses for every micro-batch.
  struct WorkBuffers {
    DeviceBuffer emb_full, head_full, grad_a, grad_b;
    DeviceBuffer norm_grads;  // the norms' gradients, packed for one TP all-reduce
    LayerActs fwd_acts;       // forward activations dropped at once (full recompute)
  };
  // The pipeline's activations in flight and the messages between stages.
  struct PipelineState {
    DeviceBuffer grad_in;                     // the received gradient of a chunk's output
    DeviceSpan input_grad;                    // the last backward's input gradient, to send
    std::unique_ptr<InFlight> pending_input;  // the next forward's buffers, its input received into xs[0]
    std::map<std::pair<int, int>, std::unique_ptr<InFlight>> in_flight;  // by (micro-batch, chunk)
    std::vector<std::vector<std::unique_ptr<InFlight>>> free;             // per chunk
  };

  void layout_params();
  void plan_chunks();
  void place_chunk(Chunk& ch, std::size_t& off);
  void init_optimizer_state(WeightState& w, bool sharded, std::size_t parts, std::size_t rank, std::size_t bucket);
  bool is_moe_layer(int layer) const;
  std::uint64_t weight_seed(std::uint64_t what) const;
  void place_experts(LayerParams& w, LayerParams& g, int layer);
  void update_experts(const AdamConfig& adam, std::int64_t step);
  std::size_t expert_bucket() const;  // elements per bucket of the experts' reduction (a multiple of EDP)
  // ZeRO >= 1 over `comm`: each bucket's gradients reduce-scattered into
  // grad_shard, Adam on the shard, the updated master all-gathered into params
  // (the dense weights over DP x CP, the experts over expert-DP).
  void sharded_adam_step(Communicator& comm, WeightState& w, std::size_t bucket, const AdamConfig& adam,
                         std::int64_t step);
  void forward(int micro_batch, int chunk, std::int64_t step);
  void backward(int micro_batch, int chunk, std::int64_t step);
  // One pipeline exchange: the sends of `done`'s results and the receives of
  // `next`'s inputs (either may be empty or need none), as one batch.
  void exchange(std::span<const ScheduleStep> done, std::span<const ScheduleStep> next);
  void reduce_gradients_and_update(std::int64_t step);
  // The norms' weights (or, with grads = true, their gradients): every
  // layer's two norms and the final one, as spans of the flat buffers.
  std::vector<DeviceSpan> norm_spans(bool grads) const;
  std::unique_ptr<InFlight> acquire(int chunk);
  std::uint64_t layer_seed(std::int64_t step, int micro_batch, int layer) const;

  Backend& be_;
  ProcessGroups& groups_;
  ModelSpec model_;
  ParallelPlan plan_;
  OpTimer& timer_;
  StepOptions options_;
  std::unique_ptr<LayerRunner> runner_;
  AttentionMemory attention_memory_ = AttentionMemory::keep_probs;
  int stage_ = 0, virtual_stages_ = 1, micro_batches_ = 1;
  int data_ranks_ = 1, data_index_ = 0;  // the gradient group (DP x CP) and this rank's place in it
  std::vector<Chunk> chunks_;
  StageOrder order_;
  std::size_t pair_begin_ = 0, pair_end_ = 0;  // order_[pair_begin_, pair_end_): forward-backward pairs

  WeightState dense_;
  // MoE: the local experts of every MoE layer on this rank, apart from the
  // rest (their gradients go over expert-DP, not DP).
  MoeDims moe_;
  WeightState experts_;
  std::size_t expert_at_ = 0;   // layout: where the next MoE layer's experts go
  bool shard_experts_ = false;  // ZeRO >= 1 over an expert-DP group of more than one rank
  BatchBuffers batch_;
  WorkBuffers work_;
  PipelineState pipe_;
};

}  // namespace cuboid::exec
