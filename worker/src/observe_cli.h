// Internal: the observability commands of the `gradwire` tool (main.cc dispatches):
//   gradwire debug   who waits on whom in a running job (rpc/waits.h), from every worker;
//   gradwire top     the workers' calls, bytes, latency, queues and steps, refreshed;
//   gradwire trace   merge the workers' trace files into one timeline, or render it as SVG.
// Each takes the arguments after its name and returns the process's exit status (2 for
// bad usage, with the usage on stderr).
#ifndef GRADWIRE_WORKER_SRC_OBSERVE_CLI_H_
#define GRADWIRE_WORKER_SRC_OBSERVE_CLI_H_

#include <string>
#include <vector>

namespace gw::worker {

extern const char kObserveUsage[];

int RunDebug(const std::vector<std::string>& args);
int RunTop(const std::vector<std::string>& args);
int RunTrace(const std::vector<std::string>& args);

}  // namespace gw::worker

#endif  // GRADWIRE_WORKER_SRC_OBSERVE_CLI_H_
