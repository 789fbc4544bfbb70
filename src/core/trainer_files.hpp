#pragma once
// The trainers/*.json files as the build embedded them (embed_trainers.py
// writes the definition), in the order src/core/meson.build lists them: the
// default trainer first. The binary needs no file at run time.
#include <span>
#include <string_view>

namespace cuboid {

struct EmbeddedFile {
  std::string_view path;  // "trainers/megatron-core.json", as errors name it
  std::string_view text;
};

std::span<const EmbeddedFile> embedded_trainer_files();

}  // namespace cuboid
