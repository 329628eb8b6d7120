// gradwire: the command-line tool. `gradwire launch` starts N local workers of a program
// (like torchrun's local mode); see Usage() below and gradwire/worker/launcher.h for what
// the workers get and how failures are handled. `gradwire secret` makes job secrets.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/security.h"
#include "gradwire/worker/launcher.h"
#include "observe_cli.h"

namespace gw::worker {
namespace {

constexpr char kUsage[] =
    R"(usage: gradwire launch [-n N] [--nnodes M --node-rank K] [--master-addr A] [--master-port P]
                       [--name-prefix S] [--kill-grace SECONDS] [--max-restarts K]
                       [--max-workers M] [--join] [--metrics-port P] PROGRAM [ARGS...]
       gradwire launch --rdzv etcd://HOST:PORT/JOB [-n N] [--nnodes M --node-rank K] ... PROGRAM [ARGS...]
       gradwire secret [--metrics-token]
       gradwire debug|top JOB ...        (gradwire debug --help)
       gradwire trace merge|render ...   (gradwire trace --help)
       gradwire --help

Commands:
  launch   start N worker processes of PROGRAM on this machine (like torchrun): the whole
           job, or with --nnodes this machine's share of a job over several machines
  secret   print a fresh job secret (64 hex digits), for a job over several machines or
           one that others join: save it to a file readable by the job's user only, copy
           it to every machine, and set GRADWIRE_SECRET_FILE=FILE for every launcher;
           with --metrics-token, print the metrics token of the job whose secret
           GRADWIRE_SECRET_FILE (or GRADWIRE_SECRET) gives: what a scraper sends as
           "Authorization: Bearer TOKEN" to endpoints bound beyond loopback
  debug    who waits on whom in a running job, naming the worker at the root
  top      a running job's workers: calls/s, MB/s, p99, queues, steps, refreshed
  trace    merge the workers' traces (GRADWIRE_TRACE=DIR) onto one clock; render as SVG

Options of launch (they end at PROGRAM; everything after it goes to PROGRAM untouched):
  -n N, --nproc-per-node N  number of workers on this machine (default 1)
  --nnodes M                machines the job spans (default 1); run one launcher on each,
                            with the same -n and --master-addr and --master-port (or --rdzv)
  --node-rank K             this machine's index in [0, M) (default 0); it starts ranks
                            K*N ... K*N+N-1, and node 0 must be the host of --master-addr
  --master-addr A           MASTER_ADDR given to the workers (default 127.0.0.1): the address
                            of node 0, where rank 0 serves the rendezvous
  --master-port P           MASTER_PORT given to the workers (default 0: pick a free port;
                            required with --nnodes > 1 unless --rdzv is given)
  --rdzv etcd://HOST:PORT/JOB
                            meet through that etcd (3.4 or later) instead of a store served
                            by rank 0: every node gives the same address, in any order, and
                            no --master-addr/--master-port; JOB names the job's keys in etcd
                            (use a new JOB for each run if a run may have crashed)
  --name-prefix S           worker names S0, S1, ... (default "worker")
  --kill-grace SECONDS      when a worker fails, the others get SIGTERM, then SIGKILL
                            after this many seconds (default 5)
  --max-restarts K          start a failed worker again under the same rank and name, up
                            to K times each (default 0: the first failure stops the job);
                            rank 0 hosts the rendezvous and is restarted only with --rdzv
  --max-workers M           the job may grow to M workers as others join it (elastic;
                            default: the workers started now)
  --join                    these workers join a job that is running (started with
                            --max-workers): give its --master-addr and --master-port (or
                            --rdzv); each gets the next free rank and the name
                            worker<rank> from the job, and leaves it when it exits
  --metrics-port P          worker k serves Prometheus metrics at http://127.0.0.1:(P+k)/metrics
                            (GRADWIRE_METRICS_HOST=ADDR binds another address; beyond
                            loopback a job with a secret asks for its metrics token)
  -h, --help                print this help

Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the node
rank), MASTER_ADDR and MASTER_PORT (with --rdzv: GRADWIRE_RDZV instead) and
GRADWIRE_WORKER_NAME (and, unless already set,
OMP_NUM_THREADS = cores / N, at least 1, as torchrun does), reads stdin from /dev/null,
and has each line of its stdout and stderr prefixed with "[worker<rank>] ". SIGINT/SIGTERM are forwarded to the workers.
Workers that use gradwire's rpc library print line by line (GRADWIRE_LINE_BUFFERED=1).
At most 1024 workers per launcher: set GRADWIRE_LAUNCH_MAX_WORKERS=N to allow N.
The job's workers authenticate each other with a secret: unless GRADWIRE_SECRET_FILE,
GRADWIRE_SECRET or GRADWIRE_AUTH is set, launch makes a fresh one for the job (in memory,
never in a file: each worker reads it from GRADWIRE_SECRET_FILE=/proc/self/fd/N); a job
over several machines, one started with --max-workers, and --join need the secret given:
  gradwire secret > job.secret && chmod 600 job.secret
  GRADWIRE_SECRET_FILE=job.secret gradwire launch -n 4 --max-workers 6 --master-port 29500 PROGRAM
  GRADWIRE_SECRET_FILE=job.secret gradwire launch --join --master-port 29500 PROGRAM
Exit status: 0 if every worker exited 0, else the first failing worker's status
(128+N if it was killed by signal N); 2 for bad usage; 127 if PROGRAM is not found.
)";

