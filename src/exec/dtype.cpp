#include "cuboid/exec/dtype.hpp"

namespace cuboid::exec {

std::string_view to_string(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}

}  // namespace cuboid::exec
