#pragma once
// Private to the resolution models (src/io/resolve_*.cpp): the builder of a
// ResolvedRun, number parsing and the world size from an export's launch line.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "cuboid/io/export_read.hpp"
#include "cuboid/io/export_resolve.hpp"

namespace cuboid::resolve {

class Builder {
 public:
  explicit Builder(std::string_view target) { run_.target = std::string(target); }
  void set(std::string name, std::string value, std::string source) {
    run_.settings.push_back({std::move(name), std::move(value), std::move(source)});
  }
  void set(std::string name, std::int64_t value, std::string source) {
    set(std::move(name), std::to_string(value), std::move(source));
  }
  void set(std::string name, bool value, std::string source) {
    set(std::move(name), std::string(value ? "true" : "false"), std::move(source));
  }
  void set(std::string name, const char* value, std::string source) {
    set(std::move(name), std::string(value), std::move(source));
  }
  // A start-up assertion that fires: what fails and where.
  void fail(std::string what) { run_.failures.push_back(std::move(what)); }
  ResolvedRun done() { return std::move(run_); }

 private:
  ResolvedRun run_;
};

// An integer option's value; std::invalid_argument naming `what` otherwise.
std::int64_t to_int(const std::string& value, std::string_view what);
// A probability as the trainers read it ("0", "0.1"), spelled as priced_settings spells it.
std::string probability(const std::string& value, std::string_view what);
std::string probability(double p);
// A full recomputation's setting as priced_settings spells it: "full" for
// Megatron-Core's uniform method with one layer per checkpoint, else
// "full:METHOD:N" (the method and layer count as the export gives them,
// "none" where it gives none).
std::string full_recompute(std::string method, std::string num_layers);
// The DDP bucket as priced_settings spells it: the parameters given, or
// Megatron-Core's rule where none is (0).
std::string ddp_bucket(std::int64_t params);
// A value without its surrounding double quotes.
std::string unquote_value(const std::string& value);
// True for Python's True and YAML's / JSON's true.
bool truthy(const std::string& value);
// GPUs the export's launch line starts: torchrun's --nnodes x --nproc_per_node,
// or the deepspeed launcher's --num_nodes x --num_gpus.
int launch_world(const std::string& text);
// The rank order "tp-dp-pp" or, with tp_pp_dp, "tp-pp-dp".
inline const char* megatron_order(bool tp_pp_dp) { return tp_pp_dp ? "tp-pp-dp" : "tp-dp-pp"; }

ResolvedRun megatron_lm(const ExportResult& e);
ResolvedRun megatron_bridge(const ExportResult& e);
ResolvedRun deepspeed(const ExportResult& e);
ResolvedRun nemo1(const ExportResult& e);
ResolvedRun torchtitan(std::string_view target, const ExportResult& e);

}  // namespace cuboid::resolve
