#include "cluster/launch_env.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {
namespace {

constexpr int kDefaultMasterPort = 29500;

struct Launcher {
  const char* source;
  const char* rank;
  const char* size;
};

constexpr Launcher kLaunchers[] = {
    {"RANK", "RANK", "WORLD_SIZE"},
    {"SLURM", "SLURM_PROCID", "SLURM_NTASKS"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE"},
    // A Kubernetes Indexed Job gives each pod its index; WORLD_SIZE comes from the manifest.
    {"Kubernetes", "JOB_COMPLETION_INDEX", "WORLD_SIZE"},
};

}  // namespace

absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist) {
  // A list of items separated by top-level commas; an item is text with bracketed
  // groups of numbers and ranges ("rack[1-2]-n[001-004,009]"). The first host takes the
  // first number of every group, keeping its zero padding.
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("SLURM host list '", nodelist, "' has an unclosed '['"));
    }
    size_t j = i + 1;
    while (j < close && nodelist[j] >= '0' && nodelist[j] <= '9') host += nodelist[j++];
    if (j == i + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM host list '", nodelist, "': '[' is not followed by a number"));
    }
    i = close + 1;
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("SLURM host list '", nodelist, "' names no host"));
  return host;
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& env, bool need_master) {
  const Launcher* found = nullptr;
  for (const Launcher& l : kLaunchers) {
    if (!env(l.rank).empty()) {
      found = &l;
      break;
    }
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        "AgentOptions::FromEnv: this process was not started by a launcher it knows: set RANK, WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT (run the program under `gradwire launch -n N ...` or torchrun), or run it "
        "under srun (SLURM_PROCID, SLURM_NTASKS) or mpirun (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE)");
  }
  LaunchEnv out;
  out.source = found->source;
  const std::string rank = env(found->rank), size = env(found->size);
  if (!absl::SimpleAtoi(rank, &out.rank) || !absl::SimpleAtoi(size, &out.world_size) || out.world_size < 1 ||
      out.rank < 0 || out.rank >= out.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: bad ", found->rank, "=", rank, " / ",
                                                   found->size, "=", size,
                                                   " (a rank in [0, size) and a positive size)"));
  }
  if (!need_master) return out;
  out.master_addr = env("MASTER_ADDR");
  const std::string port = env("MASTER_PORT");
  const bool slurm = out.source == std::string("SLURM");
  if (out.master_addr.empty() && slurm) {
    std::string nodelist = env("SLURM_NODELIST");
    if (nodelist.empty()) nodelist = env("SLURM_JOB_NODELIST");
    if (!nodelist.empty()) {
      absl::StatusOr<std::string> first = FirstSlurmHost(nodelist);
      if (!first.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("AgentOptions::FromEnv: ", first.status().message(), "; set MASTER_ADDR to rank 0's host"));
      }
      out.master_addr = *first;
    }
  }
  if (out.master_addr.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AgentOptions::FromEnv: MASTER_ADDR is not set: set it to an address of rank 0's host that every worker "
        "reaches (started by ",
        out.source,
        ", which does not say where rank 0 runs), or let the workers meet "
        "through etcd with GRADWIRE_RDZV=etcd://HOST:PORT/JOB"));
  }
  if (!port.empty()) {
    if (!absl::SimpleAtoi(port, &out.master_port) || out.master_port < 0 || out.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: bad MASTER_PORT=", port));
    }
  } else if (out.source == std::string("RANK")) {
    return absl::InvalidArgumentError(
        "AgentOptions::FromEnv: RANK, WORLD_SIZE and either MASTER_ADDR and MASTER_PORT or GRADWIRE_RDZV "
        "(etcd://HOST:PORT/JOB) must be set (run the program under `gradwire launch -n N ...` or torchrun)");
  } else {
    out.master_port = kDefaultMasterPort;
    int64_t job = 0;
    if (slurm && absl::SimpleAtoi(env("SLURM_JOB_ID"), &job) && job >= 0) {
      out.master_port = kDefaultMasterPort + static_cast<int>(job % 10000);
    }
  }
  return out;
}

}  // namespace gw::rpc::internal
