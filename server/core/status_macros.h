// The project's one pair of status-propagation macros.
#ifndef TRANSPOSE_SERVER_CORE_STATUS_MACROS_H_
#define TRANSPOSE_SERVER_CORE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the absl::Status of `expr` from the enclosing function if it is not
// OK.
#define TRANSPOSE_RETURN_IF_ERROR(expr)                                       \
  do {                                                                        \
    if (::absl::Status transpose_status_ = (expr); !transpose_status_.ok()) { \
      return transpose_status_;                                               \
    }                                                                         \
  } while (false)

#define TRANSPOSE_STATUS_CONCAT_INNER_(a, b) a##b
#define TRANSPOSE_STATUS_CONCAT_(a, b) TRANSPOSE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::StatusOr<T>); returns its status if not OK, else
// moves its value into `lhs`, which may be a declaration:
// TRANSPOSE_ASSIGN_OR_RETURN(auto x, MakeX());
#define TRANSPOSE_ASSIGN_OR_RETURN(lhs, expr) \
  TRANSPOSE_ASSIGN_OR_RETURN_IMPL_(           \
      TRANSPOSE_STATUS_CONCAT_(transpose_statusor_, __LINE__), lhs, expr)

#define TRANSPOSE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = *std::move(statusor)

#endif  // TRANSPOSE_SERVER_CORE_STATUS_MACROS_H_
