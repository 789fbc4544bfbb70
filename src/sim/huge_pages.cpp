#include "cuboid/sim/huge_pages.hpp"

#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cuboid::sim {

namespace {

class HugePageResource final : public std::pmr::memory_resource {
  static std::size_t rounded(std::size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
#if defined(__linux__)
    if (bytes >= kHugePageBytes && alignment <= kHugePageBytes) {
      // Map 2 MiB more and trim, so the block starts on a huge-page boundary.
      const std::size_t size = rounded(bytes);
      void* raw = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) throw std::bad_alloc();
      char* const base = static_cast<char*>(raw);
      const std::size_t addr = reinterpret_cast<std::size_t>(base);
      char* const p = base + (kHugePageBytes - addr % kHugePageBytes) % kHugePageBytes;
      if (p > base) munmap(base, static_cast<std::size_t>(p - base));
      char* const end = base + size + kHugePageBytes;
      if (end > p + size) munmap(p + size, static_cast<std::size_t>(end - (p + size)));
      madvise(p, size, MADV_HUGEPAGE);  // a hint: failure leaves normal pages
      return p;
    }
#endif
    return ::operator new(bytes, std::align_val_t{alignment});
  }

  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override {
#if defined(__linux__)
    if (bytes >= kHugePageBytes && alignment <= kHugePageBytes) {
      munmap(p, rounded(bytes));
      return;
    }
#endif
    ::operator delete(p, std::align_val_t{alignment});
  }

  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
};

}  // namespace

std::pmr::memory_resource* huge_page_resource() {
  static HugePageResource* const r = new HugePageResource;  // never destroyed: engines may outlive statics
  return r;
}

}  // namespace cuboid::sim
