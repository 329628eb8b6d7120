// SummaryWriter: training curves (loss, accuracy, samples/s, ...) as TensorBoard event
// files, so that a run's curves open in TensorBoard as PyTorch's SummaryWriter's do
// (`tensorboard --logdir DIR`).
//
// Contract
//   - Open(logdir) creates logdir (and its parents) and a new file in it named as
//     TensorBoard expects, events.out.tfevents.<unix seconds>.<host>.<pid>.<n> (n counts
//     the writers this process opened, so two never share a file), whose first event says
//     the format ("brain.Event:2"). An error names the path.
//   - AddScalar(tag, value, step[, wall_time]) appends one event holding the scalar (a
//     float32, as TensorBoard keeps it). Events are records in TFRecord's framing: length
//     (uint64, little-endian), its masked CRC-32C, the Event protobuf, its masked CRC-32C
//     (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8). Written through a buffer that is
//     flushed at most a second after a scalar (TensorBoard follows the file as it grows),
//     by Flush(), and by Close().
//   - Every I/O error is a Status naming the file; after one, the writer refuses further
//     scalars with the same error. Close() flushes, closes and returns the first error;
//     the destructor closes (its error is lost: call Close to see it). Not thread-safe.
//   - ReadScalarEvents(path) reads such a file back (tests, tools): every record's
//     length and CRCs are checked; DATA_LOSS names the file and the byte offset of a
//     record that is cut short or whose CRC does not match, INVALID_ARGUMENT one that is
//     not an Event. The file-version event is checked and not returned.
#ifndef GRADWIRE_DATA_SUMMARY_WRITER_H_
#define GRADWIRE_DATA_SUMMARY_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gw::data {

class SummaryWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SummaryWriter>> Open(const std::string& logdir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  absl::Status AddScalar(std::string_view tag, double value, int64_t step) {
    return AddScalar(tag, value, step, absl::Now());
  }
  absl::Status AddScalar(std::string_view tag, double value, int64_t step, absl::Time wall_time);
  absl::Status Flush();
  absl::Status Close();
  const std::string& path() const { return path_; }

 private:
  SummaryWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteRecord(const std::string& data);
  absl::Status Fail(const std::string& what);

  const std::string path_;
  std::FILE* file_;
  absl::Status error_;
  absl::Time last_flush_ = absl::Now();
};

struct ScalarEvent {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;  // seconds since the Unix epoch
  float value = 0;
};
absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(const std::string& path);

}  // namespace gw::data

#endif  // GRADWIRE_DATA_SUMMARY_WRITER_H_
