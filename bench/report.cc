#include "bench/report.h"

#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "base/byte_size.h"
#include "base/json_writer.h"

namespace ferry::bench {

std::string FormatTable(const Report& r) {
  std::string out = absl::StrFormat("%-16s %10s %6s %9s %12s %11s %11s  %s\n", "series", "size",
                                    "batch", "GB/s", "ops/s", "p50 us", "p99 us", "note");
  for (const Measurement& m : r.rows) {
    absl::StrAppendFormat(&out, "%-16s %10s %6d %9.3f %12.0f %11.1f %11.1f  %s\n", m.series,
                          m.size ? FormatByteSize(m.size) : "-", m.batch, m.gbps, m.ops_per_sec,
                          m.p50_us, m.p99_us, m.note);
  }
  if (r.rss_a_peak || r.rss_b_peak) {
    absl::StrAppendFormat(&out, "\nagent peak RSS: node-a %.1f MiB, node-b %.1f MiB\n",
                          r.rss_a_peak / 1048576.0, r.rss_b_peak / 1048576.0);
  }
  if (r.rss_run_bytes) {
    absl::StrAppendFormat(
        &out, "RSS over a %s run (node-b): %.1f MiB after 1 GiB, %.1f MiB at the end\n",
        FormatByteSize(r.rss_run_bytes), r.rss_early / 1048576.0, r.rss_late / 1048576.0);
  }
  if (!r.findings.empty()) {
    out += "\n";
    for (const auto& f : r.findings) absl::StrAppend(&out, f, "\n");
  }
  return out;
}

std::string FormatJson(const Report& r) {
  JsonWriter j;
  j.BeginObject();
  j.Key("date").String(r.date);
  j.Key("machine").String(r.machine);
  j.Key("rows").BeginArray();
  for (const Measurement& m : r.rows) {
    j.BeginObject();
    j.Key("series").String(m.series);
    j.Key("size").Uint(m.size);
    j.Key("batch").Uint(m.batch);
    j.Key("ops").Uint(m.ops);
    j.Key("bytes").Uint(m.bytes);
    j.Key("seconds").Double(m.seconds);
    j.Key("gbps").Double(m.gbps);
    j.Key("ops_per_sec").Double(m.ops_per_sec);
    j.Key("p50_us").Double(m.p50_us);
    j.Key("p99_us").Double(m.p99_us);
    j.Key("note").String(m.note);
    j.EndObject();
  }
  j.EndArray();
  j.Key("rss").BeginObject();
  j.Key("node_a_peak").Uint(r.rss_a_peak);
  j.Key("node_b_peak").Uint(r.rss_b_peak);
  j.Key("long_run_bytes").Uint(r.rss_run_bytes);
  j.Key("after_first_gib").Uint(r.rss_early);
  j.Key("at_end").Uint(r.rss_late);
  j.EndObject();
  j.Key("findings").BeginArray();
  for (const auto& f : r.findings) j.String(f);
  j.EndArray();
  j.EndObject();
  return j.str() + "\n";
}

namespace {

// Tic labels at every 4x of the measured sizes, in binary units ("64 KiB").
std::string XTics(const Report& r) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const Measurement& m : r.rows) {
    if (m.size == 0) continue;
    lo = std::min(lo, m.size);
    hi = std::max(hi, m.size);
  }
  if (hi == 0) return "";
  std::string tics = "set xtics (";
  for (uint64_t s = lo; s <= hi; s *= 4) {
    absl::StrAppend(&tics, s == lo ? "" : ", ", "'", FormatByteSize(s), "' ", s);
    if (s > hi / 4) break;
  }
  return tics + ")\n";
}

}  // namespace

namespace {

// Rows plotted as latency (p50 of one op against size) rather than bandwidth.
bool IsLatencySeries(const std::string& series) {
  return series == "ferry lat" || series == "ferry stream lat" || series == "grpc unary" ||
         series == "ucx put_lat";
}

}  // namespace

absl::Status PlotPng(const Report& r, const std::string& png) {
  std::string base = png.substr(0, png.rfind('.'));
  // Bandwidth panel: every sized series but the latency ones and the engine (ops/s, no wire),
  // KV batches as one line over their block sizes. Latency panel: p50 of one op, log-log.
  std::map<std::string, std::vector<const Measurement*>> bandwidth, latency;
  std::string engine_label;
  for (const Measurement& m : r.rows) {
    if (m.series == "engine only") {
      // The note starts with the layout ("scattered, ...").
      absl::StrAppendFormat(&engine_label, "%sengine only, %s %s blocks: %.0f ops/s",
                            engine_label.empty() ? "" : "\\n", FormatByteSize(m.size),
                            m.note.substr(0, m.note.find(',')), m.ops_per_sec);
    } else if (m.size > 0) {
      std::string name = m.series == "ferry kv" ? absl::StrCat("ferry kv (", m.batch, " blocks)")
                                                : m.series;
      (IsLatencySeries(m.series) ? latency : bandwidth)[name].push_back(&m);
    }
  }
  std::string data = base + ".dat";
  std::ofstream dat(data);
  std::string plot = absl::StrCat(
      // noenhanced: "put_bw" is a name, not p-u-t with a subscript.
      "set terminal pngcairo size 1600,600 noenhanced\nset output '", png, "'\n",
      "set multiplot layout 1,2 title 'ferry on loopback vs baselines (", r.date, ")'\n",
      "set logscale x 2\n", XTics(r), "set xlabel 'transfer size'\n",
      "set ylabel 'GB/s'\nset key left top\nset grid\nset title 'throughput'\nplot ");
  int index = 0, curves = 0;
  // Each series a data set of (size, value) and a curve of the panel being written.
  auto add_series = [&](const std::map<std::string, std::vector<const Measurement*>>& series,
                        double Measurement::*value) {
    for (const auto& [name, rows] : series) {
      dat << "# " << name << "\n";
      for (const Measurement* m : rows) dat << m->size << " " << m->*value << "\n";
      dat << "\n\n";
      absl::StrAppend(&plot, curves++ ? ", " : "", "'", data, "' index ", index++,
                      " with linespoints title '", name, "'");
    }
  };
  add_series(bandwidth, &Measurement::gbps);
  for (const Measurement& m : r.rows) {
    if (m.size == 0) {
      absl::StrAppend(&plot, curves++ ? ", " : "", m.gbps, " with lines dashtype 2 title '",
                      m.series, "'");
    }
  }
  absl::StrAppend(&plot, "\nset logscale y 10\nset ylabel 'p50 us, one op at a time'\n",
                  "set title 'latency of one op'\n");
  if (!engine_label.empty()) {
    absl::StrAppend(&plot, "set label 1 \"", engine_label,
                    "\" at graph 0.02, graph 0.75 front\n");
  }
  absl::StrAppend(&plot, "plot ");
  curves = 0;
  add_series(latency, &Measurement::p50_us);
  if (curves == 0) absl::StrAppend(&plot, "NaN notitle");
  plot += "\nunset multiplot\n";
  std::string script = base + ".gp";
  std::ofstream(script) << plot;
  dat.close();
  if (std::system(absl::StrCat("gnuplot ", script, " 2>/dev/null").c_str()) != 0) {
    // Older gnuplot builds lack pngcairo; the plain png terminal draws the same picture.
    std::string plain = absl::StrReplaceAll(plot, {{"pngcairo", "png"}});
    std::ofstream(script) << plain;
    if (std::system(absl::StrCat("gnuplot ", script).c_str()) != 0) {
      return absl::InternalError(absl::StrCat("gnuplot ", script, " failed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ferry::bench
