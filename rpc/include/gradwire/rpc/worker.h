// The records and options every unit of rpc/ shares: who the workers are (WorkerInfo,
// MemberChange), how an agent is set up (AgentOptions), how a call is made and seen
// (CallOptions, CallInfo), and how a handler is registered (RawHandler, HandlerMode,
// RegisterOptions). The Agent that uses them is agent.h; the failure model the calls
// follow is worded in errors.h.
//
// Contract
//   - Plain values, copyable; the defaults are those of a local job. AgentOptions::FromEnv
//     (agent.cc) reads them from a launcher's environment, described at its declaration.
#ifndef GRADWIRE_RPC_WORKER_H_
#define GRADWIRE_RPC_WORKER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/device_map.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/transport.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc {

struct WorkerInfo {
  std::string name;
  int rank = 0;
  std::string address;  // transport address
  int64_t pid = 0;
  int gpus = 0;  // the GPUs its process sees (device maps toward it are checked against them)
};

struct AgentOptions {
  std::string name;  // empty: "worker<rank>"
  int rank = 0;      // ignored with `join`
  int world_size = 1;
  // The ranks the group may grow to as workers join (0: world_size, a fixed group). Every
  // worker of Start's group needs the same value.
  int max_world_size = 0;
  // Join a running group (agent.h, elastic groups) instead of forming one: rank,
  // world_size and max_world_size come from the group.
  bool join = false;
  // The store's address: host:port, or etcd://HOST:PORT/JOB for an etcd cluster (store.h).
  std::string rendezvous = "127.0.0.1:29500";
  bool host_store = true;           // rank 0 hosts the store at `rendezvous` (never for etcd)
  std::string run_id = "gradwire";  // namespace of this group's keys in the store
  // "shm" (default): tcp, plus cross-memory attach for large tensors between processes
  // on the same host, negotiated per connection; "tcp"; or "grpc".
  std::string transport = "shm";
  // The address the transport binds: one of this host's, or a wildcard (0.0.0.0, ::).
  std::string listen_host = "127.0.0.1";
  // The host peers dial, announced in the store. Empty: listen_host, or when that is a
  // wildcard, the address of the interface that reaches the rendezvous host.
  std::string advertise_host;
  absl::Duration start_timeout = absl::Seconds(60);
  absl::Duration default_timeout = absl::Seconds(60);
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Failure detection (the failure model above): a peer this worker has a connection to
  // and has heard nothing from for heartbeat_interval is sent a heartbeat, which its I/O
  // thread answers at once (however long its handlers compute); a peer silent for
  // peer_timeout is declared dead (frozen, its host gone, or cut off), so it is reported
  // within peer_timeout + heartbeat_interval (3 s by default) of the last frame it sent.
  // Traffic counts as hearing: a busy connection is never pinged. A zero interval turns
  // heartbeats off (then only a closed connection declares a peer dead); otherwise Start
  // refuses a peer_timeout below twice the interval (INVALID_ARGUMENT). A single frame
  // that takes longer than peer_timeout to arrive (gigabytes over a slow link) looks like
  // silence: raise peer_timeout for such links.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Milliseconds(2500);
  // How long Sync() polls for the reply before sleeping (0: never polls).
  absl::Duration sync_spin = absl::Microseconds(200);
  int worker_threads = 2;
  // Who may talk to this worker (security.h): the job's secret (on by default: a group of
  // more than one worker needs one), TLS, and limits per peer. Start takes what is not set
  // here from the environment (GRADWIRE_SECRET_FILE / GRADWIRE_SECRET, as `gradwire
  // launch` sets them; GRADWIRE_TLS_*; Security::FromEnv), and hands it to the transport
  // and the rendezvous store (transport_options.security is overwritten).
  Security security;
  TransportOptions transport_options;
  // At graceful shutdown, owned RRef values still referenced by other workers are
  // logged (kWarn) or also make Shutdown fail with FAILED_PRECONDITION (kError).
  enum class LeakCheck { kOff, kWarn, kError };
  LeakCheck rref_leak_check = LeakCheck::kWarn;
  // On which of a peer's devices this worker's GPU tensors arrive (device_map.h; empty: on
  // its CPU). Every map's from() is this worker's name. Start checks the maps against the
  // GPUs of this process, before announcing it, and of each peer, once the group has
  // formed (INVALID_ARGUMENT naming the pair and the device; a map toward a worker that is
  // not in a fixed group is one too).
  DeviceMaps device_maps;

