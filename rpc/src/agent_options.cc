// AgentOptions::FromEnv (worker.h): a worker's options from the variables its launcher
// set (cluster/launch_env.h), the rendezvous (GRADWIRE_RDZV, an etcd cluster, or
// MASTER_ADDR's store) and the addresses to listen on and announce; ResolveOptions
// (agent_options.h); and stdout's line buffering under `gradwire launch`.
#include "agent_options.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/launch_env.h"
#include "gradwire/rpc/faults.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/worker.h"
#include "store/etcd_store.h"
#include "transport/host_address.h"

namespace gw::rpc {
namespace {

// `gradwire launch` relays its workers' output line by line, but their stdout is a pipe,
// which stdio buffers in blocks: a worker printing progress would show nothing until it
// exits. The launcher sets GRADWIRE_LINE_BUFFERED=1 and every program that uses an agent
// makes stdout line-buffered before main() runs, before anything is written to it
// (std::cout writes through stdio: synced by default). This file is linked into every
// such program, from a static library too: Agent::Start calls ResolveOptions, and a
// program may read its options (FromEnv) before it starts an agent, or without one.
[[maybe_unused]] const bool kStdoutLineBuffered = [] {
  const char* v = std::getenv("GRADWIRE_LINE_BUFFERED");
  if (v != nullptr && std::string_view(v) == "1") std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return true;
}();

std::string Env(const char* name) {  // "" when unset
  const char* v = std::getenv(name);
  return v ? v : "";
}

// FromEnv's addresses: GRADWIRE_LISTEN / GRADWIRE_ADVERTISE, else loopback for a local
// job, else the address of the interface that reaches the rendezvous host (MASTER_ADDR,
// or GRADWIRE_RDZV's etcd host), which `variable` names.
absl::Status ChooseAddresses(const char* variable, const std::string& rendezvous_host, AgentOptions* o) {
  const std::string listen = Env("GRADWIRE_LISTEN"), advertise = Env("GRADWIRE_ADVERTISE");
  if (!listen.empty() || !advertise.empty()) {
    o->advertise_host = advertise;
    o->listen_host = !listen.empty() ? listen : advertise.find(':') != std::string::npos ? "::" : "0.0.0.0";
    return absl::OkStatus();
  }
  if (internal::IsLoopbackHost(rendezvous_host)) return absl::OkStatus();  // 127.0.0.1, as local jobs always did
  absl::StatusOr<std::string> local = internal::LocalAddressToward(rendezvous_host);
  if (!local.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AgentOptions::FromEnv: cannot tell which address of this host the other workers reach, from ",
                     variable, "=", Env(variable), ": ", local.status().message(), "; check ", variable,
                     ", or set GRADWIRE_LISTEN (the address to bind, e.g. 0.0.0.0) and "
                     "GRADWIRE_ADVERTISE (the address the other workers dial)"));
  }
  // A rendezvous host that names this host through loopback (e.g. its name in /etc/hosts).
  o->listen_host = internal::IsLoopbackHost(*local) ? "127.0.0.1" : *local;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentOptions> AgentOptions::FromEnv() {
  AgentOptions o;
  const std::string rdzv = Env("GRADWIRE_RDZV");
  o.join = Env("GRADWIRE_JOIN") == "1";
  // A worker that joins gets its rank from the group: RANK is not needed.
  auto env = [&o](const char* name) {
    return o.join && std::string(name) == "RANK" && Env(name).empty() ? "0" : Env(name);
  };
  absl::StatusOr<internal::LaunchEnv> launch = internal::ReadLaunchEnv(env, /*need_master=*/rdzv.empty());
  if (!launch.ok()) return launch.status();
  o.rank = launch->rank;
  o.world_size = launch->world_size;
  if (std::string m = Env("GRADWIRE_MAX_WORLD_SIZE"); !m.empty()) {
    if (!absl::SimpleAtoi(m, &o.max_world_size) || o.max_world_size < o.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: bad GRADWIRE_MAX_WORLD_SIZE=", m,
                                                     " (a number of workers, at least WORLD_SIZE=", o.world_size, ")"));
    }
  }
  if (!rdzv.empty()) {  // etcd: nobody hosts the store
    absl::StatusOr<internal::EtcdUrl> url = internal::ParseEtcdUrl(rdzv);
    if (!url.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: GRADWIRE_RDZV: ", url.status().message()));
    }
    o.rendezvous = rdzv;
    o.host_store = false;
    if (absl::Status s = ChooseAddresses("GRADWIRE_RDZV", url->host, &o); !s.ok()) return s;
  } else {
    o.rendezvous = internal::JoinHostPort(launch->master_addr, launch->master_port);
    if (absl::Status s = ChooseAddresses("MASTER_ADDR", launch->master_addr, &o); !s.ok()) return s;
  }
  o.name = Env("GRADWIRE_WORKER_NAME");
  if (std::string t = Env("GRADWIRE_TRANSPORT"); !t.empty()) o.transport = t;
  if (std::string r = Env("GRADWIRE_RUN_ID"); !r.empty()) o.run_id = r;
  for (auto [name, field] : {std::pair{"GRADWIRE_HEARTBEAT_INTERVAL", &o.heartbeat_interval},
                             std::pair{"GRADWIRE_PEER_TIMEOUT", &o.peer_timeout}}) {
    const std::string v = Env(name);
    if (v.empty()) continue;
    if (!absl::ParseDuration(v, field) || *field < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AgentOptions::FromEnv: bad ", name, "=", v, " (a duration such as 500ms or 3s)"));
    }
  }
  if (std::string m = Env("GRADWIRE_DEVICE_MAPS"); !m.empty()) {
    if (o.name.empty() && o.join) {
      return absl::InvalidArgumentError(
          "AgentOptions::FromEnv: GRADWIRE_DEVICE_MAPS needs GRADWIRE_WORKER_NAME on a joining worker (its rank, and "
          "so its default name, comes from the group)");
    }
    absl::StatusOr<DeviceMaps> maps = DeviceMaps::Parse(o.name.empty() ? absl::StrCat("worker", o.rank) : o.name, m);
    if (!maps.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AgentOptions::FromEnv: GRADWIRE_DEVICE_MAPS=", m, ": ", maps.status().message()));
    }
    o.device_maps = *std::move(maps);
  }
  absl::StatusOr<Security> security = Security::FromEnv();
  if (!security.ok())
    return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: ", security.status().message()));
  o.security = *std::move(security);
  if (std::string f = Env("GRADWIRE_FAULTS"); !f.empty()) {
    absl::StatusOr<FaultSpec> faults = ParseFaults(f);
    if (!faults.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AgentOptions::FromEnv: GRADWIRE_FAULTS=", f, ": ", faults.status().message()));
    }
    o.transport_options.faults = std::make_shared<FaultInjector>(*std::move(faults));
  }
  return o;
}

