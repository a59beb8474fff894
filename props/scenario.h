// Random scenarios for the property suites (SPEC §6): a layer stack, a
// schedule (default k-of-n, a random valid schedule table, or the same table
// driven by hand in manual mode), the simulator's speeds and seed, all drawn
// by RapidCheck so that failures shrink to small scenarios.
//
// A scenario runs through the workload driver (workload/workload.h) on a
// SimBackend; the run records where in the trace each phase of the driver
// began, so properties can check ordering in virtual time.

#ifndef OFFLOAD_PROPS_SCENARIO_H_
#define OFFLOAD_PROPS_SCENARIO_H_

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/schedule.h"
#include "engine/status.h"
#include "rapidcheck.h"
#include "workload/workload.h"

namespace offload {

// What one save of a layer looks like (turned into buffers and saves of a
// LayerSpec by BuildLayer).
struct SaveRecipe {
  enum class Kind {
    kPlain,         // a contiguous tensor
    kRepeated,      // the same tensor saved 2-3 times
    kHalves,        // x[:, ::2] and x[:, 1::2], with offload_base
    kQkv,           // q, k, v: interleaved column blocks of one qkv buffer
    kTransposed,    // a transposed view (and sometimes the tensor itself)
    kStridedBase,   // a contiguous view of a transposed (strided) base
    kSparse,        // x[::8] along rows: made contiguous or skipped
    kSmall,         // under min_offload_elements: kept
    kParameter,     // persistent, flagged parameter: kept
    kWeight,        // persistent, flagged weight: kept
    kNotOffload,    // marked do_not_offload: kept
    kComposite,     // data + transpose + small scale + absent + metadata
  };
  Kind kind = Kind::kPlain;
  DType dtype = DType::kBF16;
  int64_t rows = 16;
  int64_t cols = 16;  // even
  int repeats = 2;
};

struct Scenario {
  enum class Mode { kDefault, kTable, kManual };
  Mode mode = Mode::kDefault;
  int layers = 1;
  int offloaded = 0;     // kDefault
  ScheduleTable table;   // kTable and kManual (manual calls follow it)
  std::vector<std::vector<SaveRecipe>> saves;  // per layer
  std::vector<int64_t> forward_ns;             // per layer; backward is 2x
  SimOptions sim;
  int iterations = 1;
  bool retain_pinned_buffers = false;
  bool skip_sparse_views = false;
  int64_t min_offload_elements = 256;

  // The schedule in force: the default table (from SPEC §4.1, computed
  // independently of the engine), `table`, or the manual plan.
  ScheduleTable EffectiveSchedule() const;
  OffloadOptions Options() const;
  WorkloadSpec Spec() const;
};

std::ostream& operator<<(std::ostream& os, const Scenario& scenario);

struct ScenarioLimits {
  int max_layers = 16;
  int max_saves_per_layer = 20;
  bool allow_sparse = true;
  bool allow_manual = true;
  bool allow_retain = true;
};

// Draws scenarios within `limits`: layer counts 1..max_layers, default,
// table or manual schedules, 0..max_saves_per_layer saves of random kinds,
// dtypes and shapes per layer, compute of 20..400 us, copies of 2..200 GB/s
// with 0..20 us latency (bandwidth-bound and compute-bound regimes), a
// simulator seed and 0..0.5 duration jitter, 1..3 iterations.
rc::Gen<Scenario> GenScenario(const ScenarioLimits& limits = {});

// Turns one layer's recipes into its buffers and saves. `layer` names them.
LayerSpec BuildLayer(int layer, const std::vector<SaveRecipe>& saves,
                     int64_t forward_ns);

// Where the driver was when, as an index into the simulator's trace.
struct PhaseMark {
  WorkloadEvent event;
  size_t trace_index = 0;
};

// One scenario's run. Destroys the Offloader before the simulator.
struct ScenarioRun {
  std::unique_ptr<SimBackend> sim;
  std::unique_ptr<Offloader> offloader;
  Status status;  // RunWorkload's, or the first failed manual call's
  WorkloadResult result;
  std::vector<PhaseMark> marks;
  // Trace index range [begin, end) of each manual StartOffload(layer) call
  // in the last iteration.
  std::map<int, std::pair<size_t, size_t>> manual_offload_calls;
  int64_t persistent_bytes = 0;

  ScenarioRun() = default;
  ScenarioRun(ScenarioRun&&) = default;
  ScenarioRun& operator=(ScenarioRun&&) = default;
  ~ScenarioRun();
};

// Runs `scenario` (every iteration, byte checks on, simulator hooks), then
// runs the simulator until idle.
ScenarioRun RunScenario(const Scenario& scenario);

// The most device memory the schedule lets the scenario's activations use:
// the maximum over steps of the activation bytes of layers resident at that
// step (SPEC §6.2), plus what is never offloaded (kept tensors' buffers),
// plus contiguous copies of sparse views, plus persistent buffers.
int64_t DeviceMemoryBound(const Scenario& scenario);

}  // namespace offload

#endif  // OFFLOAD_PROPS_SCENARIO_H_
