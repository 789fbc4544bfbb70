// The NCCL semantics model (see nccl_model.hpp).
#include "nccl_model.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include <fmt/format.h>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec::model {

namespace {

const char* kind_name(Fabric::Kind k) {
  switch (k) {
    case Fabric::Kind::send: return "send";
    case Fabric::Kind::recv: return "recv";
    case Fabric::Kind::all_reduce: return "all_reduce";
    case Fabric::Kind::reduce_scatter: return "reduce_scatter";
    case Fabric::Kind::all_gather: return "all_gather";
    case Fabric::Kind::all_to_all: return "all_to_all";
    case Fabric::Kind::broadcast: return "broadcast";
    case Fabric::Kind::barrier: return "barrier";
    case Fabric::Kind::split: return "split";
  }
  return "?";
}

bool is_p2p(Fabric::Kind k) { return k == Fabric::Kind::send || k == Fabric::Kind::recv; }

// Element-wise sum of `members` buffers into `out` (f32 or i32).
void add_into(void* out, const void* in, std::size_t count, DType dtype) {
  if (dtype == DType::i32) {
    auto* o = static_cast<std::int32_t*>(out);
    const auto* x = static_cast<const std::int32_t*>(in);
    for (std::size_t i = 0; i < count; ++i) o[i] += x[i];
  } else {
    auto* o = static_cast<float*>(out);
    const auto* x = static_cast<const float*>(in);
    for (std::size_t i = 0; i < count; ++i) o[i] += x[i];
  }
}

}  // namespace

// --- the communicator the executor sees ------------------------------------
class ModelCommunicator final : public Communicator {
 public:
  ModelCommunicator(std::shared_ptr<Fabric> fabric, int comm, int member, int size)
      : fabric_(std::move(fabric)), comm_(comm), member_(member), size_(size) {}

  std::string_view kind() const noexcept override { return "nccl-model"; }
  int rank() const noexcept override { return member_; }
  int size() const noexcept override { return size_; }
  void barrier() override { collective(Fabric::Kind::barrier, nullptr, nullptr, 0, DType::f32, 0, "barrier"); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> out;
    Fabric::Op op;
    op.kind = Fabric::Kind::split;
    op.color = color;
    op.key = key;
    op.out = &out;
    fabric_->launch(comm_, member_, {op}, "ncclCommSplit");
    return out;
  }

