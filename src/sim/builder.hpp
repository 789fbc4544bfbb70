#pragma once
// Private to the simulator: builds the task graph of one iteration on an
// Engine (see simulator.cpp for the model) and keeps, per task, what the
// breakdown and the trace need.
#include <cstdint>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/sim/engine.hpp"
#include "cuboid/core/schedule.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/zero3.hpp"
#include "cuboid/cost/offload.hpp"
#include "cuboid/cost/step.hpp"
#include "message_plan.hpp"
#include "pass_template.hpp"
#include "program.hpp"
#include "task_meta.hpp"
#include "tp_probe.hpp"

namespace cuboid::sim::detail {

inline constexpr TaskId kNoTask = std::numeric_limits<TaskId>::max();

// A pass's name in traces: F3, B3, or F3.1 for model chunk 1 of interleaved stages.
std::string step_name(Direction d, int mb, int chunk, int v);

// A compute segment or a collective as the trace shows it.
struct TraceLabel {
  std::string name;
  std::string category;
  const Program* program = nullptr;  // compute: nested ops [first_op, first_op + num_ops)
  std::uint32_t first_op = 0;
  std::uint32_t num_ops = 0;
  // Compute segments merged across programs: (program, first_op, num_ops) parts.
  std::vector<std::tuple<const Program*, std::uint32_t, std::uint32_t>> parts;
};

struct StepSpan {
  int stage = 0;
  TaskId first = 0, last = 0;
  std::string name;
  bool forward = true;
  // An EP overlap's combined step (F1+B0): the backward's own first and
  // last compute, its two passes shown as one span from the earlier start
  // to the later end (they run at once: two spans would not nest).
  TaskId first2 = std::numeric_limits<TaskId>::max(), last2 = std::numeric_limits<TaskId>::max();
};

// A stage's representative rank (TP rank 0 of the replica that sets the
// pace), whose streams and groups carry the stage's tasks.
struct Representative {
  int rank = 0;
  int stage = 0;
  StreamId compute = 0, tp = 0, pp_fwd = 0, pp_bwd = 0, dp = 0;
  // The EP overlap's communication stream (plan.moe_ep_overlap), whose
  // exchanges hold SMs of the compute stream.
  StreamId a2a = 0;
  StreamId offload = kNoStream;  // CPU offloading's copies to and from host memory
  GroupId tp_group = 0, dp_group = 0, cp_group = 0, ep_group = 0;
  // The same EP ranks for the allgather / flex dispatcher's exchanges
  // (CommGroup::dispatch); ep_group where the plan's dispatcher is alltoall.
  GroupId ep_dispatch_group = 0;
  // The experts' gradient group (expert-DP): dp_group where it is the same ranks.
  GroupId edp_group = 0;
};

// What ZeRO-3 gathers at once within a unit: the whole unit, or (tensor
// units, TrainerSettings::zero3_unit) the ops of one weight's module.
struct Part {
  const Program* prog = nullptr;
  double params = 0;         // gathered before it, per GPU (0: resident)
  double grads = 0;          // gradients ready after it, per GPU
  std::vector<double> grad_tensors;  // the same, per parameter tensor (they sum to grads)
  std::int64_t tensor = -1;  // Zero3Use::tensor
  std::string name;
  double quantized = 0;      // of `params`, the quantized linear weights (StepDescription::gathered_bytes)
  // Of `params` and `quantized`, the routed experts' (gathered over
  // expert-DP after the rest), and of `grads` the experts' (reduced there,
  // not in grad_tensors): Megatron-FSDP's buckets per unit and group.
  double expert = 0, expert_quantized = 0, expert_grads = 0;
};

// One unit of a model chunk: the embedding, a transformer layer or the LM head.
struct Unit {
  const Program* fwd = nullptr;
  const Program* bwd = nullptr;  // recompute + backward
  double params = 0;             // per GPU, for DP buckets and ZeRO-3 gathers
  std::string name;
  std::vector<Part> fwd_parts, bwd_parts;  // ZeRO-3 only, in execution order
  int layer = -1;                          // a decoder layer's index in the model; -1: embedding, head, MTP
  double expert = 0;                       // of `params`, the routed experts'
};

class Builder {
 public:
  Builder(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan, const SimOptions& opts);
  // Off: every pass is played op by op, as traced stages always are (tests
  // check that both give the same task graph). On by default.
  void stamp_passes(bool on) { stamp_ = on; }
  void build();

