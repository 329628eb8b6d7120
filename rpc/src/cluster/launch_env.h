// Internal: LaunchEnv, a worker's place in its job as the program that started it tells
// it through the environment (AgentOptions::FromEnv).
//
// Contract
//   - ReadLaunchEnv(env) reads, in this order, the first launcher whose variables are set:
//       torchrun / `gradwire launch`: RANK and WORLD_SIZE;
//       SLURM (srun):   SLURM_PROCID and SLURM_NTASKS; MASTER_ADDR defaults to the first
//                       host of SLURM_NODELIST (or SLURM_JOB_NODELIST), expanded from
//                       SLURM's compressed form ("gpu[03-08,11],login1" -> "gpu03"), and
//                       MASTER_PORT to 29500 + SLURM_JOB_ID % 10000, so that every task of
//                       one job agrees on it without a shared file;
//       Open MPI (mpirun): OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE;
//       MPICH / Intel MPI (Hydra): PMI_RANK and PMI_SIZE;
//       a Kubernetes Indexed Job: JOB_COMPLETION_INDEX, with WORLD_SIZE, MASTER_ADDR (pod
//       0's name through the Job's headless service) and MASTER_PORT set in the manifest.
//     MASTER_ADDR and MASTER_PORT, when set, always win. Under an MPI launcher MASTER_ADDR
//     must be set (MPI says nothing about rank 0's host); MASTER_PORT defaults to 29500.
//     `source` names the launcher found ("RANK", "SLURM", "Open MPI", "PMI",
//     "Kubernetes"). A launcher is found by its rank variable.
//   - INVALID_ARGUMENT, naming the variables, when none is set, a number is malformed, the
//     rank is outside [0, world_size), or no master address can be found; the message says
//     what to set.
//   - FirstSlurmHost(nodelist) is the first host of a SLURM host list.
//   - Pure functions of `env` (a lookup returning "" for unset variables): no state.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_LAUNCH_ENV_H_
#define GRADWIRE_RPC_SRC_CLUSTER_LAUNCH_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace gw::rpc::internal {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string source;
};

using EnvLookup = std::function<std::string(const char* name)>;

// need_master = false: the job meets elsewhere (GRADWIRE_RDZV), MASTER_ADDR and
// MASTER_PORT are neither needed nor defaulted.
absl::StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& env, bool need_master = true);
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_LAUNCH_ENV_H_
