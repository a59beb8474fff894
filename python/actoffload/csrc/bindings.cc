// actoffload._C: the engine's front doors for Python, over a Session
// (session.h): the layer mode as a TrainingLoop (loop_binding.cc) and the
// fine-grained mode here. Thin: each method is one engine call; a non-OK Status
// becomes actoffload.OffloadError with the engine's message. The Python
// package (actoffload/*.py) puts PyTorch's hooks around these.

#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/offload.h"
#include "engine/pipeline_offload.h"
#include "engine/pipeline_summary.h"
#include "python/actoffload/csrc/loop_binding.h"
#include "python/actoffload/csrc/saved_version.h"
#include "python/actoffload/csrc/session.h"

namespace actoffload {
namespace {

namespace py = pybind11;
using offload::SavedTensor;

// An event on the compute stream marking a tensor's bytes final (TE's
// start_offload).
struct ReadyEvent {
  std::shared_ptr<offload::Event> event;
};

// What the pack hook hands autograd for a tensor the engine took.
struct Handle {
  std::shared_ptr<Session> session;  // outlives `saved`
  SavedTensor saved;
  SavedVersion version;
  int layer() const { return saved.layer(); }
};

offload::TensorFlags Flags(bool parameter, bool do_not_offload,
                           bool offload_base) {
  offload::TensorFlags flags;
  flags.parameter = parameter;
  flags.do_not_offload = do_not_offload;
  flags.offload_base = offload_base;
  return flags;
}

// Push and Pop, the same for both front doors.
template <typename FrontDoor>
py::object PushTensor(Session& session, FrontDoor& door,
                      const py::object& object, bool parameter,
                      bool do_not_offload, bool offload_base,
                      const ReadyEvent* ready) {
  const at::Tensor tensor = py::cast<at::Tensor>(object);
  if (tensor.device() != session.device()) {
    throw EngineError(offload::InvalidArgumentError(
        "a saved tensor on " + tensor.device().str() +
        " pushed to an offloader on " + session.device().str()));
  }
  offload::Tensor engine = session.ToEngine(
      tensor, Flags(parameter, do_not_offload, offload_base),
      ready == nullptr ? nullptr : ready->event);
  SavedTensor saved = ValueOrThrow(door.Push(engine));
  if (saved.kept() != nullptr) return object;  // handed back untouched
  Handle handle{session.shared_from_this(), std::move(saved),
                SavedVersion::Of(tensor)};
  return py::cast(std::move(handle));
}

template <typename FrontDoor>
at::Tensor PopTensor(Session& session, FrontDoor& door, const Handle& handle) {
  handle.version.Check();
  offload::Tensor popped = ValueOrThrow(door.Pop(handle.saved));
  // The compute stream now waits for the reload; on the simulator, the host
  // runs it there before torch (a CPU op) reads the bytes.
  session.SyncComputeForHost();
  return session.ToTorch(popped, handle.version.dtype);
}

// Fine-grained mode (engine/pipeline_offload.h), Megatron's calls for one
// pipeline rank.
class FineGrainedOffloader {
 public:
  FineGrainedOffloader(std::shared_ptr<Session> session,
                       const offload::PipelineOffloadOptions& options)
      : session_(std::move(session)),
        offloader_(ValueOrThrow(
            offload::PipelineOffloader::Create(session_->backend(), options))) {}

