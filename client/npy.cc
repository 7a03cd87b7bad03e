#include "client/npy.h"

#include <array>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/core/status_macros.h"

namespace transpose {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

struct DescrEntry {
  DataType dtype;
  absl::string_view descr;
};

constexpr std::array<DescrEntry, 14> kDescrs = {{
    {DataType::kFloat32, "<f4"},
    {DataType::kFloat64, "<f8"},
    {DataType::kFloat16, "<f2"},
    {DataType::kBFloat16, "|V2"},
    {DataType::kInt8, "|i1"},
    {DataType::kUInt8, "|u1"},
    {DataType::kInt16, "<i2"},
    {DataType::kUInt16, "<u2"},
    {DataType::kInt32, "<i4"},
    {DataType::kUInt32, "<u4"},
    {DataType::kInt64, "<i8"},
    {DataType::kUInt64, "<u8"},
    {DataType::kComplex64, "<c8"},
    {DataType::kComplex128, "<c16"},
}};

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("not a usable .npy file: ", what));
}

// The Python literal that follows 'key': in the header dict, up to the matching
// delimiter; a string without its quotes, a tuple with its parentheses.
absl::StatusOr<absl::string_view> DictValue(absl::string_view dict,
                                            absl::string_view key) {
  // Python's literal syntax, which NumPy reads the dict with, takes either
  // quote; np.save writes single ones.
  std::string quoted = absl::StrCat("'", key, "'");
  size_t at = dict.find(quoted);
  if (at == absl::string_view::npos) {
    quoted = absl::StrCat("\"", key, "\"");
    at = dict.find(quoted);
  }
  if (at == absl::string_view::npos)
    return Invalid(absl::StrCat("header has no ", key));
  absl::string_view rest = dict.substr(at + quoted.size());
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!absl::ConsumePrefix(&rest, ":"))
    return Invalid("header dict does not parse");
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (rest.empty()) return Invalid("header dict does not parse");
  size_t end;
  if (rest[0] == '\'' || rest[0] == '"') {
    end = rest.find(rest[0], 1);
    if (end == absl::string_view::npos)
      return Invalid("unterminated string in header");
    return rest.substr(1, end - 1);
  }
  if (rest[0] == '(') {
    end = rest.find(')');
    if (end == absl::string_view::npos)
      return Invalid("unterminated shape in header");
    return rest.substr(0, end + 1);
  }
  end = rest.find_first_of(",}");
  return absl::StripTrailingAsciiWhitespace(rest.substr(0, end));
}

struct ElementType {
  DataType dtype = DataType::kUnspecified;
  size_t size = 0;
};

// NumPy's plain kinds, with a byte count in the descr ('U': a count of 4-byte
// characters): elements whose bytes can be moved as any type of their size.
// Not 'O' (pointers).
constexpr absl::string_view kPlainKinds = "biufcVSMmU";

