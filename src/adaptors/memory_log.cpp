#include "cuemm/adaptors/memory_log.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "cuemm/error.hpp"
#include "util/byte_size.hpp"

namespace cuemm {
namespace {

// Fields of one CSV line: quotes as RFC 4180 has them; spaces around a field
// (", " between them, as some writers put) are not part of it.
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::size_t kept = 0;  // the field's length up to its last quoted or non-space character
  bool quoted = false;
  auto end_field = [&] {
    field.resize(kept);
    fields.push_back(field);
    field.clear();
    kept = 0;
  };
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c;
      kept = field.size();
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      end_field();
    } else if (c == ' ' || c == '\t' || c == '\r') {
      if (!field.empty()) field += c;  // leading spaces are dropped, trailing ones trimmed at the end
    } else {
      field += c;
      kept = field.size();
    }
  }
  end_field();
  return fields;
}

// A time in seconds: a number, or a time of day as H:M:S with a fraction
// (RMM's logs have written either).
std::optional<double> parse_seconds(const std::string& text) {
  double total = 0;
  const char* at = text.c_str();
  for (int part = 0; part < 3; ++part) {
    char* after = nullptr;
    const double value = std::strtod(at, &after);
    if (after == at) return std::nullopt;
    total = total * 60 + value;
    if (!std::isfinite(total)) return std::nullopt;
    if (*after == '\0') return total;
    if (*after != ':' || part == 2) return std::nullopt;
    at = after + 1;
  }
  return std::nullopt;
}

// Bytes short enough for an axis label: 3.0 KiB, 512.0 MiB, 1.5 GiB.
std::string axis_bytes(std::size_t bytes) {
  const util::ScaledBytes scaled = util::scale_byte_size(bytes);
  char text[32];
  std::snprintf(text, sizeof text, bytes < 1024 ? "%.0f %s" : "%.1f %s", scaled.value, scaled.unit);
  return text;
}

// The round step nearest to `range / ticks`: 1, 2 or 5 times a power of ten.
double round_step(double range, int ticks) {
  const double rough = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double best = power;
  for (const double multiple : {2.0, 5.0, 10.0}) {
    if (std::abs(std::log(multiple * power / rough)) < std::abs(std::log(best / rough))) best = multiple * power;
  }
  return best;
}

struct EventType {
  const char* name;
  bool allocate;
  LoggedKind kind;
};
// The seed's columns, as LoggingAdaptor writes them; RMM's action names read
// there too (a log written by hand or by a script that took them from RMM).
constexpr std::array<EventType, 8> kEventTypes{{{"Alloc", true, LoggedKind::Device},
                                               {"Free", false, LoggedKind::Device},
                                               {"HostAlloc", true, LoggedKind::Host},
                                               {"HostFree", false, LoggedKind::Host},
                                               {"ManagedAlloc", true, LoggedKind::Managed},
                                               {"ManagedFree", false, LoggedKind::Managed},
                                               {"allocate", true, LoggedKind::Device},
                                               {"deallocate", false, LoggedKind::Device}}};
// RMM's logging_resource_adaptor (Thread,Time,Action,Pointer,Size,Stream):
// device memory only, "allocate" and "free" ("deallocate" is read as well);
// its failed allocations ("allocate failure") hold nothing.
constexpr std::array<EventType, 3> kRmmActions{{{"allocate", true, LoggedKind::Device},
                                               {"free", false, LoggedKind::Device},
                                               {"deallocate", false, LoggedKind::Device}}};
constexpr const char* kRmmFailure = "allocate failure";

// Event types compare without case: "ALLOC" and "alloc" are still an allocation.
bool same_name(const std::string& text, const char* name) {
  return std::equal(text.begin(), text.end(), name, name + std::char_traits<char>::length(name),
                    [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) ==
                                                std::tolower(static_cast<unsigned char>(b)); });
}

