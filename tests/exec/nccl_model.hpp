#pragma once
// A model of NCCL's semantics for the executor's tests: every rank is a
// thread of one process, every communicator a ModelCommunicator on a shared
// Fabric, and the executor's own code (StepRunner, LayerRunner,
// make_process_groups) runs on it unchanged. Buffers are host memory (the cpu
// backend's), so the ranks compute real values.
//
// The rules it enforces are NCCL's, as the executor relies on them:
// * A launch (one NCCL call, or one ncclGroupStart / ncclGroupEnd of p2p
//   calls) occupies its rank until every op in it has completed: the compute
//   stream waits for the communicator's stream after each launch (the
//   executor's NCCL communicator waits at once), and one communicator's
//   launches run in issue order on its stream.
// * Point-to-point: the k-th send from a to b on a communicator matches the
//   k-th receive at b from a (NCCL has no tags; "P2P operations ... are
//   matched in order", nccl docs usage/p2p.html), and a send completes only
//   once its receive has been launched (src/enqueue.cc schedules a send and
//   its peer's receive as one transfer; nothing is buffered eagerly for the
//   sizes the executor sends). Ops inside one group progress together.
// * Collectives: the k-th collective on a communicator is the same call with
//   the same count (and root) on every member, and completes once every
//   member has launched it (nccl docs usage/communicators.html: "operations
//   ... must be called in the same order on all ranks").
// The model also checks what NCCL cannot: the tags of matched p2p ops (the
// executor's tags name the micro-batch, chunk and direction), so an order
// that would silently pair the wrong tensors fails here.
//
// When every rank that has not ended waits in a launch that cannot complete,
// the model reports a deadlock naming each rank, its launch and the ops it
// waits on, and every waiting rank throws ExecError with that report.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuboid/exec/communicator.hpp"

namespace cuboid::exec::model {

class Fabric : public std::enable_shared_from_this<Fabric> {
 public:
  static std::shared_ptr<Fabric> make(int world_size);

  // The world communicator of `rank` (call once per rank).
  std::unique_ptr<Communicator> world(int rank);
  // The thread of `rank` has ended (returned or thrown): ranks waiting on it
  // can no longer be matched.
  void retire(int rank);
  // The deadlock or mismatch found, or "" when none.
  std::string failure() const;
  // Launches so far (every rank), for tests that count them.
  std::size_t launches() const;

  enum class Kind { send, recv, all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, barrier, split };
  struct Op {
    Kind kind = Kind::send;
    int peer = -1;  // p2p: member index in the communicator
    const void* src = nullptr;
    void* dst = nullptr;
    std::size_t count = 0;
    DType dtype = DType::f32;
    int tag = 0;
    int root = 0;
    int color = 0, key = 0;                        // split
    std::unique_ptr<Communicator>* out = nullptr;  // split
    // Filled by the fabric.
    int comm = 0, member = 0;
    bool done = false;
  };
  // Runs one launch of `ops` on communicator `comm` for `member`; returns when
  // every op has completed, throws ExecError on deadlock or mismatch.
  void launch(int comm, int member, std::vector<Op> ops, const char* what);
  int rank_of(int comm, int member) const;

 private:
  explicit Fabric(int world_size);
  struct Launch {
    std::vector<Op> ops;
    const char* what = "";
    int comm = 0;
    bool complete() const;
  };
  using PairKey = std::tuple<int, int, int>;  // comm, from member, to member
  void post(Op& op);
  void match_p2p(Op& send, Op& recv);
  void run_collectives(int comm);
  void check_deadlock();
  void fail(std::string message);
  std::string describe(const Op& op) const;

  void wake(const Op& op);

  mutable std::mutex mutex_;
  std::vector<std::condition_variable> woken_;  // per world rank: an op of its launch completed
  int world_size_;
  std::vector<std::vector<int>> comms_;  // members (world ranks) of each communicator
  std::vector<Launch*> waiting_;         // per world rank
  std::vector<bool> retired_;
  std::map<PairKey, std::deque<Op*>> sends_, recvs_;
  std::map<int, std::vector<std::deque<Op*>>> collectives_;  // comm -> per member
  std::string failure_;
  std::size_t launches_ = 0;
};

}  // namespace cuboid::exec::model
