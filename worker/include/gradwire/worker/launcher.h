// Launch: start the worker processes of one program on this machine, like torchrun:
// all of a job's workers (one node), or this node's share of a job that spans
// options.nnodes machines, each running its own launcher.
//
// Contract
//   - Launch() starts options.num_workers processes of options.command (PROGRAM ARGS...,
//     PROGRAM looked up in the launcher's PATH like execvp). Each gets the launcher's
//     environment plus options.extra_env plus RANK, LOCAL_RANK, WORLD_SIZE,
//     LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT (or, with options.rdzv,
//     GRADWIRE_RDZV instead) and GRADWIRE_WORKER_NAME ("worker1"), and reads stdin from
//     /dev/null. Every variable of kLaunchEnvVars that Launch() does not set is removed
//     from the workers' environment (so a GRADWIRE_RDZV of the launcher's own does not
//     reach workers launched without rdzv).
//   - rdzv "etcd://HOST:PORT/JOB": the workers meet through that etcd (AgentOptions::
//     FromEnv reads GRADWIRE_RDZV; rpc/store.h) instead of a store served by rank 0, so
//     master_addr and master_port are not used and no port is picked. A value that does
//     not start with etcd:// or lacks /JOB is INVALID_ARGUMENT; the workers check the rest.
//   - Several nodes (nnodes > 1): node k's launcher starts global ranks
//     k * num_workers ... (k+1) * num_workers - 1 (LOCAL_RANK 0 ... num_workers-1,
//     GROUP_RANK = k, WORLD_SIZE = nnodes * num_workers); every node runs the same
//     program with the same num_workers, master_addr and master_port. Rank 0 (on node 0,
//     the host of master_addr) serves the rendezvous there; the agents of every node meet
//     through it (rpc/agent.h), so process groups span the nodes. master_port must be
//     given (a free port picked on one machine means nothing on another). With rdzv
//     every node gives the same etcd address instead, and any node may start first. Each launcher
//     supervises its own workers; a worker that dies on another node fails its peers'
//     calls (UNAVAILABLE naming it), so their programs fail and their launchers stop.
//   - Each worker's stdout and stderr are copied line by line to `out` / `err`, each line
//     prefixed with "[<name>] "; a last line without '\n' is written (with a '\n' added)
//     when the worker closes its output. Lines longer than 64 KiB are split. Workers get
//     GRADWIRE_LINE_BUFFERED=1 (unless the launcher's environment or extra_env sets it):
//     a program that uses the rpc library (an agent) then has a line-buffered stdout, so
//     each line it prints is relayed as it is printed, not when a pipe-sized block has
//     filled or the program exits (=0 keeps stdio's block buffering).
//   - Bounds, checked before anything starts: at most 1024 workers per launcher
//     (INVALID_ARGUMENT saying so; GRADWIRE_LAUNCH_MAX_WORKERS=N in the launcher's
//     environment allows N), at most rpc::GlobalId::kMaxRanks ranks in the job, fewer
//     workers than this user's process limit (RLIMIT_NPROC, unless root), and two file
//     descriptors per worker (the soft RLIMIT_NOFILE is raised towards the hard one
//     while the launch runs, the workers get the original; RESOURCE_EXHAUSTED, naming
//     the limit and the ulimit option, when that is not enough).
//   - Each worker runs in its own process group. When a worker's main process exits
//     non-zero or is killed by a signal, every other worker's group gets SIGTERM and,
//     after kill_grace, SIGKILL; the result names that first failing worker, with
//     exit_code = its exit status, or 128 + signal number. When any worker exits,
//     whatever it left running in its group gets SIGTERM (SIGKILL after kill_grace).
//   - Restarts (max_restarts > 0, like torchrun's elastic agent, but per worker): a worker
//     that fails is started again at once under the same rank and name, with the same
//     environment plus GRADWIRE_RESTART_COUNT (how many times it was restarted), instead
//     of stopping the job; the launcher says so on `err`. Its peers see it die and rejoin
//     (rpc/agent.h: calls fail with UNAVAILABLE while it is down, reach it once it joined;
//     a parameter server resumes from its checkpoint). A worker that has failed
//     max_restarts + 1 times stops the job as above. Rank 0 is not restarted when it hosts the
//     rendezvous store, which the others need (it is with rdzv: etcd holds the store). A worker killed by the launcher itself
//     (after another failure, or a forwarded signal) is never restarted.
//   - SIGINT / SIGTERM received by the launcher during Launch() are forwarded to every
//     worker's group (SIGKILL follows after kill_grace; a second such signal sends
//     SIGKILL at once) and the result's exit_code is 128 + that signal. One that arrives
//     while the workers are being started stops the starting: only those started so far
//     get it.
//   - The job secret (rpc/security.h): unless GRADWIRE_SECRET_FILE, GRADWIRE_SECRET or
//     GRADWIRE_AUTH=off is in the launcher's environment or extra_env (then the workers
//     get that, untouched), Launch() makes a fresh secret for the job in a sealed memfd
//     that no file system holds, and gives every worker (restarts included)
//     GRADWIRE_SECRET_FILE=/proc/self/fd/N, a descriptor each inherits: nothing is
//     written to disk, and nothing is left when the launcher dies, even by SIGKILL.
//     A job over several nodes, one that others may join (max_workers above the workers
//     started) and workers that join (join) need a secret given: FAILED_PRECONDITION
//     saying how to make one (`gradwire secret`).
//   - No zombies, no orphans: children set PR_SET_PDEATHSIG(SIGKILL), so they die if the
//     launcher thread dies (even by SIGKILL). While Launch() runs the process is a child
//     subreaper (PR_SET_CHILD_SUBREAPER, previous setting restored after), so processes
//     orphaned inside a worker's group become its children and are reaped. Launch()
//     returns once every worker and such orphan is reaped and all output is drained.
//     Not covered: processes that leave their worker's group (setsid/setpgid); they are
//     not waited for, and if reparented to the launcher they stay its children.
//   - Errors are returned as a Status after killing and reaping any worker already
//     started: bad options (InvalidArgument), PROGRAM not found (NotFound), PROGRAM not
//     executable (PermissionDenied), fork/pipe failures (ResourceExhausted / Internal).
//   - Thread safety: Launch() installs process-wide handlers for SIGINT, SIGTERM and
//     SIGCHLD while it runs (restoring the previous ones when it returns), so at most
//     one Launch() may run per process at a time; a concurrent call fails with
//     FailedPrecondition. REQUIRES: the calling thread outlives the launch (the
//     children's death signal is tied to it); nothing else in the process reaps the
//     workers (e.g. waitpid(-1, ...)); the process's other children do not orphan
//     processes during Launch() (those would be reparented to it and left unreaped).
//   - PickFreePort() binds `address`:0, reads the port the OS chose and closes the
//     socket. Another process may take the port before rank 0 binds it.
#ifndef GRADWIRE_WORKER_LAUNCHER_H_
#define GRADWIRE_WORKER_LAUNCHER_H_

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gw::worker {

struct LaunchOptions {
  int num_workers = 1;                 // -n: workers on this node
  int nnodes = 1;                      // machines the job spans
  int node_rank = 0;                   // this machine's index in [0, nnodes)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: pick a free port (PickFreePort(master_addr)); one node only
  std::string rdzv;                    // "etcd://HOST:PORT/JOB": meet through etcd (replaces master_*)
  std::string name_prefix = "worker";  // worker names by global rank: worker0, worker1, ...
  absl::Duration kill_grace = absl::Seconds(5);  // SIGTERM, then SIGKILL after this
  int max_restarts = 0;                // times each failed worker is restarted (rank 0 only with rdzv)
  // Elastic jobs (rpc agent.h): the ranks the group may grow to (GRADWIRE_MAX_WORLD_SIZE;
  // 0: a fixed group), and whether these workers join a running job (GRADWIRE_JOIN=1:
  // each gets its rank and name, worker<rank>, from the group; no RANK is set, and
  // master_port or rdzv must name the running job's rendezvous).
  int max_workers = 0;
  bool join = false;
  // Each worker serves its metrics (rpc/metrics_endpoint.h) on port metrics_port + its
  // rank (GRADWIRE_METRICS_PORT_BASE; the agent adds the rank, which a joining worker
  // learns from the group). 0: no endpoint.
  int metrics_port = 0;
  std::vector<std::string> command;    // PROGRAM ARGS...
  // Added to every worker's environment. Must not set the variables Launch() sets.
  std::map<std::string, std::string> extra_env;
};

struct LaunchResult {
  int exit_code = 0;          // 0 when every worker exited 0
  std::string failed_worker;  // e.g. "worker1"; empty if none failed (or on a forwarded signal)
  std::string reason;         // e.g. "exited with status 3", "was killed by signal 9 (SIGKILL)"
};

// The environment variables Launch() sets in every worker.
inline constexpr const char* kLaunchEnvVars[] = {"RANK",
                                                 "LOCAL_RANK",
                                                 "WORLD_SIZE",
                                                 "LOCAL_WORLD_SIZE",
                                                 "GROUP_RANK",
                                                 "MASTER_ADDR",
                                                 "MASTER_PORT",
                                                 "GRADWIRE_WORKER_NAME",
                                                 "GRADWIRE_RDZV",
                                                 "GRADWIRE_RESTART_COUNT",
                                                 "GRADWIRE_METRICS_PORT_BASE"};

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options, std::FILE* out = stdout,
                                    std::FILE* err = stderr);

// The checks Launch() makes of `options` before it starts anything (bounds, the secret a
// job needs), for a caller that wants their answer first (the CLI, before it says what it
// starts): the same errors.
absl::Status CheckLaunchOptions(const LaunchOptions& options);

// A TCP port that was free on `address` (IPv4/IPv6 literal or host name) a moment ago.
absl::StatusOr<int> PickFreePort(const std::string& address);

}  // namespace gw::worker

#endif  // GRADWIRE_WORKER_LAUNCHER_H_
