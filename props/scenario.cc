#include "props/scenario.h"

#include <algorithm>
#include <utility>

#include "workload/sim_compute.h"

namespace offload {
namespace {

using Kind = SaveRecipe::Kind;

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kPlain: return "plain";
    case Kind::kRepeated: return "repeated";
    case Kind::kHalves: return "halves";
    case Kind::kQkv: return "qkv";
    case Kind::kTransposed: return "transposed";
    case Kind::kStridedBase: return "strided_base";
    case Kind::kSparse: return "sparse";
    case Kind::kSmall: return "small";
    case Kind::kParameter: return "parameter";
    case Kind::kWeight: return "weight";
    case Kind::kNotOffload: return "not_offload";
    case Kind::kComposite: return "composite";
  }
  return "?";
}

ViewSpec ViewOf(int buffer, std::vector<ViewOp> ops = {},
                TensorFlags flags = {}) {
  return ViewSpec{buffer, std::move(ops), flags};
}

SaveSpec Plain(std::string name, ViewSpec view) {
  SaveSpec save;
  save.name = std::move(name);
  save.components.emplace_back(std::move(view));
  return save;
}

int64_t Bytes(const std::vector<int64_t>& shape, DType dtype) {
  int64_t n = DTypeSize(dtype);
  for (int64_t size : shape) n *= size;
  return n;
}

rc::Gen<SaveRecipe> GenSave(bool allow_sparse) {
  std::vector<Kind> kinds = {
      Kind::kPlain,      Kind::kRepeated,    Kind::kHalves,
      Kind::kQkv,        Kind::kTransposed,  Kind::kStridedBase,
      Kind::kSmall,      Kind::kParameter,   Kind::kWeight,
      Kind::kNotOffload, Kind::kComposite};
  if (allow_sparse) kinds.push_back(Kind::kSparse);
  return rc::gen::build<SaveRecipe>(
      rc::gen::set(&SaveRecipe::kind, rc::gen::elementOf(kinds)),
      rc::gen::set(&SaveRecipe::dtype,
                   rc::gen::element(DType::kBF16, DType::kF32, DType::kF16,
                                    DType::kFP8E4M3, DType::kU8, DType::kI64)),
      rc::gen::set(&SaveRecipe::rows, rc::gen::inRange<int64_t>(32, 65)),
      rc::gen::set(&SaveRecipe::cols,
                   rc::gen::map(rc::gen::inRange<int64_t>(8, 33),
                                [](int64_t c) { return 2 * c; })),
      rc::gen::set(&SaveRecipe::repeats, rc::gen::inRange(2, 4)));
}

}  // namespace