 protected:
  void all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) override {
    collective(Fabric::Kind::all_reduce, buffer.native(), buffer.native(), count, buffer.dtype(), 0, "ncclAllReduce");
  }
  void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t recv_count) override {
    collective(Fabric::Kind::reduce_scatter, send.native(), recv.native(), recv_count, recv.dtype(), 0,
               "ncclReduceScatter");
  }
  void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) override {
    collective(Fabric::Kind::all_gather, send.native(), recv.native(), send_count, recv.dtype(), 0, "ncclAllGather");
  }
  // NCCL has no all-to-all call: NcclCommunicator groups a send and a
  // receive per peer, self included, which NCCL matches as one collective.
  void all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) override {
    collective(Fabric::Kind::all_to_all, send.native(), recv.native(), count, recv.dtype(), 0,
               "ncclSend + ncclRecv to every peer (one group)");
  }
  void broadcast_impl(DeviceSpan buffer, std::size_t count, int root) override {
    collective(Fabric::Kind::broadcast, buffer.native(), buffer.native(), count, buffer.dtype(), root,
               "ncclBroadcast");
  }
  void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) override {
    fabric_->launch(comm_, member_, {p2p(Fabric::Kind::send, buffer.native(), nullptr, count, buffer.dtype(), peer, tag)},
                    "ncclSend");
  }
  void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) override {
    fabric_->launch(comm_, member_, {p2p(Fabric::Kind::recv, nullptr, buffer.native(), count, buffer.dtype(), peer, tag)},
                    "ncclRecv");
  }
  void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer, DeviceSpan recv_buffer,
                      std::size_t recv_count, int recv_peer, int tag) override {
    fabric_->launch(comm_, member_,
                    {p2p(Fabric::Kind::send, send_buffer.native(), nullptr, send_count, send_buffer.dtype(), send_peer, tag),
                     p2p(Fabric::Kind::recv, nullptr, recv_buffer.native(), recv_count, recv_buffer.dtype(), recv_peer, tag)},
                    "ncclSend + ncclRecv (one group)");
  }
  // As NcclCommunicator: one group of a send and a receive per peer with a
  // non-empty block; the self block is a copy (NCCL's send to self is a
  // local copy inside the group, and the fabric refuses self p2p).
  void all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                         std::span<const std::size_t> recv_counts) override {
    const std::size_t esz = dtype_bytes(send.dtype());
    std::vector<Fabric::Op> launch;
    std::size_t s_at = 0, r_at = 0;
    for (int peer = 0; peer < size_; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      const auto* src = static_cast<const unsigned char*>(send.native()) + s_at * esz;
      auto* dst = static_cast<unsigned char*>(recv.native()) + r_at * esz;
      if (peer == member_) {
        if (send_counts[p] != recv_counts[p])
          throw ExecError(__FILE__, __LINE__, member_, "all_to_all_v", "the self block differs in size on its two sides");
        std::memcpy(dst, src, send_counts[p] * esz);
      } else {
        if (send_counts[p] > 0) launch.push_back(p2p(Fabric::Kind::send, src, nullptr, send_counts[p], send.dtype(), peer, 0));
        if (recv_counts[p] > 0) launch.push_back(p2p(Fabric::Kind::recv, nullptr, dst, recv_counts[p], recv.dtype(), peer, 0));
      }
      s_at += send_counts[p];
      r_at += recv_counts[p];
    }
    if (!launch.empty()) fabric_->launch(comm_, member_, std::move(launch), "ncclSend + ncclRecv per peer (one group)");
  }
  // As NcclCommunicator: one ncclGroupStart / ncclGroupEnd of every op.
  void exchange_impl(std::span<const P2pOp> ops) override {
    std::vector<Fabric::Op> launch;
    for (const P2pOp& o : ops)
      launch.push_back(o.is_send ? p2p(Fabric::Kind::send, o.send_buffer.native(), nullptr, o.count,
                                       o.send_buffer.dtype(), o.peer, o.tag)
                                 : p2p(Fabric::Kind::recv, nullptr, o.recv_buffer.native(), o.count,
                                       o.recv_buffer.dtype(), o.peer, o.tag));
    fabric_->launch(comm_, member_, std::move(launch), "exchange (one ncclGroupStart/End)");
  }

 private:
  static Fabric::Op p2p(Fabric::Kind kind, const void* src, void* dst, std::size_t count, DType dtype, int peer,
                        int tag) {
    return Fabric::Op{.kind = kind, .peer = peer, .src = src, .dst = dst, .count = count, .dtype = dtype, .tag = tag};
  }
  void collective(Fabric::Kind kind, const void* src, void* dst, std::size_t count, DType dtype, int root,
                  const char* what) {
    fabric_->launch(comm_, member_,
                    {Fabric::Op{.kind = kind, .src = src, .dst = dst, .count = count, .dtype = dtype, .root = root}},
                    what);
  }

  std::shared_ptr<Fabric> fabric_;
  int comm_, member_, size_;
};

// --- the fabric --------------------------------------------------------------
std::shared_ptr<Fabric> Fabric::make(int world_size) { return std::shared_ptr<Fabric>(new Fabric(world_size)); }

Fabric::Fabric(int world_size)
    : woken_(static_cast<std::size_t>(world_size)), world_size_(world_size), waiting_(static_cast<std::size_t>(world_size), nullptr),
      retired_(static_cast<std::size_t>(world_size), false) {
  std::vector<int> all(static_cast<std::size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  comms_.push_back(all);
}

std::unique_ptr<Communicator> Fabric::world(int rank) {
  return std::make_unique<ModelCommunicator>(shared_from_this(), 0, rank, world_size_);
}

int Fabric::rank_of(int comm, int member) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comms_[static_cast<std::size_t>(comm)][static_cast<std::size_t>(member)];
}

std::string Fabric::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::size_t Fabric::launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return launches_;
}

bool Fabric::Launch::complete() const {
  return std::all_of(ops.begin(), ops.end(), [](const Op& o) { return o.done; });
}

void Fabric::retire(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  retired_[static_cast<std::size_t>(rank)] = true;
  check_deadlock();
}

