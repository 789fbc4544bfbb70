#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The CUDA backend's communicator: NCCL collectives and p2p on a stream of
// their own, ordered against the backend's compute stream with events, the
// way a trainer overlaps them. The MPI twin is mpi_comm.hpp.
//
// Every NCCL call goes through CUBOID_NCCL_CHECK, which throws ExecError with
// the call, NCCL's error string (and its last error), the rank, and the file
// and line.
//
// Only built with the `gpu` feature, into the module cuboid-cuda.so
// (src/exec/cuda_module.hpp).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "cuboid/exec/communicator.hpp"
#include "cuboid/exec/cuda_backend.hpp"

namespace cuboid::exec {

// Throws ExecError for a failed NCCL call; use through CUBOID_NCCL_CHECK.
[[noreturn]] void throw_nccl_error(ncclResult_t code, const char* call, const char* file, int line);

}  // namespace cuboid::exec

#define CUBOID_NCCL_CHECK(call)                                                    \
  do {                                                                             \
    const ncclResult_t cuboid_nccl_rc_ = (call);                                   \
    if (cuboid_nccl_rc_ != ncclSuccess) {                                          \
      ::cuboid::exec::throw_nccl_error(cuboid_nccl_rc_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

namespace cuboid::exec {

struct NcclCommTraits {
  static void destroy(ncclComm_t c) noexcept { (void)ncclCommDestroy(c); }
};
using NcclComm = UniqueCudaHandle<ncclComm_t, NcclCommTraits>;

// Rank 0 of a new world calls nccl_unique_id() and the launcher hands
// the bytes to every rank (MPI_Bcast, or the torchrun store); then every rank
// calls make_nccl_world with them.
struct NcclUniqueId {
  std::array<char, 128> bytes{};  // NCCL_UNIQUE_ID_BYTES
};
NcclUniqueId nccl_unique_id();

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the `size` processes that pass the same id. Uses the
  // backend's device and orders every call after the work already enqueued on
  // its compute stream (and the compute stream's later work after the call).
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, CudaBackend& backend);
  ~NcclCommunicator() override;

  std::string_view kind() const noexcept override { return "nccl"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  void barrier() override;
  std::optional<std::string> async_error() override;
  void abort_local() noexcept override;
  // ncclCommSplit; nullptr for color < 0 (NCCL_SPLIT_NOCOLOR).
  std::unique_ptr<Communicator> split(int color, int key) override;

  cudaStream_t comm_stream() const noexcept { return comm_stream_.get(); }

 protected:
  void all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) override;
  void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t recv_count) override;
  void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) override;
  void broadcast_impl(DeviceSpan buffer, std::size_t count, int root) override;
  void all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) override;
  void all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                         std::span<const std::size_t> recv_counts) override;
  void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) override;
  void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) override;
  void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer, DeviceSpan recv_buffer,
                      std::size_t recv_count, int recv_peer, int tag) override;
  // One ncclGroupStart / ncclGroupEnd of every op: NCCL progresses them
  // together, so two stages that send to each other in one exchange cannot
  // wait for each other; the compute stream waits for the group.
  void exchange_impl(std::span<const P2pOp> ops) override;

 private:
  NcclCommunicator(NcclComm comm, CudaBackend& backend);
  // Makes the comm stream wait for the compute stream, runs `enqueue` (the
  // NCCL calls) on the comm stream, then makes the compute stream wait for it.
  template <typename Enqueue>
  void on_comm_stream(Enqueue&& enqueue);

  CudaBackend* backend_;
  NcclComm comm_;
  CudaStream comm_stream_;
  CudaEvent compute_ready_;
  CudaEvent comm_done_;
  DeviceBuffer barrier_word_;  // one f32 all-reduced by barrier()
  int rank_ = 0;
  int size_ = 1;
};

std::unique_ptr<Communicator> make_nccl_world(const NcclUniqueId& id, int rank, int size, CudaBackend& backend);

}  // namespace cuboid::exec