  Network& network() { return *net_; }
  Engine& engine() { return *eng_; }
  const Engine& engine() const { return *eng_; }
  // The simulation's arena (huge_pages.hpp), for tables that live as long as the builder.
  std::pmr::memory_resource* arena() { return &arena_; }
  const std::vector<Representative>& representatives() const { return representatives_; }
  std::span<const TaskMeta> meta() const { return meta_; }
  const std::map<TaskId, TraceLabel>& labels() const { return labels_; }
  const std::vector<StepSpan>& spans() const { return spans_; }
  // [stage][chunk] -> the units in forward order (after build()).
  const std::vector<std::vector<std::vector<Unit>>>& units() const { return work_.units; }
  bool traced(int stage) const { return !traced_stages_.empty() && traced_stages_[static_cast<std::size_t>(stage)]; }
  // Peak NVLink utilisation of TP collectives priced off the shared network.
  double tp_probe_peak() const { return pacing_.tp_probe.peak_utilisation(); }
  // The bytes of the DP-side collectives (cost/step.hpp's groups) it added
  // for `stage`'s representative over the iteration, per group and kind:
  // what tests hold to StepDescription::stage.
  double played_bytes(int stage, StepGroup group, Collective c) const {
    return traffic_.played_bytes[played_index(stage, group, c)];
  }
  // The factor stage s's compute runs at (make_programs): its GPU's speed
  // spread times the straggler's slowdown on the straggler's stage.
  double compute_factor(int stage) const { return pacing_.compute_factor[static_cast<std::size_t>(stage)]; }

 private:
  struct PassState {  // one (direction, micro-batch, virtual stage) pass
    bool added = false;
    std::uint32_t end_off = 0, end_len = 0;  // its end dependencies: a range in ends_
    TaskId p2p = std::numeric_limits<TaskId>::max();    // its outgoing message, once created
    TaskId ready = std::numeric_limits<TaskId>::max();  // that message received (and gathered)
  };
  struct Chain {  // the task chain of one pass on one GPU
    int stage = 0;
    std::vector<TaskId> deps;
    std::vector<TaskId> async;
    TimeNs pending_ns = 0;
    TimeNs pending_held_ns = 0;  // the same while a DP collective holds SMs (Item::held_ns)
    bool pending = false;
    // The uncontended time of the async TP collective the next compute runs
    // under (Item::reduced_ns), -1 when none is in flight.
    TimeNs overlap_ns = -1;
    std::vector<std::tuple<const Program*, std::uint32_t, std::uint32_t>> parts;
    TaskId first = std::numeric_limits<TaskId>::max();
    TaskId last_compute = std::numeric_limits<TaskId>::max();
  };

  void make_representatives();
  void make_programs();
  void make_units();
  bool tp_isolated() const;
  bool rails_foldable() const;
  // The TP ranks whose DP, pipeline and embedding groups are registered: all,
  // or with folded rails TP rank 0's alone (CommGroup::rail0_part), the
  // others being its rotations.
  int mirrored_tp() const;
  // The representative's EP and expert-DP groups, with every other one of
  // its stage as mirrors.
  void add_expert_groups(Representative& r);
  // The TP group of stage `pp` at data index `data` (DP x CP).
  std::vector<int> tp_group_of(int pp, int data) const { return map_.tp_group(pp, data / shape_.cp, data % shape_.cp); }

