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

  std::size_t parameter_count() const { return param_count_; }  // on this rank
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

  void layout_params();
  void place_experts(LayerParams& w, LayerParams& g, int layer);
  void update_experts(const AdamConfig& adam, std::int64_t step);
  std::size_t expert_bucket() const;  // elements per bucket of the experts' reduction (a multiple of EDP)
  // ZeRO >= 1 over `comm`: each bucket's gradients reduce-scattered into
  // grad_shard, Adam on the shard, the updated master all-gathered into params
  // (the dense weights over DP x CP, the experts over expert-DP).
  void sharded_adam_step(Communicator& comm, DeviceSpan grads, DeviceSpan grad_shard, DeviceSpan params,
                         DeviceSpan param_shard, DeviceSpan master, DeviceSpan m, DeviceSpan v, std::size_t bucket,
                         const AdamConfig& adam, std::int64_t step);
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

  std::size_t param_count_ = 0, padded_count_ = 0;
  // MoE: the local experts of every MoE layer on this rank, apart from the
  // rest (their gradients go over expert-DP, not DP).
  MoeDims moe_;
  std::size_t expert_count_ = 0, expert_at_ = 0;
  DeviceBuffer expert_params_, expert_grads_, expert_master_buf_, expert_m_, expert_v_;
  DeviceBuffer expert_grad_shard_, expert_param_shard_;  // ZeRO >= 1: this rank's block of each bucket
  std::size_t expert_padded_ = 0;  // expert_count_ rounded up to the expert-DP size when sharded
  bool shard_experts_ = false;     // ZeRO >= 1 over an expert-DP group of more than one rank
  DeviceSpan expert_master_;
  DeviceBuffer params_, grads_, master_buf_, adam_m_, adam_v_, grad_shard_, param_shard_;
  DeviceSpan master_;
  std::vector<DeviceBuffer> ids_, labels_;  // per micro-batch, [T] i32
  DeviceBuffer losses_;                     // [micro_batches] f32
  DeviceBuffer vocab_stats_;                // [T] f32: the vocab-parallel cross-entropy's all-reduces
  DeviceBuffer emb_full_, head_full_, grad_a_, grad_b_;
  DeviceBuffer grad_in_;                    // the received gradient of a chunk's output
  DeviceBuffer norm_grads_;                 // the norms' gradients, packed for one TP all-reduce
  DeviceSpan input_grad_;                   // the last backward's input gradient, to send
  std::unique_ptr<InFlight> pending_input_; // the next forward's buffers, its input received into xs[0]
  LayerActs fwd_scratch_;  // forward activations dropped at once (full recompute)
  std::map<std::pair<int, int>, std::unique_ptr<InFlight>> in_flight_;
  std::vector<std::vector<std::unique_ptr<InFlight>>> free_;
};

}  // namespace cuboid::exec
