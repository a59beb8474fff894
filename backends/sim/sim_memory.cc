// SimBackend, part 2 of 5: blocks of simulated memory, allocation and free,
// and the memory statistics that follow device time. (Graph memory during a
// capture is reserved by sim_graph.cc.)

#include "backends/sim/sim_backend.h"

#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>

namespace offload {
namespace {

constexpr int64_t kDeviceAlignment = 256;

std::string Bytes(int64_t n) { return std::to_string(n) + " B"; }

}  // namespace

uintptr_t SimBackend::ReserveDeviceAddress(int64_t size) {
  uintptr_t address = next_device_address_;
  // A gap after every block: an off-by-one range never lands in the next.
  next_device_address_ +=
      (size + 2 * kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  return address;
}

SimBackend::Block& SimBackend::NewBlock(MemorySpace space, int64_t size,
                                       uintptr_t address) {
  Block block;
  block.id = next_block_id_++;
  block.space = space;
  block.size = size;
  if (space == MemorySpace::kDevice) {
    if (address != 0) {
      // Graph memory: a launch's block at the capture's reserved address.
      // The previous one keeps its bytes for its pending work.
      block.address = address;
      auto it = blocks_.find(address);
      if (it != blocks_.end()) {
        if (it->second.bytes != nullptr) {
          superseded_.emplace(it->second.id, std::move(it->second));
        }
        blocks_.erase(it);
      }
    } else {
      block.address = ReserveDeviceAddress(size);
    }
    if (options_.store_bytes) {
      block.bytes.reset(new uint8_t[size]);
      std::memset(block.bytes.get(), kPoisonByte, size);
    }
  } else {
    // REQUIRES (checked by the caller): the allocation succeeded.
    block.bytes.reset(new (std::nothrow) uint8_t[size]);
    block.address = reinterpret_cast<uintptr_t>(block.bytes.get());
    // The host may hand out the address of a freed pinned block again: forget
    // stale records that overlap it.
    auto it = blocks_.lower_bound(block.address);
    if (it != blocks_.begin()) --it;
    while (it != blocks_.end() && it->first < block.address + size) {
      if (it->second.freed && it->second.bytes == nullptr &&
          it->first + it->second.size > block.address) {
        it = blocks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const uintptr_t start = block.address;
  return blocks_.emplace(start, std::move(block)).first->second;
}

StatusOr<SimBackend::Location> SimBackend::Resolve(const void* data,
                                                   int64_t bytes,
                                                   std::string_view role,
                                                   int stream) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  auto it = blocks_.upper_bound(address);
  if (it != blocks_.begin()) {
    --it;
    Block& block = it->second;
    if (address - block.address + static_cast<uint64_t>(bytes) <=
        static_cast<uint64_t>(block.size)) {
      if (block.reserved &&
          (capture_ == nullptr || capture_->id != block.graph ||
           stream < 0 || CaptureSlot(stream) < 0)) {
        return InvalidArgumentError(
            std::string(role) + " range of " + Bytes(bytes) + " is in " +
            block.Name() + ", device memory reserved by the capture of graph#" +
            std::to_string(block.graph) +
            ": only that capture's streams may use it (its launches "
            "allocate it)");
      }
      return Location{&block, static_cast<int64_t>(address - block.address)};
    }
  }
  return InvalidArgumentError(std::string(role) + " range of " + Bytes(bytes) +
                              " is not inside one allocation of this "
                              "simulated backend");
}

SimBackend::Block* SimBackend::FindBlock(uintptr_t address, uint64_t id) {
  auto it = blocks_.find(address);
  if (it != blocks_.end() && it->second.id == id) return &it->second;
  auto old = superseded_.find(id);
  return old != superseded_.end() ? &old->second : nullptr;
}

void SimBackend::AddLive(MemorySpace space, int64_t delta) {
  SimMemoryStats& stats = stats_[SpaceIndex(space)];
  stats.live_bytes += delta;
  if (stats.live_bytes > stats.peak_bytes) {
    stats.peak_bytes = stats.live_bytes;
    stats.peak_time_ns = now_ns_;
  }
}

StatusOr<Buffer> SimBackend::AllocateDevice(int64_t bytes, Stream& stream) {
  int s = StreamIndex(stream);
  if (s < 0) {
    return InvalidArgumentError("AllocateDevice: stream '" +
                                std::string(stream.name()) +
                                "' belongs to another backend");
  }
  if (bytes <= 0) {
    return InvalidArgumentError("AllocateDevice on stream '" +
                                std::string(stream.name()) +
                                "': byte count must be positive, got " +
                                std::to_string(bytes));
  }
  if (CaptureSlot(s) >= 0) return AllocateInCapture(s, stream, bytes);
  // Memory whose free is still pending on this same stream is reusable: the
  // allocation is ordered after that free.
  int64_t available = DeviceAvailable(s);
  if (bytes > available) {
    return ResourceExhaustedError(
        "AllocateDevice on stream '" + std::string(stream.name()) + "': " +
        Bytes(bytes) + " requested, " + Bytes(available) + " of " +
        Bytes(options_.device_capacity_bytes) +
        " device memory available to this stream");
  }
  Block& block = EnqueueAllocation(s, bytes);
  return MakeBuffer(reinterpret_cast<void*>(block.address), bytes,
                    MemorySpace::kDevice, &stream);
}

int64_t SimBackend::DeviceBytesInUse() const {
  int64_t bytes = held_bytes_[0];
  for (const auto& [stream, pending] : pending_free_[0]) bytes -= pending;
  return bytes;
}

SimBackend::Block& SimBackend::EnqueueAllocation(int s, int64_t bytes,
                                                 uintptr_t address,
                                                 uint64_t graph) {
  Block& block = NewBlock(MemorySpace::kDevice, bytes, address);
  block.graph = graph;
  held_bytes_[0] += bytes;
  in_use_probe_.Note(DeviceBytesInUse());
  ++stats_[0].allocations;
  Op op;
  op.desc.kind = SimOpKind::kAlloc;
  op.desc.dst = block.Ref(0);
  op.desc.bytes = bytes;
  op.on_end = [this, bytes, graph, address = block.address, id = block.id] {
    AddLive(MemorySpace::kDevice, bytes);
    if (graph != 0) graph_live_[address] = id;
  };
  AccessOp ref = Enqueue(s, std::move(op), nullptr);
  detector_.OnAllocate(block.id, block.Name(), std::move(ref));
  return block;
}

StatusOr<Buffer> SimBackend::AllocatePinned(int64_t bytes) {
  if (bytes <= 0) {
    return InvalidArgumentError(
        "AllocatePinned: byte count must be positive, got " +
        std::to_string(bytes));
  }
  if (capture_ != nullptr) {
    return FailedPreconditionError("AllocatePinned of " + Bytes(bytes) +
                                   ": " + CaptureWhere() +
                                   "; pinned allocations are refused then");
  }
  int64_t available = options_.pinned_capacity_bytes - held_bytes_[1];
  if (bytes > available) {
    return ResourceExhaustedError(
        "AllocatePinned: " + Bytes(bytes) + " requested, " + Bytes(available) +
        " of " + Bytes(options_.pinned_capacity_bytes) +
        " pinned memory available");
  }
  // Probe the host allocation before touching any state.
  std::unique_ptr<uint8_t[]> probe(new (std::nothrow) uint8_t[bytes]);
  if (probe == nullptr) {
    return ResourceExhaustedError("AllocatePinned: the host cannot provide " +
                                  Bytes(bytes));
  }
  probe.reset();
  Block& block = NewBlock(MemorySpace::kPinnedHost, bytes);
  if (block.bytes == nullptr) {
    blocks_.erase(block.address);
    return ResourceExhaustedError("AllocatePinned: the host cannot provide " +
                                  Bytes(bytes));
  }
  held_bytes_[1] += bytes;
  ++stats_[1].allocations;
  AddLive(MemorySpace::kPinnedHost, bytes);
  SimTraceEntry desc;
  desc.kind = SimOpKind::kAlloc;
  desc.dst = block.Ref(0);
  desc.bytes = bytes;
  AccessOp ref = HostOp(std::move(desc));
  detector_.OnAllocate(block.id, block.Name(), std::move(ref));
  return MakeBuffer(block.bytes.get(), bytes, MemorySpace::kPinnedHost,
                    nullptr);
}

Status SimBackend::Release(void* data, int64_t size, MemorySpace space,
                           Stream* stream) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data);
  auto it = blocks_.find(address);
  if (it != blocks_.end() && it->second.graph != 0 &&
      it->second.size == size && it->second.space == space) {
    return ReleaseGraphMemory(it->second, stream);
  }
  if (it == blocks_.end() || it->second.freed || it->second.size != size ||
      it->second.space != space) {
    return InvalidArgumentError("Free: " + Bytes(size) + " of " +
                                std::string(MemorySpaceName(space)) +
                                " memory is not a live allocation of this "
                                "simulated backend");
  }
  Block& block = it->second;
  int sp = SpaceIndex(space);
  if (space == MemorySpace::kPinnedHost && capture_ != nullptr) {
    return FailedPreconditionError("Free of " + block.Name() + ": " +
                                   CaptureWhere() +
                                   "; pinned frees are refused then");
  }
  if (stream == nullptr) {
    if (space == MemorySpace::kDevice) {
      return InvalidArgumentError("Free of " + block.Name() +
                                  ": device memory is freed on a stream");
    }
    block.freed = true;
    SimTraceEntry desc;
    desc.kind = SimOpKind::kFree;
    desc.dst = block.Ref(0);
    desc.bytes = size;
    AccessOp ref = HostOp(std::move(desc));
    detector_.OnFree(block.id, ref, host_clock_);
    held_bytes_[sp] -= size;
    AddLive(space, -size);
    block.bytes.reset();
    return OkStatus();
  }
  int s = StreamIndex(*stream);
  if (s < 0) {
    return InvalidArgumentError("Free of " + block.Name() + ": stream '" +
                                std::string(stream->name()) +
                                "' belongs to another backend");
  }
  if (CaptureSlot(s) >= 0) {
    return FailedPreconditionError(
        "Free of " + block.Name() + " on stream '" + streams_[s].name +
        "': " + CaptureWhere() +
        "; memory allocated outside the capture is not freed by a graph "
        "in the simulator (free it on a stream that does not capture)");
  }
  EnqueueFree(block, s);
  return OkStatus();
}

void SimBackend::EnqueueFree(Block& block, int s) {
  const uintptr_t address = block.address;
  const int64_t size = block.size;
  const MemorySpace space = block.space;
  const int sp = SpaceIndex(space);
  block.freed = true;
  pending_free_[sp][s] += size;
  Op op;
  op.desc.kind = SimOpKind::kFree;
  op.desc.dst = block.Ref(0);
  op.desc.bytes = size;
  uint64_t id = block.id;
  op.on_end = [this, address, id, size, space, sp, s] {
    pending_free_[sp][s] -= size;
    held_bytes_[sp] -= size;
    AddLive(space, -size);
    if (Block* gone = FindBlock(address, id)) gone->bytes.reset();
    superseded_.erase(id);
    auto live = graph_live_.find(address);
    if (live != graph_live_.end() && live->second == id) {
      graph_live_.erase(live);
    }
  };
  VectorClock clock;
  AccessOp ref = Enqueue(s, std::move(op), &clock);
  detector_.OnFree(id, ref, clock);
}

StatusOr<uint8_t*> SimBackend::MutableBytes(const void* data, int64_t bytes) {
  if (bytes < 0) return InvalidArgumentError("MutableBytes: negative size");
  auto reserved = blocks_.upper_bound(reinterpret_cast<uintptr_t>(data));
  if (reserved != blocks_.begin() && (--reserved)->second.reserved &&
      reinterpret_cast<uintptr_t>(data) <
          reserved->first + reserved->second.size) {
    return FailedPreconditionError(
        "MutableBytes: " + reserved->second.Name() +
        " is graph memory no launch has allocated; it holds no bytes");
  }
  OFFLOAD_ASSIGN_OR_RETURN(Location at,
                           Resolve(data, bytes, "MutableBytes", -1));
  if (at.block->graph != 0) {
    // Launches allocate graph memory at one address: the bytes are those of
    // the launch whose allocation ran last in device time.
    auto live = graph_live_.find(at.block->address);
    Block* block = live == graph_live_.end()
                       ? nullptr
                       : FindBlock(at.block->address, live->second);
    if (block == nullptr) {
      return FailedPreconditionError(
          "MutableBytes: " + at.block->Name() + ", memory of graph#" +
          std::to_string(at.block->graph) +
          ", is not allocated at this device time");
    }
    at.block = block;
  }
  // The bytes exist until the free reaches its stream (device time).
  if (at.block->bytes == nullptr && at.block->freed) {
    return InvalidArgumentError("MutableBytes: " + at.block->Name() +
                                " has been freed");
  }
  if (at.block->bytes == nullptr) {
    return FailedPreconditionError("MutableBytes: " + at.block->Name() +
                                   " holds no bytes (store_bytes is false)");
  }
  return at.block->bytes.get() + at.offset;
}

}  // namespace offload
