// actoffload._C.TrainingLoop: the engine's TrainingLoop (engine/
// training_loop.h, SPEC §7) behind PyTorch's saved-tensor hooks. The pack
// and unpack hooks are these C++ methods themselves (one call each, no
// Python in between); the package's Python only says where layers begin and
// end (a context's enter, a module's pre-hook, a tensor hook on a layer's
// output).
//
// What is never offloaded (SPEC §1.2, §7.5) is decided here, once, before
// the engine sees the tensor: tensor subclasses (nn.Parameter among them),
// views of parameters (frozen or not), leaf tensors that require grad and
// their views, the parameters and buffers of the modules the caller names
// (set_model_tensors; offloading memory a module holds frees nothing),
// non-strided layouts, empty tensors, dtypes the
// engine cannot copy, other devices, tensors marked do-not-offload
// (mark_not_offload, TE's _TE_do_not_offload), and tensors under the size
// threshold (elements for TE, bytes for torchtune). Such a tensor is kept
// as it is, with its version for autograd's in-place check. The one tensor
// subclass offloaded is a DTensor activation (tensor parallelism): its local
// shard goes to the engine and unpack rebuilds the DTensor with the same
// mesh, placements, shape and stride, so it is never gathered whole.

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/offload.h"
#include "engine/training_loop.h"
#include "python/actoffload/csrc/loop_binding.h"
#include "python/actoffload/csrc/saved_version.h"
#include "python/actoffload/csrc/session.h"

namespace actoffload {
namespace {

namespace py = pybind11;

// A layer-end marker's hold on its iteration (the tensor hook's closure).
struct LoopRef {
  std::shared_ptr<Session> session;  // outlives `ref`
  offload::IterationRef ref;
};

// What the pack hook hands autograd for a tensor the engine took.
struct LoopHandle {
  std::shared_ptr<Session> session;  // outlives `saved`
  offload::LoopSaved saved;
  SavedVersion version;
};

// What the pack hook hands autograd for a DTensor whose local shard the
// engine took: the shard's handle and what rebuilds the DTensor
// (actoffload._common.dtensor_shard).
struct ShardHandle {
  py::object local;  // a LoopHandle
  py::object parts;
};

// The tensor's own attribute dict entry `name`, without the cost of a
// failed attribute lookup (most tensors have no dict at all).
PyObject* OwnAttribute(PyObject* object, const char* name) {
  PyObject** dict = _PyObject_GetDictPtr(object);
  if (dict == nullptr || *dict == nullptr) return nullptr;
  return PyDict_GetItemString(*dict, name);  // borrowed
}

bool Truthy(PyObject* value) {
  return value != nullptr && PyObject_IsTrue(value) == 1;
}

// Whether autograd's engine runs a backward pass (a graph task) on this
// thread: TrainingLoop::Create's backward_running. A graph freed outside
// one, while its pass is open, is that of a backward that raised.
bool BackwardRunning() {
  return torch::autograd::get_current_graph_task_nodes_in_graph() != nullptr;
}

class Loop : public std::enable_shared_from_this<Loop> {
 public:
  Loop(std::shared_ptr<Session> session, const offload::OffloadOptions& options,
       int64_t min_bytes)
      : session_(std::move(session)),
        loop_(ValueOrThrow(
            offload::TrainingLoop::Create(session_->backend(), options,
                                          BackwardRunning))),
        min_elements_(options.min_offload_elements),
        min_bytes_(min_bytes),
        tensor_type_(reinterpret_cast<PyObject*>(THPVariableClass)) {}

