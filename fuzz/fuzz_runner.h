// Runs a FuzzProgram against an Offloader on a SimBackend wrapped in a
// FaultInjectingBackend, and checks what SPEC §3.6, §6.3, §6.4 and §6.7
// promise for any call sequence:
//  - every error is a clear Status: a non-empty message and one of
//    kInvalidArgument, kFailedPrecondition, kResourceExhausted, kInternal;
//    argument and state errors (the first two) change no state: group
//    states, OffloadedBytes and stats are as before (except FinishBackward,
//    which ends the iteration whatever fails);
//  - handles of a destroyed Offloader, of an earlier iteration, empty
//    handles and composite/plain mix-ups are rejected;
//  - every popped tensor has the dtype, shape and bytes it was pushed with
//    (composites: also name, metadata and which components are present);
//  - the simulator reports no hazard, after any call;
//  - once the Offloader and every tensor are gone and the simulator ran
//    idle, no device or pinned bytes are live.

#ifndef OFFLOAD_FUZZ_FUZZ_RUNNER_H_
#define OFFLOAD_FUZZ_FUZZ_RUNNER_H_

#include <optional>
#include <string>

#include "fuzz/fuzz_program.h"

namespace offload::fuzz {

// The first violation found (naming the call, its index and what was
// wrong), or nullopt. `verbose`: print each call and its status to stderr.
std::optional<std::string> RunProgram(const FuzzProgram& program, bool verbose);

}  // namespace offload::fuzz

#endif  // OFFLOAD_FUZZ_FUZZ_RUNNER_H_