// Where a log format keeps what a replay needs (`time`: the header's size
// where the log has no time column).
struct LogColumns {
  std::size_t type, address, size, time;
  const EventType* types_begin;
  const EventType* types_end;
};

constexpr std::array<const char*, 3> kKindNames{"device", "host", "managed"};
constexpr std::array<const char*, 3> kKindColours{"#1f77b4", "#ff7f0e", "#2ca02c"};
// Lines without a colour of their own (plot_series_svg), in turn.
constexpr std::array<const char*, 4> kPalette{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};

// Events read from rows with an empty time field hold their row's number.
// Where no row had a time, that is every event's time (the log is untimed);
// else each takes the time of the timed event above it, or, above the first
// timed event, that one's, so that a plot's time runs on.
void give_times_to_untimed_rows(std::vector<LoggedEvent>& events, const std::vector<std::size_t>& without_time,
                                MemoryLogGaps& found) {
  if (without_time.empty()) return;
  if (without_time.size() == events.size()) {
    found.untimed = true;
    return;
  }
  std::vector<bool> untimed(events.size());
  for (const std::size_t i : without_time) untimed[i] = true;
  const std::size_t first_timed = static_cast<std::size_t>(std::find(untimed.begin(), untimed.end(), false) -
                                                           untimed.begin());
  double latest = events[first_timed].time;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (untimed[i]) events[i].time = latest;
    else latest = events[i].time;
  }
}

}  // namespace

std::vector<LoggedEvent> read_memory_log(std::istream& in, const std::string& source, MemoryLogGaps* gaps) {
  MemoryLogGaps found;
  std::string line;
  if (!std::getline(in, line)) throw InvalidArgument("'" + source + "' is empty, not a cuemm CSV log");
  if (line.starts_with("\xef\xbb\xbf")) line.erase(0, 3);  // a byte-order mark
  const auto header = split_csv(line);
  auto find = [&](const char* name) {
    return static_cast<std::size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  const bool rmm = find("Event Type") == header.size() && find("Action") != header.size();
  auto column = [&](const char* name) {
    const std::size_t i = find(name);
    if (i == header.size()) {
      throw InvalidArgument("'" + source + "' has no '" + name + "' column (is it a cuemm CSV log, or RMM's?)");
    }
    return i;
  };
  // The time is only drawn (rows replay in the log's order): the seed's End,
  // else its Start; RMM's Time; else the row's number.
  const std::size_t time_column = rmm ? find("Time") : std::min(find("End"), find("Start"));
  const LogColumns columns =
      rmm ? LogColumns{column("Action"), column("Pointer"), column("Size"), time_column, kRmmActions.begin(),
                       kRmmActions.end()}
          : LogColumns{column("Event Type"), column("Address"), column("Size (bytes)"), time_column,
                       kEventTypes.begin(), kEventTypes.end()};
  found.untimed = time_column == header.size();
  const std::size_t device_column = rmm ? header.size() : find("Device ID");  // (optional)
  std::vector<LoggedEvent> events;
  using Key = std::tuple<int, LoggedKind, std::string>;
  std::map<Key, std::uint64_t> live;
  std::set<Key> empty;  // zero-byte allocations, whose frees are left out too
  std::uint64_t next = 0;
  std::vector<std::size_t> events_without_time;  // in order; their time, for now, is their row's number
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.empty() || line == "\r") continue;
    const auto fields = split_csv(line);
    const std::string where = source + ":" + std::to_string(row);
    // A last line with no newline that does not read is a row the writer
    // did not finish (a process killed mid-write): left out, and said so.
    const bool unfinished = in.eof();
    const auto refuse = [&](const std::string& why) {
      if (!unfinished) throw InvalidArgument(where + ": " + why);
      found.unfinished_last_row = true;
    };
    if (fields.size() < header.size()) {
      refuse("too few columns (" + std::to_string(fields.size()) + " of the header's " +
             std::to_string(header.size()) + ")");
      continue;
    }
    const auto type = std::find_if(columns.types_begin, columns.types_end,
                                   [&](const EventType& t) { return same_name(fields[columns.type], t.name); });
    if (type == columns.types_end) {
      if (rmm && same_name(fields[columns.type], kRmmFailure)) {
        ++found.failed_allocations;
      } else if (found.rows_of_other_types++ == 0) {
        found.first_other_type = fields[columns.type];
      }
      continue;
    }
    LoggedEvent event{type->allocate, type->kind, 0, 0, 0.0};
    const auto bytes = util::parse_whole_number(fields[columns.size]);
    if (!bytes) {
      refuse("the size '" + fields[columns.size] + "' is not a byte count");
      continue;
    }
    event.size = *bytes;
    const bool time_left_out = !found.untimed && fields[columns.time].empty();
    const std::optional<double> seconds = found.untimed || time_left_out ? std::optional<double>(row)
                                                                          : parse_seconds(fields[columns.time]);
    if (!seconds) {
      refuse("the time '" + fields[columns.time] + "' is neither seconds nor H:M:S");
      continue;
    }
    event.time = *seconds;
    if (device_column < header.size()) {
      const auto device = util::parse_whole_number(fields[device_column]);
      if (!device || *device > 1 << 20) {
        refuse("the device ID '" + fields[device_column] + "' is not a device ordinal");
        continue;
      }
      event.device = static_cast<int>(*device);
    }
    // A zero-byte allocation holds no memory (and managers refuse one): the
    // row and the free of its address are left out.
    const auto key = std::make_tuple(event.device, event.kind, fields[columns.address]);
    if (event.size == 0 && event.allocate) {
      empty.insert(key);
      ++found.zero_byte_allocations;
      continue;
    }
    if (event.allocate) {
      auto [it, fresh] = live.try_emplace(key, next);
      if (!fresh) {  // the address came back, so its free happened
        LoggedEvent inferred = event;
        inferred.allocate = false;
        inferred.id = it->second;
        events.push_back(inferred);
        if (time_left_out) events_without_time.push_back(events.size() - 1);
        it->second = next;
        ++found.frees_inferred;
      }
      event.id = next++;
    } else if (auto it = live.find(key); it != live.end()) {
      event.id = it->second;
      live.erase(it);
    } else {
      if (empty.erase(key) == 0) ++found.frees_of_unknown_addresses;
      continue;
    }
    events.push_back(event);
    if (time_left_out) events_without_time.push_back(events.size() - 1), ++found.rows_without_time;
  }
  give_times_to_untimed_rows(events, events_without_time, found);
  if (gaps) *gaps = found;
  return events;
}

