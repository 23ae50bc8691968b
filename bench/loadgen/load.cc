#include "bench/loadgen/load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace kvserve::bench {
namespace {

// Counts shared by the senders and the progress bar.
struct Progress {
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> failed{0};
};

// Redraws one line on stderr four times a second until stopped.
class ProgressBar {
 public:
  ProgressBar(const ProgressOptions& options, const Progress* progress, int64_t total,
              double duration_s)
      : options_(options), progress_(progress), total_(total), duration_s_(duration_s) {
    if (options_.enabled) thread_ = std::thread([this] { Loop(); });
  }
  ~ProgressBar() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    Draw();
    std::fputc('\n', stderr);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) {
      Draw();
    }
  }
  void Draw() const {
    const double elapsed = SteadySeconds() - start_;
    const int64_t done = progress_->done.load();
    double frac = 0;
    if (total_ > 0) frac = static_cast<double>(done) / static_cast<double>(total_);
    if (duration_s_ > 0) frac = std::max(frac, elapsed / duration_s_);
    frac = std::clamp(frac, 0.0, 1.0);
    constexpr int kWidth = 30;
    char bar[kWidth + 1];
    const int filled = static_cast<int>(frac * kWidth);
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
    bar[kWidth] = '\0';
    const std::string count = total_ > 0 ? absl::StrCat(done, "/", total_) : absl::StrCat(done);
    std::fprintf(stderr, "\r%s [%s] %s requests %5.1fs %6.1f req/s", options_.label.c_str(), bar,
                 count.c_str(), elapsed, elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0);
    if (int64_t f = progress_->failed.load(); f > 0) {
      std::fprintf(stderr, " %lld failed", static_cast<long long>(f));
    }
    std::fflush(stderr);
  }

  const ProgressOptions options_;
  const Progress* progress_;
  const int64_t total_;
  const double duration_s_;
  const double start_ = SteadySeconds();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Hands out request numbers until the count or the time is up.
class Ticket {
 public:
  Ticket(int64_t limit, double deadline) : limit_(limit), deadline_(deadline) {}
  // The next request number, or -1 when no more may be sent.
  int64_t Next() {
    if (deadline_ > 0 && SteadySeconds() >= deadline_) return -1;
    const int64_t i = next_.fetch_add(1);
    return limit_ > 0 && i >= limit_ ? -1 : i;
  }

 private:
  const int64_t limit_;
  const double deadline_;
  std::atomic<int64_t> next_{0};
};

}  // namespace

std::vector<double> PoissonArrivals(int n, double rate, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (rate <= 0) return out;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double t = 0;
  for (double& a : out) {
    t += gap(rng);
    a = t;
  }
  return out;
}

LoadResult RunLoad(const LoadSpec& spec, const std::vector<BenchRequest>& workload,
                   const ClientFactory& make_client, const ProgressOptions& progress_options) {
  LoadResult out;
  if (workload.empty()) return out;
  int64_t limit = spec.num_requests;
  if (limit == 0 && spec.duration_s <= 0) limit = static_cast<int64_t>(workload.size());
  // "All at once" needs an end.
  if (limit == 0 && spec.mode == LoadSpec::Mode::kOpen && spec.request_rate <= 0) {
    limit = static_cast<int64_t>(workload.size());
  }

  Progress progress;
  std::mutex results_mu;
  auto send = [&](Client& client, int64_t i) {
    const BenchRequest& r = workload[static_cast<size_t>(i) % workload.size()];
    RequestResult res = client.Send(r);
    res.expected_input_tokens = r.input_tokens;
    res.request_index = i;
    if (!res.ok) progress.failed.fetch_add(1);
    progress.done.fetch_add(1);
    std::lock_guard<std::mutex> lock(results_mu);
    out.results.push_back(std::move(res));
  };

  const double start = SteadySeconds();
  const double deadline = spec.duration_s > 0 ? start + spec.duration_s : 0;
  {
    ProgressBar bar(progress_options, &progress, limit, spec.duration_s);
    std::vector<std::thread> threads;
    if (spec.mode == LoadSpec::Mode::kClosed) {
      Ticket ticket(limit, deadline);
      for (int c = 0; c < std::max(1, spec.concurrency); ++c) {
        threads.emplace_back([&] {
          std::unique_ptr<Client> client = make_client();
          for (int64_t i; (i = ticket.Next()) >= 0;) send(*client, i);
        });
      }
      for (std::thread& t : threads) t.join();
    } else {
      std::mutex mu;
      std::condition_variable cv;
      std::deque<int64_t> queue;
      bool closed = false;
      for (int c = 0; c < std::max(1, spec.max_concurrency); ++c) {
        threads.emplace_back([&] {
          std::unique_ptr<Client> client = make_client();
          while (true) {
            int64_t i;
            {
              std::unique_lock<std::mutex> lock(mu);
              cv.wait(lock, [&] { return closed || !queue.empty(); });
              if (queue.empty()) return;
              i = queue.front();
              queue.pop_front();
            }
            send(*client, i);
          }
        });
      }
      // The dispatcher: this thread, sleeping until each arrival.
      std::mt19937_64 rng(spec.seed);
      std::exponential_distribution<double> gap(spec.request_rate > 0 ? spec.request_rate : 1.0);
      double arrival = start;
      for (int64_t i = 0; limit <= 0 || i < limit; ++i) {
        if (spec.request_rate > 0) {
          arrival += gap(rng);
          const double now = SteadySeconds();
          if (arrival > now) {
            std::this_thread::sleep_for(std::chrono::duration<double>(arrival - now));
          }
        }
        if (deadline > 0 && SteadySeconds() >= deadline) break;
        {
          std::lock_guard<std::mutex> lock(mu);
          queue.push_back(i);
        }
        cv.notify_one();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        closed = true;
      }
      cv.notify_all();
      for (std::thread& t : threads) t.join();
    }
  }
  out.duration_s = SteadySeconds() - start;
  return out;
}

}  // namespace kvserve::bench
