#pragma once
// An allocator for the engine's big per-task tables: a million-task iteration
// keeps ~100 MB of them and the run visits them in time order, not in the
// order they were built, so with 4 KiB pages nearly every visit misses the
// TLB and every new page costs a fault. Blocks of 2 MiB and more are mapped
// with transparent huge pages requested (Linux madvise; elsewhere, or when
// the kernel says no, they are ordinary pages). Same contents either way.
#include <cstddef>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cuboid::sim {

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

  HugePageAllocator() = default;
  template <typename U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
#if defined(__linux__)
    if (bytes >= kHugePageBytes) {
      // Map 2 MiB more and trim, so the block starts on a huge-page boundary.
      const std::size_t size = rounded(bytes);
      void* raw = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) throw std::bad_alloc();
      char* const base = static_cast<char*>(raw);
      const std::size_t addr = reinterpret_cast<std::size_t>(base);
      char* const p = base + (kHugePageBytes - addr % kHugePageBytes) % kHugePageBytes;
      if (p > base) munmap(base, static_cast<std::size_t>(p - base));
      if (base + size + kHugePageBytes > p + size) munmap(p + size, static_cast<std::size_t>(base + size + kHugePageBytes - (p + size)));
      madvise(p, size, MADV_HUGEPAGE);  // a hint: failure leaves normal pages
      return reinterpret_cast<T*>(p);
    }
#endif
    return static_cast<T*>(::operator new(bytes, std::align_val_t{alignof(T)}));
  }

  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
#if defined(__linux__)
    if (bytes >= kHugePageBytes) {
      munmap(p, rounded(bytes));
      return;
    }
#endif
    ::operator delete(p, std::align_val_t{alignof(T)});
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }

 private:
  static std::size_t rounded(std::size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }
};

}  // namespace cuboid::sim