  PassState& pass(Direction d, int mb, int vs);
  std::span<const TaskId> end_of(const PassState& s) const { return {ends_.data() + s.end_off, s.end_len}; }
  int stage_of(int vs) const { return vs % shape_.pp; }
  int chunk_of(int vs) const { return vs / shape_.pp; }
  bool can_add(int stage, std::size_t idx);
  // Whether the input of `st` on `stage` from the neighbouring virtual stage
  // exists (none needed: true), and its tasks appended to `entry`.
  bool input_ready(int stage, const ScheduleStep& st) const;
  void add_input(int stage, const ScheduleStep& st, std::vector<TaskId>& entry) const;
  void reserve_tasks();
  void try_message(std::uint32_t msg);
  void add_step(int stage, std::size_t idx);
  // The EP overlap (core/ep_overlap.hpp): with PP 1 stage 0's order as
  // Megatron-Core's combined 1F1B runs it (F0, then F(i+1) with B(i), then
  // the last backward); with PP > 1 the interleaved order (one more warm-up
  // step), its steady state's forward / backward pairs combined.
  // pair_first_[stage] marks each forward played with the backward after it;
  // play_combined plays such a pair layer by layer in ep_pair_order,
  // play_node one node of a layer's pass: its exchanges, or its compute, all
  // of it or (the weight gradients delayed) the weight-gradient items or the
  // others.
  enum class NodeItems : std::uint8_t { all, data_grad, weight_grad };
  void pair_passes();
  void play_combined(int stage, std::size_t idx);
  void play_node(Chain& ch, const Program& prog, std::size_t first, std::size_t end, bool exchange,
                 NodeItems items = NodeItems::all);
  // A model chunk's parameter gathers in the next forward
  // (--overlap-param-gather): its buckets' gathers in forward order, issued
  // back to back on the DP stream, and the unit each bucket starts at.
  struct ChunkGathers {
    std::vector<TaskId> tasks;
    std::vector<std::size_t> starts;
    bool issued = false;
  };
  // Issues stage `stage`'s chunk `chunk` gathers after `deps` (the host's
  // point): at the chunk's first forward, or ahead of it where the schedule
  // aligns them (ParallelPlan::aligns_param_gather; gathers_ahead_).
  void issue_chunk_gathers(int stage, int chunk, const std::vector<TaskId>& deps);
  void plan_gathers_ahead();
  // One pass from `entry` on, op by op; its end dependencies are left in scratch_.chain.deps.
  // `gathers`: a chunk's first forward with --overlap-param-gather: each
  // bucket's units wait for its gather.
  void play_pass(int stage, const ScheduleStep& st, bool reduce_now, const std::vector<TaskId>& entry,
                 const ChunkGathers* gathers = nullptr);
  // A ZeRO-3 pass's units, part by part, with their gathers and reductions (zero3.hpp).
  void play_zero3(int stage, const ScheduleStep& st, bool reduce_now);
  // One ZeRO-3 pass being played: its plan, the DP stream's last task and
  // DeepSpeed's reduce bucket (the gradient tensors waiting in it, what they
  // depend on, whether the current part added some, and the buckets that
  // hold the current part's gradients, reduced after it).
  struct Zero3Pass {
    Zero3Pass(const Representative& r, Zero3PassPlan p, int s, std::string name);
    const Representative& me;
    Zero3PassPlan plan;
    int stage;
    TaskMeta dp_meta, host_meta;  // DP work on the DP stream; DP work holding the compute stream
    std::string pass_name;
    TaskId dp_tail = std::numeric_limits<TaskId>::max();
    std::vector<TaskId> deps;  // scratch
    double acc = 0;
    std::vector<double> held;
    std::vector<TaskId> held_deps, end_deps;
    bool held_current = false;
    std::vector<std::vector<double>> after;
  };
  // Everything issued so far into z.deps: what torch.cuda.synchronize waits for.
  void zero3_drain(Zero3Pass& z);
  void zero3_gather(Zero3Pass& z, std::size_t part);
  void zero3_reduce(Zero3Pass& z, const std::vector<double>& tensors, const std::vector<TaskId>& after,
                    double experts = 0);
  void zero3_fill_bucket(Zero3Pass& z, const Part& pt);
  bool zero3_tensor() const;
  PassTemplate& pass_template(int stage, const ScheduleStep& st, bool reduce_now);
  void stamp(const PassTemplate& pt, int stage, const std::vector<TaskId>& entry, std::pmr::vector<TaskId>& end);
  // The engine calls of a pass, or, while recording, their template entries.
  TaskId emit_compute(StreamId stream, TimeNs ns, const std::vector<TaskId>& deps, const TaskMeta& mt,
                      TimeNs held_ns = 0);
  TaskId emit_collective(Collective c, GroupId group, double bytes, StreamId stream, const std::vector<TaskId>& deps,
                         const TaskMeta& mt, bool dp_reduction = false);
  // Items [first, end) of prog (all by default).
  void play(Chain& ch, const Program& prog, std::size_t first = 0, std::size_t end = static_cast<std::size_t>(-1));
  // CPU offloading around one decoder layer of a pass (offload.hpp): before
  // it, the waits and the reloads it issues; after a forward, its copies.
  void offload_before(Chain& ch, const Unit& unit, bool fwd);
  void offload_after(Chain& ch, const Unit& unit, bool fwd);
  void flush(Chain& ch);
  TaskId add_tp(Chain& ch, const Item& it, const Program& prog, const std::vector<TaskId>& deps);
  void dp_bucket(int stage, double params, const std::vector<TaskId>& deps, const std::string& name);
  // The distributed optimizer's gather of one bucket of `params` (dense and
  // experts in the stage's proportion) on the DP stream; the last task.
  TaskId param_gather(int stage, double params, const std::vector<TaskId>& deps, const std::string& name);
  static std::size_t played_index(int stage, StepGroup group, Collective c) {
    return (static_cast<std::size_t>(stage) * 3 + static_cast<std::size_t>(group)) * kCollectiveKinds +
           static_cast<std::size_t>(c);
  }
  // Adds a collective on `group` to played_bytes when the group is one of
  // the stage's DP-side groups.
  void count_played(int stage, GroupId group, Collective c, double bytes);
  void finish_iteration();
  void optimizer_step(int stage, const std::vector<TaskId>& deps);