absl::StatusOr<ElementType> ElementTypeOfDescr(absl::string_view descr) {
  // ORDER KIND SIZE: a descr of another form is refused rather than copied
  // into the output's header.
  if (descr.empty() || !absl::StrContains("<>=|", descr[0])) {
    if (absl::StartsWith(descr, "[")) {
      return Invalid(
          "structured dtypes (records of named fields) are not supported; "
          "save one field as a plain array");
    }
    return Invalid(absl::StrCat("dtype '", descr,
                                "' does not start with a byte order (<, >, "
                                "= or |)"));
  }
  std::string normalized(descr);
  // Native and little-endian are the same here; one-byte types have no order.
  if (normalized[0] == '=') normalized[0] = '<';
  if (normalized.size() == 3 && normalized[2] == '1') normalized[0] = '|';
  if (normalized == "<V2") normalized = "|V2";
  for (const DescrEntry& entry : kDescrs) {
    if (entry.descr == normalized) {
      return ElementType{entry.dtype, ElementSize(entry.dtype)};
    }
  }
  // ORDER KIND SIZE, and a unit for datetimes: "<M8[s]".
  absl::string_view rest = normalized;
  size_t size = 0;
  if (rest.size() >= 3 && absl::StrContains("<>|", rest[0]) &&
      absl::StrContains(kPlainKinds, rest[1])) {
    rest.remove_prefix(2);
    const absl::string_view digits = rest.substr(0, rest.find('['));
    // No sane element is 4 GiB; the bound keeps the 'U' count from wrapping.
    if (!absl::SimpleAtoi(digits, &size) || size > (size_t{1} << 32)) size = 0;
    if (normalized[1] == 'U') size *= 4;
    // Only datetimes have a unit, of letters: a .npy output repeats the descr
    // as it stands, so nothing else may follow the size.
    absl::string_view unit = rest.substr(digits.size());
    const bool datetime = normalized[1] == 'M' || normalized[1] == 'm';
    if (!unit.empty() &&
        !(datetime && absl::ConsumePrefix(&unit, "[") &&
          absl::ConsumeSuffix(&unit, "]") && !unit.empty() &&
          absl::c_all_of(unit, [](char c) {
            return absl::ascii_isalnum(static_cast<unsigned char>(c));
          }))) {
      size = 0;
    }
  }
  // Big-endian elements land here too: a transpose moves whole elements, so
  // their byte order is the file's business, not the service's.
  if (size == 0) {
    return Invalid(absl::StrCat("dtype '", descr, "' is not supported"));
  }
  return ElementType{DataType::kUnspecified, size};
}

}  // namespace

absl::string_view NpyDescr(DataType dtype) {
  for (const DescrEntry& entry : kDescrs) {
    if (entry.dtype == dtype) return entry.descr;
  }
  return "";
}