  // Observability (README, "Watching a job").
  // Serve this worker's metrics (metrics_endpoint.h) at metrics_host:metrics_port; 0: a
  // port the OS picks, -1: none. GRADWIRE_METRICS_PORT (or GRADWIRE_METRICS_PORT_BASE plus
  // the rank) and GRADWIRE_METRICS_HOST override these.
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  // Write this worker's trace into this directory (trace.h); empty: no trace.
  // GRADWIRE_TRACE overrides it.
  std::string trace_dir;
  // When something this worker waits for (waits.h) has waited this long, it logs who
  // waits on whom in the job, once per wait; zero: never. GRADWIRE_STALL_REPORT (seconds)
  // overrides it.
  absl::Duration stall_report_after = absl::Seconds(60);

  // From the environment, as set by `gradwire launch` or torchrun: RANK, WORLD_SIZE,
  // MASTER_ADDR, MASTER_PORT (required unless GRADWIRE_RDZV is set); or by srun
  // (SLURM_PROCID, SLURM_NTASKS, rank 0's host from SLURM_NODELIST, MASTER_PORT 29500 +
  // SLURM_JOB_ID % 10000 unless set), by mpirun (OMPI_COMM_WORLD_RANK/SIZE, or
  // PMI_RANK/SIZE; MASTER_ADDR required, MASTER_PORT 29500 unless set), or a Kubernetes
  // Indexed Job (JOB_COMPLETION_INDEX; WORLD_SIZE and MASTER_ADDR from the manifest);
  //   GRADWIRE_RDZV       etcd://HOST:PORT/JOB: meet through that etcd (rendezvous; host_store
  //                       false; MASTER_ADDR and MASTER_PORT are then ignored, and the etcd
  //                       host takes MASTER_ADDR's part in choosing addresses below);
  // GRADWIRE_WORKER_NAME, GRADWIRE_TRANSPORT, GRADWIRE_RUN_ID (optional);
  // GRADWIRE_MAX_WORLD_SIZE (max_world_size), GRADWIRE_JOIN=1 (join; RANK is then not
  // needed, WORLD_SIZE still is, as the launcher sets it);
  // the security settings (security: Security::FromEnv, the secret, TLS files, limits);
  // GRADWIRE_DEVICE_MAPS (optional: device_maps in DeviceMaps::Parse's form,
  // "worker1=cuda:0->cuda:0;worker2=cuda:0->cuda:1", read as the maps of this worker's name);
  // GRADWIRE_HEARTBEAT_INTERVAL and GRADWIRE_PEER_TIMEOUT (optional durations such as
  // "500ms", "3s": heartbeat_interval, peer_timeout); GRADWIRE_FAULTS (optional: faults to inject, as
  // ParseFaults reads them, into transport_options.faults; every worker needs it; the
  // agent names itself to its transport, TransportOptions::self_name). Addresses (as
  // torchrun and NCCL let users pick an interface):
  //   GRADWIRE_LISTEN     listen_host (an address of this host, or 0.0.0.0 / ::);
  //   GRADWIRE_ADVERTISE  advertise_host (when only it is set, the agent listens on the
  //                       wildcard address of its family: the advertised address may be
  //                       one this host does not own, e.g. behind NAT).
  // Neither set: when MASTER_ADDR is loopback (127.x, localhost, ::1) the agent listens
  // on and advertises 127.0.0.1, as a local job always did; otherwise both are the
  // address of this host's interface that routes to MASTER_ADDR (found without sending
  // anything). INVALID_ARGUMENT when a variable is missing or malformed, or when
  // MASTER_ADDR (GRADWIRE_RDZV's host) cannot be resolved or reached (the message says
  // which variable to set).
  static absl::StatusOr<AgentOptions> FromEnv();
};

struct CallOptions {
  absl::Duration timeout = absl::ZeroDuration();  // zero: the agent's default_timeout
};

// A change of the group's members (Agent::WatchMembers).
struct MemberChange {
  enum class Kind { kJoined, kLeft };
  Kind kind = Kind::kJoined;
  WorkerInfo worker;
};

// Who is calling a handler.
struct CallInfo {
  std::string caller;  // worker name, or "unknown" before its hello arrived
  std::string function;
  int caller_rank = -1;
};

using RawHandler = std::function<Future<Value>(const CallInfo&, ValueList)>;

// Where a handler runs.
enum class HandlerMode {
  // On the agent's worker pool (default): handlers may block or take long.
  kPool,
  // On the transport I/O thread that received the request, with no thread hop: for
  // handlers that are quick and never block (lookups, small arithmetic, parameter pulls).
  // A blocking inline handler stalls every connection of this worker.
  kInline,
};

struct RegisterOptions {
  HandlerMode mode = HandlerMode::kPool;
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_WORKER_H_
