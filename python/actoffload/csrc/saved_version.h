// Autograd's in-place check for tensors the saved-tensor hooks took: hooks
// bypass autograd's own, so each saved tensor remembers its version counter
// (shared by its views) and its value at the pack, and the unpack raises
// autograd's error if it moved.

#ifndef ACTOFFLOAD_CSRC_SAVED_VERSION_H_
#define ACTOFFLOAD_CSRC_SAVED_VERSION_H_

#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace actoffload {

struct SavedVersion {
  at::ScalarType dtype = at::kFloat;
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  uint32_t saved_version = 0;
  std::vector<int64_t> shape;

  static SavedVersion Of(const at::Tensor& tensor) {
    SavedVersion out;
    out.dtype = tensor.scalar_type();
    out.version = torch::autograd::impl::version_counter(tensor);
    out.saved_version = out.version.current_version();
    out.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    return out;
  }

  // Throws autograd's RuntimeError if the tensor was modified in place
  // since the pack.
  void Check() const {
    if (!version.enabled()) return;
    const uint32_t now = version.current_version();
    if (now == saved_version) return;
    std::string dims;
    for (int64_t size : shape) {
      dims += (dims.empty() ? "" : ", ") + std::to_string(size);
    }
    throw std::runtime_error(
        "one of the variables needed for gradient computation has been "
        "modified by an inplace operation: a saved tensor [" +
        std::string(c10::toString(dtype)) + " [" + dims +
        "]] offloaded by actoffload is at version " + std::to_string(now) +
        "; expected version " + std::to_string(saved_version) + " instead.");
  }
};

}  // namespace actoffload

#endif  // ACTOFFLOAD_CSRC_SAVED_VERSION_H_
