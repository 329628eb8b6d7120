// --logdir DIR: the examples that write their training curves as TensorBoard event files
// (curves.h) take it. Header-only: include it in the program's one .cc that defines flags.
#ifndef GRADWIRE_EXAMPLES_LOGDIR_FLAG_H_
#define GRADWIRE_EXAMPLES_LOGDIR_FLAG_H_

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, logdir, "",
          "write the training curves (loss, accuracy, samples/s, step time) as TensorBoard event files in this "
          "directory (by the worker that shows the progress; `tensorboard --logdir DIR` shows them)");

#endif  // GRADWIRE_EXAMPLES_LOGDIR_FLAG_H_
