// Checkpoints of a parameter-server deployment: what a user sees of them.
//
// A checkpoint is a numbered version in the servers' checkpoint directory
// (ServerOptions::checkpoint_dir: shared by the servers of one host, when a version is
// usable only with every server's file; or one per host, or a network file system across
// hosts, where each server checks the files it sees, its own first, and a reader needs
// every server's file):
//
//   <dir>/v00000012/worker0.gwps   each server's tables (nn/serialize.h: every entry and
//   <dir>/v00000012/worker1.gwps   the whole file checksummed with CRC32C)
//   <dir>/v00000012/MANIFEST       JSON, written last: the job, the version, the step, each
//                                  file's size, CRC32C and shards, each table's layout;
//                                  its last line is the CRC32C of the rest
//
// Contract
//   - One version is one moment of training: every synchronous table of every server as
//     of the start of the same step (each shard's values and optimizer state copied in
//     memory when it is at that step, so training stalls only for the copy; the files are
//     written in the background; a resumed job pushes that step again). Asynchronous and
//     bounded-staleness shards are copied when the cut reaches them (they have no common
//     step). A version without its MANIFEST was cut short and is never read.
//   - Who cuts: Client::Checkpoint() (now), or the one client of a job with
//     ClientOptions::checkpoint_every (cut at the step it is about to push, once a period).
//     A job's last trainer step followed by Client::Checkpoint() is its final checkpoint.
//   - What a server keeps: the newest ServerOptions::checkpoint_keep complete versions. A
//     cut of tables holding NaN or infinities (a diverged run) fails instead of writing a
//     version no server would restore (unless ServerOptions::allow_non_finite).
//   - What a server restores: at start, the newest version whose manifest and files are
//     intact (versions passed over are named on stderr and in RestoredCheckpoint::skipped);
//     if versions exist and none is usable, the server does not start (the error lists
//     why each failed); ServerOptions::fresh starts empty instead. Versions that were all
//     cut short (no manifest: the job died writing its first one) hold nothing: the server
//     starts empty (naming them in skipped) and numbers its versions after them. Values that are not
//     finite are refused unless ServerOptions::allow_non_finite.
//   - What a trainer does on a restored deployment: Client::Resume() says the step the
//     servers restored (every server must have restored the same version), and the
//     trainer continues from that step. A synchronous or bounded-staleness push of a step
//     the table has long passed is refused (FAILED_PRECONDITION naming the steps) instead
//     of being dropped as a retry: a trainer that does not resume cannot train into the
//     void. (A restored bounded-staleness table takes each trainer's first push at its
//     clock, so a step of it may count twice or not at all across a restore: its cut is
//     not one step. A job of bounded-staleness tables only resumes at step 0.)
//   - Readers (Reader::LoadCheckpoint, serve's ServeCheckpoint) take a directory or one
//     version's directory and read through its manifest: the files in shard order, each
//     checked against its size and CRC32C; a file that is missing, damaged, or from another
//     version is an error naming it.
#ifndef GRADWIRE_PARAM_SERVER_CHECKPOINT_H_
#define GRADWIRE_PARAM_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace gw::param_server {

// A version that was written (Client::Checkpoint).
struct CheckpointInfo {
  int64_t version = 0;
  int64_t step = 0;  // the synchronous tables' step (0 when none is synchronous)
  std::string job;
  std::vector<std::string> files;  // every server's file, in the order of the servers' names
};

// What the servers of a deployment restored (Client::Resume): version 0 when none.
struct ResumePoint {
  int64_t version = 0;
  int64_t step = 0;
  std::string job;
};

// What one server restored at its start (ParameterServer::restored).
struct RestoredCheckpoint {
  int64_t version = 0;  // 0: nothing restored
  int64_t step = 0;
  std::string job;
  std::string path;  // the version's directory
  int64_t tables = 0;
  std::vector<std::string> skipped;  // newer versions passed over, each with why
};

// A server's checkpoint writes (ParameterServer::checkpoint_stats).
struct CheckpointStats {
  int64_t written = 0;  // versions committed
  int64_t failed = 0;   // versions this server could not write or commit
  int64_t failures_in_a_row = 0;
  std::string last_error;
  int64_t last_version = 0;
  int64_t last_step = 0;
  int64_t last_bytes = 0;
  absl::Duration last_copy;   // training stalled for this (the in-memory copy)
  absl::Duration last_write;  // the background write of the file
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_CHECKPOINT_H_
