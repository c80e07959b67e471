// Text and JSON renderings of a doctor report.
#include "absl/strings/str_cat.h"
#include "base/json_writer.h"
#include "transport/topology/doctor.h"
#include "transport/topology/plan_format.h"

namespace ferry::topology {

std::string FormatDoctorText(const DoctorReport& report) {
  std::string out;
  for (const Finding& f : report.findings) {
    absl::StrAppend(&out, "[", SeverityName(f.severity), "]",
                    f.severity == Severity::kOk ? "   " : " ", f.check, ": ", f.fact, "\n");
    if (!f.remedy.empty()) absl::StrAppend(&out, "       remedy: ", f.remedy, "\n");
  }
  absl::StrAppend(&out, "\n", report.Count(Severity::kOk), " OK, ",
                  report.Count(Severity::kWarn), " WARN, ", report.Count(Severity::kFail),
                  " FAIL\n");
  return out;
}

std::string FormatDoctorJson(const DoctorReport& report, const Machine& machine,
                             const TopologyPlan& plan) {
  JsonWriter json;
  json.BeginObject();
  json.Key("ok").Bool(!report.HasFailure());
  json.Key("counts").BeginObject();
  json.Key("ok").Int(report.Count(Severity::kOk));
  json.Key("warn").Int(report.Count(Severity::kWarn));
  json.Key("fail").Int(report.Count(Severity::kFail));
  json.EndObject();
  json.Key("findings").BeginArray();
  for (const Finding& f : report.findings) {
    json.BeginObject();
    json.Key("severity").String(SeverityName(f.severity));
    json.Key("check").String(f.check);
    json.Key("fact").String(f.fact);
    json.Key("remedy").String(f.remedy);
    json.EndObject();
  }
  json.EndArray();
  json.Key("topology").BeginObject();
  WritePlanMembers(machine, plan, json);
  json.EndObject();
  json.EndObject();
  return json.str() + "\n";
}

}  // namespace ferry::topology
