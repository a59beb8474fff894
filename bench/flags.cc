#include "bench/flags.h"

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tools/flag_parser.h"

namespace offload::bench {
namespace {

const char kUsage[] =
    "usage: layer_stack_bench | pipeline_bench --hidden=4096 --tokens=8192 "
    "[--layers=8] [--steps=5] [--warmup=2] [--kmax=LAYERS-2] [--retain] "
    "[--push_at=gemm|layer] [--sim_only [--gemm_ms=a,b,...(15)] "
    "[--trace_k=K]] [--timeline_k=K --timeline_prefix=PATH] "
    "[--budget_k=4,4.5,...] [--joint_k=...] [--ckpt_k=...] [--probe] "
    "[--graph_k=0,2,4] [--pp=P --microbatches=M (pipeline_bench)]\n";

// "a,b,c" as numbers into *out, or the reason it is refused.
std::string Doubles(const std::string& v, std::vector<double>* out) {
  std::vector<double> values;
  for (const std::string& item : SplitList(v)) {
    char* end = nullptr;
    values.push_back(std::strtod(item.c_str(), &end));
    if (end == item.c_str() || *end != '\0') return "not a list of numbers";
  }
  *out = std::move(values);
  return "";
}

// Layer indices (k values) must lie in [0, layers).
std::string OutsideLayers(const std::vector<double>& ks, int layers) {
  for (double k : ks) {
    if (!(k >= 0 && k < layers)) {
      return "values must be in [0, --layers) = [0, " + std::to_string(layers) + ")";
    }
  }
  return "";
}

}  // namespace

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  FlagParser parser(kUsage);
  parser.Int64("hidden", &f.shape.hidden, 1);
  parser.Int64("tokens", &f.shape.tokens, 1);
  parser.Int("layers", &f.shape.layers, 1);
  parser.Int("steps", &f.steps, 1);
  parser.Int("warmup", &f.warmup, 0);
  parser.Int("pp", &f.pp, 1);
  parser.Int("microbatches", &f.microbatches, 1);
  parser.Int("kmax", &f.kmax, 0);
  parser.Custom("push_at", [&f](const std::string& at) -> std::string {
    if (at == "gemm") f.shape.push_at = PushAt::kGemm;
    else if (at == "layer") f.shape.push_at = PushAt::kLayer;
    else return "must be gemm or layer";
    return "";
  });
  parser.Bool("sim_only", &f.sim_only);
  parser.Bool("retain", &f.retain);
  parser.Bool("probe", &f.probe);
  parser.Int("trace_k", &f.trace_k, 0);
  parser.Int("timeline_k", &f.timeline_k, 0);
  parser.String("timeline_prefix", &f.timeline_prefix);
  parser.Custom("gemm_ms", [&f](const std::string& v) { return Doubles(v, &f.gemm_ms); });
  parser.Custom("budget_k", [&f](const std::string& v) { return Doubles(v, &f.budget_k); });
  parser.Custom("joint_k", [&f](const std::string& v) { return Doubles(v, &f.joint_k); });
  parser.Custom("ckpt_k", [&f](const std::string& v) { return Doubles(v, &f.ckpt_k); });
  parser.Custom("graph_k", [&f](const std::string& v) -> std::string {
    std::vector<double> ks;
    if (std::string why = Doubles(v, &ks); !why.empty()) return why;
    f.graph_k.clear();
    for (double k : ks) {
      if (k != double(int(k))) return "values must be integers";
      f.graph_k.push_back(int(k));
    }
    return "";
  });
  FlagParser::Result result = parser.Parse(argc, argv);
  const struct {
    const char* name;
    std::vector<double> ks;
  } lists[] = {{"budget_k", f.budget_k},
               {"joint_k", f.joint_k},
               {"ckpt_k", f.ckpt_k},
               {"graph_k", std::vector<double>(f.graph_k.begin(), f.graph_k.end())}};
  for (const auto& list : lists) {
    if (result != FlagParser::Result::kOk) break;
    if (std::string why = OutsideLayers(list.ks, f.shape.layers); !why.empty()) {
      std::ostringstream value;
      for (size_t i = 0; i < list.ks.size(); ++i) {
        value << (i ? "," : "") << list.ks[i];
      }
      result = parser.Fail(list.name, value.str(), why);
    }
  }
  if (result != FlagParser::Result::kOk) std::exit(FlagParser::ExitCode(result));
  if (f.kmax < 0) f.kmax = f.shape.layers - 2;
  return f;
}

}  // namespace offload::bench