LayerSpec BuildLayer(int layer, const std::vector<SaveRecipe>& saves,
                     int64_t forward_ns) {
  LayerSpec spec;
  spec.forward_ns = forward_ns;
  spec.backward_ns = 2 * forward_ns;
  for (size_t j = 0; j < saves.size(); ++j) {
    const SaveRecipe& r = saves[j];
    const std::string name = "L" + std::to_string(layer) + ".s" +
                             std::to_string(j) + "." + KindName(r.kind);
    const int b = static_cast<int>(spec.buffers.size());
    auto add_buffer = [&](std::string suffix, DType dtype,
                          std::vector<int64_t> shape, bool persistent) {
      spec.buffers.push_back(
          BufferSpec{name + suffix, dtype, std::move(shape), persistent});
      return static_cast<int>(spec.buffers.size()) - 1;
    };
    TensorFlags flags;
    switch (r.kind) {
      case Kind::kPlain:
        add_buffer("", r.dtype, {r.rows, r.cols}, false);
        spec.saves.push_back(Plain(name, ViewOf(b)));
        break;
      case Kind::kRepeated:
        add_buffer("", r.dtype, {r.rows, r.cols}, false);
        for (int i = 0; i < r.repeats; ++i) {
          spec.saves.push_back(Plain(name + "#" + std::to_string(i), ViewOf(b)));
        }
        break;
      case Kind::kHalves:
        add_buffer("", r.dtype, {r.rows, r.cols}, false);
        flags.offload_base = true;
        spec.saves.push_back(Plain(
            name + ".even", ViewOf(b, {ViewOp::Slice(1, 0, r.cols, 2)}, flags)));
        spec.saves.push_back(Plain(
            name + ".odd", ViewOf(b, {ViewOp::Slice(1, 1, r.cols, 2)}, flags)));
        break;
      case Kind::kQkv:
        add_buffer("", r.dtype, {r.rows, 3 * r.cols}, false);
        for (int i = 0; i < 3; ++i) {
          spec.saves.push_back(Plain(
              name + "." + "qkv"[i],
              ViewOf(b, {ViewOp::Slice(1, i * r.cols, (i + 1) * r.cols)})));
        }
        break;
      case Kind::kTransposed:
        add_buffer("", r.dtype, {r.rows, r.cols}, false);
        spec.saves.push_back(
            Plain(name + ".t", ViewOf(b, {ViewOp::Transpose(0, 1)})));
        if (r.repeats == 3) spec.saves.push_back(Plain(name, ViewOf(b)));
        break;
      case Kind::kStridedBase:
        // [4, rows, cols] seen as [rows, 4, cols] (strided); one head of it
        // is a contiguous view whose base is not.
        add_buffer("", r.dtype, {4, r.rows, r.cols}, false);
        spec.saves.push_back(Plain(
            name, ViewOf(b, {ViewOp::Transpose(0, 1), ViewOp::Select(1, 1)})));
        break;
      case Kind::kSparse:
        add_buffer("", r.dtype, {8 * r.rows, r.cols}, false);
        spec.saves.push_back(
            Plain(name, ViewOf(b, {ViewOp::Slice(0, 0, 8 * r.rows, 8)})));
        break;
      case Kind::kSmall:
        add_buffer("", DType::kF32, {4, 8}, false);
        spec.saves.push_back(Plain(name, ViewOf(b)));
        break;
      case Kind::kParameter:
      case Kind::kWeight:
        add_buffer("", r.dtype, {r.rows, r.cols}, /*persistent=*/true);
        (r.kind == Kind::kParameter ? flags.parameter : flags.weight) = true;
        spec.saves.push_back(Plain(name, ViewOf(b, {}, flags)));
        break;
      case Kind::kNotOffload:
        add_buffer("", r.dtype, {r.rows, r.cols}, false);
        flags.do_not_offload = true;
        spec.saves.push_back(Plain(name, ViewOf(b, {}, flags)));
        break;
      case Kind::kComposite: {
        int data = add_buffer(".data", DType::kFP8E4M3, {r.rows, r.cols}, false);
        int transpose =
            add_buffer(".transpose", DType::kFP8E4M3, {r.cols, r.rows}, false);
        int scale = add_buffer(".scale", DType::kF32, {1, 4}, false);
        SaveSpec save;
        save.name = name;
        save.composite = true;
        save.components = {ViewOf(data), ViewOf(transpose), ViewOf(scale),
                           std::nullopt};
        save.metadata = {0xF8, static_cast<uint8_t>(layer),
                         static_cast<uint8_t>(j)};
        spec.saves.push_back(std::move(save));
        break;
      }
    }
  }
  return spec;
}

ScheduleTable Scenario::EffectiveSchedule() const {
  if (mode != Mode::kDefault) return table;
  // SPEC §4.1, written out here rather than taken from the engine's
  // DefaultSchedule, so that the properties' oracle is independent of the
  // code under test: layer i < k is released when layer n-k+i begins its
  // forward and reloaded when layer n-1-k+i begins its backward.
  ScheduleTable spec_table;
  const int n = layers, k = offloaded;
  for (int i = 0; i < k; ++i) {
    const int release_step = n - k + i + 1;         // forward of layer n-k+i
    const int reload_step = n + (n - (n - 1 - k + i));  // its backward
    spec_table[i] = ScheduleEntry{true, release_step, false, reload_step - n};
  }
  return spec_table;
}

OffloadOptions Scenario::Options() const {
  OffloadOptions options;
  options.model_layers = layers;
  options.offloaded_layers = mode == Mode::kDefault ? offloaded : 0;
  options.manual_synchronization = mode == Mode::kManual;
  if (mode == Mode::kTable) options.schedule = table;
  options.retain_pinned_buffers = retain_pinned_buffers;
  options.skip_sparse_views = skip_sparse_views;
  options.min_offload_elements = min_offload_elements;
  return options;
}

WorkloadSpec Scenario::Spec() const {
  WorkloadSpec spec;
  spec.seed = sim.seed * 31 + 7;
  for (int l = 0; l < layers; ++l) {
    spec.layers.push_back(BuildLayer(l, saves[l], forward_ns[l]));
  }
  return spec;
}

