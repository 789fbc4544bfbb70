#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// The nccl-tests result table (`size count type redop root time algbw busbw
// #wrong`), so that `cuboid calibrate` output reads like all_reduce_perf's and
// can be compared with it line by line. algbw = size / time; busbw = algbw x
// NCCL's bus factor (calibration.hpp: bus_factor).
#include <cstdint>
#include <string>

namespace cuboid::calibrate {

struct NcclRow {
  std::int64_t size_bytes = 0;  // nccl-tests "size"
  std::int64_t count = 0;       // elements
  std::string type;             // "float", "bfloat16"
  std::string redop;            // "sum" or "none"
  int root = -1;                // broadcast's root, else -1
  double time_us = 0;
  double bus_factor = 1;
  std::int64_t wrong = 0;       // elements that differ from the expected result
};

double algbw_GBps(double size_bytes, double time_us);

// Two header lines ("#  size  count ..." and the units), each ending in '\n'.
std::string nccl_table_header();
// One row, ending in '\n'; the time as nccl-tests prints it (%7.2f below
// 100 us, %7.1f below 10 ms, %7.0f above).
std::string format_nccl_row(const NcclRow& row);

}  // namespace cuboid::calibrate
