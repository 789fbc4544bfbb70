#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// The flows on one link class of the network (Network's private part).
#include <cstdint>

namespace cuboid::sim {

using FlowId = std::uint32_t;

// An entry of a link class's flow list: a flow and which of its set's
// class uses this is.
struct FlowRef {
  FlowId flow = 0;
  std::uint32_t use = 0;  // index into the flow's set's class uses
};

// A link class's flows, 16 bytes, one inline (the usual case: a class
// private to one set), kept apart from the class's other fields: starting or
// ending a flow touches 16 bytes per class, and the one-flow case is a store
// and a count, no capacity checks. Once a list has spilled to the heap it
// stays there (classes shared once are shared again).
class FlowList {
 public:
  FlowList() = default;
  FlowList(const FlowList&) = delete;
  FlowList& operator=(const FlowList&) = delete;
  FlowList(FlowList&& o) noexcept : u_(o.u_), n_(o.n_), cap_(o.cap_) { o.n_ = o.cap_ = 0; }
  FlowList& operator=(FlowList&&) = delete;
  ~FlowList() {
    if (cap_ > 0) delete[] u_.heap;
  }
  std::uint32_t size() const { return n_; }
  FlowRef* begin() { return cap_ > 0 ? u_.heap : &u_.one; }
  FlowRef* end() { return begin() + n_; }
  const FlowRef* begin() const { return cap_ > 0 ? u_.heap : &u_.one; }
  const FlowRef* end() const { return begin() + n_; }
  FlowRef& operator[](std::uint32_t i) { return begin()[i]; }
  FlowRef& back() { return begin()[n_ - 1]; }
  void pop_back() { --n_; }
  void push_back(FlowRef r) {
    if (cap_ == 0 && n_ == 0) {
      u_.one = r;
      n_ = 1;
      return;
    }
    if (cap_ == 0 || n_ == cap_) grow();
    u_.heap[n_++] = r;
  }

 private:
  void grow() {
    const std::uint32_t cap = cap_ == 0 ? 4 : 2 * cap_;
    auto* heap = new FlowRef[cap];
    for (std::uint32_t i = 0; i < n_; ++i) heap[i] = begin()[i];
    if (cap_ > 0) delete[] u_.heap;
    u_.heap = heap;
    cap_ = cap;
  }
  union Storage {
    FlowRef one;
    FlowRef* heap;
  };
  Storage u_{FlowRef{}};
  std::uint32_t n_ = 0;
  std::uint32_t cap_ = 0;  // 0: inline
};

}  // namespace cuboid::sim
