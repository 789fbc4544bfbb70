#pragma once
// The trainers' own option definitions (tests/data/trainer_options/<target>-<version>.json,
// facts read from the upstream file at the commit each names) and the readers
// of cuboid's own export formats (io/export_read), so that test_export can
// check every emitted flag or key against them.
#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/io/export_read.hpp"
#include "fixtures.hpp"

namespace cuboid::test {

// Option name -> its value as written ("" for a bare flag); the readers are
// the library's (io/export_read), which the resolution model reads too.
using Emitted = ExportedOptions;

inline std::string unquote(std::string v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

inline Emitted read_megatron(const std::string& text) { return read_megatron_args(text); }
inline Emitted read_deepspeed(const std::string& text) { return read_json_leaves(text); }
inline Emitted read_torchtitan_flags(const std::string& text) { return read_torchtitan_overrides(text); }
inline Emitted read_toml(const std::string& text) { return read_toml_tables(text); }
inline Emitted read_python(const std::string& text, const std::string& var, const std::string& kwargs_prefix) {
  return read_python_fields(text, var, kwargs_prefix);
}
inline Emitted read_yaml(const std::string& text) { return read_yaml_keys(text); }

struct OptionSet {
  std::string source;
  nlohmann::json options;
};

inline OptionSet load_options(const std::string& file) {
  std::ifstream in(source_root() / "tests/data/trainer_options" / file);
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j.at("source").get<std::string>(), j.at("options")};
}

// Every problem with one emitted option ("" when it matches its definition).
inline std::string check_option(const OptionSet& set, const std::string& name, const std::string& value) {
  if (!set.options.contains(name)) return name + ": not an option of " + set.source;
  const nlohmann::json& o = set.options.at(name);
  if (o.value("ignored", false)) return name + ": parsed but never read (" + o.at("from").get<std::string>() + ")";
  const std::string type = o.at("type").get<std::string>();
  if (o.value("nullable", false) && (value == "null" || value == "None")) return "";
  static const std::regex integer(R"(-?\d+)");
  static const std::regex number(R"(-?\d+(\.\d+)?([eE][-+]?\d+)?)");
  bool ok = false;
  if (type == "flag") ok = value.empty();
  else if (type == "int") ok = std::regex_match(value, integer);
  else if (type == "float") ok = std::regex_match(value, number);
  // Megatron's moe_freq_type: an int, or a list expression of 0 / 1 runs
  // (quoted on a command line), as cuboid writes it.
  else if (type == "moe_freq")
    ok = std::regex_match(unquote(value), std::regex(R"(\d+|\[[01]\]\*\d+(\+\[[01]\]\*\d+)*)"));
  // A YAML flow list of 0 / 1, one per layer (NeMo's moe_layer_freq).
  else if (type == "layer_list") ok = std::regex_match(value, std::regex(R"(\[[01](, [01])*\])"));
  // Megatron-Core's pipeline layout string (pipeline_parallel_layer_layout.py's characters).
  else if (type == "pipeline_layout") ok = std::regex_match(unquote(value), std::regex(R"([ELtm|(),*0-9]+)"));
  // Comma-separated module FQNs (torchtitan's filter_fqns lists).
  else if (type == "fqn_list") ok = std::regex_match(value, std::regex(R"([\w.]+(,[\w.]+)*)"));
  // A Python expression of the shape the option's pattern gives.
  else if (type == "pattern") ok = std::regex_match(value, std::regex(o.at("pattern").get<std::string>()));
  else if (type == "bool") ok = value == "true" || value == "false" || value == "True" || value == "False";
  else if (type == "enum" || type == "python" || type == "hydra_defaults") {
    for (const auto& v : o.at("values")) ok = ok || (v.is_string() ? v.get<std::string>() : v.dump()) == unquote(value);
  }
  return ok ? "" : name + ": value " + value + " is not a valid " + type + " (" + o.dump() + ")";
}

inline std::int64_t num(const Emitted& e, const std::string& key) {
  const auto it = e.find(key);
  if (it == e.end()) return -1;
  return std::stoll(it->second);
}

}  // namespace cuboid::test