void Fabric::launch(int comm, int member, std::vector<Op> ops, const char* what) {
  std::unique_lock<std::mutex> lock(mutex_);
  const int rank = comms_[static_cast<std::size_t>(comm)][static_cast<std::size_t>(member)];
  if (!failure_.empty()) throw ExecError(__FILE__, __LINE__, rank, what, failure_);
  ++launches_;
  Launch l;
  l.ops = std::move(ops);
  l.what = what;
  l.comm = comm;
  for (Op& op : l.ops) {
    op.comm = comm;
    op.member = member;
  }
  waiting_[static_cast<std::size_t>(rank)] = &l;
  for (Op& op : l.ops) {
    if (!failure_.empty()) break;
    post(op);
  }
  check_deadlock();
  woken_[static_cast<std::size_t>(rank)].wait(lock, [&] { return l.complete() || !failure_.empty(); });
  waiting_[static_cast<std::size_t>(rank)] = nullptr;
  if (!l.complete()) throw ExecError(__FILE__, __LINE__, rank, what, failure_);
}

void Fabric::post(Op& op) {
  if (op.kind == Kind::send || op.kind == Kind::recv) {
    const int size = static_cast<int>(comms_[static_cast<std::size_t>(op.comm)].size());
    if (op.peer < 0 || op.peer >= size || op.peer == op.member) {
      fail(fmt::format("{} to peer {} in a group of {}", describe(op), op.peer, size));
      return;
    }
    const bool send = op.kind == Kind::send;
    const PairKey key = send ? PairKey{op.comm, op.member, op.peer} : PairKey{op.comm, op.peer, op.member};
    auto& other = send ? recvs_[key] : sends_[key];
    if (!other.empty()) {
      Op* peer = other.front();
      other.pop_front();
      if (send)
        match_p2p(op, *peer);
      else
        match_p2p(*peer, op);
    } else {
      (send ? sends_ : recvs_)[key].push_back(&op);
    }
    return;
  }
  auto& queues = collectives_[op.comm];
  queues.resize(comms_[static_cast<std::size_t>(op.comm)].size());
  queues[static_cast<std::size_t>(op.member)].push_back(&op);
  run_collectives(op.comm);
}

void Fabric::match_p2p(Op& send, Op& recv) {
  if (send.count != recv.count || send.dtype != recv.dtype || send.tag != recv.tag) {
    fail(fmt::format("p2p matched in issue order pairs {} with {}: the two ranks' orders differ (NCCL would "
                     "{})",
                     describe(send), describe(recv),
                     send.count == recv.count && send.dtype == recv.dtype ? "silently deliver the wrong tensor"
                                                                          : "fail or hang"));
    return;
  }
  std::memcpy(recv.dst, send.src, send.count * dtype_bytes(send.dtype));
  send.done = recv.done = true;
  wake(send);
  wake(recv);
}

