// Internal: the spill file a tracer writes while its worker runs
// (DIR/<worker>.trace.spill), and its conversion into Chrome trace-event JSON
// (Tracer::ConvertSpill).
//
// Why a spill: a traced call records three spans, seven trace events, about 1.3 KB of
// JSON. Formatting and writing that while the job runs cost W3 a third of its calls; the
// spill is the spans' own bytes (about 90 each), written by one fwrite per drain, and the
// JSON is made once, when the worker closes its trace (or by `gradwire trace merge` for a
// worker that was killed).
//
// Contract
//   - The file is a header, then records, each complete in itself: names (an interned
//     Name's text), threads (a lane's id and name), batches of spans of one thread,
//     clock offsets, counts of dropped spans. A record refers only to names and threads
//     written before it, so any prefix of whole records is a readable spill.
//   - The format is this build's own (spans are stored as Tracer::Span's bytes, whose
//     size the header records): a spill is converted by the build that wrote it, not
//     kept or exchanged. A spill of another layout is INVALID_ARGUMENT naming the path.
//   - SpillToJson reads a spill up to its last whole record (`complete` says whether it
//     had a closing record, i.e. its tracer was closed) and writes the JSON to
//     json_path + ".tmp", renamed onto json_path once whole: a trace file is never seen
//     half-written. Errors name the path.
#ifndef GRADWIRE_RPC_SRC_OBSERVE_TRACE_SPILL_H_
#define GRADWIRE_RPC_SRC_OBSERVE_TRACE_SPILL_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "gradwire/rpc/trace.h"

namespace gw::rpc::internal {

void AppendSpillHeader(std::string& out, std::string_view worker, int rank, int64_t origin_us);
void AppendSpillName(std::string& out, Tracer::Name id, std::string_view text);
void AppendSpillThread(std::string& out, int tid, std::string_view name);
// A batch of spans of one thread: this header, then the spans' bytes (SpillBytesOf),
// written as they are (no copy into `out`).
void AppendSpillSpansHeader(std::string& out, int tid, size_t count);
std::string_view SpillBytesOf(std::span<const Tracer::Span> spans);
void AppendSpillOffset(std::string& out, int rank, int64_t offset_us, int64_t rtt_us);
void AppendSpillDropped(std::string& out, uint64_t dropped);
// The last record of a closed tracer's spill.
void AppendSpillEnd(std::string& out);

absl::Status SpillToJson(const std::string& spill_path, const std::string& json_path, bool* complete);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_OBSERVE_TRACE_SPILL_H_
