// The step runner: the plan's pipeline schedule on one rank, with TP, PP and
// DP communication and the optimizer step.
#include "cuboid/exec/step.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::exec {

namespace {
std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }
constexpr double kGradBytes = kFp32Bytes;  // fp32 gradients (StepRunner::WeightState::grads)
}  // namespace

struct StepRunner::InFlight {
  std::vector<DeviceBuffer> xs;    // layer inputs, then the chunk's output: [local_tokens, h]
  std::vector<LayerActs> acts;     // per layer (empty with full recompute)
  DeviceBuffer norm_out, norm_mean, norm_rstd, norm_full, logits;  // LM head
};

StepRunner::StepRunner(Backend& backend, ProcessGroups& groups, const ModelSpec& model, const ParallelPlan& plan,
                       OpTimer& timer, const StepOptions& options)
    : be_(backend), groups_(groups), model_(model), plan_(plan), timer_(timer), options_(options) {
  stage_ = groups_.coord.pp;
  virtual_stages_ = plan_.schedule == Schedule::interleaved ? plan_.virtual_stages : 1;
  micro_batches_ = static_cast<int>(plan_.num_micro_batches());
  try {
    order_ = pipeline_order(plan_.schedule, plan_.pp, micro_batches_, virtual_stages_)[sz(stage_)];
    if (plan_.schedule == Schedule::interleaved) {
      // The steady phase: forward-backward pairs after the warm-up forwards.
      pair_begin_ = sz(warmup_steps(plan_.schedule, plan_.pp, stage_, micro_batches_, virtual_stages_));
      pair_end_ = order_.size() - pair_begin_;
    }
  } catch (const std::invalid_argument& e) {
    throw InputError("plan", "parallel.schedule", e.what(), "choose sizes the schedule supports");
  }
  attention_memory_ = plan_.recompute == Recompute::selective ? AttentionMemory::recompute_probs
                                                              : AttentionMemory::keep_probs;
  const LayerDims dims = layer_dims(model_, plan_, options_.dropout);
  if (model_.moe.enabled()) {
    CUBOID_EXEC_REQUIRE(groups_.ep != nullptr && groups_.edp != nullptr, "StepRunner",
                        "an MoE plan needs the EP and expert-DP groups (make_process_groups with expert_groups)");
    moe_ = moe_dims(model_, plan_, dims.local_tokens);
  }
  if (plan_.cp > 1)
    CUBOID_EXEC_REQUIRE(groups_.cp != nullptr && groups_.cp->size() == plan_.cp, "StepRunner",
                        "a CP plan needs its CP group (make_process_groups)");
  data_ranks_ = plan_.dp * plan_.cp;
  data_index_ = groups_.coord.cp + plan_.cp * groups_.coord.dp;
  runner_ = std::make_unique<LayerRunner>(be_, groups_.tp.get(), dims, timer_, model_.moe.enabled() ? &moe_ : nullptr,
                                          groups_.ep.get(), plan_.cp > 1 ? groups_.cp.get() : nullptr,
                                          groups_.flex.intra != nullptr ? &groups_.flex : nullptr);
  layout_params();

  const LayerDims& d = runner_->dims();
  const std::int64_t T = d.tokens, Tl = d.local_tokens, h = d.hidden;
  // Synthetic data: token ids of the DP replica's micro-batches (the same on
  // every TP rank and stage), shifted into this rank's vocabulary shard.
  // With CP the rank takes chunks r and 2 cp - 1 - r of each sequence
  // (its positions [0, s/2) and [s/2, s)): every token keeps the id and
  // label it has without CP.
  const std::int64_t vocab_first = d.vocab * groups_.coord.tp;
  const std::int64_t b = d.micro_batch;
  for (int mb = 0; mb < micro_batches_; ++mb) {
    std::vector<std::int32_t> ids(sz(T)), labels(sz(T));
    for (std::int64_t i = 0; i < T; ++i) {
      const std::int64_t global =  // rows are [s, b]
          cp_global_position(i / b, d.seq, groups_.coord.cp, plan_.cp) * b + i % b;
      const std::uint64_t key = (static_cast<std::uint64_t>(groups_.coord.dp) << 40) ^
                                (static_cast<std::uint64_t>(mb) << 24) ^ static_cast<std::uint64_t>(global);
      const auto id = static_cast<std::int64_t>(uniform01(options_.seed, key) * static_cast<float>(model_.vocab_size));
      ids[sz(i)] = static_cast<std::int32_t>(id - vocab_first);
      labels[sz(i)] = static_cast<std::int32_t>(uniform01(options_.seed + 1, key) * static_cast<float>(d.vocab));
    }
    batch_.ids.push_back(be_.alloc(sz(T), DType::i32));
    be_.upload_indices(ids, batch_.ids.back());
    batch_.labels.push_back(be_.alloc(sz(T), DType::i32));
    be_.upload_indices(labels, batch_.labels.back());
  }
  batch_.losses = be_.alloc(sz(micro_batches_), DType::f32);
  batch_.vocab_stats = be_.alloc(sz(T), DType::f32);
  be_.fill(batch_.vocab_stats, 0.0f);
  work_.emb_full = be_.alloc(sz(T * h));
  work_.head_full = be_.alloc(sz(T * h));
  work_.grad_a = be_.alloc(sz(Tl * h));
  work_.grad_b = be_.alloc(sz(Tl * h));
  pipe_.grad_in = be_.alloc(sz(Tl * h));
  if (plan_.recompute == Recompute::full) work_.fwd_acts = runner_->make_acts(AttentionMemory::recompute_probs);
  pipe_.free.resize(chunks_.size());
}

