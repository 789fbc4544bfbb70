// A main() for the fuzz harnesses in normal (non-fuzzing) builds: runs the
// harness once on every file of the given corpus folders, so the committed
// corpus (seeds and every crash found, kept as regression inputs) is checked
// by `meson test`, under the sanitizers too (tools/test-sanitize).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  std::set<std::filesystem::path> files;  // sorted: a failure names the same file every run
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg = argv[i];
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file()) files.insert(entry.path());
    } else {
      files.insert(arg);
    }
  }
  if (files.empty()) {
    std::cerr << "replay: no corpus files given\n";
    return 1;
  }
  for (const auto& path : files) {
    std::cout << "replay: " << path.string() << std::endl;  // flushed: the last line names a crashing input
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::cout << "replay: " << files.size() << " inputs, no crash\n";
  return 0;
}
