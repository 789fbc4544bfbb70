#pragma once
// A memory resource that counts what passes through it, for tests of which
// tables a component takes from the resource it is given (the simulator's
// SimArena, huge_pages.hpp). Blocks come from the heap.
#include <cstddef>
#include <cstring>
#include <memory_resource>

namespace cuboid::test {

class CountingResource : public std::pmr::memory_resource {
 public:
  // dirty: each block is filled with 0xA5 bytes, as reused memory may be.
  explicit CountingResource(bool dirty = false) : dirty_(dirty) {}
  std::size_t allocations = 0;
  std::size_t total_bytes = 0;  // all ever allocated
  std::size_t live_bytes = 0;  // allocated and not given back (with the size it was allocated with)

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = std::pmr::new_delete_resource()->allocate(bytes, alignment);
    if (dirty_) std::memset(p, 0xA5, bytes);
    ++allocations;
    total_bytes += bytes;
    live_bytes += bytes;
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override {
    live_bytes -= bytes;
    std::pmr::new_delete_resource()->deallocate(p, bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
  bool dirty_;
};

}  // namespace cuboid::test
