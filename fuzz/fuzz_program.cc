#include "fuzz/fuzz_program.h"

#include <climits>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

namespace offload::fuzz {
namespace {

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> data) : data_(data) {}
  bool empty() const { return pos_ >= data_.size(); }
  int Byte() { return empty() ? 0 : data_[pos_++]; }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// A layer argument: mostly in [0, layers] (layers itself is out of range),
// sometimes far out.
int Layer(int b, int layers) {
  static constexpr int kFar[] = {-1, INT_MIN, INT_MAX, 1000};
  return b < 0xF0 ? b % (layers + 1) : kFar[b % 4];
}

// (fwd, num) of a schedule step of an n-layer model (schedule.h).
std::pair<bool, int> FromStep(int step, int n) {
  return step <= n ? std::pair{true, step} : std::pair{false, step - n};
}

ScheduleTable DecodeTable(ByteReader& in, int n) {
  ScheduleTable table;
  int mask = in.Byte();
  if ((mask & 0x80) == 0) mask &= (1 << n) - 1;
  for (int layer = 0; layer < 8; ++layer) {
    if ((mask & (1 << layer)) == 0) continue;
    const int r = in.Byte(), q = in.Byte();
    ScheduleEntry entry;
    if ((q & 0x80) != 0 || layer >= n) {  // raw: often invalid
      entry = {(r & 1) != 0, (r >> 1) % (n + 2), (q & 1) != 0,
               (q >> 1) % (n + 2)};
    } else {  // valid (schedule.h): own forward < release <= reload <= own
              // backward
      const int last = 2 * n - layer;
      const int release = layer + 2 + r % (last - layer - 1);
      const int reload = release + q % (last - release + 1);
      std::tie(entry.offload_fwd, entry.offload_num) = FromStep(release, n);
      std::tie(entry.reload_fwd, entry.reload_num) = FromStep(reload, n);
    }
    table[layer] = entry;
  }
  return table;
}

TensorSpec DecodeTensor(ByteReader& in) {
  TensorSpec spec;
  const int k = in.Byte();
  spec.kind = static_cast<TensorKind>(k & 7);
  spec.hold = (k & 8) != 0;
  spec.ready_event = (k & 16) != 0;
  if (spec.kind == TensorKind::kFlagged) {
    spec.flags.parameter = (k & 32) != 0;
    spec.flags.weight = (k & 64) != 0;
    spec.flags.do_not_offload = (k & 128) != 0 || (k & 96) == 0;
  }
  spec.rows = 1 + in.Byte() % 64;
  spec.cols = 1 + in.Byte() % 64;
  const int d = in.Byte();
  spec.dtype = static_cast<DType>(d & 7);
  spec.extra = d >> 3;
  return spec;
}

}  // namespace

