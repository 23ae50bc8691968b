#include "server/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/runner_factory.h"
#include "server/config/config_help.h"
#include "server/config/config_values.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using config_values::Bad;
using config_values::ExpandEnv;
using config_values::ParseBool;
using config_values::ParseBytes;
using config_values::ParseDouble;
using config_values::ParseEnum;
using config_values::ParseInt;
using config_values::ParseSeconds;

enum class Source { kFile, kOverride };

// One settable key: parses a scalar's text into the struct.
struct Field {
  std::string key;
  std::function<absl::Status(ServeConfig&, const std::string& text, Source source,
                             const std::string& base_dir)>
      set;
};

Field Int(std::string key, int64_t min, int64_t max, std::string expected,
          std::function<void(ServeConfig&, int64_t)> assign) {
  return {key, [=](ServeConfig& c, const std::string& text, Source, const std::string&) {
            KV_ASSIGN_OR_RETURN(int64_t v, ParseInt(key, text, min, max, expected));
            assign(c, v);
            return absl::OkStatus();
          }};
}

// A number `in_range` accepts (else the error says `expected`).
Field Double(std::string key, std::string expected, std::function<bool(double)> in_range,
             std::function<void(ServeConfig&, double)> assign) {
  return {key, [=](ServeConfig& c, const std::string& text, Source, const std::string&) {
            KV_ASSIGN_OR_RETURN(double v, ParseDouble(key, text, expected));
            if (!in_range(v)) return Bad(key, expected, text);
            assign(c, v);
            return absl::OkStatus();
          }};
}

Field Str(std::string key, std::function<void(ServeConfig&, std::string)> assign) {
  return {key, [=](ServeConfig& c, const std::string& text, Source, const std::string&) {
            assign(c, text);
            return absl::OkStatus();
          }};
}

Field Enum(std::string key, std::vector<std::string> allowed,
           std::function<void(ServeConfig&, std::string)> assign) {
  return {key, [=](ServeConfig& c, const std::string& text, Source, const std::string&) {
            KV_ASSIGN_OR_RETURN(std::string v, ParseEnum(key, text, allowed));
            assign(c, std::move(v));
            return absl::OkStatus();
          }};
}

Field Bool(std::string key, std::function<void(ServeConfig&, bool)> assign) {
  return {key, [=](ServeConfig& c, const std::string& text, Source, const std::string&) {
            KV_ASSIGN_OR_RETURN(bool v, ParseBool(key, text));
            assign(c, v);
            return absl::OkStatus();
          }};
}

// A file path: relative ones from the file resolve against its directory.
// "dummy:<preset>" and empty values are kept as they are.
Field Path(std::string key, std::function<void(ServeConfig&, std::string)> assign) {
  return {key,
          [=](ServeConfig& c, const std::string& text, Source source, const std::string& base_dir) {
            std::string v = text;
            if (source == Source::kFile && !v.empty() && !base_dir.empty() &&
                !v.starts_with("dummy:") && fs::path(v).is_relative()) {
              v = (fs::path(base_dir) / v).lexically_normal().string();
            }
            assign(c, std::move(v));
            return absl::OkStatus();
          }};
}

// A timeout in seconds (suffixes as ParseSeconds), > 0.
Field Timeout(std::string key, std::function<void(ServeConfig&, double)> assign) {
  return {key, [=](ServeConfig& c, const std::string& text, Source, const std::string&) {
            KV_ASSIGN_OR_RETURN(double v, ParseSeconds(key, text));
            if (v <= 0) return Bad(key, "a duration in seconds > 0 (e.g. 10, 2.5s, 500ms)", text);
            assign(c, v);
            return absl::OkStatus();
          }};
}

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

