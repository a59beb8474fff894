#include "timeline/svg_timeline.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace offload::timeline {
namespace {

constexpr int kLeft = 130;  // row labels
constexpr int kRight = 20;

const char* Fill(SliceKind kind) {
  switch (kind) {
    case SliceKind::kForward: return "#4e79a7";
    case SliceKind::kBackward: return "#59a14f";
    case SliceKind::kD2H: return "#f28e2b";
    case SliceKind::kH2D: return "#b07aa1";
    case SliceKind::kGather: return "#edc948";
    case SliceKind::kStall: return "#e15759";
    case SliceKind::kOther: return "#bab0ac";
  }
  return "#bab0ac";
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Num(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

// A tick step of 1, 2 or 5 times a power of ten giving about 8 ticks.
double TickStep(double span) {
  double step = 1;
  while (span / step > 10) step *= 10;
  while (span / step < 4) step /= 10;
  if (span / step > 8) step *= span / (step * 2) > 8 ? 5 : 2;
  return step;
}

}  // namespace

std::string ToSvg(const std::vector<Timeline>& timelines,
                  const SvgOptions& options) {
  int64_t span_ns = 1;
  for (const Timeline& t : timelines) {
    span_ns = std::max(span_ns, t.EndNs() - t.origin_ns);
  }
  const double plot = options.width - kLeft - kRight;
  auto x = [&](int64_t ns, int64_t origin) {
    return kLeft + plot * static_cast<double>(ns - origin) / span_ns;
  };
  int64_t top = 1;  // the memory scale: the highest peak or budget
  for (const Timeline& t : timelines) {
    top = std::max(top, t.budget_bytes);
    auto device = t.counters.find(kDeviceBytes);
    if (device == t.counters.end()) continue;
    for (const CounterPoint& p : device->second) top = std::max(top, p.value);
  }
  std::string body;
  int y = 10;
  // Legend.
  const SliceKind kinds[] = {SliceKind::kForward, SliceKind::kBackward,
                             SliceKind::kD2H,     SliceKind::kH2D,
                             SliceKind::kGather,  SliceKind::kStall,
                             SliceKind::kOther};
  int lx = kLeft;
  for (SliceKind kind : kinds) {
    body += "<rect class=\"legend\" x=\"" + std::to_string(lx) + "\" y=\"" +
            std::to_string(y) + "\" width=\"14\" height=\"12\" fill=\"" +
            Fill(kind) + "\"/><text x=\"" + std::to_string(lx + 18) +
            "\" y=\"" + std::to_string(y + 11) + "\">" + SliceKindName(kind) +
            "</text>\n";
    lx += 100;
  }
  y += 30;
  for (const Timeline& t : timelines) {
    body += "<g class=\"panel\" data-title=\"" + Escape(t.title) + "\">\n";
    body += "<text class=\"title\" x=\"10\" y=\"" + std::to_string(y + 14) +
            "\" font-weight=\"bold\">" + Escape(t.title) + "</text>\n";
    y += 24;
    for (const std::string& track : t.tracks) {
      body += "<g class=\"row\" data-track=\"" + Escape(track) + "\">\n";
      body += "<text x=\"10\" y=\"" + std::to_string(y + 17) + "\">" +
              Escape(track) + "</text>\n";
      body += "<line x1=\"" + std::to_string(kLeft) + "\" x2=\"" +
              std::to_string(options.width - kRight) + "\" y1=\"" +
              std::to_string(y + options.row_height - 2) + "\" y2=\"" +
              std::to_string(y + options.row_height - 2) +
              "\" stroke=\"#ddd\"/>\n";
      for (const Slice& s : t.slices) {
        if (s.track != track) continue;
        const double x0 = x(s.start_ns, t.origin_ns);
        const double w = std::max(0.5, x(s.end_ns, t.origin_ns) - x0);
        std::string tip = s.name + " (" + Num((s.end_ns - s.start_ns) / 1e3) +
                          " us)";
        for (const auto& [key, value] : s.args) tip += "\n" + key + ": " + value;
        body += "<rect class=\"slice\" data-track=\"" + Escape(track) +
                "\" data-kind=\"" + SliceKindName(s.kind) + "\" data-name=\"" +
                Escape(s.name) + "\" x=\"" + Num(x0) + "\" y=\"" +
                std::to_string(y + 2) + "\" width=\"" + Num(w) +
                "\" height=\"" + std::to_string(options.row_height - 6) +
                "\" fill=\"" + Fill(s.kind) + "\"" +
                (s.kind == SliceKind::kStall ? " stroke=\"#a00\"" : "") +
                "><title>" + Escape(tip) + "</title></rect>\n";
        if (!s.label.empty() && w >= 7.0 * s.label.size() + 4) {
          body += "<text class=\"label\" x=\"" + Num(x0 + w / 2) + "\" y=\"" +
                  std::to_string(y + 17) +
                  "\" text-anchor=\"middle\" fill=\"white\" font-size=\"11\">" +
                  Escape(s.label) + "</text>\n";
        }
      }
      body += "</g>\n";
      y += options.row_height;
    }
    // The device-memory curve and the budget, on one scale for all panels.
    auto device = t.counters.find(kDeviceBytes);
    int64_t peak = 0;
    if (device != t.counters.end()) {
      for (const CounterPoint& p : device->second) peak = std::max(peak, p.value);
    }
    const int h = options.memory_height;
    auto my = [&](int64_t value) {
      return y + h - static_cast<double>(h - 10) * value / top;
    };
    body += "<g class=\"memory\">\n<text x=\"10\" y=\"" +
            std::to_string(y + h / 2) + "\">device memory</text>\n";
    body += "<text x=\"10\" y=\"" + std::to_string(y + h / 2 + 14) +
            "\" font-size=\"11\">peak " + Num(peak / 1048576.0) +
            " MiB</text>\n";
    if (device != t.counters.end() && !device->second.empty()) {
      std::string path;
      const std::vector<CounterPoint>& points = device->second;
      double last_y = my(points.front().value);
      path += "M" + Num(x(points.front().time_ns, t.origin_ns)) + "," +
              Num(last_y);
      for (size_t i = 0; i < points.size(); ++i) {
        // Of several changes at one moment, only the last is drawn.
        if (i + 1 < points.size() && points[i + 1].time_ns == points[i].time_ns) {
          continue;
        }
        const double px = x(points[i].time_ns, t.origin_ns);
        path += " L" + Num(px) + "," + Num(last_y);
        last_y = my(points[i].value);
        path += " L" + Num(px) + "," + Num(last_y);
      }
      path += " L" + Num(x(t.EndNs(), t.origin_ns)) + "," + Num(last_y);
      body += "<path class=\"memory-curve\" d=\"" + path +
              "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.5\"/>\n";
    }
    if (t.budget_bytes >= 0) {
      const double by = my(t.budget_bytes);
      body += "<line class=\"budget\" x1=\"" + std::to_string(kLeft) +
              "\" x2=\"" + std::to_string(options.width - kRight) +
              "\" y1=\"" + Num(by) + "\" y2=\"" + Num(by) +
              "\" stroke=\"#e15759\" stroke-dasharray=\"6,4\"/>\n";
      body += "<text x=\"" + std::to_string(options.width - kRight - 4) +
              "\" y=\"" + Num(by - 4) +
              "\" text-anchor=\"end\" fill=\"#e15759\" font-size=\"11\">" +
              Escape(t.budget_label) + "</text>\n";
    }
    body += "</g>\n</g>\n";
    y += h + 16;
  }
  // Time axis.
  const double span_us = span_ns / 1e3;
  const double step = TickStep(span_us);
  body += "<g class=\"axis\">\n<line x1=\"" + std::to_string(kLeft) +
          "\" x2=\"" + std::to_string(options.width - kRight) + "\" y1=\"" +
          std::to_string(y) + "\" y2=\"" + std::to_string(y) +
          "\" stroke=\"#333\"/>\n";
  for (double tick = 0; tick <= span_us + 1e-9; tick += step) {
    const double px = kLeft + plot * tick / span_us;
    body += "<line x1=\"" + Num(px) + "\" x2=\"" + Num(px) + "\" y1=\"" +
            std::to_string(y) + "\" y2=\"" + std::to_string(y + 5) +
            "\" stroke=\"#333\"/><text x=\"" + Num(px) + "\" y=\"" +
            std::to_string(y + 18) + "\" text-anchor=\"middle\" "
            "font-size=\"11\">" + Num(tick / 1000.0) + "</text>\n";
  }
  body += "<text x=\"" + std::to_string(options.width - kRight) + "\" y=\"" +
          std::to_string(y + 34) + "\" text-anchor=\"end\" font-size=\"11\">"
          "time (ms)</text>\n</g>\n";
  y += 44;
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         std::to_string(options.width) + "\" height=\"" + std::to_string(y) +
         "\" viewBox=\"0 0 " + std::to_string(options.width) + " " +
         std::to_string(y) + "\" font-family=\"sans-serif\" font-size=\"13\">\n"
         "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body +
         "</svg>\n";
}

}  // namespace offload::timeline