StepRunner::~StepRunner() = default;

int StepRunner::layers_on_rank() const {
  int n = 0;
  for (const Chunk& c : chunks_) n += c.num_layers;
  return n;
}

bool StepRunner::is_moe_layer(int layer) const {
  return model_.moe.enabled() && model_.moe.moe_layers[sz(layer)];
}

// TP ranks hold different shards; DP replicas the same weights.
std::uint64_t StepRunner::weight_seed(std::uint64_t what) const {
  return mix64(options_.seed ^ (what << 16) ^ static_cast<std::uint64_t>(groups_.coord.tp));
}

// This rank's chunks (one per virtual stage) and how many dense and expert
// parameters they hold.
void StepRunner::plan_chunks() {
  const LayerDims& d = runner_->dims();
  const auto h = sz(d.hidden), vocab = sz(d.vocab);
  const int pp = plan_.pp, v = virtual_stages_;
  const auto L = static_cast<int>(model_.num_layers);
  const std::size_t norm = d.rmsnorm ? h : 2 * h;
  std::size_t total = 0;
  for (int c = 0; c < v; ++c) {
    Chunk ch;
    ch.virtual_stage = c * pp + stage_;
    ch.num_layers = layers_in_chunk(plan_, L, stage_, c);
    ch.first_layer = first_layer_of_chunk(plan_, L, stage_, c);
    ch.has_embedding = ch.virtual_stage == 0;
    ch.has_head = ch.virtual_stage == pp * v - 1;
    total += (ch.has_embedding ? vocab * h : 0) + (ch.has_head ? norm + h * vocab : 0);
    for (int i = 0; i < ch.num_layers; ++i) {
      total += layer_param_count(d, is_moe_layer(ch.first_layer + i));
      if (is_moe_layer(ch.first_layer + i)) experts_.count += moe_.expert_param_count();
    }
    chunks_.push_back(std::move(ch));
  }
  dense_.count = total;
}

// The chunk's weights as views into the flat buffers from `off` on, drawn.
void StepRunner::place_chunk(Chunk& ch, std::size_t& off) {
  const LayerDims& d = runner_->dims();
  const auto h = sz(d.hidden), vocab = sz(d.vocab);
  auto take = [&](DeviceSpan flat, std::size_t at, std::size_t n) { return flat.subspan(at, n); };
  if (ch.has_embedding) {
    ch.embedding = take(dense_.params, off, vocab * h);
    ch.embedding_grad = take(dense_.grads, off, vocab * h);
    be_.fill_random(ch.embedding, weight_seed(1), kInitScale);
    off += vocab * h;
  }
  for (int i = 0; i < ch.num_layers; ++i) {
    const int layer = ch.first_layer + i;
    const bool moe = is_moe_layer(layer);
    ch.layers.push_back(layer_params_at(dense_.params, off, d, moe));
    ch.layer_grads.push_back(layer_params_at(dense_.grads, off, d, moe));
    init_layer_params(be_, ch.layers.back(), weight_seed(100 + static_cast<std::uint64_t>(layer)));
    off += layer_param_count(d, moe);
    if (moe) place_experts(ch.layers.back(), ch.layer_grads.back(), layer);
  }
  if (ch.has_head) {
    ch.final_gamma = take(dense_.params, off, h);
    ch.final_gamma_grad = take(dense_.grads, off, h);
    be_.fill(ch.final_gamma, 1.0f);
    off += h;
    if (!d.rmsnorm) {
      ch.final_beta = take(dense_.params, off, h);
      ch.final_beta_grad = take(dense_.grads, off, h);
      off += h;
    }
    ch.w_out = take(dense_.params, off, h * vocab);
    ch.w_out_grad = take(dense_.grads, off, h * vocab);
    be_.fill_random(ch.w_out, weight_seed(2), kInitScale);
    off += h * vocab;
  }
}

