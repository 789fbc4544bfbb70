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
#include <string_view>

#include "cuboid/exec/buffer.hpp"

namespace cuboid::exec {

// A non-blocking send or receive in flight (Communicator::isend / irecv).
// Move-only through its owner (std::unique_ptr); destroying one that has not
// been waited for gives up on it (MPI: cancels a receive).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  CommRequest() = default;
  CommRequest(const CommRequest&) = delete;
  CommRequest& operator=(const CommRequest&) = delete;

  // Completes the transfer for what the caller does next: afterwards a sent
  // buffer may be overwritten and a received one read by work enqueued on the
  // backend. MPI: the host waits (MPI_Wait). NCCL: the compute stream waits
  // for the transfer; the host does not.
  virtual void wait() = 0;
  // True when the transfer has finished (wait() has nothing left to wait for).
  virtual bool test() = 0;
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
  virtual ~Communicator() = default;
  Communicator() = default;
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
  void send(ConstDeviceSpan buffer, std::size_t count, int peer, int tag);
  void recv(DeviceSpan buffer, std::size_t count, int peer, int tag);
  // Send and receive at once (no deadlock when two stages exchange, as in 1F1B).
  void send_recv(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                 DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer, int tag);
  // Non-blocking point-to-point: starts the transfer after the work already
  // enqueued on the backend and returns at once; the buffer must stay valid
  // and untouched until the request's wait(). A pipeline stage posts its sends
  // and receives with these so that no order of a schedule deadlocks two
  // stages that send to each other. NCCL runs p2p on one stream in issue
  // order, so it holds a send back until the next irecv (or wait) on this
  // communicator and issues them as one ncclGroupStart/End, Megatron's
  // batched send/recv pairs.
  std::unique_ptr<CommRequest> isend(ConstDeviceSpan buffer, std::size_t count, int peer, int tag);
  std::unique_ptr<CommRequest> irecv(DeviceSpan buffer, std::size_t count, int peer, int tag);
  virtual void barrier() = 0;
  // Ends every process of the job (MPI_Abort / ncclCommAbort then abort).
  [[noreturn]] virtual void abort(std::string_view message) = 0;
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
  virtual void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
  virtual void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
  virtual void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                              DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer,
                              int tag) = 0;
  virtual std::unique_ptr<CommRequest> isend_impl(ConstDeviceSpan buffer, std::size_t count, int peer,
                                                  int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
};

}  // namespace cuboid::exec
