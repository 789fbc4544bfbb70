#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// Backend memory as the executor's code holds it: DeviceBuffer owns it,
// DeviceSpan and ConstDeviceSpan view it; OwnedHandle frees it (or any other
// backend resource, such as an event) through the backend that made it.
#include <algorithm>
#include <cstddef>
#include <utility>

#include "cuboid/exec/dtype.hpp"

namespace cuboid::exec {

class DeviceBuffer;

// A view: non-owning (pointer, element count, dtype), cheap to copy. The
// pointer is backend memory: only a backend dereferences it.
class DeviceSpan {
 public:
  DeviceSpan() = default;
  DeviceSpan(void* data, std::size_t size, DType dtype) noexcept
      : data_(data), size_(size), dtype_(dtype) {}
  DeviceSpan(DeviceBuffer& buffer) noexcept;  // NOLINT: implicit on purpose

  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * dtype_bytes(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return size_ == 0; }
  // Elements [offset, offset + count); ExecError when out of range.
  DeviceSpan subspan(std::size_t offset, std::size_t count) const;
  // Elements [offset, size()).
  DeviceSpan subspan(std::size_t offset) const { return subspan(offset, size_ - std::min(offset, size_)); }
  // For backend implementations only.
  void* native() const noexcept { return data_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
};

class ConstDeviceSpan {
 public:
  ConstDeviceSpan() = default;
  ConstDeviceSpan(const void* data, std::size_t size, DType dtype) noexcept
      : data_(data), size_(size), dtype_(dtype) {}
  ConstDeviceSpan(DeviceSpan s) noexcept : data_(s.native()), size_(s.size()), dtype_(s.dtype()) {}
  ConstDeviceSpan(const DeviceBuffer& buffer) noexcept;  // NOLINT: implicit on purpose

  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * dtype_bytes(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return size_ == 0; }
  ConstDeviceSpan subspan(std::size_t offset, std::size_t count) const;
  ConstDeviceSpan subspan(std::size_t offset) const {
    return subspan(offset, size_ - std::min(offset, size_));
  }
  const void* native() const noexcept { return data_; }

 private:
  const void* data_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
};

// A move-only owner of one backend resource (memory, an event). The deleter is
// a plain function plus a context pointer (e.g. the backend's allocator).
class OwnedHandle {
 public:
  using Deleter = void (*)(void* handle, void* context) noexcept;
  OwnedHandle() = default;
  OwnedHandle(void* handle, Deleter deleter, void* context) noexcept
      : handle_(handle), deleter_(deleter), context_(context) {}
  ~OwnedHandle() { reset(); }
  OwnedHandle(OwnedHandle&& other) noexcept;
  OwnedHandle& operator=(OwnedHandle&& other) noexcept;
  OwnedHandle(const OwnedHandle&) = delete;
  OwnedHandle& operator=(const OwnedHandle&) = delete;

  void* get() const noexcept { return handle_; }
  void reset() noexcept;

 private:
  void* handle_ = nullptr;
  Deleter deleter_ = nullptr;
  void* context_ = nullptr;
};

// Backend memory: `size()` elements of `dtype()`. Move-only; freed by the
// backend that allocated it (which must outlive it).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(OwnedHandle memory, std::size_t size, DType dtype) noexcept
      : memory_(std::move(memory)), size_(size), dtype_(dtype) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * dtype_bytes(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return size_ == 0; }
  DeviceSpan span() noexcept { return {memory_.get(), size_, dtype_}; }
  ConstDeviceSpan span() const noexcept { return {memory_.get(), size_, dtype_}; }
  DeviceSpan subspan(std::size_t offset, std::size_t count) { return span().subspan(offset, count); }
  ConstDeviceSpan subspan(std::size_t offset, std::size_t count) const {
    return span().subspan(offset, count);
  }
  // Elements [offset, size()).
  DeviceSpan subspan(std::size_t offset) { return span().subspan(offset); }
  ConstDeviceSpan subspan(std::size_t offset) const { return span().subspan(offset); }
  void* native() const noexcept { return memory_.get(); }  // for backends only

 private:
  OwnedHandle memory_;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
};

inline DeviceSpan::DeviceSpan(DeviceBuffer& b) noexcept
    : data_(b.native()), size_(b.size()), dtype_(b.dtype()) {}
inline ConstDeviceSpan::ConstDeviceSpan(const DeviceBuffer& b) noexcept
    : data_(b.native()), size_(b.size()), dtype_(b.dtype()) {}

}  // namespace cuboid::exec