const std::vector<Field>& Fields() {
  static const std::vector<Field>*
      fields =
          new std::vector<Field>{
              // model
              Path("model.path",
                   [](ServeConfig& c, std::string v) { c.model.path = std::move(v); }),
              Path("model.tokenizer",
                   [](ServeConfig& c, std::string v) { c.model.tokenizer = std::move(v); }),
              Str("model.name", [](ServeConfig& c, std::string v) { c.model.name = std::move(v); }),
              {"model.device",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 absl::StatusOr<DeviceSpec> d = ParseDevice(text);
                 if (!d.ok()) return Bad("model.device", "cpu, cuda or cuda:N", text);
                 c.model.device = std::string(absl::StripAsciiWhitespace(text));
                 return absl::OkStatus();
               }},
              Int("model.threads", 0, 4096, "an integer in [0, 4096] (0: what the cgroup allows)",
                  [](ServeConfig& c, int64_t v) { c.model.threads = static_cast<int32_t>(v); }),
              {"model.dtype",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 if (!ResolveWeightDtype(text, DeviceSpec{}).ok()) {
                   return Bad("model.dtype", "one of auto, fp32, fp16, bf16", text);
                 }
                 c.model.dtype = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
                 return absl::OkStatus();
               }},
              {"model.weight_dtype",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 absl::StatusOr<WeightQuantSpec> q = ParseWeightQuant(text);
                 if (!q.ok()) return q.status();
                 c.model.weight_dtype = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
                 return absl::OkStatus();
               }},
              {"model.weight_dtype_head",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 absl::StatusOr<WeightQuantSpec> q = ParseWeightQuant("auto", text);
                 if (!q.ok()) return q.status();
                 c.model.weight_dtype_head =
                     absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
                 return absl::OkStatus();
               }},
              Int("model.weight_group_size", 8, 4096, "a multiple of 8 in [8, 4096] (32 or 128)",
                  [](ServeConfig& c, int64_t v) {
                    c.model.weight_group_size = static_cast<int32_t>(v);
                  }),
              Bool("model.cuda_graphs", [](ServeConfig& c, bool v) { c.model.cuda_graphs = v; }),
              Enum("model.attention_kernel", {"fast", "reference"},
                   [](ServeConfig& c, std::string v) { c.model.attention_kernel = std::move(v); }),
              Bool("model.mmap", [](ServeConfig& c, bool v) { c.model.mmap = v; }),
              Enum("model.tool_call_format", {"auto", "hermes", "llama3_json", "mistral"},
                   [](ServeConfig& c, std::string v) { c.model.tool_call_format = std::move(v); }),
              {"model.chat_template",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 const std::string name(absl::StripAsciiWhitespace(text));
                 if (name == "auto") {
                   c.model.chat_template = ChatTemplate::Auto();
                   return absl::OkStatus();
                 }
                 absl::StatusOr<ChatTemplate> t = ChatTemplate::Builtin(name);
                 if (!t.ok()) {
                   return Bad("model.chat_template",
                              "auto, a built-in template (plain, chatml, llama3) or a map of role "
                              "patterns",
                              text);
                 }
                 c.model.chat_template = *std::move(t);
                 return absl::OkStatus();
               }},
              // cache
              {"cache.kv_dtype",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 std::string t(absl::StripAsciiWhitespace(text));
                 if (!KvDtypeSpec::Parse(t).ok()) {
                   return Bad("cache.kv_dtype",
                              absl::StrCat("one of ", absl::StrJoin(KvDtypeNames(), ", "),
                                           ", or one per layer (e.g. int8,int4_kc*,int8: NAME*N "
                                           "for N layers, NAME* for the rest)"),
                              text);
                 }
                 c.cache.kv_dtype = t;
                 return absl::OkStatus();
               }},
              Int("cache.block_size", 1, 4096, "a positive integer",
                  [](ServeConfig& c, int64_t v) { c.cache.block_size = static_cast<int32_t>(v); }),
              Int("cache.num_blocks", 0, kMaxInt32, "an integer >= 0 (0: from the memory budget)",
                  [](ServeConfig& c, int64_t v) { c.cache.num_blocks = static_cast<int32_t>(v); }),
              {"cache.memory_bytes",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(c.cache.memory_bytes, ParseBytes("cache.memory_bytes", text));
                 return absl::OkStatus();
               }},
              Double(
                  "cache.memory_fraction", "a number in (0, 1]",
                  [](double v) { return v > 0 && v <= 1; },
                  [](ServeConfig& c, double v) { c.cache.memory_fraction = v; }),
              Int("cache.num_swap_blocks", 0, kMaxInt32, "an integer >= 0",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.num_swap_blocks = static_cast<int32_t>(v);
                  }),
              Int("cache.int4_group_size", 1, 4096, "a positive integer",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.int4_group_size = static_cast<int32_t>(v);
                  }),
              Bool("cache.prefix_caching",
                   [](ServeConfig& c, bool v) { c.cache.prefix_caching = v; }),
              Enum("cache.eviction_policy", EvictionPolicyNames(),
                   [](ServeConfig& c, std::string v) { c.cache.eviction_policy = std::move(v); }),
              Int("cache.eviction_budget", 0, kMaxInt32, "an integer >= 0",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.eviction_budget = static_cast<int32_t>(v);
                  }),
              Int("cache.sink_tokens", 0, kMaxInt32, "an integer >= 0",
                  [](ServeConfig& c, int64_t v) { c.cache.sink_tokens = static_cast<int32_t>(v); }),
              Int("cache.recent_tokens", 0, kMaxInt32, "an integer >= 0",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.recent_tokens = static_cast<int32_t>(v);
                  }),
              Int("cache.eviction_history", 1, 64, "an integer in [1, 64]",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.eviction_history = static_cast<int32_t>(v);
                  }),
              Path("cache.evictor_model",
                   [](ServeConfig& c, std::string v) { c.cache.evictor_model = std::move(v); }),
              Path("cache.low_rank",
                   [](ServeConfig& c, std::string v) { c.cache.low_rank = std::move(v); }),
              Int("cache.cross_layer.from_layer", -1, kMaxInt32, "an integer >= 0 (-1: off)",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.cross_layer.from_layer = static_cast<int>(v);
                  }),
              Double(
                  "cache.cross_layer.threshold", "an angle / pi in [0, 1]",
                  [](double v) { return v >= 0 && v <= 1; },
                  [](ServeConfig& c, double v) { c.cache.cross_layer.threshold = v; }),
              Double(
                  "cache.cross_layer.retain", "a fraction of a block's slots in (0, 1]",
                  [](double v) { return v > 0 && v <= 1; },
                  [](ServeConfig& c, double v) { c.cache.cross_layer.retain = v; }),
              {"cache.host_tier_bytes",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(c.cache.host_tier_bytes,
                                     ParseBytes("cache.host_tier_bytes", text));
                 return absl::OkStatus();
               }},
              Path("cache.disk_tier_path",
                   [](ServeConfig& c, std::string v) { c.cache.disk_tier_path = std::move(v); }),
              {"cache.disk_tier_bytes",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(c.cache.disk_tier_bytes,
                                     ParseBytes("cache.disk_tier_bytes", text));
                 return absl::OkStatus();
               }},
              {"cache.remote_tier_url",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 c.cache.remote_tier_url = std::string(absl::StripAsciiWhitespace(text));
                 return absl::OkStatus();
               }},
              Int("cache.tier_load_timeout_ms", 1, 3600000, "an integer in [1, 3600000]",
                  [](ServeConfig& c, int64_t v) {
                    c.cache.tier_load_timeout_ms = static_cast<int32_t>(v);
                  }),
              // scheduler
              Int("scheduler.max_num_seqs", 1, kMaxInt32, "a positive integer",
                  [](ServeConfig& c, int64_t v) {
                    c.scheduler.max_num_seqs = static_cast<int32_t>(v);
                  }),
              Int("scheduler.max_num_batched_tokens", 1, kMaxInt32, "a positive integer",
                  [](ServeConfig& c, int64_t v) {
                    c.scheduler.max_num_batched_tokens = static_cast<int32_t>(v);
                  }),
              Int("scheduler.max_model_len", 0, kMaxInt32, "an integer >= 0 (0: the model's)",
                  [](ServeConfig& c, int64_t v) {
                    c.scheduler.max_model_len = static_cast<int32_t>(v);
                  }),
              Enum("scheduler.preemption_mode", {"recompute", "swap"},
                   [](ServeConfig& c, std::string v) {
                     c.scheduler.preemption_mode = std::move(v);
                   }),
              Enum("scheduler.fairness", {"auto", "per_client", "fcfs"},
                   [](ServeConfig& c, std::string v) { c.scheduler.fairness = std::move(v); }),
              // server
              Str("server.host",
                  [](ServeConfig& c, std::string v) { c.server.host = std::move(v); }),
              Int("server.http_port", 0, 65535, "a port number in [0, 65535]",
                  [](ServeConfig& c, int64_t v) { c.server.http_port = static_cast<int32_t>(v); }),
              Int("server.grpc_port", 0, 65535, "a port number in [0, 65535]",
                  [](ServeConfig& c, int64_t v) { c.server.grpc_port = static_cast<int32_t>(v); }),
              {"server.shutdown_timeout",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(c.server.shutdown_timeout,
                                     ParseSeconds("server.shutdown_timeout", text));
                 return absl::OkStatus();
               }},
              {"server.max_body_bytes",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(int64_t v, ParseBytes("server.max_body_bytes", text));
                 if (v < 1) return Bad("server.max_body_bytes", "a positive byte count", text);
                 c.server.max_body_bytes = v;
                 return absl::OkStatus();
               }},
              Int("server.max_queue", 1, kMaxInt32, "a positive integer",
                  [](ServeConfig& c, int64_t v) { c.server.max_queue = static_cast<int32_t>(v); }),
              Str("server.api_key",
                  [](ServeConfig& c, std::string v) { c.server.api_key = std::move(v); }),
              Int("server.http_threads", 1, 4096, "an integer in [1, 4096]",
                  [](ServeConfig& c, int64_t v) {
                    c.server.http_threads = static_cast<int32_t>(v);
                  }),
              Bool("server.reuse_port", [](ServeConfig& c, bool v) { c.server.reuse_port = v; }),
              // server: HTTP connection limits and TLS
              Timeout("server.http_header_timeout_s",
                      [](ServeConfig& c, double v) { c.server.http_header_timeout_s = v; }),
              Timeout("server.http_body_timeout_s",
                      [](ServeConfig& c, double v) { c.server.http_body_timeout_s = v; }),
              Timeout("server.http_idle_timeout_s",
                      [](ServeConfig& c, double v) { c.server.http_idle_timeout_s = v; }),
              Timeout("server.http_write_timeout_s",
                      [](ServeConfig& c, double v) { c.server.http_write_timeout_s = v; }),
              Int("server.max_connections", 1, 1 << 20, "an integer in [1, 1048576]",
                  [](ServeConfig& c, int64_t v) {
                    c.server.max_connections = static_cast<int32_t>(v);
                  }),
              {"server.http_stream_buffer_bytes",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(int64_t v,
                                     ParseBytes("server.http_stream_buffer_bytes", text));
                 if (v < 1) {
                   return Bad("server.http_stream_buffer_bytes", "a positive byte count", text);
                 }
                 c.server.http_stream_buffer_bytes = v;
                 return absl::OkStatus();
               }},
              Path("server.api_key_file",
                   [](ServeConfig& c, std::string v) { c.server.api_key_file = std::move(v); }),
              Bool("server.metrics_auth",
                   [](ServeConfig& c, bool v) { c.server.metrics_auth = v; }),
              Path("server.tls.cert_file",
                   [](ServeConfig& c, std::string v) { c.server.tls.cert_file = std::move(v); }),
              Path("server.tls.key_file",
                   [](ServeConfig& c, std::string v) { c.server.tls.key_file = std::move(v); }),
              // limits (the request cost budget; see ServeConfig::Limits)
              {"limits.max_prompt_bytes",
               [](ServeConfig& c, const std::string& text, Source, const std::string&) {
                 KV_ASSIGN_OR_RETURN(c.limits.max_prompt_bytes,
                                     ParseBytes("limits.max_prompt_bytes", text));
                 return absl::OkStatus();
               }},
              Int("limits.max_prompt_tokens", 0, kMaxInt32, "an integer >= 0 (0: max_model_len)",
                  [](ServeConfig& c, int64_t v) { c.limits.max_prompt_tokens = v; }),
              Int("limits.max_generated_tokens", 0, std::numeric_limits<int64_t>::max(),
                  "an integer >= 0 (0: 64 x max_model_len)",
                  [](ServeConfig& c, int64_t v) { c.limits.max_generated_tokens = v; }),
              Int("limits.max_n", 1, 4096, "an integer in [1, 4096]",
                  [](ServeConfig& c, int64_t v) { c.limits.max_n = static_cast<int32_t>(v); }),
              Int("limits.max_stop_strings", 0, 4096, "an integer in [0, 4096]",
                  [](ServeConfig& c, int64_t v) {
                    c.limits.max_stop_strings = static_cast<int32_t>(v);
                  }),
              Int("limits.max_stop_bytes", 1, 65536, "an integer in [1, 65536]",
                  [](ServeConfig& c, int64_t v) {
                    c.limits.max_stop_bytes = static_cast<int32_t>(v);
                  }),
              Int("limits.max_stop_token_ids", 0, 65536, "an integer in [0, 65536]",
                  [](ServeConfig& c, int64_t v) {
                    c.limits.max_stop_token_ids = static_cast<int32_t>(v);
                  }),
              Int("limits.max_logprobs", 0, 1024, "an integer in [0, 1024]",
                  [](ServeConfig& c, int64_t v) {
                    c.limits.max_logprobs = static_cast<int32_t>(v);
                  }),
              Int("limits.max_concurrent_per_client", 0, kMaxInt32,
                  "an integer >= 0 (0: unlimited)",
                  [](ServeConfig& c,
                     int64_t v) { c.limits.max_concurrent_per_client = static_cast<int32_t>(v); }),
              Int("limits.max_unsent_outputs", 1, kMaxInt32, "a positive integer",
                  [](ServeConfig& c, int64_t v) {
                    c.limits.max_unsent_outputs = static_cast<int32_t>(v);
                  }),
              // logging
              Enum("logging.level", {"trace", "debug", "info", "warn", "error", "critical", "off"},
                   [](ServeConfig& c, std::string v) { c.logging.level = std::move(v); }),
              Enum("logging.format", {"text", "json"},
                   [](ServeConfig& c, std::string v) { c.logging.format = std::move(v); }),
          };
  return *fields;
}

