// The sharded-vs-unsharded forward check. Full weights are drawn on the host
// (the same on every rank), each rank uploads its TP slices the way
// Megatron-LM shards them, and both layers run through the same LayerRunner.
#include "cuboid/exec/check.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuboid/exec/layer.hpp"
#include "cuboid/exec/mpi_comm.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::exec {

double check_tolerance(DType compute) { return compute == DType::bf16 ? 3e-2 : 1e-4; }

double check_tolerance(DType compute, Precision precision) {
  if (precision == Precision::bf16) return check_tolerance(compute);
  // E4M3 keeps 3 mantissa bits: a value rounds with a relative error of at
  // most u = 2^-4 (per-tensor and MXFP8 scaling alike, short of saturation,
  // which the scales avoid). A GEMM of two rounded operands carries at most
  // 2u per product; each block chains two such GEMMs (QKV then the
  // projection, FC1 then FC2): 2 x 2u = 0.25 of the block's largest output.
  constexpr double u = 1.0 / 16.0;
  return 2.0 * 2.0 * u;
}

namespace {

using Matrix = std::vector<float>;  // row-major

Matrix random_matrix(std::size_t n, std::uint64_t seed, float scale, float offset = 0.0f) {
  Matrix m(n);
  for (std::size_t i = 0; i < n; ++i) m[i] = offset + (2.0f * uniform01(seed, i) - 1.0f) * scale;
  return m;
}

// Columns [first, first + count) of a rows x cols matrix.
Matrix columns(const Matrix& m, std::int64_t rows, std::int64_t cols, std::int64_t first, std::int64_t count) {
  Matrix out;
  out.reserve(static_cast<std::size_t>(rows * count));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < count; ++c) out.push_back(m[static_cast<std::size_t>(r * cols + first + c)]);
  return out;
}

Matrix rows_of(const Matrix& m, std::int64_t cols, std::int64_t first, std::int64_t count) {
  return Matrix(m.begin() + first * cols, m.begin() + (first + count) * cols);
}