// The master weights and Adam state of `w`: all of them, or `sharded`
// (Megatron's distributed optimizer) this rank's block, the `rank`-th of
// `parts`, of every bucket, its master the initial weights' block.
void StepRunner::init_optimizer_state(WeightState& w, bool sharded, std::size_t parts, std::size_t rank,
                                      std::size_t bucket) {
  const std::size_t owned = sharded ? w.padded / parts : w.padded;
  if (be_.compute_dtype() == DType::f32 && !sharded) {
    w.master = w.params;
  } else {
    w.master_buf = be_.alloc(owned, DType::f32);
    w.master = w.master_buf;
    if (!sharded) be_.copy(w.params, w.master);
  }
  w.m = be_.alloc(owned, DType::f32);
  w.v = be_.alloc(owned, DType::f32);
  be_.fill(w.m, 0.0f);
  be_.fill(w.v, 0.0f);
  if (!sharded) return;
  w.grad_shard = be_.alloc(owned, DType::f32);
  w.param_shard = be_.alloc(owned);
  for (std::size_t start = 0; start < w.padded; start += bucket) {
    const std::size_t len = std::min(bucket, w.padded - start), block = len / parts;
    be_.copy(DeviceSpan(w.params).subspan(start + rank * block, block), w.master.subspan(start / parts, block));
  }
}

// Sizes first, then views into one flat buffer (one DP bucket list, one Adam).
void StepRunner::layout_params() {
  plan_chunks();
  const auto dp = sz(data_ranks_);
  dense_.padded = (dense_.count + dp - 1) / dp * dp;
  dense_.params = be_.alloc(dense_.padded);
  // Gradients in fp32 whatever the compute dtype, as Megatron's main_grad:
  // the wgrad GEMMs and the norm and embedding kernels accumulate into them
  // (bf16 inputs, fp32 output) and the DP reduction moves 4 bytes each.
  dense_.grads = be_.alloc(dense_.padded, DType::f32);
  be_.fill(dense_.params, 0.0f);
  be_.fill(dense_.grads, 0.0f);
  std::size_t off = 0;
  for (Chunk& ch : chunks_) place_chunk(ch, off);
  // The experts over expert-DP (place_experts sized their buffers), the
  // rest over DP x CP.
  if (experts_.count > 0) {
    const auto edp = sz(groups_.edp->size());
    init_optimizer_state(experts_, shard_experts_, edp, sz(groups_.edp->rank()), expert_bucket());
  }
  init_optimizer_state(dense_, plan_.zero_stage >= 1, dp, sz(data_index_), sz(options_.dp_bucket_elements) / dp * dp);
}

// An MoE layer's router (the same on every TP and DP rank: its seed has no
// TP coordinate) and its local experts, laid out in the experts' buffers
// (allocated at the first MoE layer) and drawn by global expert index, so
// that the expert-DP replicas of an expert start equal.
void StepRunner::place_experts(LayerParams& w, LayerParams& g, int layer) {
  if (experts_.params.size() == 0) {
    const auto edp = sz(groups_.edp->size());
    shard_experts_ = plan_.zero_stage >= 1 && edp > 1;
    experts_.padded = shard_experts_ ? (experts_.count + edp - 1) / edp * edp : experts_.count;
    experts_.params = be_.alloc(experts_.padded);
    experts_.grads = be_.alloc(experts_.padded, DType::f32);
    be_.fill(experts_.params, 0.0f);
    be_.fill(experts_.grads, 0.0f);
  }
  const auto l = static_cast<std::uint64_t>(layer);
  be_.fill_random(w.experts.router, mix64(options_.seed ^ ((300 + l) << 16)), kInitScale);
  set_expert_params(w, experts_.params, expert_at_, moe_);
  set_expert_params(g, experts_.grads, expert_at_, moe_);
  expert_at_ += moe_.expert_param_count();
  const auto first = static_cast<std::uint64_t>(groups_.ep->rank() * moe_.local_experts());
  for (std::size_t e = 0; e < w.experts.fc1.size(); ++e) {
    const std::uint64_t key = options_.seed ^ ((400 + l) << 16) ^ ((first + e) << 40);
    be_.fill_random(w.experts.fc1[e], mix64(key + 1), kInitScale);
    be_.fill_random(w.experts.fc2[e], mix64(key + 2), kInitScale);
  }
}

