// How every example program takes its command line: ParseFlags(argc, argv, usage).
//
// Contract
//   - --help (or -h, --helpfull) prints the usage line and this program's own flags (name,
//     default, meaning; no source paths) to stdout and exits 0, so that under the
//     launcher a request for help does not read as a crash.
//   - Every other argument goes to Abseil's parser (an unknown flag exits 1 naming it).
//   - The flags every example shares are checked before anything runs, each error
//     naming the flag and what it needs (exit 2): --epochs >= 1, --batch_size >= 1,
//     --lr > 0, --max_steps >= 0 (in a program with a --model flag, --epochs=0 and --lr=0 mean the chosen
//     model's default, fashion_mnist_mlp.h's Recipe), --chunks >= 1, --checkpoint_keep >= 1, --checkpoint_every_s >= 0,
//     --checkpoint_max_failures >= 0. CheckWritable(path), called by the worker that will write
//     a file (--save) before it trains, fails at once on a directory it cannot write.
//   - Threads: a program started without OMP_NUM_THREADS (so not by `gradwire launch`,
//     which gives each worker its share of the cores) starts itself again with
//     OMP_NUM_THREADS=1 (libgomp reads it once, at load; omp_set_num_threads would reach
//     only the calling thread, not the RPC and autograd threads). Measured with
//     train_fashion_mnist on a 2-core AMD EPYC (2026-11-27): one thread 72,000 samples/s on
//     a quiet machine and 69,000 with the other core busy; two 100,000 quiet but 29,000
//     busy (OpenMP threads that spin waiting for a preempted peer); two with passive
//     waiting 60,000 either way. One thread also gives the same numbers on every machine
//     (oneDNN's sums depend on the thread count). Set OMP_NUM_THREADS to choose another.
//   Header-only; the examples link absl::flags_reflection.
#ifndef GRADWIRE_EXAMPLES_FLAGS_H_
#define GRADWIRE_EXAMPLES_FLAGS_H_

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

// Does this program have its own flag `name`?
inline bool HasOwnFlag(const char* name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && absl::StrContains(flag->Filename(), "examples/");
}

inline void CheckSharedFlags() {
  double v = 0;
  // With --model, 0 stands for the model's own default (its Recipe).
  const bool per_model = HasOwnFlag("model");
  const char* or_default = per_model ? " (or 0: the model's default)" : "";
  if (Number("epochs", &v) && v < 1 && !(per_model && v == 0)) {
    Refuse(absl::StrCat("--epochs=", v, ": needs at least one pass (--epochs >= 1)", or_default));
  }
  if (Number("batch_size", &v) && v < 1) Refuse(absl::StrCat("--batch_size=", v, ": needs at least 1"));
  if (Number("max_steps", &v) && v < 0) Refuse(absl::StrCat("--max_steps=", v, ": 0 (no limit) or more"));
  if (Number("chunks", &v) && v < 1) Refuse(absl::StrCat("--chunks=", v, ": needs at least 1 micro-batch"));
  if (Number("lr", &v) && !(v > 0) && !(per_model && v == 0)) {
    Refuse(absl::StrCat("--lr=", v, ": the learning rate must be positive", or_default));
  }
  if (Number("checkpoint_keep", &v) && v < 1) Refuse(absl::StrCat("--checkpoint_keep=", v, ": keep at least 1 version"));
  if (Number("checkpoint_every_s", &v) && !(v >= 0)) {
    Refuse(absl::StrCat("--checkpoint_every_s=", v, ": seconds between checkpoints, 0 or more"));
  }
  if (Number("checkpoint_max_failures", &v) && v < 0) {
    Refuse(absl::StrCat("--checkpoint_max_failures=", v, ": 0 (never stop) or more"));
  }
}

// One oneDNN (OpenMP) thread when nobody chose a count (see the contract above).
inline void DefaultThreads(char** argv) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  ::setenv("OMP_NUM_THREADS", "1", 1);
  ::execv("/proc/self/exe", argv);  // returns only if it failed: then go on as we are
}

}  // namespace flags_internal

// Exits 2 naming `flag` and the directory when `path`'s directory cannot be written.
inline void CheckWritable(const char* flag, const std::string& path) {
  if (path.empty()) return;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::access(dir.c_str(), W_OK) != 0) {
    flags_internal::Refuse(absl::StrCat("--", flag, "=", path, ": cannot write into ", dir, " (",
                                        std::strerror(errno), "); make the directory or choose another path"));
  }
}

inline void ParseFlags(int argc, char** argv, const char* usage) {
  flags_internal::DefaultThreads(argv);
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
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_FLAGS_H_