absl::Status internal::ResolveOptions(AgentOptions& options) {
  if (options.join) options.rank = -1;  // the group gives it one
  if (options.max_world_size == 0) options.max_world_size = options.world_size;
  if (options.world_size < 1 || options.max_world_size < options.world_size ||
      options.max_world_size > GlobalId::kMaxRanks ||
      (!options.join && (options.rank < 0 || options.rank >= options.world_size))) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " is not in [0, ", options.world_size,
                                                   "), or max_world_size ", options.max_world_size,
                                                   " is below world_size or above ", GlobalId::kMaxRanks));
  }
  if (options.heartbeat_interval > absl::ZeroDuration() && options.peer_timeout < 2 * options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.name, ": AgentOptions::peer_timeout (", absl::FormatDuration(options.peer_timeout),
                     ") must be at least twice heartbeat_interval (", absl::FormatDuration(options.heartbeat_interval),
                     "), or a silent peer is declared dead before it could answer a ping; to turn heartbeats off set "
                     "heartbeat_interval (GRADWIRE_HEARTBEAT_INTERVAL) to 0"));
  }
  // The secret and TLS files not given in the options come from the environment; a
  // group that may have more than one worker needs a secret unless authentication is off.
  Security& sec = options.security;
  if (sec.secret.empty() || !sec.tls.enabled()) {
    absl::StatusOr<Security> env = Security::FromEnv();
    if (!env.ok()) return env.status();
    if (sec.secret.empty()) sec.secret = env->secret;
    if (!sec.tls.enabled()) sec.tls = env->tls;
    if (!env->authenticate) sec.authenticate = false;
  }
  if (absl::Status s = sec.Validate(); !s.ok()) return s;
  if (std::string dir = Env("GRADWIRE_TRACE"); !dir.empty()) options.trace_dir = std::move(dir);
  if (std::string after = Env("GRADWIRE_STALL_REPORT"); !after.empty()) {
    double seconds = 0;
    if (!absl::SimpleAtod(after, &seconds) || seconds < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GRADWIRE_STALL_REPORT=", after,
                       " is not a number of seconds: give how long something may wait before "
                       "the worker reports who waits on whom (0: never)"));
    }
    options.stall_report_after = absl::Seconds(seconds);
  }
  const bool alone = options.max_world_size <= 1 && !options.join;
  if (sec.authenticate && sec.secret.empty() && !alone) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.name.empty() ? absl::StrCat("rank ", options.rank) : options.name,
        ": this job has no secret, and its workers authenticate each other by one: start it with `gradwire "
        "launch` (which makes one), or give every worker the same secret (GRADWIRE_SECRET_FILE=PATH, "
        "GRADWIRE_SECRET=..., or AgentOptions::security.secret); only on a network where every process is "
        "trusted, turn authentication off with GRADWIRE_AUTH=off (Security::authenticate = false)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<MetricsEndpointOptions>> internal::MetricsFromEnv(const AgentOptions& options) {
  // GRADWIRE_METRICS_PORT: this worker's port (0: any free one); _BASE: plus the rank.
  auto port_of = [&](const char* variable, bool base) -> absl::StatusOr<int> {
    const std::string v = Env(variable);
    const int offset = base ? options.rank : 0;
    int port = 0;
    if (!absl::SimpleAtoi(v, &port) || port < (base ? 1 : 0) || port + offset > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(options.name, ": ", variable, "=", v,
                                                     base ? absl::StrCat(" plus rank ", offset) : "",
                                                     " is not a TCP port: give a number in 1-65535",
                                                     base ? " (the workers take base + rank)" : " (0: any free port)"));
    }
    return port + offset;
  };
  MetricsEndpointOptions m;
  if (!Env("GRADWIRE_METRICS_PORT").empty()) {
    absl::StatusOr<int> port = port_of("GRADWIRE_METRICS_PORT", false);
    if (!port.ok()) return port.status();
    m.port = *port;
  } else if (!Env("GRADWIRE_METRICS_PORT_BASE").empty()) {
    absl::StatusOr<int> port = port_of("GRADWIRE_METRICS_PORT_BASE", true);
    if (!port.ok()) return port.status();
    m.port = *port;
  } else if (options.metrics_port >= 0) {
    if (options.metrics_port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.name, ": AgentOptions::metrics_port ", options.metrics_port,
                       " is not a TCP port: give a number in 0-65535 (0: any free port)"));
    }
    m.port = options.metrics_port;
  } else {
    return std::nullopt;
  }
  m.host = options.metrics_host.empty() ? "127.0.0.1" : options.metrics_host;
  if (std::string host = Env("GRADWIRE_METRICS_HOST"); !host.empty()) m.host = std::move(host);
  if (!internal::IsLoopbackHost(m.host) && options.security.authenticates()) {
    m.bearer_token = MetricsToken(options.security.secret);
  }
  m.owner = options.name;
  m.rank = options.rank;
  return m;
}

}  // namespace gw::rpc