const Field* FindField(const std::string& key) {
  for (const Field& f : Fields()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

absl::Status UnknownKey(const std::string& key) {
  std::string section = key.substr(0, key.find('.'));
  std::vector<std::string> known;
  for (const Field& f : Fields()) {
    if (f.key.starts_with(section + ".")) known.push_back(f.key.substr(section.size() + 1));
  }
  if (known.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key,
                     ": unknown key (sections: model, cache, scheduler, server, limits, "
                     "logging)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": unknown key (", section, " has: ", absl::StrJoin(known, ", "), ")"));
}

std::string Describe(const YAML::Node& node) {
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "null";
}

absl::Status SetScalar(ServeConfig& config, const std::string& key, const std::string& raw,
                       Source source, const std::string& base_dir) {
  const Field* field = FindField(key);
  if (field == nullptr) return UnknownKey(key);
  KV_ASSIGN_OR_RETURN(std::string text, ExpandEnv(key, raw));
  return field->set(config, text, source, base_dir);
}

absl::Status SetChatTemplateMap(ServeConfig& config, const YAML::Node& node) {
  std::map<std::string, std::string> patterns;
  std::string generation_prompt;
  for (const auto& kv : node) {
    std::string role = kv.first.as<std::string>();
    std::string key = absl::StrCat("model.chat_template.", role);
    if (!kv.second.IsScalar()) return Bad(key, "a string", Describe(kv.second));
    if (role == "generation_prompt") {
      generation_prompt = kv.second.Scalar();
    } else {
      patterns[role] = kv.second.Scalar();
    }
  }
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromPatterns(std::move(patterns), std::move(generation_prompt));
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.chat_template.", std::string(t.status().message())));
  }
  config.model.chat_template = *std::move(t);
  return absl::OkStatus();
}

absl::Status ApplyYaml(ServeConfig& config, const YAML::Node& root, const std::string& base_dir) {
  if (!root || root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError("the config must be a map of sections (model, cache, ...)");
  }
  for (const auto& section : root) {
    std::string name = section.first.as<std::string>();
    if (name != "model" && name != "cache" && name != "scheduler" && name != "server" &&
        name != "limits" && name != "logging") {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": unknown section (sections: model, cache, scheduler, server, limits, logging)"));
    }
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap()) return Bad(name, "a map", section.second.Scalar());
    for (const auto& kv : section.second) {
      std::string key = absl::StrCat(name, ".", kv.first.as<std::string>());
      const YAML::Node& value = kv.second;
      if (key == "model.chat_template" && value.IsMap()) {
        KV_RETURN_IF_ERROR(SetChatTemplateMap(config, value));
        continue;
      }
      if ((key == "server.tls" || key == "cache.cross_layer") && value.IsMap()) {  // nested keys
        for (const auto& sub : value) {
          const std::string sub_key = absl::StrCat(key, ".", sub.first.as<std::string>());
          if (FindField(sub_key) == nullptr) return UnknownKey(sub_key);
          if (sub.second.IsNull()) continue;
          if (!sub.second.IsScalar()) return Bad(sub_key, "a single value", Describe(sub.second));
          KV_RETURN_IF_ERROR(
              SetScalar(config, sub_key, sub.second.Scalar(), Source::kFile, base_dir));
        }
        continue;
      }
      if (FindField(key) == nullptr) return UnknownKey(key);
      if (value.IsNull()) continue;  // "key:" with no value keeps the default
      if (!value.IsScalar()) return Bad(key, "a single value", Describe(value));
      KV_RETURN_IF_ERROR(SetScalar(config, key, value.Scalar(), Source::kFile, base_dir));
    }
  }
  return absl::OkStatus();
}

