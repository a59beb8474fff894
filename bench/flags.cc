#include "bench/flags.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace offload::bench {
namespace {

// "a,b,c" as numbers.
std::vector<double> Doubles(const char* v) {
  std::vector<double> out;
  for (const char* p = v; *p;) {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    if (end == p) Die(std::string("not a list of numbers: ") + v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      size_t n = std::strlen(name);
      if (a.compare(0, n, name) == 0 && a.size() > n && a[n] == '=') {
        return a.c_str() + n + 1;
      }
      return nullptr;
    };
    if (const char* v = val("--hidden")) f.shape.hidden = std::atoll(v);
    else if (const char* v = val("--tokens")) f.shape.tokens = std::atoll(v);
    else if (const char* v = val("--layers")) f.shape.layers = std::atoi(v);
    else if (const char* v = val("--steps")) f.steps = std::atoi(v);
    else if (const char* v = val("--warmup")) f.warmup = std::atoi(v);
    else if (const char* v = val("--pp")) f.pp = std::atoi(v);
    else if (const char* v = val("--microbatches")) f.microbatches = std::atoi(v);
    else if (const char* v = val("--kmax")) f.kmax = std::atoi(v);
    else if (const char* v = val("--push_at")) {
      const std::string at = v;
      if (at == "gemm") f.shape.push_at = PushAt::kGemm;
      else if (at == "layer") f.shape.push_at = PushAt::kLayer;
      else Die("--push_at must be gemm or layer, not " + at);
    }
    else if (a == "--sim_only") f.sim_only = true;
    else if (a == "--retain") f.retain = true;
    else if (a == "--probe") f.probe = true;
    else if (const char* v = val("--trace_k")) f.trace_k = std::atoi(v);
    else if (const char* v = val("--timeline_k")) f.timeline_k = std::atoi(v);
    else if (const char* v = val("--timeline_prefix")) f.timeline_prefix = v;
    else if (const char* v = val("--gemm_ms")) f.gemm_ms = Doubles(v);
    else if (const char* v = val("--budget_k")) f.budget_k = Doubles(v);
    else if (const char* v = val("--joint_k")) f.joint_k = Doubles(v);
    else if (const char* v = val("--ckpt_k")) f.ckpt_k = Doubles(v);
    else if (const char* v = val("--graph_k")) {
      for (double k : Doubles(v)) {
        if (k != double(int(k))) Die("--graph_k values must be integers");
        f.graph_k.push_back(int(k));
      }
    }
    else Die("unknown flag " + a);
  }
  if (f.kmax < 0) f.kmax = f.shape.layers - 2;
  for (const std::vector<double>* list : {&f.joint_k, &f.ckpt_k}) {
    for (double k : *list) {
      if (!(k >= 0 && k < f.shape.layers)) {
        Die("--joint_k and --ckpt_k values must be in [0, layers)");
      }
    }
  }
  for (double k : f.budget_k) {
    if (!(k >= 0 && k < f.shape.layers)) {
      Die("--budget_k values must be in [0, layers)");
    }
  }
  for (int k : f.graph_k) {
    if (k < 0 || k >= f.shape.layers) {
      Die("--graph_k values must be in [0, layers)");
    }
  }
  return f;
}

}  // namespace offload::bench