constexpr int kUsageError = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "%s\n\n%s", message.c_str(), kUsage);
  return kUsageError;
}

// Splits "--name=value" into name and value; `has_value` tells whether '=' was present.
void SplitOption(const std::string& arg, std::string* name, std::string* value, bool* has_value) {
  const size_t eq = arg.find('=');
  *has_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
  *name = *has_value ? arg.substr(0, eq) : arg;
  *value = *has_value ? arg.substr(eq + 1) : "";
}

int RunLaunch(const std::vector<std::string>& args) {
  constexpr char kWho[] = "gradwire launch: ";
  LaunchOptions options;
  bool master_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") break;  // PROGRAM
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::string name, value;
    bool has_value;
    SplitOption(arg, &name, &value, &has_value);
    if (!has_value && name.size() > 2 && name.rfind("-n", 0) == 0 && name[2] != '-') {
      value = name.substr(2);  // -n4
      name = "-n";
      has_value = true;
    }
    const bool known = name == "-n" || name == "--nproc-per-node" || name == "--nnodes" || name == "--node-rank" ||
                       name == "--master-addr" || name == "--master-port" || name == "--rdzv" ||
                       name == "--name-prefix" || name == "--kill-grace" || name == "--max-restarts" ||
                       name == "--max-workers" || name == "--metrics-port";
    if (name == "--join") {  // a flag
      options.join = true;
      continue;
    }
    if (!known) return UsageError(absl::StrCat(kWho, "unknown option '", arg, "'"));
    if (!has_value) {
      if (i + 1 >= args.size()) return UsageError(absl::StrCat(kWho, name, " needs a value"));
      value = args[++i];
    }
    if (name == "-n" || name == "--nproc-per-node") {
      if (!absl::SimpleAtoi(value, &options.num_workers) || options.num_workers < 1) {
        return UsageError(
            absl::StrCat(kWho, name, " expects a positive number of workers, got '", value, "'"));
      }
    } else if (name == "--nnodes") {
      if (!absl::SimpleAtoi(value, &options.nnodes) || options.nnodes < 1) {
        return UsageError(absl::StrCat(kWho, "--nnodes expects a positive number of machines, got '", value, "'"));
      }
    } else if (name == "--node-rank") {
      if (!absl::SimpleAtoi(value, &options.node_rank) || options.node_rank < 0) {
        return UsageError(absl::StrCat(kWho, "--node-rank expects this machine's index (0, 1, ...), got '", value, "'"));
      }
    } else if (name == "--master-addr") {
      if (value.empty()) return UsageError(absl::StrCat(kWho, "--master-addr is empty"));
      options.master_addr = value;
      master_given = true;
    } else if (name == "--master-port") {
      if (!absl::SimpleAtoi(value, &options.master_port) || options.master_port < 0 ||
          options.master_port > 65535) {
        return UsageError(absl::StrCat(kWho, "--master-port expects a port in [0, 65535] ",
                                       "(0 picks a free one), got '", value, "'"));
      }
      master_given = true;
    } else if (name == "--rdzv") {
      if (value.empty()) return UsageError(absl::StrCat(kWho, "--rdzv is empty; give etcd://HOST:PORT/JOB"));
      options.rdzv = value;  // Launch() checks its form
    } else if (name == "--max-restarts") {
      if (!absl::SimpleAtoi(value, &options.max_restarts) || options.max_restarts < 0) {
        return UsageError(absl::StrCat(kWho, "--max-restarts expects a number of restarts (0, 1, ...), got '", value, "'"));
      }
    } else if (name == "--max-workers") {
      if (!absl::SimpleAtoi(value, &options.max_workers) || options.max_workers < 1) {
        return UsageError(absl::StrCat(kWho, "--max-workers expects a number of workers, got '", value, "'"));
      }
    } else if (name == "--metrics-port") {
      if (!absl::SimpleAtoi(value, &options.metrics_port) || options.metrics_port < 1 || options.metrics_port > 65535) {
        return UsageError(absl::StrCat(
            kWho, "--metrics-port expects a port in [1, 65535] (worker k takes P + k), got '", value, "'"));
      }
    } else if (name == "--name-prefix") {
      options.name_prefix = value;
    } else {  // --kill-grace
      double seconds;
      if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0) || seconds > 86400) {
        return UsageError(
            absl::StrCat(kWho, "--kill-grace expects seconds in [0, 86400], got '", value, "'"));
      }
      options.kill_grace = absl::Seconds(seconds);
    }
  }
  if (i >= args.size()) return UsageError(absl::StrCat(kWho, "missing PROGRAM to launch"));
  options.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());

  if (options.node_rank >= options.nnodes) {
    return UsageError(absl::StrCat(kWho, "--node-rank ", options.node_rank, " is not below --nnodes ", options.nnodes,
                                   " (nodes are numbered 0 to ", options.nnodes - 1, ")"));
  }
  if (!options.rdzv.empty() && master_given) {
    return UsageError(absl::StrCat(kWho, "--rdzv replaces --master-addr and --master-port (the workers meet through "
                                   "etcd, not through rank 0): give one or the other"));
  }
  if (options.nnodes > 1 && options.master_port == 0 && options.rdzv.empty()) {
    return UsageError(absl::StrCat(kWho, "--nnodes ", options.nnodes,
                                   " needs --master-port: give every node's launcher the same port, e.g. 29500 "
                                   "(or the same --rdzv etcd://HOST:PORT/JOB)"));
  }
  if (options.join && options.master_port == 0 && options.rdzv.empty()) {
    return UsageError(absl::StrCat(kWho, "--join needs the running job's rendezvous: --master-addr and --master-port "
                                   "(or --rdzv etcd://HOST:PORT/JOB)"));
  }
  if (options.max_workers > 0 && options.max_workers < options.nnodes * options.num_workers) {
    return UsageError(absl::StrCat(kWho, "--max-workers ", options.max_workers, " is below the ",
                                   options.nnodes * options.num_workers, " workers the job starts with"));
  }
  if (absl::Status s = CheckLaunchOptions(options); !s.ok()) {
    std::fprintf(stderr, "%s%s\n", kWho, std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? kUsageError : 1;
  }
  if (options.master_port == 0 && options.rdzv.empty()) {
    absl::StatusOr<int> port = PickFreePort(options.master_addr);
    if (!port.ok()) {
      std::fprintf(stderr, "%s%s\n", kWho, std::string(port.status().message()).c_str());
      return 1;
    }
    options.master_port = *port;
  }
  const std::string rendezvous =
      options.rdzv.empty() ? absl::StrCat("MASTER_ADDR=", options.master_addr, ", MASTER_PORT=", options.master_port)
                           : absl::StrCat("GRADWIRE_RDZV=", options.rdzv);
  if (options.nnodes > 1) {
    std::fprintf(stderr, "%snode %d of %d: starting ranks %d-%d of %d (%s)\n", kWho, options.node_rank,
                 options.nnodes, options.node_rank * options.num_workers,
                 (options.node_rank + 1) * options.num_workers - 1, options.nnodes * options.num_workers,
                 rendezvous.c_str());
  } else {
    std::fprintf(stderr, "%sstarting %d worker%s (%s)\n", kWho, options.num_workers,
                 options.num_workers == 1 ? "" : "s", rendezvous.c_str());
  }
  std::fflush(stderr);

  absl::StatusOr<LaunchResult> result = Launch(options, stdout, stderr);
  if (!result.ok()) {
    std::fprintf(stderr, "%s%s\n", kWho, std::string(result.status().message()).c_str());
    switch (result.status().code()) {
      case absl::StatusCode::kNotFound:
        return 127;  // as shells do for a missing command
      case absl::StatusCode::kPermissionDenied:
        return 126;  // as shells do for a command that cannot be executed
      case absl::StatusCode::kInvalidArgument:
        return kUsageError;
      default:
        return 1;
    }
  }
  if (result->exit_code != 0) {
    if (!result->failed_worker.empty()) {
      std::fprintf(stderr, "%s%s %s%s\n", kWho, result->failed_worker.c_str(),
                   result->reason.c_str(),
                   options.num_workers > 1 ? "; stopped the other workers" : "");
    } else {
      std::fprintf(stderr, "%s%s\n", kWho, result->reason.c_str());
    }
  }
  return result->exit_code;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return UsageError("gradwire: missing command");
  const std::string& command = args[0];
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "launch") return RunLaunch(std::vector<std::string>(args.begin() + 1, args.end()));
  if (command == "debug" || command == "top" || command == "trace") {
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (!rest.empty() && (rest[0] == "-h" || rest[0] == "--help")) {
      std::fputs(kObserveUsage, stdout);
      return 0;
    }
    if (command == "debug") return RunDebug(rest);
    if (command == "top") return RunTop(rest);
    return RunTrace(rest);
  }
  if (command == "secret") {
    if (args.size() == 2 && args[1] == "--metrics-token") {
      absl::StatusOr<rpc::Security> security = rpc::Security::FromEnv();
      if (!security.ok() || security->secret.empty()) {
        std::fprintf(stderr, "gradwire secret --metrics-token: %s\n",
                     security.ok() ? "no job secret: set GRADWIRE_SECRET_FILE=FILE, the job's secret file"
                                   : std::string(security.status().message()).c_str());
        return 1;
      }
      std::printf("%s\n", rpc::MetricsToken(security->secret).c_str());
      return 0;
    }
    if (args.size() > 1) return UsageError(absl::StrCat("gradwire secret: unknown option '", args[1], "'"));
    std::printf("%s\n", rpc::MakeJobSecret().c_str());
    return 0;
  }
  return UsageError(absl::StrCat("gradwire: unknown command '", command, "'"));
}

}  // namespace
}  // namespace gw::worker

int main(int argc, char** argv) { return gw::worker::Main(argc, argv); }