  // (LoopRef or None, layer id or -1, whether the engine offloads it).
  py::tuple ForwardStep(int expected) {
    if (!refusal_.empty()) {  // SPEC §7.8: told once, at the next forward
      std::string message = std::move(refusal_);
      refusal_.clear();
      throw py::value_error("actoffload: " + message);
    }
    offload::LoopLayer layer = ValueOrThrow(loop_->ForwardStep(expected));
    py::object ref = py::none();
    if (!layer.iteration.empty()) {
      ref = py::cast(LoopRef{session_, std::move(layer.iteration)});
    }
    return py::make_tuple(ref, layer.layer, layer.offloaded);
  }
  void AbandonForward() { ThrowIfError(loop_->AbandonForward()); }
  void EndForward() { loop_->EndForward(); }
  void EndLayer() { loop_->EndLayer(); }
  // The parameters and buffers of the caller's modules: never offloaded.
  void SetModelTensors(const std::vector<at::Tensor>& tensors) {
    model_storages_.clear();
    AddModelTensors(tensors);
  }
  void AddModelTensors(const std::vector<at::Tensor>& tensors) {
    for (const at::Tensor& tensor : tensors) {
      if (tensor.defined() && tensor.has_storage()) {
        model_storages_.insert(tensor.storage().unsafeGetStorageImpl());
      }
    }
  }

  py::object Pack(const py::object& object) {
    if (!loop_->offloading()) return Keep(object);
    if (Py_TYPE(object.ptr()) != reinterpret_cast<PyTypeObject*>(tensor_type_)) {
      return PackSubclass(object);
    }
    const at::Tensor tensor = py::cast<at::Tensor>(object);
    if (!Offloadable(tensor) ||
        Truthy(OwnAttribute(object.ptr(), "_actoffload_do_not_offload")) ||
        Truthy(OwnAttribute(object.ptr(), "_TE_do_not_offload"))) {
      return Keep(object, tensor);
    }
    offload::TensorFlags flags;
    flags.offload_base =
        Truthy(OwnAttribute(object.ptr(), "_actoffload_offload_base"));
    std::shared_ptr<offload::Event> ready;
    if (PyObject* event = OwnAttribute(object.ptr(), "_actoffload_ready")) {
      ready = ReadyEventOf(event);
    } else if (Truthy(OwnAttribute(object.ptr(), "_actoffload_start_offload"))) {
      ready = session_->RecordReady();  // TE's start_offload: final now
    }
    offload::TrainingLoop::Pushed pushed = ValueOrThrow(
        loop_->Push(session_->ToEngine(tensor, flags, std::move(ready))));
    if (pushed.kept) return Keep(object, tensor);
    return py::cast(LoopHandle{session_, std::move(pushed.saved),
                               SavedVersion::Of(tensor)});
  }

  py::object Unpack(const py::object& packed) {
    if (py::isinstance<ShardHandle>(packed)) {
      const ShardHandle& shard = packed.cast<const ShardHandle&>();
      return Common().attr("dtensor_of")(Unpack(shard.local), shard.parts);
    }
    if (PyTuple_Check(packed.ptr())) {
      py::tuple kept = py::reinterpret_borrow<py::tuple>(packed);
      const at::Tensor tensor = py::cast<at::Tensor>(kept[0]);
      const uint32_t saved = kept[1].cast<uint32_t>();
      const uint32_t now =
          torch::autograd::impl::version_counter(tensor).current_version();
      if (now != saved) {
        SavedVersion version = SavedVersion::Of(tensor);
        version.saved_version = saved;
        version.Check();
      }
      return kept[0];
    }
    const LoopHandle& handle = packed.cast<const LoopHandle&>();
    handle.version.Check();
    QueuePassEnd();
    offload::Tensor popped = ValueOrThrow(
        loop_->Pop(handle.saved, handle.saved.saved().layer()));
    // The compute stream now waits for the reload; on the simulator the
    // host runs it there before torch (a CPU op) reads the bytes.
    session_->SyncComputeForHost();
    return py::cast(session_->ToTorch(popped, handle.version.dtype));
  }

  void BackwardStep(const LoopRef& ref, int layer) {
    QueuePassEnd();
    ThrowIfError(loop_->BackwardStep(ref.ref, layer));
  }

