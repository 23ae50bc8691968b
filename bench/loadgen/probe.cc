#include "bench/loadgen/probe.h"

#include <cstdio>

namespace kvserve::bench {

std::vector<ProbeCase> RunConnectionProbe(const ClientOptions& options, int requests,
                                          bool include_http, bool progress) {
  struct Variant {
    const char* name;
    Api api;
    bool stream;
  };
  const Api http_api = options.api == Api::kChat ? Api::kChat : Api::kCompletions;
  std::vector<Variant> variants;
  if (include_http) {
    variants.push_back({"http", http_api, false});
    variants.push_back({"http_stream", http_api, true});
  }
  if (!options.grpc_target.empty()) variants.push_back({"grpc", Api::kGrpc, true});

  BenchRequest request;
  request.prompt = "Once upon a time";
  request.max_tokens = 1;
  constexpr int kWarmup = 5;

  std::vector<ProbeCase> out;
  for (const Variant& v : variants) {
    ClientOptions o = options;
    o.api = v.api;
    o.stream = v.stream;
    o.ignore_eos = true;
    ProbeCase c;
    c.name = v.name;
    std::unique_ptr<Client> kept = MakeClient(o, /*keep_alive=*/true);
    std::vector<double> fresh_ms, kept_ms;
    auto one = [&](bool keep, bool record) {
      std::unique_ptr<Client> fresh;
      Client* client = kept.get();
      if (!keep) {
        fresh = MakeClient(o, /*keep_alive=*/false);
        client = fresh.get();
      }
      RequestResult r = client->Send(request);
      if (!record) return;
      if (!r.ok) {
        if (c.first_error.empty()) c.first_error = r.error;
        ++c.failed;
        return;
      }
      (keep ? kept_ms : fresh_ms).push_back(r.e2e_s * 1e3);
    };
    for (int i = 0; i < kWarmup; ++i) {
      one(true, false);
      one(false, false);
    }
    for (int i = 0; i < requests; ++i) {
      // Alternate which goes first, so neither always follows the other.
      const bool keep_first = (i % 2) == 1;
      one(keep_first, true);
      one(!keep_first, true);
      if (progress && (i + 1) % 20 == 0) {
        std::fprintf(stderr, "\rprobe %s: %d/%d pairs", v.name, i + 1, requests);
        std::fflush(stderr);
      }
    }
    if (progress) std::fprintf(stderr, "\n");
    c.fresh_ms = Summarize(fresh_ms);
    c.kept_alive_ms = Summarize(kept_ms);
    c.ratio_p50 = c.fresh_ms.p50 > 0 ? c.kept_alive_ms.p50 / c.fresh_ms.p50 : 0;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace kvserve::bench