bool IsNpy(absl::string_view file) { return absl::StartsWith(file, kMagic); }

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view file,
                                         std::optional<uint64_t> file_size) {
  if (!IsNpy(file)) return Invalid("no \\x93NUMPY magic");
  if (file.size() < 10) return Invalid("truncated header");
  const int major = static_cast<uint8_t>(file[6]);
  size_t header_len;
  size_t prefix;
  if (major == 1) {
    header_len = static_cast<uint8_t>(file[8]) | static_cast<uint8_t>(file[9])
                                                     << 8;
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (file.size() < 12) return Invalid("truncated header");
    header_len = 0;
    for (int i = 3; i >= 0; --i)
      header_len = header_len << 8 | static_cast<uint8_t>(file[8 + i]);
    prefix = 12;
  } else {
    return Invalid(absl::StrCat("format version ", major, " is unknown"));
  }
  if (file.size() < prefix + header_len) {
    return Invalid(file_size.has_value() && *file_size < prefix + header_len
                       ? "truncated header"
                       : absl::StrFormat("header of %d bytes is longer than "
                                         "the first %d bytes read for it",
                                         header_len, file.size()));
  }
  const absl::string_view dict = file.substr(prefix, header_len);
  // A Python dict literal, padded with spaces and ended by a newline.
  if (const absl::string_view stripped = absl::StripAsciiWhitespace(dict);
      !absl::StartsWith(stripped, "{") || !absl::EndsWith(stripped, "}")) {
    return Invalid("header is not a dict literal ({...})");
  }

  NpyHeader header;
  header.data_offset = prefix + header_len;
  TRANSPOSE_ASSIGN_OR_RETURN(absl::string_view descr, DictValue(dict, "descr"));
  TRANSPOSE_ASSIGN_OR_RETURN(const ElementType element,
                             ElementTypeOfDescr(descr));
  header.descr = std::string(descr);
  header.dtype = element.dtype;
  header.element_size = element.size;
  TRANSPOSE_ASSIGN_OR_RETURN(absl::string_view fortran,
                             DictValue(dict, "fortran_order"));
  if (fortran != "False" && fortran != "True") {
    return Invalid(absl::StrCat("fortran_order ", fortran, " does not parse"));
  }
  header.fortran_order = fortran == "True";
  TRANSPOSE_ASSIGN_OR_RETURN(const absl::string_view shape_value,
                             DictValue(dict, "shape"));
  // A Python tuple of integers: "()", "(3,)", "(3, 4)" or "(3, 4,)"; "(3)" and
  // "3" are integers.
  absl::string_view shape_text = shape_value;
  const auto not_a_tuple = [&shape_value] {
    return Invalid(absl::StrCat("shape ", shape_value, " is not a tuple"));
  };
  if (!absl::ConsumePrefix(&shape_text, "(") ||
      !absl::ConsumeSuffix(&shape_text, ")")) {
    return not_a_tuple();
  }
  std::vector<absl::string_view> parts = absl::StrSplit(shape_text, ',');
  const auto blank = [](absl::string_view part) {
    return absl::StripAsciiWhitespace(part).empty();
  };
  if (parts.size() == 1 && blank(parts[0])) {
    parts.clear();
  } else if (parts.size() == 1) {
    return not_a_tuple();
  } else if (blank(parts.back()) && !blank(parts[parts.size() - 2])) {
    parts.pop_back();
  }
  std::vector<uint64_t> dims;
  for (absl::string_view part : parts) {
    uint64_t dim;
    absl::string_view digits = absl::StripAsciiWhitespace(part);
    // Python 2's long literals ("3L"), which old files hold and NumPy reads.
    if (!absl::ConsumeSuffix(&digits, "L")) absl::ConsumeSuffix(&digits, "l");
    if (digits.empty() || !absl::c_all_of(digits, absl::ascii_isdigit) ||
        !absl::SimpleAtoi(digits, &dim)) {
      return Invalid(absl::StrCat("shape (", shape_text, ") does not parse"));
    }
    dims.push_back(dim);
  }
  if (dims.size() == 2) {
    header.shape = {1, dims[0], dims[1]};
  } else if (dims.size() == 3) {
    header.shape = {dims[0], dims[1], dims[2]};
    header.batched = true;
  } else {
    return Invalid(absl::StrCat("array has ", dims.size(),
                                dims.size() == 1 ? " dimension" : " dimensions",
                                "; a matrix has 2, a batch of matrices 3"));
  }

  // An array with a zero dimension is a valid file with no data: the caller
  // decides what to do with it (the service takes no empty matrices).
  uint64_t bytes = header.shape.empty() ? 0 : header.element_size;
  for (uint64_t dim : dims) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return Invalid(absl::StrCat("shape (", shape_text, ") overflows"));
    }
  }
  if (uint64_t end; __builtin_add_overflow(header.data_offset, bytes, &end)) {
    return Invalid(absl::StrCat("shape (", shape_text, ") overflows"));
  }
  if (!file_size.has_value()) return header;
  const uint64_t data_bytes =
      *file_size > header.data_offset ? *file_size - header.data_offset : 0;
  if (*file_size < header.data_offset || data_bytes != bytes) {
    return Invalid(absl::StrFormat(
        "header declares %d data bytes, the file holds %d", bytes, data_bytes));
  }
  return header;
}

std::string FormatNpyHeader(absl::string_view descr, const MatrixShape& shape,
                            bool batched) {
  std::string dict = absl::StrFormat(
      "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr,
      batched ? absl::StrCat(shape.batch, ", ", shape.rows, ", ", shape.cols)
              : absl::StrCat(shape.rows, ", ", shape.cols));
  // Pad with spaces and end with a newline so the data starts on a 64-byte
  // boundary.
  const bool v2 = dict.size() + 11 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string header(kMagic);
  header.push_back(static_cast<char>(v2 ? 2 : 1));
  header.push_back(0);
  const size_t len = dict.size();
  header.push_back(static_cast<char>(len & 0xff));
  header.push_back(static_cast<char>(len >> 8 & 0xff));
  if (v2) {
    header.push_back(static_cast<char>(len >> 16 & 0xff));
    header.push_back(static_cast<char>(len >> 24 & 0xff));
  }
  return header + dict;
}

}  // namespace transpose
