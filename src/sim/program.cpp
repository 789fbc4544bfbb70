// Op list -> items (see program.hpp).
#include "program.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/tp_overlap.hpp"
#include "cuboid/cost/cost.hpp"

namespace cuboid::sim::detail {

namespace {

bool is_tp_collective(const Op& op) { return op.kind == OpKind::collective && op.group == Group::tp; }

// ops[i] is the input-gradient reduce of a column-parallel GEMM X when it
// follows X_dgrad, X_wgrad.
bool column_parallel_reduce(const std::vector<Op>& ops, std::size_t i) {
  if (i < 2 || !is_tp_collective(ops[i]) || ops[i].pass != Pass::backward) return false;
  if (ops[i].collective != Collective::all_reduce && ops[i].collective != Collective::reduce_scatter) return false;
  const std::string& d = ops[i - 2].name;
  const std::string& w = ops[i - 1].name;
  if (!d.ends_with(op::dgrad_suffix) || !w.ends_with(op::wgrad_suffix)) return false;
  return d.substr(0, d.size() - 6) == w.substr(0, w.size() - 6);
}

class Builder {
 public:
  Builder(const GpuProfile& gpu, double slowdown, int overlap_sms, int held_sms)
      : gpu_(gpu),
        slowdown_(slowdown),
        held_sms_(held_sms),
        overlap_(gpu, overlap_sms),
        held_(gpu, held_sms),
        both_(gpu, overlap_sms + held_sms),
        margin_(gpu, kUbCommSms) {}

  // A compute op that runs under the async collective just issued: its own
  // item, with its time on the SMs the collective leaves.
  void overlapped(const Op& op, int sms_taken) {
    close();
    compute(op);
    if (sms_taken <= 0) return;
    p_.items.back().reduced_ns = slowed(overlap_(op));
    if (held_sms_ > 0) p_.items.back().reduced_held_ns = slowed(both_(op));
    close();
  }

  TimeNs slowed(TimeNs t) const {
    return slowdown_ != 1.0 ? static_cast<TimeNs>(std::llround(static_cast<double>(t) * slowdown_)) : t;
  }

  void compute(const Op& op) {
    const TimeNs t = slowed(op_time_ns(gpu_, op));
    compute_at(op, t, held_sms_ > 0 && op.kind == OpKind::gemm ? slowed(held_(op)) : t);
  }

  // A compute op at a given time (`held`: while a DP collective holds its SMs).
  void compute_at(const Op& op, TimeNs t, TimeNs held) {
    // Weight gradients in items of their own: the EP overlap plays them apart
    // when they are delayed (Builder::play_combined).
    const bool wgrad = op.name.ends_with(op::wgrad_suffix);
    if (open_ >= 0 && p_.items[static_cast<std::size_t>(open_)].wgrad != wgrad) close();
    if (open_ < 0) {
      Item it;
      it.kind = ItemKind::compute;
      it.wgrad = wgrad;
      it.first_op = static_cast<std::uint32_t>(p_.ops.size());
      p_.items.push_back(it);
      open_ = static_cast<int>(p_.items.size()) - 1;
    }
    Item& it = p_.items[static_cast<std::size_t>(open_)];
    it.duration_ns += t;
    if (held_sms_ > 0) it.held_ns += held;
    ++it.num_ops;
    p_.ops.push_back(OpSpan{op.name, t});
    p_.compute_ns += t;
    p_.flops += op.flops;
  }

  void collective(ItemKind kind, Collective c, double bytes, std::string name, Group group = Group::tp,
                  bool own_dispatch = false) {
    close();
    Item it;
    it.kind = kind;
    it.group = group;
    it.own_dispatch = own_dispatch;
    it.collective = c;
    it.bytes = bytes;
    it.name_op = static_cast<std::uint32_t>(p_.ops.size());
    p_.ops.push_back(OpSpan{std::move(name), 0});
    p_.items.push_back(it);
  }

  // Transformer Engine's userbuffers (core/tp_overlap.hpp): ring_exchange
  // plays TP - 1 steps of [send/recv of the next shard | the chunk's GEMM]
  // and the last chunk; pipeline plays the first chunk, then [reduce-scatter
  // of chunk i - 1 | chunk i's GEMM], then the last chunk's reduce-scatter,
  // every chunk on the SMs the comm kernels leave (margin_).
  void userbuffers(const UbOverlap& u, const Op& gemm, const Op& comm, double comm_bytes) {
    const Op chunk = ub_chunk_gemm(gemm, u.chunks);
    const double step_bytes = ub_chunk_bytes(u, comm_bytes);
    const bool margin = u.comm_sms > 0;
    const TimeNs t = slowed(margin ? margin_(chunk) : op_time_ns(gpu_, chunk));
    const TimeNs held = held_sms_ > 0 && !margin ? slowed(held_(chunk)) : t;
    auto step = [&] {
      collective(ItemKind::async, u.chunk_collective(), step_bytes, comm.name);
      close();
      compute_at(chunk, t, held);
      close();
      join();
    };
    if (u.method == UbMethod::ring_exchange) {
      for (int i = 1; i < u.chunks; ++i) step();
      compute_at(chunk, t, held);
      close();
      return;
    }
    close();
    compute_at(chunk, t, held);
    for (int i = 1; i < u.chunks; ++i) step();
    collective(ItemKind::collective, u.chunk_collective(), step_bytes, comm.name);
  }