std::string memory_plot_svg(const std::vector<LoggedEvent>& events, bool untimed) {
  std::array<PlotSeries, 3> by_kind;
  std::array<std::size_t, 3> live{};
  std::map<std::uint64_t, std::size_t> sizes;  // what each live allocation had
  // Rows come in the order their events took effect, but threads time them
  // before they take the log's lock, so a row's time may lie a little before
  // the row above's: each is drawn no earlier than the one before it (x does
  // not decrease, as PlotSeries wants; a long log's columns would zigzag).
  const double first = events.empty() ? 0.0 : events.front().time;
  double latest = first;
  for (const LoggedEvent& event : events) {
    latest = std::max(latest, event.time);
    const auto k = static_cast<std::size_t>(event.kind);
    if (event.allocate) {
      sizes[event.id] = event.size;
      live[k] += event.size;
    } else if (auto it = sizes.find(event.id); it != sizes.end()) {
      live[k] -= it->second;
      sizes.erase(it);
    }
    if (by_kind[k].points.empty()) by_kind[k].points.emplace_back(first, 0);
    by_kind[k].points.emplace_back(latest, live[k]);
  }
  std::vector<PlotSeries> series;
  for (std::size_t k = 0; k < by_kind.size(); ++k) {
    if (by_kind[k].points.empty()) continue;  // a kind the log never used
    by_kind[k].label = std::string(kKindNames[k]) + " memory in use";
    by_kind[k].colour = kKindColours[k];
    series.push_back(std::move(by_kind[k]));
  }
  return plot_series_svg(series, untimed ? "row" : nullptr);
}