// Context parallelism: the rows ([s, b] order) of CP rank r of cp, chunks r
// and 2 cp - 1 - r of the sequence.
Matrix cp_rows(const Matrix& m, std::int64_t cols, std::int64_t seq, std::int64_t b, int r, int cp) {
  if (cp <= 1) return m;
  Matrix out;
  const std::int64_t local = seq / cp;
  for (std::int64_t p = 0; p < local; ++p) {
    const Matrix rows = rows_of(m, cols, cp_global_position(p, local, r, cp) * b, b);
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

Matrix hcat(std::initializer_list<Matrix> parts, std::int64_t rows) {
  // Concatenates column blocks of equal row count.
  std::vector<std::int64_t> widths;
  for (const Matrix& p : parts) widths.push_back(static_cast<std::int64_t>(p.size()) / rows);
  Matrix out;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::size_t i = 0;
    for (const Matrix& p : parts) {
      const std::int64_t w = widths[i++];
      out.insert(out.end(), p.begin() + r * w, p.begin() + (r + 1) * w);
    }
  }
  return out;
}

struct HostLayer {
  Matrix g1, b1, qkv, proj, g2, b2, fc1, fc2;
  Matrix router;                   // an MoE layer: [h, experts]
  std::vector<Matrix> efc1, efc2;  // its experts (all, or this EP rank's)
};

HostLayer full_weights(const LayerDims& f, const MoeDims* moe) {
  const std::uint64_t seed = 0xC0FFEE;
  const auto h = static_cast<std::size_t>(f.hidden);
  HostLayer w;
  // Gains near 1 and non-zero biases, so a norm applied to the wrong shard shows.
  w.g1 = random_matrix(h, mix64(seed + 1), 0.1f, 1.0f);
  w.b1 = random_matrix(h, mix64(seed + 2), 0.1f);
  w.qkv = random_matrix(h * static_cast<std::size_t>(f.qkv_cols()), mix64(seed + 3), 0.05f);
  w.proj = random_matrix(static_cast<std::size_t>(f.q_cols()) * h, mix64(seed + 4), 0.05f);
  w.g2 = random_matrix(h, mix64(seed + 5), 0.1f, 1.0f);
  w.b2 = random_matrix(h, mix64(seed + 6), 0.1f);
  w.fc1 = random_matrix(h * static_cast<std::size_t>(f.fc1_cols()), mix64(seed + 7), 0.05f);
  w.fc2 = random_matrix(static_cast<std::size_t>(f.ffn) * h, mix64(seed + 8), 0.05f);
  if (moe != nullptr) {
    // A router with enough spread that the top-k is no coin toss.
    w.router = random_matrix(h * static_cast<std::size_t>(moe->experts), mix64(seed + 9), 0.5f);
    for (std::int64_t e = 0; e < moe->experts; ++e) {
      const auto k = static_cast<std::uint64_t>(e) << 8;
      w.efc1.push_back(random_matrix(h * static_cast<std::size_t>(moe->fc1_cols()), mix64(seed + 10 + k), 0.05f));
      w.efc2.push_back(random_matrix(static_cast<std::size_t>(moe->ffn) * h, mix64(seed + 11 + k), 0.05f));
    }
  }
  return w;
}

// Megatron's shard of rank r of t: QKV columns of this rank's heads (Q, K
// and V blocks each), FC1 columns (gate and up halves each), projection
// and FC2 rows.
HostLayer shard(const HostLayer& w, const LayerDims& f, const LayerDims& s, int r) {
  const std::int64_t h = f.hidden;
  HostLayer out = w;
  const std::int64_t q = s.q_cols(), kv = s.kv_cols();
  out.qkv = hcat({columns(w.qkv, h, f.qkv_cols(), r * q, q), columns(w.qkv, h, f.qkv_cols(), f.q_cols() + r * kv, kv),
                  columns(w.qkv, h, f.qkv_cols(), f.q_cols() + f.kv_cols() + r * kv, kv)},
                 h);
  out.proj = rows_of(w.proj, h, r * q, q);
  if (f.gated)
    out.fc1 = hcat({columns(w.fc1, h, f.fc1_cols(), r * s.ffn, s.ffn), columns(w.fc1, h, f.fc1_cols(), f.ffn + r * s.ffn, s.ffn)},
                   h);
  else
    out.fc1 = columns(w.fc1, h, f.fc1_cols(), r * s.ffn, s.ffn);
  out.fc2 = rows_of(w.fc2, h, r * s.ffn, s.ffn);
  return out;
}

// EP rank `r` of `ep` holds experts [r L, (r + 1) L).
void keep_local_experts(HostLayer& w, int r, int ep) {
  const std::size_t local = w.efc1.size() / static_cast<std::size_t>(ep), first = static_cast<std::size_t>(r) * local;
  w.efc1 = std::vector<Matrix>(w.efc1.begin() + static_cast<std::ptrdiff_t>(first),
                               w.efc1.begin() + static_cast<std::ptrdiff_t>(first + local));
  w.efc2 = std::vector<Matrix>(w.efc2.begin() + static_cast<std::ptrdiff_t>(first),
                               w.efc2.begin() + static_cast<std::ptrdiff_t>(first + local));
}

void upload(Backend& be, const HostLayer& w, const LayerParams& p) {
  be.upload(w.g1, p.norm1_gamma);
  be.upload(w.qkv, p.w_qkv);
  be.upload(w.proj, p.w_proj);
  be.upload(w.g2, p.norm2_gamma);
  if (p.moe) {
    be.upload(w.router, p.experts.router);
    for (std::size_t e = 0; e < p.experts.fc1.size(); ++e) {
      be.upload(w.efc1[e], p.experts.fc1[e]);
      be.upload(w.efc2[e], p.experts.fc2[e]);
    }
  } else {
    be.upload(w.fc1, p.w_fc1);
    be.upload(w.fc2, p.w_fc2);
  }
  if (!p.norm1_beta.empty()) be.upload(w.b1, p.norm1_beta);
  if (!p.norm2_beta.empty()) be.upload(w.b2, p.norm2_beta);
}

double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double max_diff = 0, max_ref = 1e-12;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    max_diff = std::isnan(diff) ? INFINITY : std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return max_diff / max_ref;
}

// Every rank must reach the same verdict (or some would run on while others stop).
double world_max(Backend& be, Communicator& world, double v) {
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&world)) return mpi->all_reduce_max(v);
  if (world.size() == 1) return v;
  // NCCL has no host max: gather every rank's value (as f32) on the device.
  DeviceBuffer mine = be.alloc(1, DType::f32);
  DeviceBuffer all = be.alloc(static_cast<std::size_t>(world.size()), DType::f32);
  be.upload({static_cast<float>(v)}, mine);
  world.all_gather(mine, all, 1);
  const std::vector<float> values = be.download(all);
  double out = v;
  for (float x : values) out = std::isnan(x) ? INFINITY : std::max(out, static_cast<double>(x));
  return out;
}

}  // namespace