  void join() {
    close();
    Item it;
    it.kind = ItemKind::join;
    p_.items.push_back(it);
  }

  void close() { open_ = -1; }
  Program take() { return std::move(p_); }

 private:
  const GpuProfile& gpu_;
  double slowdown_;
  int held_sms_;
  SmsTakenPricer overlap_, held_, both_;  // under an async TP collective, a DP one, both
  SmsTakenPricer margin_;                 // beside userbuffers' comm kernels (kUbCommSms)
  Program p_;
  int open_ = -1;  // index of the compute item being extended, -1 when none
};

}  // namespace

Program compile(const GpuProfile& gpu, const std::vector<Op>& ops, bool sequence_parallel, bool backward_overlap,
                double slowdown, int overlap_sms_taken, int held_sms_taken, int userbuffers_tp) {
  Builder b(gpu, slowdown, overlap_sms_taken, held_sms_taken);
  const std::vector<UbOverlap> ub = userbuffers_tp > 1 ? ub_overlaps(ops, userbuffers_tp) : std::vector<UbOverlap>{};
  std::size_t next_ub = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (next_ub < ub.size() && i == std::min(ub[next_ub].comm, ub[next_ub].gemm)) {
      const UbOverlap& u = ub[next_ub++];
      b.userbuffers(u, ops[u.gemm], ops[u.comm], comm_size_bytes(ops[u.comm], gpu.calibration.get()));
      i = std::max(u.comm, u.gemm);
      continue;
    }
    // Look ahead: is this the dgrad of a column-parallel GEMM whose reduce overlaps?
    if (backward_overlap && i + 2 < ops.size() && column_parallel_reduce(ops, i + 2) &&
        op.name.ends_with(op::dgrad_suffix)) {
      const Op& wgrad = ops[i + 1];
      const Op& reduce = ops[i + 2];
      if (sequence_parallel) {
        // SP does not keep the gathered input: it is all-gathered again under dgrad.
        b.collective(ItemKind::async, Collective::all_gather, comm_size_bytes(reduce, gpu.calibration.get()),
                     reduce.name + "_regather");
        b.overlapped(op, overlap_sms_taken);
        b.join();
      } else {
        b.compute(op);
      }
      b.collective(ItemKind::async, reduce.collective, comm_size_bytes(reduce, gpu.calibration.get()), reduce.name);
      b.overlapped(wgrad, overlap_sms_taken);
      b.join();
      i += 2;
      continue;
    }
    if ((op.kind == OpKind::collective || op.kind == OpKind::p2p) && op.group == Group::cp) {
      // A CP exchange: the ring's send/recv runs under the attention block
      // after it, which the next block waits for; an all-to-all blocks.
      const double bytes = comm_size_bytes(op, gpu.calibration.get());
      if (op.overlaps_next && i + 1 < ops.size()) {
        b.collective(ItemKind::async, op.collective, bytes, op.name, Group::cp);
        b.overlapped(ops[i + 1], 0);
        b.join();
        ++i;
      } else {
        b.collective(ItemKind::collective, op.collective, bytes, op.name, Group::cp);
      }
      continue;
    }
    if (op.kind == OpKind::collective && op.group == Group::ep) {
      // An MoE dispatch or combine: Megatron's dispatchers wait for it.
      b.collective(ItemKind::collective, op.collective, comm_size_bytes(op, gpu.calibration.get()), op.name, Group::ep,
                   op.dispatcher != MoeDispatcher::alltoall);
      continue;
    }
    if (op.kind == OpKind::collective || op.kind == OpKind::p2p) {
      if (op.group == Group::tp)
        b.collective(ItemKind::collective, op.collective, comm_size_bytes(op, gpu.calibration.get()), op.name);
      continue;  // other groups' traffic is placed by the simulator, not per op
    }
    b.compute(op);
  }
  b.close();
  return b.take();
}

void append(Program& a, const Program& b) {
  const auto offset = static_cast<std::uint32_t>(a.ops.size());
  a.ops.insert(a.ops.end(), b.ops.begin(), b.ops.end());
  for (Item it : b.items) {
    it.first_op += offset;
    it.name_op += offset;
    a.items.push_back(it);
  }
  a.compute_ns += b.compute_ns;
  a.flops += b.flops;
}

}  // namespace cuboid::sim::detail
