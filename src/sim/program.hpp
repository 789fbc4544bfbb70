#pragma once
// Private to the simulator: an op list of the workload (workload.hpp) turned
// into the items the simulator plays on a GPU's streams. Consecutive compute
// ops between two TP collectives become one compute segment (one engine task;
// the trace still shows each kernel inside it), which keeps a 3072-GPU
// iteration at a few hundred thousand tasks.
#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/sim/network.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::sim::detail {

struct OpSpan {
  std::string name;
  TimeNs duration_ns = 0;
};

enum class ItemKind : std::uint8_t {
  compute,     // a segment of compute ops on the compute stream, after the chain
  collective,  // a blocking TP (or CP) collective on the TP stream, after the chain
  async,       // a TP (or CP) collective after the chain that the following compute runs under
  join,        // the next item also waits for every async collective issued so far
};

struct Item {
  ItemKind kind = ItemKind::compute;
  TimeNs duration_ns = 0;          // compute
  std::uint32_t first_op = 0;      // compute: ops [first_op, first_op + num_ops) of Program::ops
  std::uint32_t num_ops = 0;
  bool wgrad = false;              // compute: weight-gradient kernels (ops named *_wgrad), never mixed with others
  Collective collective = Collective::all_reduce;
  double bytes = 0;                // collective / async: NCCL size
  std::uint32_t name_op = 0;       // collective / async: its name in Program::ops
  Group group = Group::tp;         // collective / async: the TP, CP or EP group
  bool own_dispatch = false;       // an EP exchange of the allgather / flex dispatcher (Op::dispatcher)
  // compute right after an async collective (its only op overlaps it): the
  // op's time while the collective holds NCCL's SMs (op_time_sms_taken_ns);
  // -1 otherwise. The builder charges overlapped_time_ns(collective, this,
  // duration_ns).
  TimeNs reduced_ns = -1;
  // compute: its time while a DP collective holds `held_sms_taken` SMs (the
  // engine's held pace, hold_sms); reduced_held_ns: the same for the op
  // under an async TP collective, with both collectives' SMs taken. 0: the
  // program was compiled without held SMs.
  TimeNs held_ns = 0;
  TimeNs reduced_held_ns = -1;
  // collective / async: its time alone on the node when the builder prices TP
  // collectives off the network (Builder::tp_probe_ns); -1 until first asked.
  mutable TimeNs probe_ns = -1;
};

struct Program {
  std::vector<Item> items;
  std::vector<OpSpan> ops;         // every op of the list, by name, in order
  TimeNs compute_ns = 0;           // sum of compute segments
  double flops = 0;
};

// Compiles `ops` (one pass of a layer, embedding or LM head). With
// `backward_overlap`, a column-parallel layer's backward (dgrad, wgrad, then
// the input-gradient reduce) becomes: [SP: async all-gather of the layer's
// input] dgrad, [join], async reduce, wgrad, join, as Megatron's
// LinearWithGradAccumulationAndAsyncCommunication does. `slowdown` scales
// every compute op (the stage's GPU speed spread, a straggler). `overlap_sms_taken` > 0 (the TP tier's
// nccl_channels) also prices each GEMM that runs under an async collective
// with that many SMs fewer (Item::reduced_ns). `held_sms_taken` > 0 (the
// DP group's nccl_ring_channels) prices every compute item also with that
// many SMs fewer (Item::held_ns), its pace while a DP collective runs.
// `userbuffers_tp` > 1 (TrainerSettings::tp_comm_overlap with SP): the SP
// collectives Transformer Engine's userbuffers overlap with their GEMM
// (core/tp_overlap.hpp) play as its chunks and steps.
Program compile(const GpuProfile& gpu, const std::vector<Op>& ops, bool sequence_parallel, bool backward_overlap,
                double slowdown = 1.0, int overlap_sms_taken = 0, int held_sms_taken = 0, int userbuffers_tp = 0);

// Appends b's items and ops to a (a's op indices stay valid).
void append(Program& a, const Program& b);

}  // namespace cuboid::sim::detail
