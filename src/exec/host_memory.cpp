#include "cuboid/exec/host_memory.hpp"

#include <sys/resource.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CUBOID_ASAN_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUBOID_ASAN_ALLOCATOR 1
#endif
#endif

namespace cuboid::exec {

std::string hold_freed_host_memory() {
#if defined(CUBOID_ASAN_ALLOCATOR)
  // ASan replaces malloc (and answers mallopt with 0); its quarantine keeps
  // freed blocks from reuse for a while on purpose.
  return "AddressSanitizer's allocator: glibc's malloc options do not apply";
#elif defined(__GLIBC__)
  // mallopt's value is an int: -1 is read as the largest size_t, so the heap
  // is never trimmed (glibc malloc/malloc.c do_set_trim_threshold).
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, -1) == 1;
  if (no_mmap && no_trim) return "glibc malloc, freed memory kept (M_MMAP_MAX 0, M_TRIM_THRESHOLD max)";
  return "glibc malloc, mallopt refused: freed memory may return to the kernel";
#else
  return "not glibc: the C library's allocator as it is";
#endif
}

std::int64_t minor_page_faults() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return -1;
  return static_cast<std::int64_t>(u.ru_minflt);
}

}  // namespace cuboid::exec
