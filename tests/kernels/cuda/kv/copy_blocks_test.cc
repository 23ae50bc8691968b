// CopyBlocks against a host simulation: copy-on-write inside the device
// pool and swap out / in through a pinned host pool, over random copy lists
// that keep block_copy.h's batch invariants. Whole pools are compared byte
// for byte, so blocks no copy names must come through unchanged.
#include "kernels/cuda/kv/copy_blocks.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/plan/block_copy_list.h"
#include "tests/kernels/cuda/device_buffer.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::DeviceBuffer;
using ::kvserve::testing::PinnedBuffer;
using ::kvserve::testing::RequireBadField;
using ::kvserve::testing::RequireOk;

std::vector<uint8_t> RandomBytes(size_t n, std::mt19937_64* rng) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>((*rng)());
  return v;
}

// `count` copies src -> dst with distinct destinations; when same_pool, no
// destination is also a source.
std::vector<BlockCopy> RandomCopies(int32_t count, int32_t src_blocks, int32_t dst_blocks,
                                    bool same_pool, std::mt19937_64* rng) {
  std::vector<int32_t> dsts(dst_blocks);
  std::iota(dsts.begin(), dsts.end(), 0);
  std::shuffle(dsts.begin(), dsts.end(), *rng);
  dsts.resize(count);
  std::vector<int32_t> srcs;
  for (int32_t b = 0; b < src_blocks; ++b) {
    if (!same_pool || std::find(dsts.begin(), dsts.end(), b) == dsts.end()) srcs.push_back(b);
  }
  std::uniform_int_distribution<size_t> pick(0, srcs.size() - 1);
  std::vector<BlockCopy> copies(count);
  for (int32_t i = 0; i < count; ++i)
    copies[i] = {srcs[pick(*rng)], dsts[i]};  // sources may repeat
  return copies;
}

// What the copies do to `dst`, on the host.
void Simulate(const std::vector<BlockCopy>& copies, const uint8_t* src, int32_t src_blocks,
              uint8_t* dst, int32_t dst_blocks, int num_layers, int64_t block_bytes) {
  for (const BlockCopy& c : copies) {
    for (int l = 0; l < num_layers; ++l) {
      std::memcpy(dst + (static_cast<int64_t>(l) * dst_blocks + c.dst) * block_bytes,
                  src + (static_cast<int64_t>(l) * src_blocks + c.src) * block_bytes, block_bytes);
    }
  }
}

struct Pools {
  int num_layers;
  int32_t device_blocks, host_blocks;
  int64_t block_bytes;
  int64_t device_bytes() const { return int64_t{num_layers} * device_blocks * block_bytes; }
  int64_t host_bytes() const { return int64_t{num_layers} * host_blocks * block_bytes; }
};

absl::Status Run(const Pools& pools, const DeviceBuffer& list, int32_t begin, int32_t count,
                 const uint8_t* src, int32_t src_blocks, uint8_t* dst, int32_t dst_blocks) {
  CopyBlocksParams p;
  p.src = src;
  p.dst = dst;
  p.src_num_blocks = src_blocks;
  p.dst_num_blocks = dst_blocks;
  p.num_layers = pools.num_layers;
  p.block_bytes = pools.block_bytes;
  p.copies = list.as<int32_t>(2 * int64_t{begin});
  p.num_copies = count;
  return CopyBlocks(p, nullptr);
}