void Fabric::run_collectives(int comm) {
  auto& queues = collectives_[comm];
  const std::vector<int> members = comms_[static_cast<std::size_t>(comm)];  // a copy: split appends to comms_
  while (std::all_of(queues.begin(), queues.end(), [](const std::deque<Op*>& q) { return !q.empty(); })) {
    std::vector<Op*> ops;
    for (auto& q : queues) {
      ops.push_back(q.front());
      q.pop_front();
    }
    const Op& first = *ops.front();
    for (const Op* o : ops)
      if (o->kind != first.kind || o->count != first.count || o->dtype != first.dtype || o->root != first.root) {
        fail(fmt::format("collectives out of order on one communicator: {} meets {}", describe(first), describe(*o)));
        return;
      }
    const std::size_t n = members.size(), count = first.count, bytes = dtype_bytes(first.dtype);
    switch (first.kind) {
      case Kind::all_reduce: {
        std::vector<unsigned char> sum(count * bytes, 0);
        for (const Op* o : ops) add_into(sum.data(), o->src, count, first.dtype);
        for (Op* o : ops) std::memcpy(o->dst, sum.data(), count * bytes);
        break;
      }
      case Kind::reduce_scatter: {
        for (std::size_t r = 0; r < n; ++r) {
          std::vector<unsigned char> sum(count * bytes, 0);
          for (const Op* o : ops)
            add_into(sum.data(), static_cast<const unsigned char*>(o->src) + r * count * bytes, count, first.dtype);
          std::memcpy(ops[r]->dst, sum.data(), count * bytes);
        }
        break;
      }
      case Kind::all_gather: {
        std::vector<unsigned char> all(n * count * bytes);
        for (std::size_t r = 0; r < n; ++r) std::memcpy(all.data() + r * count * bytes, ops[r]->src, count * bytes);
        for (Op* o : ops) std::memcpy(o->dst, all.data(), all.size());
        break;
      }
      case Kind::all_to_all: {
        // Block r of member s's send lands as block s of member r's recv.
        std::vector<unsigned char> all(n * n * count * bytes);
        for (std::size_t s = 0; s < n; ++s)
          std::memcpy(all.data() + s * n * count * bytes, ops[s]->src, n * count * bytes);
        for (std::size_t r = 0; r < n; ++r)
          for (std::size_t s = 0; s < n; ++s)
            std::memcpy(static_cast<unsigned char*>(ops[r]->dst) + s * count * bytes,
                        all.data() + (s * n + r) * count * bytes, count * bytes);
        break;
      }
      case Kind::broadcast: {
        const Op* root = ops[static_cast<std::size_t>(first.root)];
        for (Op* o : ops)
          if (o != root) std::memcpy(o->dst, root->src, count * bytes);
        break;
      }
      case Kind::split: {
        std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, member)
        for (std::size_t r = 0; r < n; ++r)
          if (ops[r]->color >= 0) by_color[ops[r]->color].push_back({ops[r]->key, static_cast<int>(r)});
        for (auto& [color, list] : by_color) {
          std::sort(list.begin(), list.end());
          std::vector<int> ranks;
          for (const auto& [key, member] : list) ranks.push_back(members[static_cast<std::size_t>(member)]);
          const int id = static_cast<int>(comms_.size());
          comms_.push_back(ranks);
          for (std::size_t i = 0; i < list.size(); ++i)
            *ops[static_cast<std::size_t>(list[i].second)]->out =
                std::make_unique<ModelCommunicator>(shared_from_this(), id, static_cast<int>(i),
                                                    static_cast<int>(list.size()));
        }
        break;
      }
      default: break;  // barrier
    }
    for (Op* o : ops) {
      o->done = true;
      wake(*o);
    }
  }
}

void Fabric::check_deadlock() {
  if (!failure_.empty()) return;
  bool anyone_waits = false;
  for (int r = 0; r < world_size_; ++r) {
    const Launch* l = waiting_[static_cast<std::size_t>(r)];
    const bool stuck = l != nullptr && !l->complete();
    if (!stuck && !retired_[static_cast<std::size_t>(r)]) return;  // this rank can still launch something
    anyone_waits = anyone_waits || stuck;
  }
  if (!anyone_waits) return;
  std::string report = "deadlock: every rank waits and none can proceed";
  for (int r = 0; r < world_size_; ++r) {
    const Launch* l = waiting_[static_cast<std::size_t>(r)];
    if (l == nullptr || l->complete()) {
      report += fmt::format("\n  rank {}: has ended", r);
      continue;
    }
    std::string open;
    for (const Op& op : l->ops)
      if (!op.done) open += (open.empty() ? "" : ", ") + describe(op);
    report += fmt::format("\n  rank {}: in {} ({} ops), waiting on {}", r, l->what, l->ops.size(), open);
  }
  fail(report);
}

void Fabric::fail(std::string message) {
  if (failure_.empty()) failure_ = std::move(message);
  for (std::condition_variable& cv : woken_) cv.notify_all();
}

void Fabric::wake(const Op& op) {
  woken_[static_cast<std::size_t>(comms_[static_cast<std::size_t>(op.comm)][static_cast<std::size_t>(op.member)])]
      .notify_all();
}

std::string Fabric::describe(const Op& op) const {
  const std::vector<int>& members = comms_[static_cast<std::size_t>(op.comm)];
  const int self = members[static_cast<std::size_t>(op.member)];
  if (is_p2p(op.kind)) {
    const int peer = op.peer >= 0 && op.peer < static_cast<int>(members.size()) ? members[static_cast<std::size_t>(op.peer)]
                                                                                  : -1;
    return fmt::format("{} {} rank {} (tag {}, {} elements, comm {})", kind_name(op.kind),
                       op.kind == Kind::send ? "to" : "from", peer, op.tag, op.count, op.comm);
  }
  return fmt::format("{} on comm {} of {} ranks by rank {} ({} elements)", kind_name(op.kind), op.comm, members.size(),
                     self, op.count);
}

}  // namespace cuboid::exec::model
