#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// MPI process groups for the executor: the environment (MPI_Init_thread /
// MPI_Finalize) and a Communicator over an owned MPI_Comm. Every MPI call goes
// through CUBOID_MPI_CHECK; communicators use MPI_ERRORS_RETURN so failures
// become ExecError with rank, call, file and line.
//
// MPI moves host memory, so MpiCommunicator serves the cpu backend (f32, i32
// buffers). The CUDA backend uses it only to bootstrap NCCL (broadcast_bytes
// of the ncclUniqueId) and for host-side agreement (gathering timings).
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

// The C API only: MPI's deprecated C++ bindings are not used (and warn).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "cuboid/exec/communicator.hpp"

namespace cuboid::exec {

// Initialises MPI for the lifetime of the object (MPI_THREAD_FUNNELED: only the
// main thread calls MPI). Finalises unless MPI was already initialised by
// someone else. One per process; non-copyable, non-movable.
class MpiEnvironment {
 public:
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int thread_level() const noexcept { return provided_; }
  static bool initialized();

 private:
  bool owns_ = false;
  int provided_ = 0;
};

// How a rank waits for a collective or a message to complete.
//  - spin: MPI's blocking calls (Open MPI polls shared memory on the core; the
//    fastest when every rank has a core of its own);
//  - yield: the non-blocking call, then MPI_Test and sched_yield() until done:
//    a waiting rank hands its core to a rank that shares it and has work, and
//    takes it back at once when there is none. With more ranks than cores,
//    spinning ranks burn the time slices of the partner they wait for and a
//    step's time depends on the scheduler; yielding makes the ranks of a core
//    take turns at their waits, so a TP group on one core runs its ranks' work
//    one after the other, which the calibration models (ranks_per_core);
//  - sleep: MPI_Test with short sleeps (2 us doubling to 200 us): leaves the
//    core idle when nobody else wants it, at the cost of wake-up latency.
enum class MpiWait { spin, yield, sleep };

// "auto" | "spin" | "yield" | "sleep" -> the policy; auto is yield when this
// node runs more MPI ranks than it has online CPUs, else spin.
// InputError (flag --mpi-wait) for any other word.
MpiWait parse_mpi_wait(std::string_view word, int ranks_on_node, int cpus_online);
std::string_view mpi_wait_name(MpiWait wait) noexcept;

// The process-wide policy every MpiCommunicator uses (default spin); set once
// after MpiEnvironment is up, before any collective. Setting sleep also lowers
// this thread's timer slack to 1 us so short sleeps stay short.
void set_mpi_wait(MpiWait wait);
MpiWait mpi_wait() noexcept;

// Ranks of MPI_COMM_WORLD on this node (MPI_Comm_split_type SHARED) and the
// node's online CPUs (sysconf). Needs MPI initialised.
int mpi_ranks_on_node();
int cpus_online();

class MpiCommunicator final : public Communicator {
 public:
  // A duplicate of MPI_COMM_WORLD (MPI_Comm_dup), so the executor's traffic
  // never matches anyone else's. Needs an MpiEnvironment alive.
  static MpiCommunicator world();
  // Takes ownership of `comm` (freed with MPI_Comm_free; never pass a
  // predefined communicator such as MPI_COMM_WORLD).
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(MpiCommunicator&& other) noexcept;
  MpiCommunicator& operator=(MpiCommunicator&& other) noexcept;

  std::string_view kind() const noexcept override { return "mpi"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  // The same as split(), typed (for bootstrapping NCCL groups alongside).
  MpiCommunicator split_mpi(int color, int key);

  // Host-memory helpers (no backend involved).
  void broadcast_bytes(std::span<std::byte> bytes, int root);
  std::vector<double> all_gather_doubles(double value);
  double all_reduce_max(double value);

  MPI_Comm native() const noexcept { return comm_; }

 protected:
  void all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) override;
  void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv,
                               std::size_t recv_count) override;
  void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) override;
  void broadcast_impl(DeviceSpan buffer, std::size_t count, int root) override;
  void all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) override;
  void all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                         std::span<const std::size_t> recv_counts) override;
  void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) override;
  void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) override;
  void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                      DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer,
                      int tag) override;
  void exchange_impl(std::span<const P2pOp> ops) override;

 private:
  void release() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace cuboid::exec
