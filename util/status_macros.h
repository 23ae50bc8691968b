// Early-return helpers for absl::Status / absl::StatusOr, used by every
// folder. util/ holds such general helpers (no kvserve types, Abseil only);
// it sits below cache/ in the dependency graph.
//
//   KV_RETURN_IF_ERROR(file.Validate());
//   KV_ASSIGN_OR_RETURN(Tensor t, cursor.Next("wq", {dim, dim}));
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KV_RETURN_IF_ERROR(...)                \
  do {                                         \
    ::absl::Status kv_status_ = (__VA_ARGS__); \
    if (!kv_status_.ok()) return kv_status_;   \
  } while (0)

#define KV_STATUS_CONCAT_INNER(a, b) a##b
#define KV_STATUS_CONCAT(a, b) KV_STATUS_CONCAT_INNER(a, b)
#define KV_ASSIGN_OR_RETURN(lhs, ...) \
  KV_ASSIGN_OR_RETURN_IMPL(KV_STATUS_CONCAT(kv_statusor_, __LINE__), lhs, (__VA_ARGS__))
#define KV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(*tmp)
