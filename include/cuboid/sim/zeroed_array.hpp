#pragma once
// A fixed-size array that starts as all zeros without writing them: a large
// one is a fresh anonymous mapping, whose pages the kernel maps (as zeros)
// only when first touched. The network's per-link tables have ~100k entries
// on a 16k-GPU fabric, of which a folded run touches a few thousand; writing
// their zeros up front faulted in every page. (calloc does not promise
// this: from a reused heap block it clears the memory itself.) For
// arithmetic types (all-zero bits is the value 0).
#include <cstddef>
#include <cstdlib>
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
  explicit ZeroedArray(std::size_t n) : n_(n) {
    if (n == 0) return;
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
  ZeroedArray(ZeroedArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  ZeroedArray& operator=(ZeroedArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
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
};

}  // namespace cuboid::sim
