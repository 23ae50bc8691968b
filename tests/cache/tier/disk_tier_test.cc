#include "cache/tier/disk_tier.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <numeric>
#include <string>
#include <vector>

#include "cache/tier/disk_loader.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

const TierIdentity kId{
    .model_fingerprint = 0x77, .kv_format = 0x88, .block_size = 4, .payload_bytes = 64};

struct Block {
  std::vector<int32_t> tokens;
  TierBlockKey key;
  std::string value;
};

Block MakeBlock(BlockHash hash, int32_t first_token) {
  Block b;
  b.tokens = {first_token, first_token + 1, first_token + 2, first_token + 3};
  b.key = {.hash = hash, .parent = hash - 1, .extra_key = 0, .tokens = b.tokens};
  std::vector<uint8_t> payload(64);
  std::iota(payload.begin(), payload.end(), static_cast<uint8_t>(first_token));
  b.value = EncodeBlockValue(kId, b.key, payload);
  return b;
}

// Room for exactly n slots (4096 bytes each, 24-byte index records).
int64_t Slots(int n) { return int64_t{n} * (4096 + 24); }

TEST_CASE("The disk tier keeps its blocks across a reopen of its file", "[cache][tier]") {
  const std::string path = testing::MakeTempDir("disk_tier") + "/kv.tier";
  Block a = MakeBlock(100, 1), b = MakeBlock(200, 5);
  {
    auto disk = DiskTier::Open(path, Slots(3), kId);
    REQUIRE(disk.ok());
    REQUIRE((*disk)->num_slots() == 3);
    REQUIRE((*disk)->num_restored() == 0);
    REQUIRE((*disk)->Put(100, a.value));
    REQUIRE((*disk)->Put(200, b.value));
  }
  auto disk = DiskTier::Open(path, Slots(3), kId);
  REQUIRE(disk.ok());
  REQUIRE((*disk)->num_restored() == 2);
  TierReject reject;
  auto got = (*disk)->Get(b.key, &reject);
  REQUIRE(got != nullptr);
  REQUIRE(*got == b.value);
  REQUIRE(reject == TierReject::kNone);

  SECTION("another identity starts the file afresh and reads nothing of it") {
    TierIdentity other = kId;
    other.model_fingerprint = 0x78;
    disk->reset();
    auto foreign = DiskTier::Open(path, Slots(3), other);
    REQUIRE(foreign.ok());
    REQUIRE((*foreign)->num_restored() == 0);
    REQUIRE((*foreign)->Get(a.key, &reject) == nullptr);
  }
  SECTION("the least recently used slot is reused when the file is full") {
    REQUIRE((*disk)->Get(a.key, &reject) != nullptr);  // a is now newer than b
    Block c = MakeBlock(300, 9), d = MakeBlock(400, 13);
    REQUIRE((*disk)->Put(300, c.value));
    REQUIRE((*disk)->Put(400, d.value));
    REQUIRE((*disk)->size() == 3);
    REQUIRE_FALSE((*disk)->Contains(200));
    REQUIRE((*disk)->Contains(100));
  }
}

TEST_CASE("A corrupt disk slot is rejected and dropped", "[cache][tier]") {
  const std::string path = testing::MakeTempDir("disk_tier") + "/kv.tier";
  Block a = MakeBlock(100, 1);
  auto disk = DiskTier::Open(path, Slots(2), kId);
  REQUIRE(disk.ok());
  REQUIRE((*disk)->Put(100, a.value));
  // Flip one payload byte of slot 0 (data after the header page and index page).
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const int64_t off = 4096 + 4096 + static_cast<int64_t>(a.value.size()) - 3;
  char byte;
  REQUIRE(pread(fd, &byte, 1, off) == 1);
  byte ^= 0x40;
  REQUIRE(pwrite(fd, &byte, 1, off) == 1);
  ::close(fd);
  TierReject reject;
  REQUIRE((*disk)->Get(a.key, &reject) == nullptr);
  REQUIRE(reject == TierReject::kCorrupt);
  REQUIRE_FALSE((*disk)->Contains(100));
  // Dropped on disk too: a reopen does not list it.
  disk->reset();
  auto again = DiskTier::Open(path, Slots(2), kId);
  REQUIRE(again.ok());
  REQUIRE((*again)->num_restored() == 0);
}

TEST_CASE("A disk tier smaller than one slot is refused naming its key", "[cache][tier]") {
  const std::string path = testing::MakeTempDir("disk_tier") + "/kv.tier";
  auto disk = DiskTier::Open(path, 4000, kId);
  REQUIRE(disk.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(disk.status().message()).find("cache.disk_tier_bytes") == 0);
}

