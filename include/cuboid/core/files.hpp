#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Every file cuboid reads or writes passes through here, so that each rule
// holds in one place:
// - inputs are regular files no larger than kMaxInputBytes (a device, a FIFO
//   or a folder is refused by name, never read until memory runs out), and
//   each one read is remembered;
// - outputs are checked before any work (check_output_paths): the folder
//   exists and is writable, the path is not a folder, not a device, not a
//   read-only file, not a file the command reads, and not another output of
//   the same command;
// - outputs are written to a temporary file in the same folder and renamed
//   into place, so a failure leaves an existing file whole.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace cuboid {

// The largest input cuboid reads: its JSON documents take about ten times
// their size in memory once parsed, so 256 MiB keeps one within a few GiB.
// The largest file cuboid writes for itself (a measurements file of a
// thousand ranks) is a few MiB.
inline constexpr std::uintmax_t kMaxInputBytes = std::uintmax_t{256} << 20;

// The whole file at `path`. InputError (naming the path) when it does not
// exist, is a folder, a device, a FIFO or a socket, cannot be opened, or is
// larger than kMaxInputBytes. The file's identity (device and inode) is
// remembered: no later output of the process may replace it.
std::string read_input_file(const std::filesystem::path& path);

// True when `path` is (the same device and inode as) a file read through
// read_input_file in this process.
bool is_input_file(const std::filesystem::path& path);

// An output the command will write: the flag that named it and the path.
struct OutputPath {
  std::string flag;  // "--out", "--svg", ...
  std::string path;
};

// Checks every output path before the command works (InputError on
// "command line", naming the flag): not empty; its folder exists and is
// writable; not a folder, device, FIFO or socket; not a read-only file (no
// write permission, or none in its mode bits: cuboid does not replace it even
// as root); not a file the process has read; not the same file as another
// output in `outputs`.
void check_output_paths(std::span<const OutputPath> outputs);

// Writes `content` to `path` through a temporary file in the same folder,
// renamed into place (permissions 0644). InputError (naming the path) when the
// folder is missing, the path is a folder or an input, or the write fails; a
// failure leaves no temporary file and the old file (if any) unchanged.
void write_output_file(const std::filesystem::path& path, const std::string& content);

}  // namespace cuboid
