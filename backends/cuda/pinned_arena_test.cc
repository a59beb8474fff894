#include "backends/cuda/pinned_arena.h"

#include <cstdint>
#include <map>
#include <optional>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload {
namespace {

using ::testing::ElementsAre;
using ::testing::Optional;
using ::testing::Pair;

constexpr uintptr_t kBase = uintptr_t{1} << 32;

TEST(PinnedArenaTest, SplitsBestFitAndMerges) {
  PinnedArena arena(256);
  arena.AddSlab(kBase, 4096);
  std::optional<uintptr_t> a = arena.Allocate(1000);  // 1024
  std::optional<uintptr_t> b = arena.Allocate(256);
  std::optional<uintptr_t> c = arena.Allocate(512);
  EXPECT_THAT(a, Optional(kBase));
  EXPECT_THAT(b, Optional(kBase + 1024));
  EXPECT_THAT(c, Optional(kBase + 1280));
  EXPECT_EQ(arena.used_bytes(), 1792);
  EXPECT_EQ(arena.largest_free_chunk(), 4096 - 1792);
  // Free b: a 256-byte hole; the best fit for 200 bytes is the hole.
  EXPECT_TRUE(arena.Free(*b));
  EXPECT_THAT(arena.Allocate(200), Optional(kBase + 1024));
  EXPECT_FALSE(arena.Free(kBase + 1));  // not a chunk start
  EXPECT_TRUE(arena.Free(kBase + 1024));
  EXPECT_FALSE(arena.Free(kBase + 1024));  // already free
  EXPECT_TRUE(arena.Free(*a));
  EXPECT_TRUE(arena.Free(*c));
  EXPECT_EQ(arena.used_bytes(), 0);
  EXPECT_EQ(arena.largest_free_chunk(), 4096);  // merged back into one
  EXPECT_EQ(arena.allocated_chunks(), 0);
}

TEST(PinnedArenaTest, ContainsChecksRequestedBytes) {
  PinnedArena arena(256);
  arena.AddSlab(kBase, 4096);
  std::optional<uintptr_t> a = arena.Allocate(1000);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(arena.Contains(*a, 1000));
  EXPECT_TRUE(arena.Contains(*a + 10, 990));
  EXPECT_FALSE(arena.Contains(*a + 10, 991));
  EXPECT_FALSE(arena.Contains(*a, 1001));      // rounding slack is not usable
  EXPECT_FALSE(arena.Contains(kBase + 2048, 1));  // free memory
  EXPECT_FALSE(arena.Contains(kBase - 1, 1));     // outside every slab
}

TEST(PinnedArenaTest, SlabsDoNotMergeAndEmptyOnesCanBeRemoved) {
  PinnedArena arena(256);
  arena.AddSlab(kBase, 1024);
  arena.AddSlab(kBase + 1024, 1024);  // adjacent, but another slab
  EXPECT_EQ(arena.slab_count(), 2);
  EXPECT_EQ(arena.Allocate(2048), std::nullopt);
  std::optional<uintptr_t> a = arena.Allocate(1024);
  ASSERT_TRUE(a.has_value());
  EXPECT_THAT(arena.RemoveEmptySlabs(),
              ElementsAre(Pair(*a == kBase ? kBase + 1024 : kBase, 1024)));
  EXPECT_EQ(arena.slab_count(), 1);
  EXPECT_EQ(arena.slab_bytes(), 1024);
  EXPECT_TRUE(arena.Free(*a));
  EXPECT_EQ(arena.RemoveEmptySlabs().size(), 1u);
  EXPECT_EQ(arena.slab_bytes(), 0);
  EXPECT_EQ(arena.Allocate(1), std::nullopt);
}

// Random allocations and frees against a model: live chunks never overlap,
// stay inside their slab, and the byte counts add up; freeing everything
// merges each slab back into one chunk.
TEST(PinnedArenaTest, RandomOperationsKeepChunksDisjoint) {
  std::mt19937_64 rng(7);
  PinnedArena arena(256);
  const int64_t slab = 1 << 20;
  for (int i = 0; i < 4; ++i) arena.AddSlab(kBase + i * 2 * slab, slab);
  std::map<uintptr_t, int64_t> live;  // address -> rounded size
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const int64_t bytes = 1 + static_cast<int64_t>(rng() % (96 << 10));
      std::optional<uintptr_t> address = arena.Allocate(bytes);
      if (!address.has_value()) {
        EXPECT_LT(arena.largest_free_chunk(), (bytes + 255) / 256 * 256);
        continue;
      }
      EXPECT_EQ(*address % 256, 0u);
      const int64_t rounded = (bytes + 255) / 256 * 256;
      const uintptr_t slab_base =
          kBase + (*address - kBase) / (2 * slab) * (2 * slab);
      EXPECT_LE(*address + rounded, slab_base + slab);
      auto next = live.lower_bound(*address);
      if (next != live.end()) {
        ASSERT_LE(*address + rounded, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *address);
      }
      EXPECT_TRUE(arena.Contains(*address, bytes));
      live[*address] = rounded;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      EXPECT_TRUE(arena.Free(it->first));
      live.erase(it);
    }
    int64_t used = 0;
    for (const auto& [address, size] : live) used += size;
    ASSERT_EQ(arena.used_bytes(), used);
  }
  for (const auto& [address, size] : live) EXPECT_TRUE(arena.Free(address));
  EXPECT_EQ(arena.used_bytes(), 0);
  EXPECT_EQ(arena.largest_free_chunk(), slab);
  EXPECT_EQ(arena.RemoveEmptySlabs().size(), 4u);
}

}  // namespace
}  // namespace offload
