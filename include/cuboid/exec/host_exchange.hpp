#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// Host-memory exchange among the processes of one job, for what happens
// around the training step rather than inside it: handing rank 0's NCCL unique
// id to every rank, checking that every rank runs the same plan, gathering the
// per-rank measurements on rank 0. Device traffic goes through Communicator;
// this moves small byte strings between hosts.
//
// Three implementations: over MPI (mpirun / srun), over the TCP store
// (torchrun / Slurm variables without MPI, tcp_store.hpp), and a one-rank world.
// Every call is collective: all ranks call it, in the same order.
#include <memory>
#include <string>
#include <vector>

namespace cuboid::exec {

class HostExchange {
 public:
  virtual ~HostExchange() = default;
  HostExchange() = default;
  HostExchange(const HostExchange&) = delete;
  HostExchange& operator=(const HostExchange&) = delete;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Afterwards every rank's `bytes` equals root's.
  virtual void broadcast(std::string& bytes, int root) = 0;
  // Root gets size() strings in rank order; the other ranks an empty vector.
  virtual std::vector<std::string> gather(const std::string& mine, int root) = 0;
  // Every rank gets size() strings in rank order.
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
  virtual void barrier() = 0;
};

// A one-rank world: everything is a copy.
std::unique_ptr<HostExchange> make_self_exchange();

// Over a duplicate of MPI_COMM_WORLD (so its traffic matches nobody else's).
// Needs MPI initialised (an MpiEnvironment alive) for its whole lifetime.
std::unique_ptr<HostExchange> make_mpi_exchange();

}  // namespace cuboid::exec