  // For a caller that knows the pass ended without the callback (it raised).
  void PassEnded() {
    pass_queued_ = false;
    offload::Status status = loop_->PassEnded();
    if (status.code() == offload::StatusCode::kResourceExhausted &&
        status.message().find("activation budget") != std::string::npos) {
      refusal_ = status.ToString();
    } else if (!status.ok()) {
      errors_.push_back(status.ToString());
    }
  }
  bool pass_open() const { return pass_queued_; }
  // Bytes of DTensor local shards handed to the engine, in all.
  int64_t shard_bytes() const { return shard_bytes_; }

  // Warnings not returned before (the loop's, then each Offloader's).
  std::vector<std::string> NewWarnings() {
    std::vector<std::string> out = std::move(errors_);
    errors_.clear();
    auto take = [&out](const offload::Diagnostics& diagnostics, size_t& seen) {
      const auto& all = diagnostics.warnings();
      for (; seen < all.size(); ++seen) out.push_back(all[seen]);
    };
    take(loop_->diagnostics(), seen_[0]);
    std::vector<const offload::Offloader*> offloaders = loop_->offloaders();
    if (seen_.size() < offloaders.size() + 1) seen_.resize(offloaders.size() + 1);
    for (size_t i = 0; i < offloaders.size(); ++i) {
      take(offloaders[i]->diagnostics(), seen_[i + 1]);
    }
    return out;
  }

  void Manual(int call, int layer) {
    offload::Offloader* target = loop_->manual_target();
    if (target == nullptr) {
      throw EngineError(offload::FailedPreconditionError(
          "manual call for layer " + std::to_string(layer) +
          ": no forward ran yet"));
    }
    switch (call) {
      case 0: ThrowIfError(target->StartOffload(layer)); break;
      case 1: ThrowIfError(target->ReleaseForwardMemory(layer)); break;
      default: ThrowIfError(target->StartReload(layer)); break;
    }
  }

  py::dict Stats() const {
    offload::OffloaderStats sum;
    for (const offload::Offloader* offloader : loop_->offloaders()) {
      const offload::OffloaderStats& s = offloader->stats();
      sum.tensors_offloaded += s.tensors_offloaded;
      sum.tensors_kept += s.tensors_kept;
      sum.spans_offloaded += s.spans_offloaded;
      sum.bytes_offloaded += s.bytes_offloaded;
      sum.bytes_reloaded += s.bytes_reloaded;
      sum.views_made_contiguous += s.views_made_contiguous;
      sum.bytes_retained_by_caller += s.bytes_retained_by_caller;
      sum.pinned_allocations += s.pinned_allocations;
    }
    return StatsDict(sum);
  }
  std::vector<std::string> Warnings() const { return loop_->Warnings(); }
  int64_t OffloadedBytes() const { return loop_->OffloadedBytes(); }
  int Pooled() const { return loop_->pooled_offloaders(); }
  int Live() const { return loop_->live_iterations(); }
  std::string BudgetPlanText() const {
    const offload::Offloader* current = loop_->current_offloader();
    return current == nullptr ? "" : current->BudgetPlanText();
  }
  bool WillOffload(int layer) const {
    const offload::Offloader* current = loop_->current_offloader();
    return current != nullptr && current->WillOffload(layer);
  }
  std::string State(int layer) const {
    const offload::Offloader* current = loop_->current_offloader();
    return current == nullptr
               ? "not_offloaded"
               : offload::GroupStateName(current->state(layer));
  }