std::uint64_t StepRunner::layer_seed(std::int64_t step, int micro_batch, int layer) const {
  return mix64(options_.seed ^ (static_cast<std::uint64_t>(step) << 40) ^ (static_cast<std::uint64_t>(micro_batch) << 20) ^
               static_cast<std::uint64_t>(layer) ^ (static_cast<std::uint64_t>(data_index_) << 56));
}

std::unique_ptr<StepRunner::InFlight> StepRunner::acquire(int c) {
  auto& pool = pipe_.free[sz(c)];
  if (!pool.empty()) {
    auto f = std::move(pool.back());
    pool.pop_back();
    return f;
  }
  const Chunk& ch = chunks_[sz(c)];
  const LayerDims& d = runner_->dims();
  auto f = std::make_unique<InFlight>();
  for (int i = 0; i <= ch.num_layers; ++i) f->xs.push_back(be_.alloc(sz(d.local_tokens * d.hidden)));
  if (plan_.recompute != Recompute::full)
    for (int i = 0; i < ch.num_layers; ++i) f->acts.push_back(runner_->make_acts(attention_memory_));
  if (ch.has_head) {
    f->norm_out = be_.alloc(sz(d.local_tokens * d.hidden));
    f->norm_mean = be_.alloc(sz(d.local_tokens), DType::f32);
    f->norm_rstd = be_.alloc(sz(d.local_tokens), DType::f32);
    if (d.sequence_parallel) f->norm_full = be_.alloc(sz(d.tokens * d.hidden));
    f->logits = be_.alloc(sz(d.tokens * d.vocab));
  }
  return f;
}

namespace {
int pp_tag(int micro_batch, int virtual_stage, int num_virtual, bool backward) {
  return ((micro_batch * num_virtual + virtual_stage) * 2 + (backward ? 1 : 0)) % 32768;
}
}  // namespace

void StepRunner::forward(int mb, int c, std::int64_t step) {
  const Chunk& ch = chunks_[sz(c)];
  const LayerDims& d = runner_->dims();
  const std::int64_t T = d.tokens, h = d.hidden;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  // The chunk's input arrived with the previous exchange (into pipe_.pending_input).
  std::unique_ptr<InFlight> f = pipe_.pending_input ? std::move(pipe_.pending_input) : acquire(c);
  DeviceSpan x0 = f->xs[0];
  if (ch.has_embedding) {
    // Vocab-parallel lookup (zero rows outside this rank's shard), then the TP reduce.
    DeviceSpan full = d.sequence_parallel ? DeviceSpan(work_.emb_full) : x0;
    timer_.run(mem_desc(op::embed_lookup, Pass::forward, 2.0 * static_cast<double>(T * h) * esz),
               [&] { be_.embedding_forward(batch_.ids[sz(mb)], ch.embedding, full, T, h); });
    runner_->tp_reduce(d.sequence_parallel ? op::tp_rs_embed : op::tp_ar_embed, Pass::forward, full, x0);
  }
  for (int i = 0; i < ch.num_layers; ++i) {
    const std::uint64_t seed = layer_seed(step, mb, ch.first_layer + i);
    LayerActs& acts = plan_.recompute == Recompute::full ? work_.fwd_acts : f->acts[sz(i)];
    const AttentionMemory mem = plan_.recompute == Recompute::full ? AttentionMemory::recompute_probs : attention_memory_;
    runner_->forward(ch.layers[sz(i)], f->xs[sz(i)], acts, f->xs[sz(i + 1)], seed, mem);
  }
  DeviceSpan out = f->xs[sz(ch.num_layers)];
  if (ch.has_head) {
    runner_->norm_forward(op::norm_final, Pass::forward, out, ch.final_gamma, ch.final_beta, f->norm_out, f->norm_mean,
                          f->norm_rstd);
    const ConstDeviceSpan in = runner_->tp_gather(op::tp_ag_head, Pass::forward, f->norm_out, f->norm_full);
    timer_.run(gemm_desc(op::logits, Pass::forward, T, d.vocab, h),
               [&] { be_.gemm(Trans::no, Trans::no, T, d.vocab, h, 1.0f, in, ch.w_out, 0.0f, f->logits); });
    // Cross-entropy over this rank's vocabulary shard; Megatron's
    // vocab-parallel version adds three fp32 all-reduces per token (max,
    // sum of exponentials, target logit), run here on real buffers.
    timer_.run(mem_desc(op::xent, Pass::forward, 4.0 * static_cast<double>(T * d.vocab) * esz), [&] {
      be_.cross_entropy(f->logits, batch_.labels[sz(mb)], f->logits, batch_.losses.subspan(sz(mb), 1), T, d.vocab);
    });
    if (d.tp > 1)
      for (const char* name : {op::tp_ar_xent_max, op::tp_ar_xent_sum, op::tp_ar_xent_tgt})
        timer_.run(comm_desc(name, Pass::forward, Collective::all_reduce, Group::tp,
                             static_cast<double>(batch_.vocab_stats.bytes()), d.tp),
                   [&] { groups_.tp->all_reduce_sum(batch_.vocab_stats, batch_.vocab_stats.size()); });
  }
  pipe_.in_flight[{mb, c}] = std::move(f);
}