// model.chat_template: auto -> the template the model directory ships (or
// the tokenizer's directory, when the model is a single file), else plain.
absl::Status ResolveAutoChatTemplate(ServeConfig& c) {
  if (c.model.chat_template.name() != "auto") return absl::OkStatus();

  std::vector<std::string> dirs;
  std::error_code ec;
  if (!c.model.path.starts_with("dummy:") && fs::is_directory(c.model.path, ec)) {
    dirs.push_back(c.model.path);
  }
  if (!c.model.tokenizer.empty()) {
    dirs.push_back(fs::is_directory(c.model.tokenizer, ec)
                       ? c.model.tokenizer
                       : fs::path(c.model.tokenizer).parent_path().string());
  }
  c.model.chat_template = ChatTemplate();
  for (const std::string& dir : dirs) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::ForModelDir(dir);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.chat_template: ", t.status().message(),
                       " (set model.chat_template to plain, chatml, llama3 or a map of role "
                       "patterns to serve without it)"));
    }
    if (t->name() == "checkpoint") {
      c.model.chat_template = *std::move(t);
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckWhole(const ServeConfig& c) {
  if (c.model.path.empty()) {
    return absl::InvalidArgumentError(
        "model.path: required (a llama2.c checkpoint, an HF directory or dummy:<preset>)");
  }
  if (c.server.http_port != 0 && c.server.http_port == c.server.grpc_port) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.grpc_port: must differ from server.http_port (both ", c.server.http_port, ")"));
  }
  if (c.scheduler.max_num_batched_tokens < c.scheduler.max_num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.max_num_batched_tokens: must be >= scheduler.max_num_seqs (",
                     c.scheduler.max_num_batched_tokens, " < ", c.scheduler.max_num_seqs, ")"));
  }
  if (c.scheduler.preemption_mode == "swap" && c.cache.num_swap_blocks == 0) {
    return absl::InvalidArgumentError(
        "cache.num_swap_blocks: must be > 0 when scheduler.preemption_mode is swap");
  }
  // `key`'s pages (what `pages` names) take no KV eviction and no tiers.
  auto refuse_eviction_and_tiers = [&](const char* key, const char* pages) -> absl::Status {
    if (c.cache.eviction_policy != "none") {
      return absl::InvalidArgumentError(absl::StrCat(key, ": KV eviction is refused with ", pages,
                                                     " (cache.eviction_policy ",
                                                     c.cache.eviction_policy, ")"));
    }
    if (c.cache.host_tier_bytes > 0 || !c.cache.disk_tier_path.empty() ||
        !c.cache.remote_tier_url.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(key,
                       ": KV tiers (cache.host_tier_bytes, cache.disk_tier_path, "
                       "cache.remote_tier_url) are refused with ",
                       pages));
    }
    return absl::OkStatus();
  };
  // Low-rank keys sit at their cache index (no slot moves), and a tier's
  // identity does not carry the bases.
  if (!c.cache.low_rank.empty()) {
    KV_RETURN_IF_ERROR(refuse_eviction_and_tiers("cache.low_rank", "low-rank latents"));
  }
  // Merged tokens have no slots to move, and a tier's identity does not
  // carry the setting; the latents of cache.low_rank are not a layer's K/V.
  if (c.cache.cross_layer.enabled()) {
    if (!c.cache.low_rank.empty()) {
      return absl::InvalidArgumentError(
          "cache.cross_layer: not with cache.low_rank (its latents are not a layer's K/V)");
    }
    KV_RETURN_IF_ERROR(refuse_eviction_and_tiers("cache.cross_layer", "cross-layer pages"));
  }
  // The eviction settings as the engine will check them (sliding_window
  // without a budget waits for the model's window).
  return c.ToEngineConfig().Validate();
}

}  // namespace

