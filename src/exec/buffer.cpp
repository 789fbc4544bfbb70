// Range-checked subspans and the move-only owners (see buffer.hpp).
#include "cuboid/exec/buffer.hpp"

#include <string>
#include <utility>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

DeviceSpan DeviceSpan::subspan(std::size_t offset, std::size_t count) const {
  CUBOID_EXEC_REQUIRE(offset <= size_ && count <= size_ - offset, "subspan",
                      "elements [" + std::to_string(offset) + ", " +
                          std::to_string(offset + count) + ") outside a span of " +
                          std::to_string(size_));
  return {static_cast<std::byte*>(data_) + offset * dtype_bytes(dtype_), count, dtype_};
}

ConstDeviceSpan ConstDeviceSpan::subspan(std::size_t offset, std::size_t count) const {
  CUBOID_EXEC_REQUIRE(offset <= size_ && count <= size_ - offset, "subspan",
                      "elements [" + std::to_string(offset) + ", " +
                          std::to_string(offset + count) + ") outside a span of " +
                          std::to_string(size_));
  return {static_cast<const std::byte*>(data_) + offset * dtype_bytes(dtype_), count, dtype_};
}

OwnedHandle::OwnedHandle(OwnedHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      deleter_(std::exchange(other.deleter_, nullptr)),
      context_(std::exchange(other.context_, nullptr)) {}

OwnedHandle& OwnedHandle::operator=(OwnedHandle&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, nullptr);
    deleter_ = std::exchange(other.deleter_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

void OwnedHandle::reset() noexcept {
  if (handle_ != nullptr && deleter_ != nullptr) deleter_(handle_, context_);
  handle_ = nullptr;
  deleter_ = nullptr;
  context_ = nullptr;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : memory_(std::move(other.memory_)),
      size_(std::exchange(other.size_, 0)),
      dtype_(other.dtype_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    memory_ = std::move(other.memory_);
    size_ = std::exchange(other.size_, 0);
    dtype_ = other.dtype_;
  }
  return *this;
}

}  // namespace cuboid::exec