 private:
  // Parameters (nn.Parameter is a subclass) and other subclasses are kept,
  // except a DTensor that is not a parameter or a view of one: its local
  // shard is packed as any tensor, and kept with it if the shard is.
  py::object PackSubclass(const py::object& object) {
    const int parameter = PyObject_IsInstance(object.ptr(), parameter_type_.ptr());
    if (parameter != 0) {
      PyErr_Clear();  // (-1: not a class instance check that can fail here)
      return Keep(object);
    }
    py::object shard = Common().attr("dtensor_shard")(object);
    if (shard.is_none()) return Keep(object);
    py::object local = Pack(shard[py::int_(0)]);
    if (PyTuple_Check(local.ptr())) return Keep(object);
    const at::Tensor tensor = py::cast<at::Tensor>(shard[py::int_(0)]);
    shard_bytes_ += tensor.numel() * static_cast<int64_t>(tensor.element_size());
    return py::cast(ShardHandle{std::move(local), shard[py::int_(1)]});
  }
  py::object Common() {
    if (common_.is_none()) common_ = py::module::import("actoffload._common");
    return common_;
  }

  bool Offloadable(const at::Tensor& tensor) const {
    if (tensor.layout() != at::kStrided || tensor.numel() == 0 ||
        tensor.device() != session_->device()) {
      return false;
    }
    offload::DType dtype;
    if (!Session::EngineDType(tensor.scalar_type(), &dtype)) return false;
    if (tensor.numel() < min_elements_ ||
        static_cast<int64_t>(tensor.numel() * tensor.element_size()) <
            min_bytes_) {
      return false;
    }
    // Parameters and buffers of the modules the caller named, and their
    // views (one storage).
    if (!model_storages_.empty() &&
        model_storages_.count(tensor.storage().unsafeGetStorageImpl()) > 0) {
      return false;
    }
    if (tensor.is_leaf() && tensor.requires_grad()) return false;
    if (tensor.is_view()) {
      const at::Tensor base(tensor._base().getIntrusivePtr());
      if (base.is_leaf() && base.requires_grad()) return false;
      // A view of a frozen nn.Parameter (weight.t() in F.linear).
      py::object object = py::cast(base);
      if (PyObject_IsInstance(object.ptr(), parameter_type_.ptr()) == 1) {
        return false;
      }
    }
    return true;
  }
  py::object Keep(const py::object& object) {
    return Keep(object, py::cast<at::Tensor>(object));
  }
  // A detached alias (same storage and version counter), never the
  // object itself: an op's saved output holds its node, and a node holding
  // its output through this C++ tuple is a cycle Python's collector cannot
  // see, so the graph would never be freed. Autograd restores the saved
  // tensor's own metadata at unpack.
  py::object Keep(const py::object& object, const at::Tensor& tensor) {
    (void)object;
    return py::make_tuple(
        py::cast(tensor.detach()),
        torch::autograd::impl::version_counter(tensor).current_version());
  }
  // The first call of a backward pass queues the loop's PassEnded at its
  // end (autograd's final callback, as queue_callback from Python).
  void QueuePassEnd() {
    if (pass_queued_) return;
    pass_queued_ = true;
    std::weak_ptr<Loop> weak = weak_from_this();
    try {
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        py::gil_scoped_acquire gil;
        if (std::shared_ptr<Loop> self = weak.lock()) self->PassEnded();
      });
    } catch (const std::exception&) {
      // Not inside a backward pass (a caller driving the hooks itself):
      // the pass stays open until pass_ended() or the next forward.
    }
  }

  std::shared_ptr<Session> session_;  // outlives loop_
  std::unique_ptr<offload::TrainingLoop> loop_;
  const int64_t min_elements_;
  const int64_t min_bytes_;
  PyObject* const tensor_type_;
  const py::object parameter_type_ =
      py::module::import("torch.nn").attr("Parameter");
  py::object common_ = py::none();
  int64_t shard_bytes_ = 0;
  std::unordered_set<const c10::StorageImpl*> model_storages_;
  bool pass_queued_ = false;
  std::vector<std::string> errors_;
  std::string refusal_;
  std::vector<size_t> seen_ = std::vector<size_t>(1, 0);
};

}  // namespace

