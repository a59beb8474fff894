// The main job's fine-grained mode (`bazel run //:demo -- --mode=pipeline`):
// Megatron-style offloading of named submodules over a pipeline-parallel
// schedule, every rank on its own simulated GPU (tools/pipeline_demo.cc).

#ifndef OFFLOAD_TOOLS_PIPELINE_DEMO_H_
#define OFFLOAD_TOOLS_PIPELINE_DEMO_H_

namespace offload {

// Parses argv (--mode=pipeline and the flags in the usage text), runs every
// rank with and without offloading and prints the report. Returns 0 when
// every popped byte was identical and no hazard was found, 1 otherwise, 2
// for bad flags.
int RunPipelineDemo(int argc, char** argv);

}  // namespace offload

#endif  // OFFLOAD_TOOLS_PIPELINE_DEMO_H_