  static TaskMeta meta_of(Category category, std::uint8_t thread, int stage, int stage2 = -1) {
    return TaskMeta{category, thread, static_cast<std::uint16_t>(stage), static_cast<std::uint16_t>(stage2 < 0 ? kNoStage : stage2)};
  }
  // Inline: every task is tagged, almost always as it is added.
  TaskId tag(TaskId t, Category category, std::uint8_t thread, int stage, int stage2 = -1) {
    return tag(t, meta_of(category, thread, stage, stage2));
  }
  TaskId tag(TaskId t, const TaskMeta& mt) {
    if (meta_.size() == t) {
      meta_.push_back(mt);
      return t;
    }
    return tag_late(t, mt);
  }
  TaskId tag_late(TaskId t, const TaskMeta& mt);
  // Names are kept only for traced stages (a million untraced tasks otherwise
  // pay for two strings each); the check is inline, on every task's path.
  void label(TaskId t, int stage, std::string_view name, std::string_view category) {
    if (traced(stage)) label_traced(t, name, category);
  }
  void label_traced(TaskId t, std::string_view name, std::string_view category);

  const ModelSpec& m_;
  const Topology& topo_;
  const ParallelPlan& plan_;
  const SimOptions& opts_;
  RankMapping map_;
  StepDescription step_;  // the iteration's DP-side traffic and optimizer step (cost/step.hpp)
  // The simulation's tables (the engine's, and below those that grow with
  // the tasks, messages and passes), on huge pages; declared before them.
  SimArena arena_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<Engine> eng_;
  // Gradients to reduce: DP x CP or expert-DP above 1.
  bool reduces() const { return shape_.dp > 1 || shape_.edp > 1; }

  std::vector<Representative> representatives_;
  std::vector<StageOrder> order_;
  std::vector<std::size_t> cursor_;
  std::vector<std::vector<TaskId>> stage_end_;      // end of each stage's previous pass
  std::pmr::vector<PassState> passes_{&arena_};
  std::pmr::vector<TaskId> ends_{&arena_};  // every pass's end dependencies, back to back (PassState::end_off)
  bool stamp_ = true;
  std::vector<std::vector<char>> pair_first_;  // pair_passes: [stage][index in its order]
  std::vector<std::vector<ChunkGathers>> chunk_gathers_;  // [stage][chunk]
  // [stage][index in its order]: the chunks whose gathers the aligned
  // interleaved schedule issues before that step (aligns_param_gather).
  std::vector<std::vector<std::vector<int>>> gathers_ahead_;
  std::vector<PassTemplate> templates_;  // [((stage * v + chunk) * 2 + backward) * 2 + reduce_now]
  PassTemplate* recording_ = nullptr;    // the template play() is recording into, if any

