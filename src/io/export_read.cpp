#include "cuboid/io/export_read.hpp"

#include <regex>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuboid {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string unquote(std::string v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

void flatten(const nlohmann::json& j, const std::string& prefix, ExportedOptions& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) flatten(*it, key, out);
    else out.emplace(key, it->dump());
  }
}

// A TOML list of strings as the override writes it: ["a", "b"] -> a,b.
std::string toml_list(const std::string& v) {
  std::string out;
  for (char c : v.substr(1, v.size() - 2))
    if (c != '"' && c != ' ') out += c;
  return out;
}

}  // namespace

ExportedOptions read_megatron_args(const std::string& text) {
  ExportedOptions out;
  std::istringstream in(text);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "MEGATRON_ARGS=(") {
      inside = true;
      continue;
    }
    if (inside && line == ")") break;
    if (!inside) continue;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    const auto sp = t.find(' ');
    out.emplace(t.substr(0, sp), sp == std::string::npos ? "" : t.substr(sp + 1));
  }
  return out;
}

ExportedOptions read_json_leaves(const std::string& text) {
  ExportedOptions out;
  flatten(nlohmann::json::parse(text), "", out);
  return out;
}

ExportedOptions read_torchtitan_overrides(const std::string& text) {
  ExportedOptions out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("--", 0) != 0) continue;
    if (line.size() >= 2 && line.substr(line.size() - 2) == " \\") line.resize(line.size() - 2);
    const auto eq = line.find('=');
    // A boolean is a tyro flag, --section.key (true) or --section.no_key
    // (false), never key=value (torchtitan docs/debugging.md@v0.2.2: "--key=False
    // will not work"): read as true / false; one written as a value is reported.
    if (eq == std::string::npos) {
      const std::string name = line.substr(2);
      const auto dot = name.rfind('.');
      const bool off = name.compare(dot + 1, 3, "no_") == 0;
      out.emplace(off ? name.substr(0, dot + 1) + name.substr(dot + 4) : name, off ? "false" : "true");
      continue;
    }
    const std::string value = line.substr(eq + 1);
    out.emplace(line.substr(2, eq - 2),
                value == "true" || value == "false" ? "(a boolean as a value: " + value + ")" : value);
  }
  return out;
}

ExportedOptions read_toml_tables(const std::string& text) {
  ExportedOptions out;
  std::istringstream in(text);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    if (section.empty() || line.empty() || line[0] == '#') continue;
    const auto eq = line.find(" = ");
    const std::string value = line.substr(eq + 3);
    out.emplace(section + "." + line.substr(0, eq),
                value.size() >= 2 && value.front() == '[' ? toml_list(value) : unquote(value));
  }
  return out;
}

ExportedOptions read_python_fields(const std::string& text, const std::string& var, const std::string& kwargs_prefix) {
  ExportedOptions out;
  std::istringstream in(text);
  std::string line;
  const std::regex assign("^    " + var + R"(\.([\w.]+) = (.*?)(  #.*)?$)");
  const std::regex base("^    " + var + R"( = (\w+)\(\)$)");
  const std::regex kwarg(R"(^        (\w+)=(.*),$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, assign)) {
      if (m[2].str().back() != '(') out.emplace(m[1].str(), unquote(m[2].str()));  // else: its kwargs follow
    } else if (std::regex_match(line, m, base)) {
      out.emplace("base_config", m[1].str());
    } else if (std::regex_match(line, m, kwarg)) {
      out.emplace(kwargs_prefix + m[1].str(), unquote(m[2].str()));
    }
  }
  return out;
}

ExportedOptions read_yaml_keys(const std::string& text) {
  ExportedOptions out;
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
      for (std::size_t i = 0; i < level && i < path.size(); ++i) key += (i ? "." : "") + path[i];
      out.emplace(key, t.substr(2));
      continue;
    }
    path.resize(level);
    const auto colon = t.find(':');
    const std::string key = t.substr(0, colon);
    const std::string value = trim(t.substr(colon + 1));
    if (value.empty()) {
      path.push_back(key);
      continue;
    }
    std::string full;
    for (const auto& p : path) full += p + ".";
    out.emplace(full + key, value);
  }
  return out;
}

std::string option_or(const ExportedOptions& o, const std::string& key, const std::string& fallback) {
  const auto it = o.find(key);
  return it == o.end() ? fallback : it->second;
}

}  // namespace cuboid