std::ostream& operator<<(std::ostream& os, const Scenario& s) {
  const char* modes[] = {"default", "table", "manual"};
  os << "Scenario{mode=" << modes[static_cast<int>(s.mode)]
     << " layers=" << s.layers << " offloaded=" << s.offloaded
     << " iterations=" << s.iterations
     << " retain=" << s.retain_pinned_buffers
     << " skip_sparse=" << s.skip_sparse_views << "\n  table:";
  for (const auto& [layer, e] : s.table) {
    os << " L" << layer << "(" << (e.offload_fwd ? "F" : "B") << e.offload_num
       << "," << (e.reload_fwd ? "F" : "B") << e.reload_num << ")";
  }
  os << "\n  sim: seed=" << s.sim.seed << " d2h=" << s.sim.d2h_gbps
     << " h2d=" << s.sim.h2d_gbps << " latency=" << s.sim.copy_latency_ns
     << " jitter=" << s.sim.duration_jitter;
  for (int l = 0; l < s.layers; ++l) {
    os << "\n  L" << l << " fwd=" << s.forward_ns[l] << "ns:";
    for (const SaveRecipe& r : s.saves[l]) {
      os << " " << KindName(r.kind) << "/" << DTypeName(r.dtype) << "["
         << r.rows << "x" << r.cols << "]";
    }
  }
  return os << "}";
}

