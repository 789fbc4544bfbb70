// nccl-tests' table layout (nccl-tests src/common.cu: the "%12li  %12li  %8s
// %6s  %6i" prefix and the time / algbw / busbw / #wrong columns).
#include "cuboid/calibrate/nccl_table.hpp"

#include <fmt/format.h>

namespace cuboid::calibrate {

double algbw_GBps(double size_bytes, double time_us) { return time_us > 0 ? size_bytes / time_us * 1e-3 : 0.0; }

std::string nccl_table_header() {
  return fmt::format("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "size", "count", "type",
                     "redop", "root", "time", "algbw", "busbw", "#wrong") +
         fmt::format("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "(B)", "(elements)", "", "",
                     "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string format_nccl_row(const NcclRow& r) {
  const std::string time = r.time_us >= 10000.0 ? fmt::format("{:7.0f}", r.time_us)
                           : r.time_us >= 100.0 ? fmt::format("{:7.1f}", r.time_us)
                                                : fmt::format("{:7.2f}", r.time_us);
  const double algbw = algbw_GBps(static_cast<double>(r.size_bytes), r.time_us);
  return fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {:>6.2f}  {:>6.2f}  {:>6}\n", r.size_bytes, r.count, r.type,
                     r.redop, r.root, time, algbw, algbw * r.bus_factor, r.wrong);
}

}  // namespace cuboid::calibrate