void StepRunner::backward(int mb, int c, std::int64_t step) {
  const Chunk& ch = chunks_[sz(c)];
  const LayerDims& d = runner_->dims();
  const std::int64_t T = d.tokens, h = d.hidden;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  auto it = pipe_.in_flight.find({mb, c});
  CUBOID_EXEC_REQUIRE(it != pipe_.in_flight.end(), "pipeline schedule", "backward before forward");
  std::unique_ptr<InFlight> f = std::move(it->second);
  pipe_.in_flight.erase(it);

  // The gradient of the chunk's output: from the head, or received with the
  // previous exchange (pipe_.grad_in). The layers write into work_.grad_a / work_.grad_b in
  // turn, never into pipe_.grad_in, which the next exchange may receive into while
  // it sends this chunk's input gradient.
  DeviceSpan dy = pipe_.grad_in;
  auto other = [&](DeviceSpan x) {
    return x.native() == work_.grad_a.native() ? DeviceSpan(work_.grad_b) : DeviceSpan(work_.grad_a);
  };
  if (ch.has_head) {
    dy = work_.grad_a;
    // dlogits (kept by the forward's cross-entropy) -> d norm_final output.
    const ConstDeviceSpan in = d.sequence_parallel ? ConstDeviceSpan(f->norm_full) : ConstDeviceSpan(f->norm_out);
    timer_.run(gemm_desc(op::logits_dgrad, Pass::backward, T, h, d.vocab),
               [&] { be_.gemm(Trans::no, Trans::yes, T, h, d.vocab, 1.0f, f->logits, ch.w_out, 0.0f, work_.head_full); });
    timer_.run(gemm_desc(op::logits_wgrad, Pass::backward, h, d.vocab, T),
               [&] { be_.gemm(Trans::yes, Trans::no, h, d.vocab, T, 1.0f, in, f->logits, 1.0f, ch.w_out_grad); });
    DeviceSpan local = d.sequence_parallel ? DeviceSpan(work_.grad_b) : DeviceSpan(work_.head_full);
    const DeviceSpan dn =
        runner_->tp_reduce(d.sequence_parallel ? op::tp_rs_head_bwd : op::tp_ar_head_bwd, Pass::backward, work_.head_full, local);
    runner_->norm_backward(op::norm_final_bwd, dn, f->xs[sz(ch.num_layers)], ch.final_gamma, f->norm_mean, f->norm_rstd,
                           dy, ch.final_gamma_grad, ch.final_beta_grad);
  }
  for (int i = ch.num_layers - 1; i >= 0; --i) {
    const std::uint64_t seed = layer_seed(step, mb, ch.first_layer + i);
    const DeviceSpan dx = other(dy);
    if (plan_.recompute == Recompute::full)
      runner_->recompute_backward(ch.layers[sz(i)], ch.layer_grads[sz(i)], f->xs[sz(i)], dy, dx, seed);
    else
      runner_->backward(ch.layers[sz(i)], ch.layer_grads[sz(i)], f->xs[sz(i)], f->acts[sz(i)], dy, dx, seed,
                        attention_memory_);
    dy = dx;
  }
  // dy now holds the gradient of the chunk's input.
  if (ch.has_embedding) {
    const ConstDeviceSpan full = runner_->tp_gather(op::tp_ag_embed_bwd, Pass::backward, dy, work_.emb_full);
    timer_.run(mem_desc(op::embed_grad, Pass::backward, 3.0 * static_cast<double>(T * h) * esz),
               [&] { be_.embedding_backward(full, batch_.ids[sz(mb)], ch.embedding_grad, T, h); });
  } else {
    pipe_.input_grad = dy;  // sent by the next exchange
  }
  pipe_.free[sz(c)].push_back(std::move(f));
}