  void StartChunk(int stage, int microbatch) {
    ThrowIfError(offloader_->StartChunk(stage, microbatch));
  }
  void GroupStart(const std::string& name) {
    ThrowIfError(offloader_->GroupStart(name));
  }
  py::object Push(const py::object& tensor, bool parameter,
                  bool do_not_offload, bool offload_base,
                  const ReadyEvent* ready) {
    return PushTensor(*session_, *offloader_, tensor, parameter,
                      do_not_offload, offload_base, ready);
  }
  void GroupCommit(const std::string& name,
                   const std::vector<at::Tensor>& release) {
    std::vector<offload::Tensor> engine;
    for (const at::Tensor& tensor : release) {
      if (!tensor.defined() || tensor.numel() == 0 ||
          tensor.device() != session_->device()) {
        continue;
      }
      offload::DType dtype;
      if (!Session::EngineDType(tensor.scalar_type(), &dtype)) continue;
      engine.push_back(session_->ToEngine(tensor, {}, nullptr));
    }
    ThrowIfError(offloader_->GroupCommit(name, engine));
  }
  void StartChunkBackward(int stage, int microbatch) {
    ThrowIfError(offloader_->StartChunkBackward(stage, microbatch));
  }
  void GroupBackwardStart(const std::string& name) {
    ThrowIfError(offloader_->GroupBackwardStart(name));
  }
  at::Tensor Pop(const Handle& handle) {
    return PopTensor(*session_, *offloader_, handle);
  }
  void GroupBackwardEnd(const std::string& name) {
    ThrowIfError(offloader_->GroupBackwardEnd(name));
  }
  void FinishIteration() { ThrowIfError(offloader_->FinishIteration()); }
  void AbandonIteration() { ThrowIfError(offloader_->AbandonIteration()); }
  bool WarmedUp() const { return offloader_->warmed_up(); }
  std::string SummaryTable() const {
    const auto& summary = offloader_->summary();
    if (!summary.has_value()) return "";
    return offload::FormatSummaryTable({*summary});
  }
  int64_t OffloadedBytes() const { return offloader_->OffloadedBytes(); }
  py::dict Stats() const { return StatsDict(offloader_->stats()); }
  std::vector<std::string> Warnings() const {
    return offloader_->diagnostics().warnings();
  }

 private:
  std::shared_ptr<Session> session_;  // outlives the offloader
  std::unique_ptr<offload::PipelineOffloader> offloader_;
};

}  // namespace

std::shared_ptr<offload::Event> ReadyEventOf(const py::handle& object) {
  return object.cast<const ReadyEvent&>().event;
}

}  // namespace actoffload

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace actoffload;
  namespace py = pybind11;
  m.doc() = "The activation offloading engine (C++), for actoffload.";
  py::exception<EngineError>& offload_error =
      py::register_exception<EngineError>(m, "OffloadError", PyExc_RuntimeError);
  {
    // An OffloadError and a torch.cuda.OutOfMemoryError (session.h:
    // EngineOutOfMemoryError). Translators registered later are tried first.
    py::object torch_oom =
        py::module_::import("torch").attr("cuda").attr("OutOfMemoryError");
    py::tuple bases = py::make_tuple(offload_error, torch_oom);
    static PyObject* out_of_memory = PyErr_NewException(
        "actoffload.OffloadOutOfMemoryError", bases.ptr(), nullptr);
    m.attr("OffloadOutOfMemoryError") = py::handle(out_of_memory);
    py::register_exception_translator([](std::exception_ptr error) {
      try {
        if (error) std::rethrow_exception(error);
      } catch (const EngineOutOfMemoryError& e) {
        PyErr_SetString(out_of_memory, e.what());
      }
    });
  }
