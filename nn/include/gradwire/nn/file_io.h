// Whole files read and written so that every failure is a Status naming the path: what
// nn's tensor files (serialize.h) and param_server's checkpoint directories are made of.
//
// Contract
//   - ReadWholeFile(path, who): the file's bytes. A path that cannot be opened or read is a
//     Status with errno's code (NOT_FOUND, PERMISSION_DENIED, ...), a directory or another
//     file that is not a regular one FAILED_PRECONDITION; the message starts with `who`
//     ("LoadTensors") and names the path. Never an exception (a std::ifstream on a
//     directory opens, then throws from its first read). A file that shrinks while it is
//     read gives the bytes that were there.
//   - WriteFileAtomically(path, pieces, who, writer): writes the pieces in order (writev,
//     from their memory) to "<path>.tmp", or "<path>.<writer>.tmp" when writers may race
//     on one path, fsyncs it, renames it over `path` and fsyncs the directory: a reader
//     sees the old file or the whole new one, and the new one survives a crash once this
//     returns OK. A failure removes the temporary file; its Status has errno's code and
//     names the file it was about.
#ifndef GRADWIRE_NN_FILE_IO_H_
#define GRADWIRE_NN_FILE_IO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gw::nn {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view who);

absl::Status WriteFileAtomically(const std::string& path, const std::vector<absl::string_view>& pieces,
                                 absl::string_view who, absl::string_view writer = "");

}  // namespace gw::nn

#endif  // GRADWIRE_NN_FILE_IO_H_