  // Programs, one set per distinct compute factor (one when every stage runs
  // at the median GPU's speed); filled once, so Unit's pointers stay valid.
  struct Programs {
    Program layer_fwd, layer_bwd, embed_fwd, embed_bwd, head_fwd, head_bwd;
    // An MoE model's dense layers (layer_* are its MoE layers).
    Program dense_fwd, dense_bwd;
    Program mtp_fwd, mtp_bwd;  // one multi-token prediction module
    // A partial full recomputation's stored layers (recomputes_layer false):
    // the backward alone, MoE (or the only kind) and dense.
    Program layer_bwd_stored, dense_bwd_stored;
    // ZeRO-3 tensor units: the layer's forward, and its recompute then
    // backward, cut per weight (split_by_weight; part_weights_ says which);
    // a stored layer's backward alone.
    std::vector<Program> layer_fwd_parts, layer_bwd_parts, layer_bwd_stored_parts;
  };
  struct PartWeight {
    int weight = -1;     // index into layer_weights, -1: none
    bool grads = false;  // a backward part (its weight's gradients are ready after it)
  };
  void make_parts(std::vector<Unit>& units, const Programs& p);

  // Set-up: the plan's sizes as the builder walks them (the DP-side ones are
  // the step description's), and what each stage computes.
  struct Shape {
    int pp = 1, v = 1, vs_count = 1, mbs = 1, tp = 1, cp = 1, ep = 1;
    int dp = 1;      // the data index: DP x CP
    int edp = 1;     // expert-DP
    int rep_dp = 0;  // the representative's data index
    bool expert_group = false;  // the expert-DP group is other ranks than the DP x CP group
    std::vector<double> expert_share;  // per stage: the routed experts' share of its parameters
  };
  struct Pacing {
    int straggler_stage = -1;
    double straggler_slowdown = 1.0;
    std::vector<double> compute_factor;  // per stage (compute_factor)
    bool tp_fast = false;
    int overlap_sms = 0;  // SMs an async TP collective takes from the GEMM under it (make_programs)
    int held_sms = 0;     // SMs a DP collective takes from the compute beside it (make_representatives)
    TpProbe tp_probe;     // prices TP collectives when tp_fast
  };
  struct StageWork {
    std::vector<Programs> programs;
    std::vector<std::size_t> stage_programs;  // stage -> index into programs
    std::vector<PartWeight> fwd_part_weights, bwd_part_weights, bwd_stored_part_weights;
    std::vector<std::vector<std::vector<Unit>>> units;  // [stage][chunk] -> units in forward order
  };
  // Playing a pass: scratch reused by every pass, so its vectors keep their capacity.
  struct PassScratch {
    std::vector<TaskId> entry;       // add_step's: the pass's entry dependencies
    std::vector<TaskId> stamp_deps;  // stamp's
    Chain chain;                     // add_step's
    Chain chain2;                    // play_combined's backward
    Chain chain3;                    // play_combined's delayed weight gradients
    std::vector<TaskId> wgrad_ends;  // play_combined's: the delayed weight gradients' last tasks
    std::vector<TaskId> gathers;     // play_zero3's: each part's gather
    std::vector<const Part*> zero3_parts;  // play_zero3's: the pass's parts in order
    std::vector<const Unit*> zero3_units;  // play_zero3's: the unit of each part
    std::vector<Zero3Use> zero3_uses;
    std::vector<TaskId> message_deps;  // try_message's
    std::vector<TaskId> host_copies;   // the pass's offload / reload per offloaded layer (offload.hpp)
  };
  // Traffic between the passes: the pipeline's messages and the DP side.
  static constexpr std::size_t kCollectiveKinds = 6;
  struct Traffic {
    explicit Traffic(std::pmr::memory_resource* mem) : messages(mem) {}
    MessagePlan messages;                      // the pipeline's p2p messages
    std::vector<GroupId> p2p_fwd_group, p2p_bwd_group;  // per stage boundary s -> s+1 (index s)
    std::vector<std::vector<TaskId>> dp_tasks;  // per stage: gradient reductions
    std::vector<double> played_bytes;           // [stage][StepGroup][Collective] (played_index)
  };
  Shape shape_;
  Pacing pacing_;
  // CPU offloading (offload.hpp): which layers, and each one's copy to host
  // memory and back, per micro-batch.
  ActivationOffload offload_;
  std::vector<TimeNs> offload_ns_, reload_ns_;
  StageWork work_;
  PassScratch scratch_;
  Traffic traffic_{&arena_};

  std::pmr::vector<TaskMeta> meta_{&arena_};
  std::map<TaskId, TraceLabel> labels_;
  std::vector<StepSpan> spans_;
  std::vector<bool> traced_stages_;
};

}  // namespace cuboid::sim::detail