TEST_CASE("CopyBlocks runs a step's swap-out, copy-on-write and swap-in batches", "[gpu]") {
  std::mt19937_64 rng(3);
  for (const Pools& pools :
       {Pools{3, 40, 24, 448}, Pools{5, 64, 16, 4160}, Pools{1, 5000, 64, 64}}) {
    INFO("layers " << pools.num_layers << " blocks " << pools.device_blocks << "/"
                   << pools.host_blocks << " block_bytes " << pools.block_bytes);
    for (int round = 0; round < 4; ++round) {
      const int32_t n = round == 0 ? 1 : std::min<int32_t>(pools.host_blocks / 2, 7 * round);
      StepCopies step;
      step.swap_out = RandomCopies(n, pools.device_blocks, pools.host_blocks, false, &rng);
      step.copies = RandomCopies(round == 3 ? std::min(pools.device_blocks / 3, 1500) : n,
                                 pools.device_blocks, pools.device_blocks, true, &rng);
      step.swap_in = RandomCopies(n, pools.host_blocks, pools.device_blocks, false, &rng);
      const absl::StatusOr<PackedStepCopies> packed =
          PackStepCopies(step, pools.device_blocks, pools.host_blocks);
      RequireOk(packed.status());

      std::vector<uint8_t> device = RandomBytes(pools.device_bytes(), &rng);
      std::vector<uint8_t> host = RandomBytes(pools.host_bytes(), &rng);
      DeviceBuffer d_pool(device.size()), d_list(CopyListBytes(packed->pairs.size()) + 8);
      PinnedBuffer h_pool(host.size());
      d_pool.Upload(device);
      std::memcpy(h_pool.data(), host.data(), host.size());
      REQUIRE_CUDA(cudaMemcpy(d_list.as<uint8_t>(), packed->pairs.data(),
                              CopyListBytes(packed->pairs.size()), cudaMemcpyHostToDevice));
      const absl::StatusOr<uint8_t*> h_dev = MappedDevicePointer(h_pool.data());
      RequireOk(h_dev.status());

      // Expected, in the step's order.
      Simulate(step.swap_out, device.data(), pools.device_blocks, host.data(), pools.host_blocks,
               pools.num_layers, pools.block_bytes);
      Simulate(step.copies, device.data(), pools.device_blocks, device.data(), pools.device_blocks,
               pools.num_layers, pools.block_bytes);
      Simulate(step.swap_in, host.data(), pools.host_blocks, device.data(), pools.device_blocks,
               pools.num_layers, pools.block_bytes);

      RequireOk(Run(pools, d_list, packed->swap_out_begin, packed->num_swap_out,
                    d_pool.as<uint8_t>(), pools.device_blocks, *h_dev, pools.host_blocks));
      RequireOk(Run(pools, d_list, packed->copies_begin, packed->num_copies, d_pool.as<uint8_t>(),
                    pools.device_blocks, d_pool.as<uint8_t>(), pools.device_blocks));
      RequireOk(Run(pools, d_list, packed->swap_in_begin, packed->num_swap_in, *h_dev,
                    pools.host_blocks, d_pool.as<uint8_t>(), pools.device_blocks));
      REQUIRE_CUDA(cudaDeviceSynchronize());
      INFO("round " << round << " copies " << n);
      REQUIRE(std::memcmp(h_pool.data(), host.data(), host.size()) == 0);
      REQUIRE(d_pool.Download<uint8_t>(device.size()) == device);
    }
  }
}

TEST_CASE("CopyBlocks skips pairs naming a block outside its pool", "[gpu]") {
  const Pools pools{2, 4, 4, 64};
  std::mt19937_64 rng(4);
  const std::vector<uint8_t> device = RandomBytes(pools.device_bytes(), &rng);
  DeviceBuffer d_pool(device.size()), d_list(CopyListBytes(4));
  d_pool.Upload(device);
  d_list.Upload(std::vector<int32_t>{-1, 0, 4, 1, 0, 4, 2, -7});
  RequireOk(Run(pools, d_list, 0, 4, d_pool.as<uint8_t>(), pools.device_blocks,
                d_pool.as<uint8_t>(), pools.device_blocks));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  REQUIRE(d_pool.Download<uint8_t>(device.size()) == device);
}

TEST_CASE("CopyBlocks rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(4096);
  CopyBlocksParams p;
  p.src = p.dst = buffer.as<uint8_t>();
  p.src_num_blocks = p.dst_num_blocks = 4;
  p.num_layers = 2;
  p.block_bytes = 64;
  p.copies = buffer.as<int32_t>(512);
  p.num_copies = 1;
  SECTION("block_bytes") {
    p.block_bytes = 72;
    RequireBadField(CopyBlocks(p, nullptr), "block_bytes");
  }
  SECTION("num_layers") {
    p.num_layers = 0;
    RequireBadField(CopyBlocks(p, nullptr), "num_layers");
  }
  SECTION("misaligned pool") {
    p.dst = buffer.as<uint8_t>(8);
    RequireBadField(CopyBlocks(p, nullptr), "dst");
  }
  SECTION("zero copies launch nothing") {
    p.num_copies = 0;
    p.copies = nullptr;
    RequireOk(CopyBlocks(p, nullptr));
  }
  SECTION("a pageable host pointer is not a swap pool") {
    std::vector<uint8_t> pageable(4096);
    RequireBadField(MappedDevicePointer(pageable.data()).status(), "pinned");
    REQUIRE_CUDA(cudaGetLastError());  // the failed query leaves no error behind
  }
}

}  // namespace
}  // namespace kvserve::cuda