void StepRunner::exchange(std::span<const ScheduleStep> done, std::span<const ScheduleStep> next) {
  const int pp = plan_.pp, nv = pp * virtual_stages_;
  const int prev_stage = (stage_ + pp - 1) % pp, next_stage = (stage_ + 1) % pp;
  std::vector<P2pOp> ops;
  bool send_fwd = false, send_bwd = false, recv_fwd = false, recv_bwd = false;
  for (const ScheduleStep& st : done) {
    const Chunk& ch = chunks_[sz(st.chunk)];
    if (st.dir == Direction::forward && !ch.has_head) {
      const DeviceSpan out = pipe_.in_flight.at({st.micro_batch, st.chunk})->xs.back();
      ops.push_back(P2pOp::send(out, out.size(), next_stage, pp_tag(st.micro_batch, ch.virtual_stage + 1, nv, false)));
      send_fwd = true;
    } else if (st.dir == Direction::backward && !ch.has_embedding) {
      ops.push_back(P2pOp::send(pipe_.input_grad, pipe_.input_grad.size(), prev_stage,
                                pp_tag(st.micro_batch, ch.virtual_stage - 1, nv, true)));
      send_bwd = true;
    }
  }
  for (const ScheduleStep& st : next) {
    const Chunk& ch = chunks_[sz(st.chunk)];
    if (st.dir == Direction::forward && !ch.has_embedding) {
      pipe_.pending_input = acquire(st.chunk);
      const DeviceSpan in = pipe_.pending_input->xs[0];
      ops.push_back(P2pOp::recv(in, in.size(), prev_stage, pp_tag(st.micro_batch, ch.virtual_stage, nv, false)));
      recv_fwd = true;
    } else if (st.dir == Direction::backward && !ch.has_head) {
      ops.push_back(P2pOp::recv(pipe_.grad_in, pipe_.grad_in.size(), next_stage,
                                pp_tag(st.micro_batch, ch.virtual_stage, nv, true)));
      recv_bwd = true;
    }
  }
  if (ops.empty()) return;
  double bytes = 0;
  for (const P2pOp& o : ops) bytes += static_cast<double>(o.is_send ? o.send_buffer.bytes() : o.recv_buffer.bytes());
  const bool backward = send_bwd || (!send_fwd && recv_bwd);
  timer_.run(comm_desc(op::pipeline_exchange(send_fwd, send_bwd, recv_fwd, recv_bwd),
                       backward ? Pass::backward : Pass::forward, Collective::send_recv, Group::pp, bytes, pp),
             [&] { groups_.pp->exchange(ops); });
}

std::vector<DeviceSpan> StepRunner::norm_spans(bool grads) const {
  std::vector<DeviceSpan> out;
  auto add = [&](DeviceSpan s) {
    if (!s.empty()) out.push_back(s);
  };
  for (const Chunk& ch : chunks_) {
    for (const LayerParams& p : grads ? ch.layer_grads : ch.layers)
      for (const DeviceSpan s : {p.norm1_gamma, p.norm1_beta, p.norm2_gamma, p.norm2_beta, p.experts.router}) add(s);
    if (ch.has_head) {
      add(grads ? ch.final_gamma_grad : ch.final_gamma);
      add(grads ? ch.final_beta_grad : ch.final_beta);
    }
  }
  return out;
}

namespace {
// max |x - mean| / max |mean| of `local` against the group's mean (a sum
// all-reduce of a copy in `scratch`).
double drift(Backend& be, Communicator& group, const std::vector<float>& local, DeviceSpan scratch) {
  if (group.size() == 1 || local.empty()) return 0;
  const DeviceSpan part = scratch.subspan(0, local.size());
  be.upload(local, part);
  group.all_reduce_sum(part, local.size());
  const std::vector<float> sum = be.download(part);
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < local.size(); ++i) {
    const double mean = static_cast<double>(sum[i]) / group.size();
    diff = std::max(diff, std::abs(static_cast<double>(local[i]) - mean));
    scale = std::max(scale, std::abs(mean));
  }
  return scale > 0 ? diff / scale : diff;
}
}  // namespace

StepRunner::ReplicaDrift StepRunner::replica_drift() {
  ReplicaDrift out;
  std::vector<float> norms;
  for (const DeviceSpan s : norm_spans(false)) {
    const std::vector<float> v = be_.download(s);
    norms.insert(norms.end(), v.begin(), v.end());
  }
  DeviceBuffer scratch = be_.alloc(std::max(norms.size(), dense_.padded), DType::f32);
  out.tp_norms = drift(be_, *groups_.tp, norms, scratch);
  out.dp_weights = drift(be_, *groups_.dp, be_.download(dense_.params), scratch);
  if (experts_.count > 0) {
    DeviceBuffer expert_scratch = be_.alloc(experts_.padded, DType::f32);
    out.dp_weights = std::max(out.dp_weights, drift(be_, *groups_.edp, be_.download(experts_.params), expert_scratch));
  }
  return out;
}

