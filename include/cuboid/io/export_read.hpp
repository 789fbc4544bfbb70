#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// Readers of cuboid's own export formats: each turns what an exporter wrote
// back into option names and values, so that a check of an export reads the
// exporter's output, not the plan it came from. They understand only what
// the exporters write (one flag a line, two-space YAML, `cfg.a.b = value`
// lines), not the formats in general.
#include <map>
#include <string>

namespace cuboid {

// Option name -> its value as written ("" for a bare flag). Repeated options
// keep every value (a reader must not hide a duplicate).
using ExportedOptions = std::multimap<std::string, std::string>;

// Megatron-LM: the MEGATRON_ARGS=( ... ) array, one flag and its value a line.
ExportedOptions read_megatron_args(const std::string& text);
// DeepSpeed's ds_config.json: its leaves as dotted paths, values as JSON text.
ExportedOptions read_json_leaves(const std::string& text);
// torchtitan v0.2: the --section.key=value overrides.
ExportedOptions read_torchtitan_overrides(const std::string& text);
// ... and the same as TOML tables (string values unquoted, lists of strings
// as "a,b").
ExportedOptions read_toml_tables(const std::string& text);
// Python: the assignments `    <var>.a.b = value` (trailing comments dropped,
// strings unquoted), the keyword arguments of one constructor call
// (`        key=value,` lines) under `kwargs_prefix`, and `    <var> = name()`
// as "base_config".
ExportedOptions read_python_fields(const std::string& text, const std::string& var, const std::string& kwargs_prefix);
// NeMo 1.x: the YAML overlay (two-space nesting, scalars, one list) as dotted keys.
ExportedOptions read_yaml_keys(const std::string& text);

// The value of `key`, or `fallback` when the export does not write it.
std::string option_or(const ExportedOptions& o, const std::string& key, const std::string& fallback);

}  // namespace cuboid
