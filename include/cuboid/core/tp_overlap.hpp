#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Transformer Engine's userbuffers overlap of the SP collectives with the
// linear layers' GEMMs (Megatron-Core --tp-comm-overlap,
// TrainerSettings::tp_comm_overlap), with TE's default method per GEMM
// (Transformer Engine d0067d0d transformer_engine/pytorch/module/base.py
// initialize_ub, get_default_config):
// * ring_exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): the
//   all-gather before the GEMM becomes TP - 1 send/recv steps of one rank's
//   shard around the ring, on the copy engines (use_ce, num_sm 1, no SM
//   margin); the GEMM runs as TP chunks of its rows, step i's chunk on the
//   shard that has arrived while the next one travels.
// * pipeline (proj_fprop, fc2_fprop): the reduce-scatter after the GEMM
//   becomes num_splits = 4 reduce-scatters of a quarter of the rows each,
//   chunk i's under chunk i + 1's GEMM; the comm kernels take num_sm = 16 SMs
//   and the GEMM runs on the rest throughout (set_sm_margin).
// * bulk (qkv_dgrad / fc1_dgrad's input all-gather, qkv_wgrad / fc1_wgrad's
//   reduce-scatter of the dgrad): one collective under one GEMM, as
//   Megatron's async backward already runs them (sim/program.cpp), its
//   kernel on 16 SMs (kUbCommSms) instead of NCCL's channels.
// The estimator and the simulator both read ub_overlaps and price each
// pair with ub_overlapped_ns's recurrence (the simulator plays its steps).
#include <cstddef>
#include <vector>

#include "cuboid/core/workload.hpp"

namespace cuboid {

enum class UbMethod : std::uint8_t { ring_exchange, pipeline };

// TE d0067d0d base.py get_default_config: num_splits 4 for pipeline, num_sm
// 16 for pipeline and bulk (set_sm_margin: the GEMM leaves them).
inline constexpr int kUbPipelineSplits = 4;
inline constexpr int kUbCommSms = 16;

struct UbOverlap {
  std::size_t comm = 0;  // the SP collective's index in the list
  std::size_t gemm = 0;  // the GEMM's (comm - 1 for pipeline, comm + 1 for ring_exchange)
  UbMethod method = UbMethod::ring_exchange;
  int chunks = 1;      // ring_exchange: TP; pipeline: kUbPipelineSplits
  int comm_sms = 0;    // SMs the GEMM chunks leave to the comm kernels
  Collective chunk_collective() const {
    return method == UbMethod::ring_exchange ? Collective::send_recv : Collective::reduce_scatter;
  }
};

// The pairs of a layer's list that TE overlaps (none with TP 1 or without
// SP: those lists have no SP collective next to a TP GEMM).
std::vector<UbOverlap> ub_overlaps(const std::vector<Op>& ops, int tp);

// One chunk's GEMM: the rows (m) split `chunks` ways.
Op ub_chunk_gemm(const Op& gemm, int chunks);
// One step's communication in bytes: ring_exchange sends one rank's shard
// (the all-gather's size / TP); pipeline reduce-scatters a quarter.
double ub_chunk_bytes(const UbOverlap& u, double comm_bytes);

// The pair's time from one chunk's GEMM (g) and one step's communication
// (c): ring_exchange g + (n - 1) max(g, c), the first chunk being local;
// pipeline g + (n - 1) max(g, c) + c, the last reduce-scatter after the
// last GEMM.
double ub_overlapped_ns(const UbOverlap& u, double chunk_gemm_ns, double chunk_comm_ns);

}  // namespace cuboid
