// The checks every communicator shares (non-virtual interface, see communicator.hpp).
#include "cuboid/exec/communicator.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

namespace {
// The process's live communicators (end_job, first_async_error).
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Communicator*>& registry() {
  static std::vector<Communicator*> r;
  return r;
}
}  // namespace

Communicator::Communicator() {
  std::lock_guard lock(registry_mutex());
  registry().push_back(this);
}

Communicator::~Communicator() {
  std::lock_guard lock(registry_mutex());
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), this), r.end());
}

void Communicator::abort(std::string_view message) { end_job(message); }

std::optional<std::string> first_async_error() {
  std::lock_guard lock(registry_mutex());
  for (Communicator* c : registry())
    if (std::optional<std::string> e = c->async_error())
      return std::string(c->kind()) + " communicator of " + std::to_string(c->size()) + " ranks (this rank " +
             std::to_string(c->rank()) + "): " + *e;
  return std::nullopt;
}

void abort_live_communicators() noexcept {
  // No lock: end_job calls this when the job is over, possibly from a thread
  // while another holds the registry; the communicators stay alive (the
  // process exits without destroying them).
  for (Communicator* c : registry()) c->abort_local();
}

namespace {

void require_count(ConstDeviceSpan s, std::size_t needed, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(s.size() >= needed, op,
                      std::string(what) + " holds " + std::to_string(s.size()) +
                          " elements, needs " + std::to_string(needed));
}

void require_peer(int peer, int size, const char* op) {
  CUBOID_EXEC_REQUIRE(peer >= 0 && peer < size, op,
                      "peer " + std::to_string(peer) + " outside a group of " +
                          std::to_string(size));
}

}  // namespace

void Communicator::all_reduce_sum(DeviceSpan buffer, std::size_t count) {
  require_count(buffer, count, "all_reduce_sum", "buffer");
  all_reduce_sum_impl(buffer, count);
}

void Communicator::reduce_scatter_sum(ConstDeviceSpan send, DeviceSpan recv,
                                      std::size_t recv_count) {
  require_count(send, recv_count * static_cast<std::size_t>(size()), "reduce_scatter_sum", "send");
  require_count(recv, recv_count, "reduce_scatter_sum", "recv");
  CUBOID_EXEC_REQUIRE(send.dtype() == recv.dtype(), "reduce_scatter_sum",
                      "send and recv differ in dtype");
  reduce_scatter_sum_impl(send, recv, recv_count);
}

void Communicator::all_gather(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) {
  require_count(send, send_count, "all_gather", "send");
  require_count(recv, send_count * static_cast<std::size_t>(size()), "all_gather", "recv");
  CUBOID_EXEC_REQUIRE(send.dtype() == recv.dtype(), "all_gather", "send and recv differ in dtype");
  all_gather_impl(send, recv, send_count);
}

void Communicator::all_to_all(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) {
  const std::size_t total = count * static_cast<std::size_t>(size());
  require_count(send, total, "all_to_all", "send");
  require_count(recv, total, "all_to_all", "recv");
  CUBOID_EXEC_REQUIRE(send.dtype() == recv.dtype(), "all_to_all", "send and recv differ in dtype");
  all_to_all_impl(send, recv, count);
}

void Communicator::all_to_all_v(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                                std::span<const std::size_t> recv_counts) {
  const auto n = static_cast<std::size_t>(size());
  CUBOID_EXEC_REQUIRE(send_counts.size() == n && recv_counts.size() == n, "all_to_all_v",
                      "needs one send and one receive count per rank (" + std::to_string(n) + "), got " +
                          std::to_string(send_counts.size()) + " and " + std::to_string(recv_counts.size()));
  std::size_t sent = 0, received = 0;
  for (std::size_t r = 0; r < n; ++r) {
    sent += send_counts[r];
    received += recv_counts[r];
  }
  require_count(send, sent, "all_to_all_v", "send");
  require_count(recv, received, "all_to_all_v", "recv");
  CUBOID_EXEC_REQUIRE(send.dtype() == recv.dtype(), "all_to_all_v", "send and recv differ in dtype");
  all_to_all_v_impl(send, send_counts, recv, recv_counts);
}

void Communicator::broadcast(DeviceSpan buffer, std::size_t count, int root) {
  require_count(buffer, count, "broadcast", "buffer");
  require_peer(root, size(), "broadcast");
  broadcast_impl(buffer, count, root);
}

void Communicator::send(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) {
  require_count(buffer, count, "send", "buffer");
  require_peer(peer, size(), "send");
  send_impl(buffer, count, peer, tag);
}

void Communicator::recv(DeviceSpan buffer, std::size_t count, int peer, int tag) {
  require_count(buffer, count, "recv", "buffer");
  require_peer(peer, size(), "recv");
  recv_impl(buffer, count, peer, tag);
}

void Communicator::send_recv(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                             DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer,
                             int tag) {
  require_count(send_buffer, send_count, "send_recv", "send buffer");
  require_count(recv_buffer, recv_count, "send_recv", "recv buffer");
  require_peer(send_peer, size(), "send_recv");
  require_peer(recv_peer, size(), "send_recv");
  send_recv_impl(send_buffer, send_count, send_peer, recv_buffer, recv_count, recv_peer, tag);
}

void Communicator::exchange(std::span<const P2pOp> ops) {
  for (const P2pOp& op : ops) {
    if (op.is_send)
      require_count(op.send_buffer, op.count, "exchange", "send buffer");
    else
      require_count(op.recv_buffer, op.count, "exchange", "recv buffer");
    require_peer(op.peer, size(), "exchange");
  }
  if (!ops.empty()) exchange_impl(ops);
}

}  // namespace cuboid::exec