EngineConfig ServeConfig::ToEngineConfig() const {
  EngineConfig e;
  e.max_num_seqs = scheduler.max_num_seqs;
  e.max_num_batched_tokens = scheduler.max_num_batched_tokens;
  e.max_model_len = scheduler.max_model_len;
  e.max_queue_size = server.max_queue;
  e.preemption_mode =
      scheduler.preemption_mode == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  e.prefix_caching = cache.prefix_caching;
  const bool keys = !server.api_key.empty() || !server.api_key_file.empty();
  e.fair_clients = scheduler.fairness == "per_client" || (scheduler.fairness == "auto" && keys);
  // The enum parser only lets policy names through.
  e.eviction.policy = ParseEvictionPolicy(cache.eviction_policy, "cache.eviction_policy")
                          .value_or(EvictionPolicyKind::kNone);
  e.eviction.budget = cache.eviction_budget;
  e.eviction.sink_tokens = cache.sink_tokens;
  e.eviction.recent_tokens = cache.recent_tokens;
  e.eviction.history = cache.eviction_history;
  e.evictor_model = cache.evictor_model;
  e.tiers.host_bytes = cache.host_tier_bytes;
  e.tiers.disk_path = cache.disk_tier_path;
  e.tiers.disk_bytes = cache.disk_tier_bytes;
  e.tiers.remote_url = cache.remote_tier_url;
  e.tiers.load_timeout_ms = cache.tier_load_timeout_ms;
  e.request_limits = ToRequestLimits();
  return e;
}

