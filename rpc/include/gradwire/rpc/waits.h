// Waits: what a worker waits for, and what its threads run, now: the records `gradwire
// debug` gathers from every worker to say who waits on whom, and that a worker logs by
// itself when something has waited longer than AgentOptions::stall_report_after.
//
// Contract
//   - Each layer adds a source to Agent::waits() (sources.h) that reads its own state
//     when asked, so keeping the record costs nothing on any call: the agent's calls in
//     flight and its handler threads, collectives with their sequence numbers and who
//     issued them, distributed-autograd passes and the gradients they wait for,
//     parameter-server steps and the trainers they wait for. A source lists at most its
//     16 oldest of each kind (the record is bounded).
//   - A Wait says what `state` a worker is in: "waits" for `what` on the ranks `on`
//     (`ready`: those that have done their part, such as a collective's contributors),
//     "runs" `what` on a thread (on: none), or "last": the last `what` it completed, for
//     context ("allreduce #811 of group 'ddp'"). `seconds`: how long it has waited or
//     run, or since the last completed (-1: no time to tell, as for "none yet").
//   - Records travel (message.h): the agent answers the reserved function "__observe.waits"
//     (WaitsQuery) and its metrics endpoint serves them as JSON at /waits (WaitsToJson).
//   - WhoWaitsOnWhom(workers) turns the records of a job into the report: the chains of
//     waits, longest first, each ending at the worker at its root and what that worker
//     runs or last did; a worker that did not answer is named as such. Deterministic:
//     the same records give the same text.
#ifndef GRADWIRE_RPC_WAITS_H_
#define GRADWIRE_RPC_WAITS_H_

#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/sources.h"

namespace gw::rpc {

struct Wait {
  std::string layer = {};  // "rpc", "handler", "collectives", "dist_autograd", "param_server", ...
  std::string state = {};  // "waits", "runs" or "last"
  std::string what = {};
  std::vector<int> on = {};
  std::vector<int> ready = {};
  double seconds = 0;
  std::string note = {};

  static constexpr auto Fields() {
    return std::make_tuple(Field("layer", &Wait::layer), Field("state", &Wait::state), Field("what", &Wait::what),
                           Field("on", &Wait::on), Field("ready", &Wait::ready), Field("seconds", &Wait::seconds),
                           Field("note", &Wait::note));
  }
};

class Waits : public Sources<Wait> {};

// Another worker's records: agent.Send(worker, WaitsQuery{}) is a Future of them.
struct WaitsQuery {
  static constexpr char kFunction[] = "__observe.waits";
  using Reply = std::vector<Wait>;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// One worker's records as gathered by `gradwire debug` or a worker's own report.
struct WorkerWaits {
  std::string worker = {};
  int rank = -1;
  bool answered = false;
  std::string error = {};  // why it did not answer
  std::vector<Wait> waits = {};
};

std::string WhoWaitsOnWhom(const std::vector<WorkerWaits>& workers);

// One worker's records as JSON ({"worker", "rank", "waits": [{"layer", ...}]}), as a
// metrics endpoint serves them at /waits, and back (INVALID_ARGUMENT saying what is wrong).
std::string WaitsToJson(const WorkerWaits& worker);
absl::StatusOr<WorkerWaits> WaitsFromJson(std::string_view json);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_WAITS_H_
