#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// Host memory as a trainer's steady state holds it. glibc's malloc hands a
// large block (128 KiB at first, at most 32 MiB) to mmap and returns it to the
// kernel on free, and trims the top of the heap; the next step's block of the
// same size then touches fresh pages, one page fault each. MPI's collectives
// allocate their temporaries per call (Open MPI's reduce-scatter a buffer of
// the whole message), so a measured step would pay a fault per 4 KiB of every
// large reduction, which the cost model, like a GPU trainer's caching
// allocator, does not: on a machine whose faults are slow (a sandboxed VM:
// 12 us per page, a 14.7 MB reduce-scatter 4 ms -> 80 ms) that alone
// decided the measured step. Both `cuboid run` and `cuboid calibrate` keep
// freed memory in the process instead, so that after the warm-up their
// steps and sweeps reuse pages already touched.
#include <cstdint>
#include <string>

namespace cuboid::exec {

// Keeps freed host memory in the process from now on (glibc: M_MMAP_MAX 0,
// every block from the heap; M_TRIM_THRESHOLD at its maximum, the heap never
// shrunk). Returns what was done, for the measurements' environment; on
// another C library, or under AddressSanitizer (whose allocator replaces
// glibc's), that the allocator is left as it is.
std::string hold_freed_host_memory();

// Minor page faults of this process so far (getrusage), for the faults per
// measured step that the measurements record.
std::int64_t minor_page_faults();

}  // namespace cuboid::exec
