#include "runtime/spirv_validate.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vulkan/vulkan.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "runtime/error.hpp"

extern char** environ;

namespace bitnet {
namespace {

// A pipe's two ends, closed when done with.
struct Pipe {
  int ends[2] = {-1, -1};
  Pipe() {
    if (pipe(ends) != 0) throw DeviceError(std::string("pipe: ") + std::strerror(errno));
  }
  ~Pipe() { close_all(); }
  void close_end(int i) {
    if (ends[i] >= 0) close(ends[i]);
    ends[i] = -1;
  }
  void close_all() {
    close_end(0);
    close_end(1);
  }
};

// Runs spirv-val on `words` (its stdin): "" when the module is valid, else what it said. The
// validator runs in a process of its own, so that nothing it does can take this one down.
std::string run_validator(std::span<const uint32_t> words, const char* target) {
  Pipe input, output;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, input.ends[0], 0);
  posix_spawn_file_actions_adddup2(&actions, output.ends[1], 1);
  posix_spawn_file_actions_adddup2(&actions, output.ends[1], 2);
  posix_spawn_file_actions_addclose(&actions, input.ends[1]);
  posix_spawn_file_actions_addclose(&actions, output.ends[0]);
  // Layouts the device may take (the driver checks its own features): never a reason to refuse.
  const char* argv[] = {"spirv-val",
                        "--target-env",
                        target,
                        "--relax-block-layout",
                        "--scalar-block-layout",
                        "--uniform-buffer-standard-layout",
                        "--workgroup-scalar-block-layout",
                        nullptr};
  pid_t child = -1;
  const int spawned =
      posix_spawnp(&child, "spirv-val", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0)
    throw UnsupportedError(
        "bg.Kernel checks SPIR-V with SPIRV-Tools' spirv-val before any driver sees it, and "
        "spirv-val was not found on PATH (Debian and Ubuntu: apt-get install spirv-tools)");
  input.close_end(0);
  output.close_end(1);
  // Writing all of stdin before reading is safe: spirv-val reads its whole input first.
  const auto* bytes = reinterpret_cast<const char*>(words.data());
  size_t left = words.size_bytes();
  const auto previous = std::signal(SIGPIPE, SIG_IGN);  // a validator that quits early
  while (left > 0) {
    const ssize_t wrote = write(input.ends[1], bytes, left);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) break;
    bytes += wrote;
    left -= static_cast<size_t>(wrote);
  }
  std::signal(SIGPIPE, previous);
  input.close_end(1);
  std::string said;
  char buffer[4096];
  for (;;) {
    const ssize_t got = read(output.ends[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (said.size() < 65536) said.append(buffer, static_cast<size_t>(got));
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFSIGNALED(status))
    return "spirv-val itself failed on it (signal " + std::to_string(WTERMSIG(status)) + ")";
  while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
  const size_t line = said.find('\n');
  return said.empty() ? "rejected" : said.substr(0, line);
}

}  // namespace

void validate_spirv(std::span<const uint32_t> words, uint32_t api_version) {
  if (words.size() < 5 || words[0] != 0x07230203u)
    throw ArgumentError("not a SPIR-V module (expected the magic number 0x07230203 and a header)");
  // A module checked once is not checked again (a user kernel made in a loop).
  static std::mutex mutex;
  static std::unordered_set<size_t> valid;
  const size_t key = std::hash<std::string_view>{}(
      std::string_view(reinterpret_cast<const char*>(words.data()), words.size_bytes()));
  {
    std::lock_guard lock(mutex);
    if (valid.count(key)) return;
  }
  const uint32_t minor = VK_API_VERSION_MINOR(api_version);
  const char* target = minor >= 3 ? "vulkan1.3" : minor == 2 ? "vulkan1.2" : "vulkan1.1";
  const std::string problem = run_validator(words, target);
  if (!problem.empty()) throw ArgumentError("invalid SPIR-V module: " + problem);
  std::lock_guard lock(mutex);
  valid.insert(key);
}

}  // namespace bitnet