std::string plot_series_svg(const std::vector<PlotSeries>& series, const char* count_name) {
  const bool untimed = count_name != nullptr;
  // Time runs from the first point: RMM's logs give seconds since 1970. (A
  // count is labelled as it is: row 2 is the log's second row.)
  // (A line's x does not decrease: its first point is its earliest.)
  std::optional<double> first;
  for (const PlotSeries& line : series)
    if (!line.points.empty()) first = std::min(first.value_or(line.points.front().first), line.points.front().first);
  const double origin = first.value_or(0.0);
  double end = 1e-9;
  std::size_t peak = 1;
  std::vector<std::size_t> peaks(series.size());
  for (std::size_t k = 0; k < series.size(); ++k)
    for (const auto& [t, b] : series[k].points) end = std::max(end, t - origin), peaks[k] = std::max(peaks[k], b);
  for (const std::size_t line_peak : peaks) peak = std::max(peak, line_peak);
  constexpr int kWidth = 800, kHeight = 400, kLeft = 70, kBottom = 30;
  auto x = [&](double t) { return kLeft + (kWidth - kLeft - 10) * t / end; };
  auto y = [&](std::size_t b) { return kHeight - kBottom - (kHeight - kBottom - 10) * static_cast<double>(b) / peak; };
  std::ostringstream out;
  char text[64];
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<line x1=\"" << kLeft << "\" y1=\"" << kHeight - kBottom << "\" x2=\"" << kWidth - 10 << "\" y2=\""
      << kHeight - kBottom << "\" stroke=\"black\"/>\n"
      << "<line x1=\"" << kLeft << "\" y1=\"10\" x2=\"" << kLeft << "\" y2=\"" << kHeight - kBottom
      << "\" stroke=\"black\"/>\n";
  out << "<text x=\"" << kLeft - 5 << "\" y=\"14\" text-anchor=\"end\">" << axis_bytes(peak) << "</text>\n";
  // Times in the unit that keeps the end's label short: s, ms or us (s, and
  // no ticks, where every event came at one instant).
  const bool one_instant = end <= 1e-9;
  const auto [time_unit, time_scale] = end >= 1.0 || one_instant ? std::pair{"s", 1.0}
                                       : end >= 1e-3              ? std::pair{"ms", 1e3}
                                                                  : std::pair{"us", 1e6};
  if (untimed) std::snprintf(text, sizeof text, "%s %.0f", count_name, end + origin);
  else std::snprintf(text, sizeof text, "%.3f %s", end * time_scale, time_unit);
  out << "<text x=\"" << kWidth - 10 << "\" y=\"" << kHeight - 8 << "\" text-anchor=\"end\">" << text << "</text>\n";
  // About how wide a label of the 11-pixel font is.
  auto label_width = [](const char* label) { return 6.5 * static_cast<double>(std::strlen(label)); };
  const double end_label_left = kWidth - 10 - label_width(text);
  // Round ticks between the origin and the labelled ends, with faint lines
  // across: a tick's label is left out where it would touch an end's.
  const util::ScaledBytes scaled_peak = util::scale_byte_size(peak);
  const double unit = static_cast<double>(peak) / scaled_peak.value;  // bytes in the peak's unit
  const double byte_step = std::max(1.0, round_step(scaled_peak.value, 5) * unit);  // whole bytes
  for (int i = 0; i * byte_step < static_cast<double>(peak); ++i) {
    const double b = i * byte_step;
    const double at = y(static_cast<std::size_t>(b));
    out << "<line x1=\"" << kLeft << "\" y1=\"" << at << "\" x2=\"" << kWidth - 10 << "\" y2=\"" << at
        << "\" stroke=\"#e0e0e0\"/>\n";
    if (at - 10 > 14) {
      out << "<text x=\"" << kLeft - 5 << "\" y=\"" << at + 4 << "\" text-anchor=\"end\">"
          << axis_bytes(static_cast<std::size_t>(b)) << "</text>\n";
    }
  }
  const double time_step =
      untimed ? std::max(1.0, round_step(end, 6)) : round_step(end * time_scale, 6) / time_scale;  // whole rows
  for (int i = 0; !one_instant && i * time_step < end; ++i) {
    const double t = i * time_step;
    const double at = x(t);
    out << "<line x1=\"" << at << "\" y1=\"" << kHeight - kBottom << "\" x2=\"" << at << "\" y2=\""
        << kHeight - kBottom + 4 << "\" stroke=\"black\"/>\n";
    if (untimed) std::snprintf(text, sizeof text, "%s %.0f", count_name, t + origin);
    else std::snprintf(text, sizeof text, "%g %s", t * time_scale, time_unit);
    if (at + label_width(text) / 2 + 10 < end_label_left)
      out << "<text x=\"" << at << "\" y=\"" << kHeight - 8 << "\" text-anchor=\"middle\">" << text << "</text>\n";
  }
  int legend_row = 0;
  // Steps, one per event; where a series has more events than a few per
  // column of half a pixel, each column is drawn as the range its values
  // took and the value it ended at: peaks stay exact, and a log of a million
  // events makes a file of tens of kilobytes, not tens of megabytes.
  constexpr int kColumns = 2 * (kWidth - kLeft - 10);
  auto point = [&](double at, std::size_t bytes) {
    std::snprintf(text, sizeof text, "%.1f,%.1f ", at, y(bytes));
    out << text;
  };
  // Lines without a colour take the palette's in turn, but those other lines have.
  auto taken = [&](const char* colour) {
    return std::any_of(series.begin(), series.end(),
                       [&](const PlotSeries& line) { return line.colour && std::string_view(line.colour) == colour; });
  };
  std::vector<const char*> colours;
  std::size_t next_colour = 0;
  for (const PlotSeries& line : series) {
    const char* colour = line.colour;
    for (std::size_t tried = 0; !colour && tried < kPalette.size(); ++tried) {
      const char* candidate = kPalette[next_colour++ % kPalette.size()];
      if (!taken(candidate)) colour = candidate;
    }
    colours.push_back(colour ? colour : kPalette[0]);
  }
  for (std::size_t k = 0; k < series.size(); ++k) {
    const auto& points = series[k].points;
    if (points.empty()) continue;
    const char* colour = colours[k];
    out << "<polyline fill=\"none\" stroke=\"" << colour << "\" points=\"";
    std::size_t previous = 0;
    if (points.size() <= 4 * static_cast<std::size_t>(kColumns)) {
      for (const auto& [t, b] : points) {
        point(x(t - origin), previous);
        point(x(t - origin), b);
        previous = b;
      }
    } else {
      auto column_of = [&](double t) { return std::min(kColumns - 1, static_cast<int>(t / end * kColumns)); };
      int column = column_of(points.front().first - origin);
      std::size_t entry = previous, lowest = previous, highest = previous;
      auto draw_column = [&] {  // from the value it began at, its range, to the value it ended at
        const double at = x(end * column / kColumns);
        point(at, entry);
        point(at, highest);
        point(at, lowest);
        point(at, previous);
      };
      for (const auto& [t, b] : points) {
        if (const int now = column_of(t - origin); now != column) {
          draw_column();
          column = now;
          entry = lowest = highest = previous;
        }
        lowest = std::min(lowest, b);
        highest = std::max(highest, b);
        previous = b;
      }
      draw_column();
    }
    out << "\"/>\n<text x=\"" << kLeft + 10 << "\" y=\"" << 24 + 14 * legend_row++ << "\" fill=\"" << colour
        << "\">" << series[k].label << " (peak " << axis_bytes(peaks[k]) << ")</text>\n";
  }
  out << "</svg>\n";
  return out.str();
}

}  // namespace cuemm