FuzzProgram DecodeProgram(std::span<const uint8_t> data) {
  ByteReader in(data);
  FuzzProgram program;
  program.sim_seed = in.Byte();
  for (auto& [skip, count] : program.faults) {
    skip = in.Byte();
    count = in.Byte() % 4;
  }
  int layers = 1;  // of the latest Create, for layer arguments
  while (!in.empty() && program.ops.size() < kMaxOps) {
    FuzzOp op;
    op.kind = static_cast<FuzzOp::Kind>(in.Byte() % FuzzOp::kNumKinds);
    switch (op.kind) {
      case FuzzOp::Kind::kCreate: {
        static constexpr int64_t kMinElements[] = {0,   1,    16,   64,
                                                   256, 1024, 4096, -1};
        static constexpr double kCoverage[] = {0.5, 0.0, 0.25, 0.75, 1.0, 1.5};
        const int flags = in.Byte();
        OffloadOptions& o = op.options;
        o.enabled = (flags & 0xE0) != 0xE0;
        o.manual_synchronization = (flags & 1) != 0;
        o.retain_pinned_buffers = (flags & 2) != 0;
        o.skip_sparse_views = (flags & 4) != 0;
        op.offload_stream = (flags & 16) != 0;
        o.model_layers = layers = 1 + in.Byte() % 8;
        o.offloaded_layers = in.Byte() % 10 - 1;
        o.min_offload_elements = kMinElements[in.Byte() % 8];
        o.min_span_coverage = kCoverage[in.Byte() % 6];
        if ((flags & 8) != 0) o.schedule = DecodeTable(in, layers);
        // One of the enabled patterns of the top bits asks for a byte
        // budget (SPEC §4.7) instead.
        if ((flags & 0xE0) == 0xC0) {
          o.activation_budget_bytes = 1 + int64_t{in.Byte()} * 4096;
        }
        break;
      }
      case FuzzOp::Kind::kBackwardStep:
      case FuzzOp::Kind::kStartOffload:
      case FuzzOp::Kind::kReleaseForwardMemory:
      case FuzzOp::Kind::kStartReload:
        op.arg = Layer(in.Byte(), layers);
        break;
      case FuzzOp::Kind::kPush:
        op.tensors.push_back(DecodeTensor(in));
        break;
      case FuzzOp::Kind::kPushComposite: {
        const int b = in.Byte();
        op.metadata.resize(b >> 5);
        for (uint8_t& m : op.metadata) m = static_cast<uint8_t>(in.Byte());
        for (int i = 0; i < 1 + (b & 3) % 3; ++i) {
          op.present.push_back(((b >> 2) & (1 << i)) != 0);
          if (op.present.back()) op.tensors.push_back(DecodeTensor(in));
        }
        break;
      }
      case FuzzOp::Kind::kPop:
      case FuzzOp::Kind::kPopComposite:
      case FuzzOp::Kind::kRunFor:
        op.arg = in.Byte();
        break;
      case FuzzOp::Kind::kArmFault:
        op.arg = in.Byte() % kNumFaultKinds;
        op.skip = in.Byte();
        op.count = in.Byte() % 4;
        break;
      default:
        break;
    }
    program.ops.push_back(std::move(op));
  }
  return program;
}

std::string FuzzOp::ToString() const {
  static constexpr const char* kNames[] = {
      "Create",         "Destroy",      "ForwardStep",          "BackwardStep",
      "FinishBackward", "Push",         "PushComposite",        "Pop",
      "PopComposite",   "StartOffload", "ReleaseForwardMemory", "StartReload",
      "ArmFault",       "RunFor"};
  std::string s = kNames[static_cast<int>(kind)];
  if (kind == Kind::kCreate) {
    const OffloadOptions& o = options;
    char buffer[160];
    std::snprintf(buffer, sizeof(buffer),
                  "(enabled=%d layers=%d k=%d manual=%d retain=%d "
                  "skip_sparse=%d min_elements=%lld coverage=%.2f stream=%d",
                  o.enabled, o.model_layers, o.offloaded_layers,
                  o.manual_synchronization, o.retain_pinned_buffers,
                  o.skip_sparse_views,
                  static_cast<long long>(o.min_offload_elements),
                  o.min_span_coverage, offload_stream);
    s += buffer;
    for (const auto& [layer, e] : o.schedule.value_or(ScheduleTable{})) {
      std::snprintf(buffer, sizeof(buffer), " %d:%c%d%c%d", layer,
                    e.offload_fwd ? 'F' : 'B', e.offload_num,
                    e.reload_fwd ? 'F' : 'B', e.reload_num);
      s += buffer;
    }
    return s + ")";
  }
  for (const TensorSpec& t : tensors) {
    char buffer[96];
    std::snprintf(buffer, sizeof(buffer),
                  " {kind=%d hold=%d ready=%d %lldx%lld %s extra=%d}",
                  static_cast<int>(t.kind), t.hold, t.ready_event,
                  static_cast<long long>(t.rows),
                  static_cast<long long>(t.cols),
                  std::string(DTypeName(t.dtype)).c_str(), t.extra);
    s += buffer;
  }
  if (kind == Kind::kArmFault) {
    return s + "(kind=" + std::to_string(arg) +
           " skip=" + std::to_string(skip) + " count=" + std::to_string(count) +
           ")";
  }
  return tensors.empty() ? s + "(" + std::to_string(arg) + ")" : s;
}

}  // namespace offload::fuzz