RequestLimits ServeConfig::ToRequestLimits() const {
  RequestLimits l;
  l.max_samples = limits.max_n;
  l.max_logprobs = limits.max_logprobs;
  l.max_stop_strings = limits.max_stop_strings;
  l.max_stop_string_bytes = limits.max_stop_bytes;
  l.max_stop_token_ids = limits.max_stop_token_ids;
  l.max_prompt_bytes = limits.max_prompt_bytes;
  l.max_prompt_tokens = limits.max_prompt_tokens;
  l.max_generated_tokens = limits.max_generated_tokens;
  return l;
}

absl::StatusOr<ServeConfig> ParseServeConfig(const std::string& yaml_text,
                                             const std::string& base_dir,
                                             const std::vector<std::string>& overrides) {
  ServeConfig config;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML syntax error: ", e.what()));
  }
  try {
    KV_RETURN_IF_ERROR(ApplyYaml(config, root, base_dir));
  } catch (const YAML::Exception& e) {
    // Keys that are not strings (e.g. a list used as a key).
    return absl::InvalidArgumentError(absl::StrCat("malformed config: ", e.what()));
  }
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", o, ": expected key.path=value (e.g. cache.block_size=32)"));
    }
    std::string key(absl::StripAsciiWhitespace(o.substr(0, eq)));
    KV_RETURN_IF_ERROR(SetScalar(config, key, o.substr(eq + 1), Source::kOverride, base_dir));
  }
  KV_RETURN_IF_ERROR(CheckWhole(config));
  KV_RETURN_IF_ERROR(ResolveAutoChatTemplate(config));
  if (config.model.tool_call_format != "auto") {
    config.model.chat_template.set_tool_call_format(config.model.tool_call_format);
  }
  return config;
}

absl::StatusOr<ServeConfig> LoadServeConfig(const std::string& path,
                                            const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the config file"));
  // Sized before it is read: a 25 MB YAML map costs seconds and a GiB to parse.
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > static_cast<uintmax_t>(kMaxConfigFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the config file has ", size,
                                                   " bytes, more than the ", kMaxConfigFileBytes,
                                                   " (1 MiB) a config may have"));
  }
  std::string text;
  text.resize(kMaxConfigFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > kMaxConfigFileBytes) {
    // Not a regular file (a pipe, /dev/zero): stopped reading at the limit.
    return absl::InvalidArgumentError(absl::StrCat(path, ": the config file is larger than the ",
                                                   kMaxConfigFileBytes,
                                                   " (1 MiB) bytes a config may have"));
  }
  std::string base_dir = fs::absolute(fs::path(path)).parent_path().string();
  absl::StatusOr<ServeConfig> config = ParseServeConfig(text, base_dir, overrides);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", std::string(config.status().message())));
  }
  return config;
}

std::vector<std::string> ServeConfigKeys() {
  std::vector<std::string> keys;
  for (const Field& f : Fields()) keys.push_back(f.key);
  return keys;
}

}  // namespace kvserve
