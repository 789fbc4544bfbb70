#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The TCP store: how ranks started by torchrun (or by Slurm without an MPI
// launcher) find each other. Rank 0 listens on MASTER_ADDR at the store port; every
// other rank connects to it (retrying until the timeout, since ranks start in
// any order), says who it is, and from then on the ranks exchange small byte
// strings through rank 0 (a star): the NCCL unique id, the plan fingerprints,
// the measurements. It is the part of PyTorch's TCPStore that `cuboid run`
// needs, as collectives rather than keys, and nothing more.
//
// Every wait has a deadline (the timeout), and every failure is an ExecError
// (or, for inconsistent launch variables, an InputError) that names this rank,
// the peer rank and the operation: a rank that never comes, dies or hangs
// ends the job with a message instead of a hang.
#include <chrono>
#include <string>
#include <vector>

#include "cuboid/exec/host_exchange.hpp"

namespace cuboid::exec {

// A move-only owner of one socket file descriptor (closed by the destructor).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept;
  void reset() noexcept;

 private:
  int fd_ = -1;
};

struct TcpStoreOptions {
  std::string master_addr;  // rank 0's host name or address (MASTER_ADDR)
  int master_port = 0;      // the store's port on rank 0 (LaunchInfo::store_port)
  std::string port_var = "MASTER_PORT";  // where that port came from, for messages
  int rank = 0;             // RANK / SLURM_PROCID
  int world_size = 1;       // WORLD_SIZE / SLURM_NTASKS
  // Connecting (all ranks must arrive within it) and every exchange.
  std::chrono::milliseconds timeout{300'000};
  // Names of the variables the values came from, for error messages.
  std::string rank_var = "RANK";
  std::string size_var = "WORLD_SIZE";
};

class TcpStore final : public HostExchange {
 public:
  // Rank 0 binds and listens, then accepts the other world_size - 1 ranks;
  // the others connect with retries. Returns once every rank is connected
  // and agrees on the world size (the rendezvous is a barrier).
  explicit TcpStore(const TcpStoreOptions& options);

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  void broadcast(std::string& bytes, int root) override;
  std::vector<std::string> gather(const std::string& mine, int root) override;
  std::vector<std::string> all_gather(const std::string& mine) override;
  void barrier() override;

 private:
  void serve(const TcpStoreOptions& o);    // rank 0
  void connect(const TcpStoreOptions& o);  // the others
  void send_to(int peer, const std::string& bytes, const char* op);
  std::string recv_from(int peer, const char* op);
  std::chrono::steady_clock::time_point deadline() const;

  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  // Rank 0: peers_[r] is rank r's connection (peers_[0] unused); others: peers_[0] is rank 0.
  std::vector<Socket> peers_;
};

}  // namespace cuboid::exec
