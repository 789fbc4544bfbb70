#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The executor's process-group interface: collectives and point-to-point
// between the ranks of one group, on backend memory. MpiCommunicator
// (mpi_comm.hpp) serves the cpu backend, NcclCommunicator (nccl_comm.hpp) the
// cuda one. As with Backend, the public calls check counts and peers
// (ExecError on violation) and then call the protected *_impl that an
// implementation provides, so every communicator gets the same checks.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <string_view>

#include "cuboid/exec/buffer.hpp"

namespace cuboid::exec {

// One send or receive of a Communicator::exchange.
struct P2pOp {
  bool is_send = false;
  ConstDeviceSpan send_buffer;  // is_send
  DeviceSpan recv_buffer;       // !is_send
  std::size_t count = 0;
  int peer = 0;
  int tag = 0;  // checked by MPI (and the tests' NCCL model); NCCL has none
  static P2pOp send(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) {
    return P2pOp{true, buffer, DeviceSpan{}, count, peer, tag};
  }
  static P2pOp recv(DeviceSpan buffer, std::size_t count, int peer, int tag) {
    return P2pOp{false, ConstDeviceSpan{}, buffer, count, peer, tag};
  }
};

// ---------------------------------------------------------------------------
// A process group: collectives and point-to-point inside it. Ranks and peers
// are ranks *in this communicator*. Counts are elements of the spans' dtype.
// Implementations are move-only owners of the library handle (MPI_Comm,
// ncclComm_t). Calls on one communicator must be issued in the same order on
// every member; p2p between a pair is matched in issue order (NCCL has no
// tags: `tag` is checked by MPI and ignored by NCCL).
class Communicator {
 public:
  // Every live communicator is listed process-wide, so that end_job can
  // abort all of them and the watchdog can poll each for errors.
  virtual ~Communicator();
  Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual std::string_view kind() const noexcept = 0;  // "mpi", "nccl"
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  // In place: buffer[0, count) = sum over ranks.
  void all_reduce_sum(DeviceSpan buffer, std::size_t count);
  // send holds size() * recv_count elements; rank r receives the sum of block r.
  void reduce_scatter_sum(ConstDeviceSpan send, DeviceSpan recv, std::size_t recv_count);
  // recv holds size() * send_count elements, block r from rank r.
  void all_gather(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count);
  void broadcast(DeviceSpan buffer, std::size_t count, int root);
  // send and recv hold size() * count elements: block r of send goes to rank
  // r, block r of recv comes from rank r (MPI_Alltoall; NCCL: one grouped
  // send and receive per peer, as nccl-tests' alltoall).
  void all_to_all(ConstDeviceSpan send, DeviceSpan recv, std::size_t count);
  // Blocks of varying size (MPI_Alltoallv; NCCL: one group of a send and a
  // receive per peer with a non-empty block, self included): send_counts[r]
  // elements go to rank r and recv_counts[r] come from it, each side's
  // blocks packed in rank order from the span's start. An MoE layer's token
  // dispatch and combine.
  void all_to_all_v(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                    std::span<const std::size_t> recv_counts);
  void send(ConstDeviceSpan buffer, std::size_t count, int peer, int tag);
  void recv(DeviceSpan buffer, std::size_t count, int peer, int tag);
  // Send and receive at once (no deadlock when two stages exchange, as in 1F1B).
  void send_recv(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                 DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer, int tag);
  // Sends and receives issued together, complete when the call returns for
  // what the caller does next: Megatron's batch_isend_irecv of one pipeline
  // step (this step's sends with the next step's receives) followed by
  // waiting for every request. NCCL: one ncclGroupStart / ncclGroupEnd on the
  // communicator's stream, which the compute stream then waits for (the host
  // does not); MPI: MPI_Isend / MPI_Irecv of every op, then the host waits
  // for all of them. Ops with one peer are matched in the order given, in
  // each direction (NCCL matches p2p in issue order and ignores tags).
  void exchange(std::span<const P2pOp> ops);
  virtual void barrier() = 0;
  // Ends every process of the job: end_job(message).
  [[noreturn]] void abort(std::string_view message);
  // An error the library found on its own since the last call (NCCL:
  // ncclCommGetAsyncError, e.g. a peer that died); nullopt when none.
  virtual std::optional<std::string> async_error() { return std::nullopt; }
  // Abandons this communicator's work in flight without waiting for peers
  // (NCCL: ncclCommAbort); nothing for MPI, whose MPI_Abort ends the job.
  virtual void abort_local() noexcept {}
  // Collective over this communicator: members with the same color (>= 0)
  // form a new communicator, ordered by (key, old rank). A negative color
  // joins no group and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

 protected:
  virtual void all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) = 0;
  virtual void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv,
                                       std::size_t recv_count) = 0;
  virtual void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) = 0;
  virtual void broadcast_impl(DeviceSpan buffer, std::size_t count, int root) = 0;
  virtual void all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) = 0;
  virtual void all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                                 std::span<const std::size_t> recv_counts) = 0;
  virtual void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
  virtual void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
  virtual void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                              DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer,
                              int tag) = 0;
  virtual void exchange_impl(std::span<const P2pOp> ops) = 0;
};

// Ends the whole job from any thread, before any teardown that could wait on
// a peer: prints "rank R: message" to stderr, aborts every communicator of
// this process (each from a helper thread, for at most 2 s: ncclCommAbort may
// wait for a kernel), then MPI_Abort when MPI runs (it ends every rank), else
// exits with status 1, which makes torchrun or srun --kill-on-bad-exit end
// the other ranks. Only the first caller prints; later ones wait for the exit.
[[noreturn]] void end_job(std::string_view message) noexcept;
// The first async_error() of the live communicators, as a message naming it.
std::optional<std::string> first_async_error();
// abort_local() on every live communicator (end_job's helper thread).
void abort_live_communicators() noexcept;

}  // namespace cuboid::exec
