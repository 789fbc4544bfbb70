#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// The collective microbenchmark of `cuboid calibrate`, nccl-tests style:
// all_reduce, reduce_scatter, all_gather, broadcast and send_recv (a ring
// shift: send to rank + 1, receive from rank - 1) over a ladder of sizes, on
// one process group through the executor's Communicator. Each call is timed
// alone after a barrier (median of several); one more call per size checks
// the result (#wrong: elements that differ from the expected sum or copy).
#include <cstdint>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::exec {
class Watchdog;
}

namespace cuboid::calibrate {

inline constexpr Collective kSweptCollectives[] = {Collective::all_reduce, Collective::reduce_scatter,
                                                   Collective::all_gather, Collective::broadcast,
                                                   Collective::send_recv,  Collective::all_to_all};

struct CollectiveMeasurement {
  Collective collective = Collective::all_reduce;
  std::int64_t size_bytes = 0;  // nccl-tests size, after rounding the count to the group
  std::int64_t count = 0;       // elements of the nccl-tests "count" column
  double time_ns = 0;           // this rank's median per call
  std::int64_t wrong = 0;       // this rank's wrong elements in the check call
};

// The element count nccl-tests uses for `size_bytes`: reduce_scatter,
// all_gather and all_to_all round it down to a multiple of the group size (at
// least one element per rank); count is per rank for the first two (the
// "count" column is the size of the smaller buffer, as nccl-tests prints
// recvcount / sendcount) and the whole buffer for all_to_all (alltoall_perf's
// count).
struct CollectiveCount {
  std::int64_t total = 0;  // elements of the size buffer
  std::int64_t column = 0; // what the "count" column shows
};
CollectiveCount collective_count(Collective c, std::int64_t size_bytes, std::int64_t element_bytes, int group_size);

struct CollectiveSweepOptions {
  int warmup_calls = 2;
  int min_calls = 3;    // timed calls per size for the largest sizes
  int max_calls = 20;   // ... and for the small ones
  std::int64_t bytes_per_size = std::int64_t{64} << 20;  // timed calls: about this much data per size
  // Cold buffers, as the step's data-parallel collectives find theirs
  // (step_cache.hpp): this many bytes written before each timed call; 0: the
  // buffers stay hot from call to call, as a layer's exchanges find theirs.
  std::size_t evict_bytes = 0;
};

// Every collective of kSweptCollectives at every size, on `group` (every
// member calls it with the same arguments).
std::vector<CollectiveMeasurement> run_collective_sweep(exec::Backend& backend, exec::Communicator& group,
                                                        const std::vector<std::int64_t>& sizes,
                                                        const CollectiveSweepOptions& options,
                                                        exec::Watchdog* watchdog);

}  // namespace cuboid::calibrate