void BindTrainingLoop(py::module& m) {
  py::class_<LoopRef>(m, "LoopRef")
      .def_property_readonly("iteration",
                             [](const LoopRef& r) { return r.ref.id(); });
  py::class_<ShardHandle>(m, "ShardHandle");
  py::class_<LoopHandle>(m, "LoopHandle")
      .def_property_readonly(
          "layer", [](const LoopHandle& h) { return h.saved.saved().layer(); })
      .def("__repr__", [](const LoopHandle& h) {
        return "<actoffload handle of layer " +
               std::to_string(h.saved.saved().layer()) + ", iteration " +
               std::to_string(h.saved.iteration().id()) + ">";
      });
  py::class_<Loop, std::shared_ptr<Loop>>(m, "TrainingLoop")
      .def(py::init([](std::shared_ptr<Session> session, int model_layers,
                       int offloaded_layers, bool manual, bool retain,
                       int64_t min_offload_elements, int64_t min_offload_bytes,
                       std::optional<int64_t> budget_bytes,
                       bool smallest_budget, int64_t offload_stream,
                       bool warnings_to_stderr,
                       std::optional<std::map<int, std::tuple<bool, int, bool, int>>>
                           schedule) {
             offload::OffloadOptions options;
             options.model_layers = model_layers;
             options.offloaded_layers = offloaded_layers;
             options.manual_synchronization = manual;
             options.retain_pinned_buffers = retain;
             options.min_offload_elements = min_offload_elements;
             options.activation_budget_bytes = budget_bytes;
             options.keep_host_copies = true;
             options.smallest_budget = smallest_budget;
             if (offload_stream != 0) {
               options.offload_stream = session->WrapStream(offload_stream);
             }
             options.warnings_to_stderr = warnings_to_stderr;
             if (schedule.has_value()) {  // SPEC §4.2: layer -> entry
               offload::ScheduleTable table;
               for (const auto& [layer, e] : *schedule) {
                 table[layer] = offload::ScheduleEntry{
                     std::get<0>(e), std::get<1>(e), std::get<2>(e),
                     std::get<3>(e)};
               }
               options.schedule = std::move(table);
             }
             return std::make_shared<Loop>(std::move(session), options,
                                           min_offload_bytes);
           }),
           py::arg("session"), py::arg("model_layers") = 1,
           py::arg("offloaded_layers") = 0, py::arg("manual") = false,
           py::arg("retain") = false, py::arg("min_offload_elements") = 0,
           py::arg("min_offload_bytes") = 0,
           py::arg("budget_bytes") = std::nullopt,
           py::arg("smallest_budget") = false,
           py::arg("offload_stream") = 0,
           py::arg("warnings_to_stderr") = false,
           py::arg("schedule") = std::nullopt)
      .def("forward_step", &Loop::ForwardStep, py::arg("expected") = -1)
      .def("abandon_forward", &Loop::AbandonForward)
      .def("end_forward", &Loop::EndForward)
      .def("end_layer", &Loop::EndLayer)
      .def("set_model_tensors", &Loop::SetModelTensors)
      .def("add_model_tensors", &Loop::AddModelTensors)
      .def("pack", &Loop::Pack)
      .def("unpack", &Loop::Unpack)
      .def("backward_step", &Loop::BackwardStep)
      .def("pass_ended", &Loop::PassEnded)
      .def_property_readonly("pass_open", &Loop::pass_open)
      .def_property_readonly("dtensor_shard_bytes", &Loop::shard_bytes)
      .def("new_warnings", &Loop::NewWarnings)
      .def("manual", &Loop::Manual)
      .def("stats", &Loop::Stats)
      .def("warnings", &Loop::Warnings)
      .def("offloaded_bytes", &Loop::OffloadedBytes)
      .def("pooled_offloaders", &Loop::Pooled)
      .def("live_iterations", &Loop::Live)
      .def("budget_plan_text", &Loop::BudgetPlanText)
      .def("will_offload", &Loop::WillOffload)
      .def("state", &Loop::State);
}

}  // namespace actoffload