rc::Gen<Scenario> GenScenario(const ScenarioLimits& limits) {
  return rc::gen::exec([limits] {
    Scenario s;
    s.layers = *rc::gen::inRange(1, limits.max_layers + 1);
    const int n = s.layers;
    s.mode = static_cast<Scenario::Mode>(
        *rc::gen::inRange(0, limits.allow_manual ? 3 : 2));
    if (s.mode == Scenario::Mode::kDefault) {
      s.offloaded = *rc::gen::inRange(0, n);
    } else {
      // A random valid table: release after the layer's own forward step,
      // reload between the release and the layer's own backward step.
      for (int l = 0; l < n; ++l) {
        if (!*rc::gen::arbitrary<bool>()) continue;
        int last = 2 * n - l;  // the layer's own backward step
        int release = *rc::gen::inRange(l + 2, last + 1);
        int reload = *rc::gen::inRange(release, last + 1);
        auto as_entry = [n](int step) {
          return step <= n ? std::pair{true, step} : std::pair{false, step - n};
        };
        auto [offload_fwd, offload_num] = as_entry(release);
        auto [reload_fwd, reload_num] = as_entry(reload);
        s.table[l] = ScheduleEntry{offload_fwd, offload_num, reload_fwd,
                                   reload_num};
      }
    }
    for (int l = 0; l < n; ++l) {
      int count = *rc::gen::inRange(0, limits.max_saves_per_layer + 1);
      s.saves.push_back(*rc::gen::container<std::vector<SaveRecipe>>(
          count, GenSave(limits.allow_sparse)));
      s.forward_ns.push_back(*rc::gen::inRange<int64_t>(20'000, 400'001));
    }
    s.sim.seed = *rc::gen::arbitrary<uint64_t>();
    s.sim.d2h_gbps = *rc::gen::inRange(2, 201);
    s.sim.h2d_gbps = *rc::gen::inRange(2, 201);
    s.sim.copy_latency_ns = *rc::gen::inRange<int64_t>(0, 20'001);
    s.sim.duration_jitter = *rc::gen::inRange(0, 6) / 10.0;
    s.iterations = *rc::gen::inRange(1, 4);
    s.retain_pinned_buffers = limits.allow_retain && *rc::gen::arbitrary<bool>();
    s.skip_sparse_views = *rc::gen::arbitrary<bool>();
    return s;
  });
}

ScenarioRun::~ScenarioRun() { offloader.reset(); }

ScenarioRun RunScenario(const Scenario& scenario) {
  ScenarioRun run;
  run.sim = NewSimBackend(scenario.sim);
  SimBackend& sim = *run.sim;
  StatusOr<std::unique_ptr<Offloader>> offloader =
      Offloader::Create(sim, scenario.Options());
  if (!offloader.ok()) {
    run.status = offloader.status();
    return run;
  }
  run.offloader = std::move(offloader).value();
  Offloader& engine = *run.offloader;
  const WorkloadSpec spec = scenario.Spec();
  for (const LayerSpec& layer : spec.layers) {
    for (const BufferSpec& buffer : layer.buffers) {
      if (buffer.persistent) run.persistent_bytes += Bytes(buffer.shape, buffer.dtype);
    }
  }

  // Manual mode follows the table by hand: StartOffload once the layer's
  // saves are pushed, the release and reload at their steps.
  const int n = scenario.layers;
  const bool manual = scenario.mode == Scenario::Mode::kManual;
  std::map<int, std::vector<int>> release_at, reload_at;
  for (const auto& [layer, e] : scenario.table) {
    release_at[ScheduleStep(n, e.offload_fwd, e.offload_num)].push_back(layer);
    reload_at[ScheduleStep(n, e.reload_fwd, e.reload_num)].push_back(layer);
  }
  Status manual_status;
  auto note = [&](Status status) {
    if (manual_status.ok() && !status.ok()) manual_status = std::move(status);
  };
  WorkloadHooks hooks = SimWorkloadHooks(sim);
  hooks.observer = [&](const WorkloadEvent& event) {
    run.marks.push_back(PhaseMark{event, sim.trace().size()});
    if (!manual) return;
    int step = -1;
    if (event.phase == WorkloadPhase::kForwardBegin) step = event.layer + 1;
    if (event.phase == WorkloadPhase::kBackwardBegin) {
      step = n + (n - event.layer);
    }
    if (step > 0) {
      for (int layer : release_at[step]) note(engine.ReleaseForwardMemory(layer));
      for (int layer : reload_at[step]) note(engine.StartReload(layer));
    }
    if (event.phase == WorkloadPhase::kPushed &&
        scenario.table.count(event.layer) > 0) {
      size_t begin = sim.trace().size();
      note(engine.StartOffload(event.layer));
      run.manual_offload_calls[event.layer] = {begin, sim.trace().size()};
    }
  };
  WorkloadOptions options;
  options.iterations = scenario.iterations;
  options.min_offload_elements = scenario.min_offload_elements;
  options.allow_made_contiguous = true;
  StatusOr<WorkloadResult> result =
      RunWorkload(sim, engine, spec, hooks, options);
  if (result.ok()) {
    run.result = std::move(result).value();
    run.status = manual_status;
  } else {
    run.status = result.status();
  }
  sim.RunUntilIdle();
  return run;
}

int64_t DeviceMemoryBound(const Scenario& scenario) {
  const int n = scenario.layers;
  const ScheduleTable schedule = scenario.EffectiveSchedule();
  const WorkloadSpec spec = scenario.Spec();
  auto resident = [&](int layer, int step) {
    auto it = schedule.find(layer);
    if (it == schedule.end()) return true;
    const ScheduleEntry& e = it->second;
    int release = ScheduleStep(n, e.offload_fwd, e.offload_num);
    int reload = ScheduleStep(n, e.reload_fwd, e.reload_num);
    return step < release || step >= reload;
  };
  int64_t most = 0;
  for (int step = 1; step <= 2 * n; ++step) {
    // Forward step s: layers 0..s-1 have begun. Backward step n + c: layers
    // 0..n-c have not finished their backward (layer n-c begins it).
    int last = step <= n ? step - 1 : n - (step - n);
    int64_t bytes = 0;
    for (int l = 0; l <= last; ++l) {
      if (resident(l, step)) bytes += spec.ActivationBytes(l);
    }
    // The manual driver starts a step's reloads before BackwardStep, which
    // is what releases the previous backward layer: both are resident then.
    if (scenario.mode == Scenario::Mode::kManual && step > n + 1) {
      bytes += spec.ActivationBytes(last + 1);
    }
    most = std::max(most, bytes);
  }
  // What stays regardless: kept tensors' buffers (a composite's scale is
  // one), contiguous copies of sparse views, persistent buffers.
  int64_t extra = 0;
  for (int l = 0; l < n; ++l) {
    const LayerSpec& layer = spec.layers[l];
    for (size_t j = 0; j < scenario.saves[l].size(); ++j) {
      const SaveRecipe& r = scenario.saves[l][j];
      const int64_t view = Bytes({r.rows, r.cols}, r.dtype);
      if (r.kind == Kind::kSmall) extra += Bytes({4, 8}, DType::kF32);
      if (r.kind == Kind::kComposite) extra += Bytes({1, 4}, DType::kF32);
      if (r.kind == Kind::kNotOffload) extra += view;
      if (r.kind == Kind::kSparse) {
        // Skipped: its whole buffer stays; else a contiguous copy exists.
        extra += scenario.skip_sparse_views ? 8 * view : view;
      }
    }
    for (const BufferSpec& buffer : layer.buffers) {
      if (buffer.persistent) extra += Bytes(buffer.shape, buffer.dtype);
    }
  }
  return most + extra;
}

}  // namespace offload
