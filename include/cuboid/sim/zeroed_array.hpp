#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// A fixed-size array that starts as all zeros without writing them: a large
// one is a fresh anonymous mapping, whose pages the kernel maps (as zeros)
// only when first touched. The network's per-link tables are large and a
// folded run touches few of their entries: writing their zeros up front
// would fault in every page. (calloc does not promise
// this: from a reused heap block it clears the memory itself.) For
// arithmetic types (all-zero bits is the value 0).
//
// Given a memory resource (a simulation's SimArena, on huge pages, where a
// fault maps 2 MiB at once), the array comes from it and is cleared.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory_resource>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cuboid::sim {

template <typename T>
class ZeroedArray {
  static_assert(std::is_arithmetic_v<T>, "ZeroedArray: zero bits must be the value zero");

 public:
  ZeroedArray() = default;
  explicit ZeroedArray(std::size_t n, std::pmr::memory_resource* mem = nullptr) : n_(n), mem_(mem) {
    if (n == 0) return;
    if (mem != nullptr) {
      p_ = static_cast<T*>(mem->allocate(n * sizeof(T), alignof(T)));
      std::memset(static_cast<void*>(p_), 0, n * sizeof(T));
      return;
    }
#if defined(__linux__)
    if (mapped()) {
      void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      p_ = static_cast<T*>(p);
      return;
    }
#endif
    p_ = static_cast<T*>(std::calloc(n, sizeof(T)));
    if (p_ == nullptr) throw std::bad_alloc();
  }
  ZeroedArray(const ZeroedArray&) = delete;
  ZeroedArray& operator=(const ZeroedArray&) = delete;
  ZeroedArray(ZeroedArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), mem_(std::exchange(o.mem_, nullptr)) {}
  ZeroedArray& operator=(ZeroedArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      mem_ = std::exchange(o.mem_, nullptr);
    }
    return *this;
  }
  ~ZeroedArray() { release(); }

  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return p_[i]; }
  const T& operator[](std::size_t i) const { return p_[i]; }

 private:
  static constexpr std::size_t kMapBytes = std::size_t{64} << 10;  // smaller: calloc
  bool mapped() const { return n_ * sizeof(T) >= kMapBytes; }
  void release() {
    if (p_ == nullptr) return;
    if (mem_ != nullptr) {
      mem_->deallocate(p_, n_ * sizeof(T), alignof(T));
      return;
    }
#if defined(__linux__)
    if (mapped()) {
      munmap(p_, n_ * sizeof(T));
      return;
    }
#endif
    std::free(p_);
  }

  T* p_ = nullptr;
  std::size_t n_ = 0;
  std::pmr::memory_resource* mem_ = nullptr;  // null: mapped or calloc'd, by size
};

}  // namespace cuboid::sim