void StepRunner::reduce_gradients_and_update(std::int64_t step) {
  const Pass bw = Pass::backward;
  const auto dp = sz(data_ranks_);
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  // With sequence parallelism each TP rank's norm gradients sum over its own
  // tokens only: Megatron all-reduces them over TP (finalize_model_grads,
  // _allreduce_layernorm_grads), packed into one buffer.
  if (plan_.sequence_parallel && plan_.tp > 1) {
    const std::vector<DeviceSpan> spans = norm_spans(true);
    std::size_t total = 0;
    for (const DeviceSpan& s : spans) total += s.size();
    if (work_.norm_grads.size() < total) work_.norm_grads = be_.alloc(total, DType::f32);
    timer_.run(comm_desc(op::tp_ar_norm_grads, bw, Collective::all_reduce, Group::tp,
                         static_cast<double>(total) * kGradBytes, plan_.tp),
               [&] {
                 std::size_t at = 0;
                 for (const DeviceSpan& s : spans) {
                   be_.copy(s, DeviceSpan(work_.norm_grads).subspan(at, s.size()));
                   at += s.size();
                 }
                 groups_.tp->all_reduce_sum(work_.norm_grads, total);
                 at = 0;
                 for (const DeviceSpan& s : spans) {
                   be_.copy(ConstDeviceSpan(work_.norm_grads).subspan(at, s.size()), s);
                   at += s.size();
                 }
               });
  }
  // Mean over micro-batches (each loss is already a mean over its tokens) and the DP x CP ranks.
  timer_.run(mem_desc(op::grad_scale, bw, 2.0 * static_cast<double>(dense_.padded) * kGradBytes),
             [&] { be_.scale(dense_.grads, 1.0f / static_cast<float>(micro_batches_ * data_ranks_)); });
  AdamConfig adam;
  if (experts_.count > 0) update_experts(adam, step);
  const std::size_t bucket = std::max<std::size_t>(dp, sz(options_.dp_bucket_elements) / dp * dp);
  if (plan_.zero_stage == 0) {
    if (dp > 1)
      for (std::size_t start = 0; start < dense_.padded; start += bucket) {
        const std::size_t len = std::min(bucket, dense_.padded - start);
        DeviceSpan part = dense_.grads.subspan(start, len);
        timer_.run(comm_desc(op::dp_ar_grads, bw, Collective::all_reduce, Group::dp, static_cast<double>(part.bytes()),
                             data_ranks_),
                   [&] { groups_.dp->all_reduce_sum(part, len); });
      }
    timer_.run(mem_desc(op::adam, bw, static_cast<double>(dense_.padded) * (kFp32Bytes * 4 * 2 + kGradBytes)),
               [&] { be_.adam_step(dense_.master, dense_.grads, dense_.m, dense_.v, adam, step + 1); });
    if (dense_.master.native() != dense_.params.native())
      timer_.run(mem_desc(op::param_copy, bw, static_cast<double>(dense_.padded) * (kFp32Bytes + esz)),
                 [&] { be_.copy(dense_.master, dense_.params); });
    return;
  }
  // ZeRO >= 1: reduce-scatter each bucket, Adam on the owned block, all-gather the updated weights.
  sharded_adam_step(*groups_.dp, dense_, bucket, adam, step);
}

void StepRunner::sharded_adam_step(Communicator& comm, WeightState& w, std::size_t bucket, const AdamConfig& adam,
                                   std::int64_t step) {
  const DeviceSpan grads = w.grads, grad_shard = w.grad_shard, params = w.params, param_shard = w.param_shard;
  const Pass bw = Pass::backward;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const int n = comm.size();
  const auto parts = sz(n);
  const std::size_t count = grads.size(), owned = count / parts;
  for (std::size_t start = 0; start < count; start += bucket) {
    const std::size_t len = std::min(bucket, count - start), block = len / parts;
    timer_.run(comm_desc(op::dp_rs_grads, bw, Collective::reduce_scatter, Group::dp,
                         static_cast<double>(len) * kGradBytes, n),
               [&] { comm.reduce_scatter_sum(grads.subspan(start, len), grad_shard.subspan(start / parts, block), block); });
  }
  timer_.run(mem_desc(op::adam, bw, static_cast<double>(owned) * (kFp32Bytes * 4 * 2 + kGradBytes)),
             [&] { be_.adam_step(w.master, grad_shard, w.m, w.v, adam, step + 1); });
  timer_.run(mem_desc(op::param_copy, bw, static_cast<double>(owned) * (kFp32Bytes + esz)),
             [&] { be_.copy(w.master, param_shard); });
  for (std::size_t start = 0; start < count; start += bucket) {
    const std::size_t len = std::min(bucket, count - start), block = len / parts;
    timer_.run(comm_desc(op::dp_ag_params, bw, Collective::all_gather, Group::dp, static_cast<double>(len) * esz, n),
               [&] { comm.all_gather(param_shard.subspan(start / parts, block), params.subspan(start, len), block); });
  }
}

