#pragma once
// The trainers' own option definitions (tests/data/trainer_options/<target>-<version>.json,
// facts read from the upstream file at the commit each names) and minimal
// readers of cuboid's own export formats, so that test_export can check every
// emitted flag or key against them. The readers understand only what the
// exporters write.
#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"

namespace cuboid::test {

// Option name -> its value as written ("" for a bare flag). Repeated options
// keep every value (a reader must not hide a duplicate).
using Emitted = std::multimap<std::string, std::string>;

inline std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

inline std::string unquote(std::string v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

// Megatron-LM: the MEGATRON_ARGS=( ... ) array, one flag and its value a line.
inline Emitted read_megatron(const std::string& text) {
  Emitted out;
  std::istringstream in(text);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "MEGATRON_ARGS=(") { inside = true; continue; }
    if (inside && line == ")") break;
    if (!inside) continue;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    const auto sp = t.find(' ');
    out.emplace(t.substr(0, sp), sp == std::string::npos ? "" : t.substr(sp + 1));
  }
  return out;
}

// DeepSpeed: JSON leaves as dotted paths, values as JSON text.
inline void flatten(const nlohmann::json& j, const std::string& prefix, Emitted& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) flatten(v, key, out);
    else out.emplace(key, v.dump());
  }
}
inline Emitted read_deepspeed(const std::string& text) {
  Emitted out;
  flatten(nlohmann::json::parse(text), "", out);
  return out;
}

// torchtitan v0.2: the --section.key=value overrides; a boolean is a tyro
// flag, --section.key (true) or --section.no_key (false), never key=value
// (torchtitan docs/debugging.md@v0.2.2: "--key=False will not work").
inline Emitted read_torchtitan_flags(const std::string& text) {
  Emitted out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("--", 0) != 0) continue;
    if (line.size() >= 2 && line.substr(line.size() - 2) == " \\") line.resize(line.size() - 2);
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      const std::string name = line.substr(2);
      const auto dot = name.rfind('.');
      const bool off = name.compare(dot + 1, 3, "no_") == 0;
      out.emplace(off ? name.substr(0, dot + 1) + name.substr(dot + 4) : name, off ? "false" : "true");
      continue;
    }
    const std::string value = line.substr(eq + 1);
    // A boolean written as a value would not parse: report it as such.
    out.emplace(line.substr(2, eq - 2), value == "true" || value == "false" ? "(a boolean as a value: " + value + ")" : value);
  }
  return out;
}
// A TOML list of strings as the override writes it: ["a", "b"] -> a,b.
inline std::string toml_list(const std::string& v) {
  std::string out;
  for (char c : v.substr(1, v.size() - 2))
    if (c != '"' && c != ' ') out += c;
  return out;
}

// ... and the same as TOML tables (string values unquoted, lists as above).
inline Emitted read_toml(const std::string& text) {
  Emitted out;
  std::istringstream in(text);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') { section = line.substr(1, line.size() - 2); continue; }
    if (section.empty() || line.empty() || line[0] == '#') continue;
    const auto eq = line.find(" = ");
    const std::string value = line.substr(eq + 3);
    out.emplace(section + "." + line.substr(0, eq),
                value.size() >= 2 && value.front() == '[' ? toml_list(value) : unquote(value));
  }
  return out;
}

// Python assignments `<var>.a.b = value` (trailing comments dropped), the
// keyword arguments of one constructor call (`    key=value,` lines) under
// `prefix`, and `<var> = name()` as base_config.
inline Emitted read_python(const std::string& text, const std::string& var, const std::string& kwargs_prefix) {
  Emitted out;
  std::istringstream in(text);
  std::string line;
  const std::regex assign("^    " + var + R"(\.([\w.]+) = (.*?)(  #.*)?$)");
  const std::regex base("^    " + var + R"( = (\w+)\(\)$)");
  const std::regex kwarg(R"(^        (\w+)=(.*),$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, assign)) {
      if (m[2].str().back() != '(') out.emplace(m[1].str(), unquote(m[2].str()));  // else: its kwargs follow
    }
    else if (std::regex_match(line, m, base)) out.emplace("base_config", m[1].str());
    else if (std::regex_match(line, m, kwarg)) out.emplace(kwargs_prefix + m[1].str(), unquote(m[2].str()));
  }
  return out;
}

// NeMo: the YAML the exporter writes (two-space nesting, scalars, one list).
inline Emitted read_yaml(const std::string& text) {
  Emitted out;
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> path;
  while (std::getline(in, line)) {
    if (line.empty() || trim(line)[0] == '#') continue;
    const std::size_t indent = line.find_first_not_of(' ');
    const std::size_t level = indent / 2;
    const std::string t = line.substr(indent);
    if (t.rfind("- ", 0) == 0) {
      std::string key;
      for (std::size_t i = 0; i < level; ++i) key += (i ? "." : "") + path[i];
      out.emplace(key, t.substr(2));
      continue;
    }
    path.resize(level);
    const auto colon = t.find(':');
    const std::string key = t.substr(0, colon);
    const std::string value = trim(t.substr(colon + 1));
    if (value.empty()) { path.push_back(key); continue; }
    std::string full;
    for (const auto& p : path) full += p + ".";
    out.emplace(full + key, value);
  }
  return out;
}

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