CheckResult check_sharded_forward(Backend& be, ProcessGroups& groups, const ModelSpec& model, const ParallelPlan& plan,
                                  OpTimer& timer, bool flip_shard) {
  ParallelPlan single = plan;
  // The reference runs unquantized: an FP8 plan is checked against the layer
  // it approximates, at a tolerance FP8's rounding accounts for.
  single.precision = Precision::bf16;
  single.tp = 1;
  single.ep = 1;
  single.cp = 1;
  single.sequence_parallel = false;
  const LayerDims sd = layer_dims(model, plan, 0.0f);
  const LayerDims fd = layer_dims(model, single, 0.0f);
  const int r = groups.coord.tp;
  // An MoE model's first MoE layer: its experts spread over the EP group
  // against all of them on this rank.
  const bool moe = model.moe.enabled();
  const MoeDims smoe = moe_dims(model, plan, sd.local_tokens), fmoe = moe_dims(model, single, fd.local_tokens);
  const int ep_rank = moe && groups.ep ? groups.ep->rank() : 0;

  const HostLayer full = full_weights(fd, moe ? &fmoe : nullptr);
  HostLayer mine = shard(full, fd, sd, r);
  if (moe) keep_local_experts(mine, ep_rank, plan.ep);
  // The injected bug: the last TP rank's FC2 shard negated (with experts:
  // the last EP rank's experts' FC2, or the last TP rank's without EP; with
  // CP and no EP: the last CP rank's V weights, so that the K/V it sends
  // around the ring differ from the reference's).
  const bool flip_cp = plan.cp > 1 && !(moe && plan.ep > 1);
  if (flip_shard && flip_cp) {
    if (groups.coord.cp == plan.cp - 1)
      for (std::int64_t row = 0; row < sd.hidden; ++row)
        for (std::int64_t c = sd.q_cols() + sd.kv_cols(); c < sd.qkv_cols(); ++c)
          mine.qkv[static_cast<std::size_t>(row * sd.qkv_cols() + c)] *= -1.0f;
  } else if (flip_shard && moe && (plan.ep > 1 ? ep_rank == plan.ep - 1 : r == plan.tp - 1)) {
    for (Matrix& m : mine.efc2)
      for (float& v : m) v = -v;
  } else if (flip_shard && !moe && r == plan.tp - 1) {
    for (float& v : mine.fc2) v = -v;
  }

  DeviceBuffer sharded_flat = be.alloc(layer_param_count(sd, moe));
  DeviceBuffer full_flat = be.alloc(layer_param_count(fd, moe));
  DeviceBuffer sharded_experts = be.alloc(moe ? smoe.expert_param_count() : 1);
  DeviceBuffer full_experts = be.alloc(moe ? fmoe.expert_param_count() : 1);
  LayerParams sp = layer_params_at(sharded_flat, 0, sd, moe);
  LayerParams fp = layer_params_at(full_flat, 0, fd, moe);
  if (moe) {
    set_expert_params(sp, sharded_experts, 0, smoe);
    set_expert_params(fp, full_experts, 0, fmoe);
  }
  upload(be, mine, sp);
  upload(be, full, fp);

  // A small residual stream, so that the blocks' outputs are not rounded
  // away in it; each data-parallel rank its own, so that an EP group's ranks
  // route different tokens (and exchange blocks of different sizes). The
  // ranks of a CP group take their chunks of one sequence.
  const std::uint64_t x_seed = 0xBADC0DE + (moe ? static_cast<std::uint64_t>(groups.coord.dp * 64) : 0);
  const Matrix x = random_matrix(static_cast<std::size_t>(fd.tokens * fd.hidden), x_seed, 0.05f);
  // This rank's rows of a full [s, b] tensor: its CP chunks, then its SP block.
  const std::int64_t first_row = sd.sequence_parallel ? r * sd.local_tokens : 0;
  auto mine_of = [&](const Matrix& full_rows) {
    return rows_of(cp_rows(full_rows, sd.hidden, fd.seq, fd.micro_batch, groups.coord.cp, plan.cp), sd.hidden, first_row,
                   sd.local_tokens);
  };
  DeviceBuffer x_full = be.alloc(x.size());
  DeviceBuffer x_local = be.alloc(static_cast<std::size_t>(sd.local_tokens * sd.hidden));
  be.upload(x, x_full);
  be.upload(mine_of(x), x_local);
  DeviceBuffer y_full = be.alloc(x_full.size());
  DeviceBuffer y_local = be.alloc(x_local.size());

  timer.begin_step(false);
  LayerRunner sharded(be, groups.tp.get(), sd, timer, moe ? &smoe : nullptr, groups.ep.get(),
                      plan.cp > 1 ? groups.cp.get() : nullptr,
                      groups.flex.intra != nullptr ? &groups.flex : nullptr);
  LayerActs sharded_acts = sharded.make_acts(AttentionMemory::keep_probs);
  sharded.forward(sp, x_local, sharded_acts, y_local, 1, AttentionMemory::keep_probs);
  LayerRunner reference(be, nullptr, fd, timer, moe ? &fmoe : nullptr);
  LayerActs reference_acts = reference.make_acts(AttentionMemory::keep_probs);
  reference.forward(fp, x_full, reference_acts, y_full, 1, AttentionMemory::keep_probs);
  timer.end_step();

  auto part = [&](const DeviceBuffer& b) { return mine_of(be.download(b)); };
  CheckResult out;
  out.tolerance = check_tolerance(be.compute_dtype(), plan.precision);
  // The attention block's own contribution (mid - x): the residual would
  // otherwise hide an error in it below the tolerance.
  const Matrix x_mine = mine_of(x);
  auto minus_x = [&](Matrix m) {
    for (std::size_t i = 0; i < m.size(); ++i) m[i] -= x_mine[i];
    return m;
  };
  out.attention_error = relative_error(minus_x(be.download(sharded_acts.mid)), minus_x(part(reference_acts.mid)));
  out.layer_error = relative_error(be.download(y_local), part(y_full));
  out.attention_error = world_max(be, *groups.world, out.attention_error);
  out.layer_error = world_max(be, *groups.world, out.layer_error);
  return out;
}

}  // namespace cuboid::exec