std::size_t StepRunner::expert_bucket() const {
  const auto edp = sz(groups_.edp->size());
  return std::max<std::size_t>(edp, sz(options_.dp_bucket_elements) / edp * edp);
}

// The experts' gradients: scaled as the others (each DP replica's tokens
// reach an expert on exactly one rank of its expert-DP group, so the sum
// over that group is the sum over the replicas), all-reduced over
// expert-DP in buckets, then Adam on every local expert; with ZeRO >= 1
// reduce-scattered instead, Adam on this rank's block of each bucket, and
// the updated weights all-gathered.
void StepRunner::update_experts(const AdamConfig& adam, std::int64_t step) {
  const Pass bw = Pass::backward;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  timer_.run(mem_desc(op::grad_scale, bw, 2.0 * static_cast<double>(experts_.padded) * kGradBytes),
             [&] { be_.scale(experts_.grads, 1.0f / static_cast<float>(micro_batches_ * data_ranks_)); });
  const int edp = groups_.edp->size();
  if (shard_experts_) {
    sharded_adam_step(*groups_.edp, experts_, expert_bucket(), adam, step);
    return;
  }
  if (edp > 1) {
    const std::size_t bucket = std::max<std::size_t>(1, sz(options_.dp_bucket_elements));
    for (std::size_t start = 0; start < experts_.count; start += bucket) {
      const std::size_t len = std::min(bucket, experts_.count - start);
      DeviceSpan part = DeviceSpan(experts_.grads).subspan(start, len);
      timer_.run(comm_desc(op::dp_ar_grads, bw, Collective::all_reduce, Group::dp, static_cast<double>(part.bytes()), edp),
                 [&] { groups_.edp->all_reduce_sum(part, len); });
    }
  }
  timer_.run(mem_desc(op::adam, bw, static_cast<double>(experts_.count) * (kFp32Bytes * 4 * 2 + kGradBytes)),
             [&] { be_.adam_step(experts_.master, experts_.grads, experts_.m, experts_.v, adam, step + 1); });
  if (experts_.master.native() != DeviceSpan(experts_.params).native())
    timer_.run(mem_desc(op::param_copy, bw, static_cast<double>(experts_.count) * (kFp32Bytes + esz)),
               [&] { be_.copy(experts_.master, experts_.params); });
}

double StepRunner::step(std::int64_t index, bool measured) {
  timer_.begin_step(measured);
  const double grad_bytes = static_cast<double>(dense_.grads.bytes() + experts_.grads.bytes());
  timer_.run(mem_desc(op::grad_zero, Pass::forward, grad_bytes), [&] {
    be_.fill(dense_.grads, 0.0f);
    if (experts_.count > 0) be_.fill(experts_.grads, 0.0f);
  });
  // Megatron's pipeline exchange: after each step of the schedule, one batch
  // of that step's sends with the next step's receives, waited for before
  // the next step computes. A step is one forward or backward, except in the
  // interleaved schedule's steady phase, where it is a forward and a
  // backward (Megatron's send_forward_backward_recv_forward_backward).
  std::span<const ScheduleStep> previous;
  for (std::size_t i = 0; i < order_.size();) {
    const std::size_t n = i + 1 < order_.size() && i >= pair_begin_ && i < pair_end_ ? 2 : 1;
    const std::span<const ScheduleStep> now(order_.data() + i, n);
    exchange(previous, now);
    for (const ScheduleStep& st : now) {
      if (st.dir == Direction::forward)
        forward(st.micro_batch, st.chunk, index);
      else
        backward(st.micro_batch, st.chunk, index);
    }
    previous = now;
    i += n;
  }
  exchange(previous, {});
  reduce_gradients_and_update(index);
  timer_.end_step();
  if (!chunks_.back().has_head) return std::numeric_limits<double>::quiet_NaN();
  const std::vector<float> losses = be_.download(batch_.losses);
  double sum = 0;
  for (float l : losses) sum += l;
  return sum / static_cast<double>(losses.size());
}

}  // namespace cuboid::exec
