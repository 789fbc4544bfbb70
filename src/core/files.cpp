#include "cuboid/core/files.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <optional>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "cuboid/core/error.hpp"

namespace cuboid {

namespace {

struct FileId {
  dev_t device;
  ino_t inode;
  std::string path;
};

// Every input read in this process; outputs must not be one of them.
std::mutex g_inputs_mutex;
std::vector<FileId> g_inputs;

void remember_input(const struct stat& st, const std::string& path) {
  std::lock_guard lock(g_inputs_mutex);
  for (FileId& f : g_inputs)
    if (f.device == st.st_dev && f.inode == st.st_ino) {
      f.path = path;  // the latest path that leads to it (an older one may lead nowhere now)
      return;
    }
  g_inputs.push_back({st.st_dev, st.st_ino, path});
}

// The input (as first read) that `st` is, if any. An input's path must still
// lead to the file read: a file deleted since may have left its inode to another.
const FileId* find_input(const struct stat& st) {
  std::lock_guard lock(g_inputs_mutex);
  for (const FileId& f : g_inputs) {
    struct stat now {};
    if (f.device == st.st_dev && f.inode == st.st_ino && ::stat(f.path.c_str(), &now) == 0 && now.st_dev == f.device &&
        now.st_ino == f.inode)
      return &f;
  }
  return nullptr;
}

std::string what_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string mib(std::uintmax_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

[[noreturn]] void too_large(const std::string& where) {
  throw InputError(where, "", "is larger than cuboid's limit of " + mib(kMaxInputBytes) + " for an input file",
                   "give the card, plan or measurements file itself; none of cuboid's inputs is that large");
}

// Read-only for cuboid: the user cannot write it, or its mode has no write
// bit at all (which root could override; cuboid does not).
bool read_only(const std::string& path, const struct stat& st) {
  return (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 || ::access(path.c_str(), W_OK) != 0;
}

}  // namespace

std::string read_input_file(const std::filesystem::path& path) {
  const std::string where = path.string();
  struct stat st {};
  if (::stat(where.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      throw InputError(where, "", "file not found", "check the path; shipped cards are in models/ and topologies/");
    throw InputError(where, "", std::string("cannot be read: ") + std::strerror(errno), "check the path and its permissions");
  }
  if (S_ISDIR(st.st_mode)) throw InputError(where, "", "is a directory, not a file", "pass the path of a .json file");
  if (!S_ISREG(st.st_mode))
    throw InputError(where, "", "is " + what_kind(st.st_mode) + ", not a regular file",
                     "give the path of a file: cuboid reads only regular files");
  if (static_cast<std::uintmax_t>(st.st_size) > kMaxInputBytes) too_large(where);
  // O_NONBLOCK: a FIFO put in the file's place after the stat must not block the open.
  const int fd = ::open(where.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(where, "", "cannot be opened for reading", "check the file's permissions");
  struct stat opened {};
  if (::fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    ::close(fd);
    throw InputError(where, "", "changed while being opened, or is not a regular file", "give the path of a file that stays put");
  }
  std::string text;
  text.resize(static_cast<std::size_t>(opened.st_size));
  std::size_t have = 0;
  for (;;) {
    if (have == text.size()) {
      // The file may have grown since fstat: read on, to one byte past the limit.
      if (text.size() > kMaxInputBytes) break;
      text.resize(std::min<std::size_t>(std::max<std::size_t>(text.size() * 2, 4096), kMaxInputBytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + have, text.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(where, "", std::string("cannot be read: ") + std::strerror(err), "check the file and its disk");
    }
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (have > kMaxInputBytes) too_large(where);
  text.resize(have);
  remember_input(opened, where);
  return text;
}

bool is_input_file(const std::filesystem::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && find_input(st) != nullptr;
}

namespace {

// Why the existing file at `path` must not be replaced by an output (a
// folder, a device, an input of the command, a read-only file), or none.
struct Refusal {
  std::string problem;
  std::string fix;
};
std::optional<Refusal> why_not_replace(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  if (S_ISDIR(st.st_mode))
    return Refusal{"is a folder, not a file",
                   "give a file name inside it, e.g. " + (std::filesystem::path(path) / "out.json").string()};
  if (!S_ISREG(st.st_mode)) return Refusal{"is " + what_kind(st.st_mode) + ", not a regular file", "give the path of a regular file"};
  if (const FileId* in = find_input(st))
    return Refusal{"is the input " + in->path + "; writing it would destroy what the command reads", "write to another file"};
  if (read_only(path, st)) return Refusal{"is read-only; cuboid does not replace it", "make it writable, remove it, or write elsewhere"};
  return std::nullopt;
}

// One output's own checks (those that need no other output).
void check_one_output(const OutputPath& o) {
  const std::string cl = "command line";
  const char* flag = o.flag.c_str();
  if (o.path.empty()) throw InputError(cl, flag, "empty file name", "give a file name, e.g. " + o.flag + " out.json");
  if (auto why = why_not_replace(o.path)) throw InputError(cl, flag, o.path + " " + why->problem, why->fix);
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(o.path, ec).parent_path();
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode))
    throw InputError(cl, flag, "folder " + dir.string() + " of " + o.path + " does not exist", "create the folder or write elsewhere");
  if ((dst.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 || ::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(cl, flag, "folder " + dir.string() + " of " + o.path + " is not writable",
                     "make the folder writable or write elsewhere");
}

// The path as it will be written: absolute, with links and dot segments resolved.
std::filesystem::path resolved(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? std::filesystem::absolute(path, ec) : p;
}

}  // namespace

void check_output_paths(std::span<const OutputPath> outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    check_one_output(outputs[i]);
    for (std::size_t j = 0; j < i; ++j) {
      std::error_code ec;
      const bool same = resolved(outputs[i].path) == resolved(outputs[j].path) ||
                        std::filesystem::equivalent(outputs[i].path, outputs[j].path, ec);
      if (same)
        throw InputError("command line", outputs[i].flag,
                         outputs[j].flag + " and " + outputs[i].flag + " name the same file " + outputs[i].path +
                             "; one would overwrite the other",
                         "give each output its own file");
    }
  }
}

void write_output_file(const std::filesystem::path& path, const std::string& content) {
  const std::string where = path.string();
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(where, "", "directory " + dir.string() + " does not exist",
                     "create the directory first, or write to an existing one");
  if (auto why = why_not_replace(where)) throw InputError(where, "", why->problem, why->fix);

  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0)
    throw InputError(where, "", "cannot create a file in " + dir.string() + ": " + std::strerror(errno),
                     "check that the directory is writable, or write elsewhere");
  ::fchmod(fd, 0644);  // mkstemp creates 0600; output files are meant to be shared
  const char* data = content.data();
  std::size_t left = content.size();
  int err = 0;
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmpl.c_str(), where.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmpl.c_str());
    throw InputError(where, "", std::string("cannot write: ") + std::strerror(err),
                     "check free space and permissions, or write elsewhere");
  }
}

}  // namespace cuboid
