// Shared helpers for gradwire's benchmark programs: timing, medians and the one-line
// result format of BENCHMARKS.md:
//   workload=<name> impl=<impl> metric=<name> value=<number> unit=<unit>
#ifndef GRADWIRE_BENCH_BENCH_UTIL_H_
#define GRADWIRE_BENCH_BENCH_UTIL_H_

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace gw::bench {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The q-quantile (0..1) of `samples` (nearest rank).
inline double Quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t i = std::min(samples.size() - 1, static_cast<size_t>(q * static_cast<double>(samples.size())));
  return samples[i];
}

inline void Report(const std::string& workload, const std::string& metric, double value, const std::string& unit) {
  std::printf("workload=%s impl=gradwire metric=%s value=%.6g unit=%s\n", workload.c_str(), metric.c_str(), value,
              unit.c_str());
  std::fflush(stdout);
}

// CPU seconds (user and system, all threads) that process `pid` has used so far; 0 if
// /proc cannot tell. Ticks of 10 ms: measure windows of seconds.
inline double ProcessCpuSeconds(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return 0;
  char text[1024] = {};
  const size_t n = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  // The fields after the command's name (which may hold spaces, in parentheses):
  // state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime.
  const char* after = std::strrchr(text, ')');
  unsigned long utime = 0, stime = 0;
  if (n == 0 || after == nullptr ||
      std::sscanf(after + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Runs fn() warmup + iters times and returns the timed durations in milliseconds.
template <typename Fn>
std::vector<double> TimeMs(int warmup, int iters, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const double t0 = NowSeconds();
    fn();
    ms.push_back((NowSeconds() - t0) * 1e3);
  }
  return ms;
}

// Re-runs this program as a child process with `env` added (the peer of a two-process
// benchmark); the child is killed if this process dies.
inline pid_t SpawnSelf(const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    char exe[] = "/proc/self/exe";
    char* args[] = {exe, nullptr};
    ::execv(exe, args);
    ::_exit(127);
  }
  return pid;
}

// Runs this process's threads, and those it makes from now on, on CPU `cpu` alone (a
// two-process benchmark with its processes on a core each reads the same figure run
// after run, where the scheduler's placement otherwise moves it by a fifth). False, with
// the reason on stderr, where the machine has no such CPU.
inline bool PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::fprintf(stderr, "cannot run on CPU %d alone: %s\n", cpu, std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace gw::bench

#endif  // GRADWIRE_BENCH_BENCH_UTIL_H_