TEST_CASE("A failing write turns the disk tier off once with its reason", "[cache][tier]") {
  const std::string path = testing::MakeTempDir("disk_tier") + "/kv.tier";
  auto disk = DiskTier::Open(path, Slots(2), kId);
  REQUIRE(disk.ok());
  Block a = MakeBlock(100, 1), b = MakeBlock(200, 5);
  REQUIRE((*disk)->Put(100, a.value));
  // A file-size limit below the slots makes every data write fail (EFBIG),
  // as a full disk fails them (ENOSPC); SIGXFSZ is ignored meanwhile.
  struct rlimit old;
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit low = old;
  low.rlim_cur = 8192;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &low) == 0);
  const bool put = (*disk)->Put(200, b.value);
  REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, old_handler);
  REQUIRE_FALSE(put);
  REQUIRE_FALSE((*disk)->enabled());
  REQUIRE((*disk)->disabled_reason().find("cannot write") == 0);
  // Off: nothing is served or taken any more.
  TierReject reject;
  REQUIRE((*disk)->Get(a.key, &reject) == nullptr);
  REQUIRE_FALSE((*disk)->Put(200, b.value));
}

DiskLoader::Read ReadOf(const DiskTier& disk, const Block& b) {
  DiskLoader::Read r;
  r.hash = b.key.hash;
  r.parent = b.key.parent;
  r.tokens = b.tokens;
  REQUIRE(disk.Locate(b.key.hash, &r.slot, &r.generation));
  return r;
}

std::vector<DiskLoader::Result> Await(DiskLoader& loader, uint64_t ticket) {
  std::vector<DiskLoader::Result> out;
  while (!loader.TakeLoad(ticket, &out)) loader.WaitForLoads(100);
  return out;
}

TEST_CASE("The disk loader reads a chain in the background, a slot rewritten meanwhile is a miss",
          "[cache][tier]") {
  const std::string path = testing::MakeTempDir("disk_tier") + "/kv.tier";
  auto disk = DiskTier::Open(path, Slots(2), kId);
  REQUIRE(disk.ok());
  Block a = MakeBlock(100, 1), b = MakeBlock(200, 5), c = MakeBlock(300, 9);
  REQUIRE((*disk)->Put(100, a.value));
  REQUIRE((*disk)->Put(200, b.value));
  DiskLoader loader(disk->get());
  const std::vector<DiskLoader::Read> reads = {ReadOf(**disk, a), ReadOf(**disk, b)};
  std::vector<DiskLoader::Result> got = Await(loader, loader.StartLoad(reads));
  REQUIRE(got.size() == 2);
  REQUIRE(*got[0].value == a.value);
  REQUIRE(*got[1].value == b.value);
  REQUIRE((*disk)->Settle(100, reads[0].slot, reads[0].generation, got[0].reject));
  REQUIRE((*disk)->Settle(200, reads[1].slot, reads[1].generation, got[1].reject));

  SECTION("a slot written between Locate and Settle is not used and not dropped") {
    const DiskLoader::Read r = ReadOf(**disk, a);  // a is older than b: its slot goes next
    std::vector<DiskLoader::Result> late = Await(loader, loader.StartLoad({r}));
    REQUIRE(late[0].value != nullptr);
    REQUIRE((*disk)->Put(300, c.value));
    REQUIRE_FALSE((*disk)->Settle(100, r.slot, r.generation, late[0].reject));
    REQUIRE((*disk)->Contains(300));
    REQUIRE_FALSE((*disk)->Contains(100));
    TierReject reject;
    REQUIRE((*disk)->Get(c.key, &reject) != nullptr);
  }
  SECTION("a corrupt slot ends the chain and is dropped at Settle") {
    const int fd = ::open(path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    const int64_t off = 4096 + 4096 + int64_t{reads[0].slot} * 4096 + 100;
    char byte;
    REQUIRE(pread(fd, &byte, 1, off) == 1);
    byte ^= 0x40;
    REQUIRE(pwrite(fd, &byte, 1, off) == 1);
    ::close(fd);
    std::vector<DiskLoader::Result> bad = Await(loader, loader.StartLoad(reads));
    REQUIRE(bad[0].value == nullptr);
    REQUIRE(bad[0].reject == TierReject::kCorrupt);
    REQUIRE(bad[1].value == nullptr);  // not read: the chain ended before it
    REQUIRE_FALSE((*disk)->Settle(100, reads[0].slot, reads[0].generation, bad[0].reject));
    REQUIRE_FALSE((*disk)->Contains(100));
    REQUIRE((*disk)->Contains(200));
  }
  SECTION("an abandoned load is never answered") {
    const uint64_t t = loader.StartLoad(reads);
    loader.AbandonLoad(t);
    const uint64_t u = loader.StartLoad({reads[1]});
    Await(loader, u);  // loads run in order: t is done or was dropped
    std::vector<DiskLoader::Result> none;
    REQUIRE_FALSE(loader.TakeLoad(t, &none));
  }
}

}  // namespace
}  // namespace kvserve