#ifdef ACTOFFLOAD_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif

  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init([](const std::string& kind, int device, uint64_t seed,
                       double sim_gbps, int64_t sim_device_bytes,
                       int64_t pinned_slab_bytes) {
             SessionOptions options;
             options.kind = kind;
             options.device = device;
             options.seed = seed;
             options.sim_gbps = sim_gbps;
             options.sim_device_bytes = sim_device_bytes;
             options.pinned_slab_bytes = pinned_slab_bytes;
             return Session::Create(options);
           }),
           py::arg("kind"), py::arg("device") = 0, py::arg("seed") = 0,
           py::arg("sim_gbps") = 55.0,
           py::arg("sim_device_bytes") = int64_t{80} << 30,
           py::arg("pinned_slab_bytes") = int64_t{64} << 20)
      .def_property_readonly("kind", &Session::kind)
      .def_property_readonly("device",
                             [](const Session& s) { return s.device().str(); })
      .def_property_readonly("compute_stream_handle",
                             &Session::compute_stream_handle)
      .def("record_ready",
           [](Session& s) { return ReadyEvent{s.RecordReady()}; })
      .def("hazards", &Session::Hazards)
      .def("sim_device_live_bytes", &Session::SimDeviceLiveBytes)
      .def("sim_device_peak_bytes", &Session::SimDevicePeakBytes)
      .def("sim_reset_peaks", &Session::SimResetPeaks)
      .def("sim_now_ns", &Session::SimNowNs)
      .def("synchronize", &Session::Synchronize);

  py::class_<ReadyEvent>(m, "ReadyEvent");
  py::class_<Handle>(m, "Handle")
      .def_property_readonly("layer", &Handle::layer)
      .def("__repr__", [](const Handle& h) {
        return "<actoffload handle of layer " + std::to_string(h.layer()) + ">";
      });

  BindTrainingLoop(m);
  BindJointPlan(m);

  py::class_<FineGrainedOffloader>(m, "FineGrainedOffloader")
      .def(py::init([](std::shared_ptr<Session> session, bool enabled,
                       std::vector<std::string> offload_modules,
                       int64_t min_offload_elements, double fraction,
                       int64_t delta_offload_bytes, int pipeline_rank,
                       int virtual_stages, std::map<std::string, int> max_inflight,
                       bool pinned_pool, double min_span_coverage,
                       bool skip_sparse_views, bool warnings_to_stderr) {
             offload::PipelineOffloadOptions options;
             options.enabled = enabled;
             options.offload_modules = std::move(offload_modules);
             options.min_offload_elements = min_offload_elements;
             options.activation_offload_fraction = fraction;
             options.delta_offload_bytes = delta_offload_bytes;
             options.pipeline_rank = pipeline_rank;
             options.virtual_stages = virtual_stages;
             options.max_inflight = std::move(max_inflight);
             options.pinned_pool = pinned_pool;
             options.min_span_coverage = min_span_coverage;
             options.skip_sparse_views = skip_sparse_views;
             options.warnings_to_stderr = warnings_to_stderr;
             return std::make_unique<FineGrainedOffloader>(std::move(session),
                                                           options);
           }),
           py::arg("session"), py::arg("enabled") = true,
           py::arg("offload_modules") = std::vector<std::string>{},
           py::arg("min_offload_elements") = 1024 * 1024,
           py::arg("fraction") = 1.0, py::arg("delta_offload_bytes") = 0,
           py::arg("pipeline_rank") = 0, py::arg("virtual_stages") = 1,
           py::arg("max_inflight") = std::map<std::string, int>{},
           py::arg("pinned_pool") = true, py::arg("min_span_coverage") = 0.5,
           py::arg("skip_sparse_views") = false,
           py::arg("warnings_to_stderr") = false)
      .def("start_chunk", &FineGrainedOffloader::StartChunk)
      .def("group_start", &FineGrainedOffloader::GroupStart)
      .def("push", &FineGrainedOffloader::Push, py::arg("tensor"),
           py::arg("parameter") = false, py::arg("do_not_offload") = false,
           py::arg("offload_base") = false, py::arg("ready") = nullptr)
      .def("group_commit", &FineGrainedOffloader::GroupCommit)
      .def("start_chunk_backward", &FineGrainedOffloader::StartChunkBackward)
      .def("group_backward_start", &FineGrainedOffloader::GroupBackwardStart)
      .def("pop", &FineGrainedOffloader::Pop)
      .def("group_backward_end", &FineGrainedOffloader::GroupBackwardEnd)
      .def("finish_iteration", &FineGrainedOffloader::FinishIteration)
      .def("abandon_iteration", &FineGrainedOffloader::AbandonIteration)
      .def("warmed_up", &FineGrainedOffloader::WarmedUp)
      .def("summary_table", &FineGrainedOffloader::SummaryTable)
      .def("offloaded_bytes", &FineGrainedOffloader::OffloadedBytes)
      .def("stats", &FineGrainedOffloader::Stats)
      .def("warnings", &FineGrainedOffloader::Warnings);
}
