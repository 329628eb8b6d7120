// How every example program takes its command line: ParseFlags(argc, argv, usage).
//
// Contract
//   - --help (or -h, --helpfull) prints the usage line and this program's own flags (name,
//     default, meaning; no source paths) to stdout and exits 0, so that under the
//     launcher a request for help does not read as a crash.
//   - Every other argument goes to Abseil's parser (an unknown flag exits 1 naming it).
//   - The flags every example shares are checked before anything runs, each error
//     naming the flag and what it needs (exit 2): --epochs >= 1, --batch_size >= 1,
//     --lr > 0, --chunks >= 1, and --save's directory exists and is writable (so that a
//     bad path fails at once, not after the whole run).
//   - Threads: a program started without OMP_NUM_THREADS and not by `gradwire launch`
//     (which gives each worker its share of the cores) runs oneDNN on one thread: these
//     models are small, and on a machine whose cores are busy OpenMP threads that wait for
//     one another make an epoch 5-8x slower. Set OMP_NUM_THREADS to choose another count.
//   Header-only; the examples link absl::flags_reflection.
#ifndef GRADWIRE_EXAMPLES_FLAGS_H_
#define GRADWIRE_EXAMPLES_FLAGS_H_

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gw::examples {

namespace flags_internal {

// This program's own flags (defined in examples/), by name.
inline std::vector<absl::CommandLineFlag*> OwnFlags() {
  std::vector<absl::CommandLineFlag*> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "examples/")) own.push_back(flag);
  }
  std::sort(own.begin(), own.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  return own;
}

inline void PrintHelp(const char* argv0, const char* usage) {
  const char* slash = std::strrchr(argv0, '/');
  std::printf("%s: %s\n\nFlags (--name=value):\n", slash ? slash + 1 : argv0, usage);
  for (absl::CommandLineFlag* flag : OwnFlags()) {
    std::string def = flag->DefaultValue();
    if (def.empty()) def = "\"\"";
    std::printf("  --%-22s %s (default %s)\n", std::string(flag->Name()).c_str(), flag->Help().c_str(), def.c_str());
  }
  std::printf("\nRun it under the launcher where it says so: gradwire launch -n N %s [flags]\n",
              slash ? slash + 1 : argv0);
}

[[noreturn]] inline void Refuse(const std::string& why) {
  std::fprintf(stderr, "error: %s\n", why.c_str());
  std::exit(2);
}

// The flag's current value as a number, if this program has the flag.
inline bool Number(const char* name, double* value) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && absl::StrContains(flag->Filename(), "examples/") &&
         absl::SimpleAtod(flag->CurrentValue(), value);
}

inline void CheckSharedFlags() {
  double v = 0;
  if (Number("epochs", &v) && v < 1) Refuse(absl::StrCat("--epochs=", v, ": needs at least one pass (--epochs >= 1)"));
  if (Number("batch_size", &v) && v < 1) Refuse(absl::StrCat("--batch_size=", v, ": needs at least 1"));
  if (Number("chunks", &v) && v < 1) Refuse(absl::StrCat("--chunks=", v, ": needs at least 1 micro-batch"));
  if (Number("lr", &v) && !(v > 0)) Refuse(absl::StrCat("--lr=", v, ": the learning rate must be positive"));
  if (absl::CommandLineFlag* save = absl::FindCommandLineFlag("save"); save != nullptr) {
    const std::string path = save->CurrentValue();
    if (!path.empty()) {
      const size_t slash = path.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
      if (::access(dir.c_str(), W_OK) != 0) {
        Refuse(absl::StrCat("--save=", path, ": cannot write into ", dir, " (", std::strerror(errno),
                            "); make the directory or choose another path"));
      }
    }
  }
}

// One oneDNN (OpenMP) thread when nobody chose a count (see the contract above).
inline void DefaultThreads() {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  // libgomp is loaded by oneDNN; its thread count can be set once it is running.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(1);
}

}  // namespace flags_internal

inline void ParseFlags(int argc, char** argv, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-h" || a == "-help" || a == "--helpfull" || a == "--helpshort") {
      flags_internal::PrintHelp(argv[0], usage);
      std::exit(0);
    }
  }
  absl::ParseCommandLine(argc, argv);
  flags_internal::CheckSharedFlags();
  flags_internal::DefaultThreads();
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_FLAGS_H_
