// Internal: `gradwire trace merge` and `gradwire trace render`, the offline half of the
// traces workers write (rpc/trace.h).
//
// Contract
//   - MergeTraces(paths) reads the workers' trace files (a directory stands for its
//     *.trace.json) and returns one Chrome trace of them all: each worker's times moved
//     onto rank 0's clock by the offset it measured over the job's connection, then made
//     relative to the earliest event. The spill of a worker that did not close its trace
//     (the process was killed; a directory's *.trace.spill without its *.trace.json, or a
//     spill named) is first turned into its JSON up to its last whole record
//     (Tracer::ConvertSpill), and `notes` says so; a file that is not
//     a gradwire trace is INVALID_ARGUMENT naming it and what is wrong; an unreadable one
//     NOT_FOUND or DATA_LOSS naming the path. Deterministic: events sorted by time, then
//     worker, then thread.
//   - RenderTrace(merged, options) draws a merged trace as an SVG: a lane per worker and
//     thread (named as the trace names them), and one per worker and category for its
//     async spans ("param_server (async)": pushes, pulls), each slice a box coloured by its category
//     and labelled when it is wide enough, each flow an arrow from the slice that starts
//     it to the one that ends it, and a time axis in milliseconds. options.from_ms and
//     to_ms select a window (default: all of it). INVALID_ARGUMENT for what is not a
//     merged trace, or a window with nothing in it.
#ifndef GRADWIRE_WORKER_SRC_TRACE_TOOL_H_
#define GRADWIRE_WORKER_SRC_TRACE_TOOL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gw::worker {

absl::StatusOr<std::string> MergeTraces(const std::vector<std::string>& paths, std::vector<std::string>* notes);

struct RenderOptions {
  double from_ms = 0;
  double to_ms = -1;  // < 0: to the end
  int width_px = 1600;
  std::string title;
};
absl::StatusOr<std::string> RenderTrace(const std::string& merged, const RenderOptions& options);

}  // namespace gw::worker

#endif  // GRADWIRE_WORKER_SRC_TRACE_TOOL_H_
