"""Draws a dashboard's panels as SVG from a Prometheus server's answers (see
scripts/dashboard-picture): each panel where its gridPos puts it, each query as Grafana would
send it with every variable at All and $__rate_interval at 5s."""

import html
import json
import math
import re
import sys
import urllib.parse
import urllib.request

COLUMN, ROW, PAD = 50, 34, 6
COLORS = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0"]
VARIABLES = {"$__rate_interval": "5s", "$registry": ".*", "$lock": ".*", "$election": ".*"}


def ask(prometheus, expr, start, end):
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{query}") as answer:
        return json.load(answer)["data"]["result"]


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def shown(value, unit):
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"


def panel(out, p, series, start, end):
    pos = p["gridPos"]
    x, y, w, h = pos["x"] * COLUMN, pos["y"] * ROW, pos["w"] * COLUMN, pos["h"] * ROW
    unit = p["fieldConfig"]["defaults"].get("unit", "short")
    out.append(f'<rect x="{x + PAD}" y="{y + PAD}" width="{w - 2 * PAD}" height="{h - 2 * PAD}" '
               f'rx="3" fill="#181b1f" stroke="#2c3235"/>')
    out.append(f'<text x="{x + 2 * PAD}" y="{y + 24}" class="title">{html.escape(p["title"])}</text>')
    if p["type"] == "stat":
        for i, (name, points) in enumerate(series):
            last = points[-1][1] if points else float("nan")
            text = "no data" if math.isnan(last) else shown(last, unit)
            cy = y + 70 + i * 50
            out.append(f'<text x="{x + w / 2}" y="{cy}" class="stat" text-anchor="middle">{text}</text>')
            out.append(f'<text x="{x + w / 2}" y="{cy + 18}" class="legend" text-anchor="middle">'
                       f"{html.escape(name)}</text>")
        return
    left, top, right, bottom = x + 52, y + 36, x + w - 2 * PAD - 6, y + h - 2 * PAD - 34
    values = [v for _, pts in series for _, v in pts if not math.isnan(v)]
    top_value = max(values, default=0) or 1
    for frac in (0, 0.5, 1):
        gy = bottom - frac * (bottom - top)
        out.append(f'<line x1="{left}" x2="{right}" y1="{gy}" y2="{gy}" stroke="#2c3235"/>')
        out.append(f'<text x="{left - 4}" y="{gy + 4}" class="axis" text-anchor="end">'
                   f"{shown(top_value * frac, unit)}</text>")
    for i, (name, points) in enumerate(series[:8]):
        color = COLORS[i % len(COLORS)]
        path, pen = [], "M"
        for t, v in points:
            if math.isnan(v):
                pen = "M"
                continue
            px = left + (t - start) / max(end - start, 1) * (right - left)
            py = bottom - v / top_value * (bottom - top)
            path.append(f"{pen}{px:.1f},{py:.1f}")
            pen = "L"
        out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        lx = x + 2 * PAD + (i % 3) * (w - 4 * PAD) / 3
        ly = bottom + 18 + (i // 3) * 13
        out.append(f'<rect x="{lx}" y="{ly - 7}" width="10" height="3" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}" class="legend">{html.escape(name[:38])}</text>')
    if not series:
        out.append(f'<text x="{(left + right) / 2}" y="{(top + bottom) / 2}" class="axis" '
                   f'text-anchor="middle">no data</text>')


def main():
    prometheus, path, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dashboard = json.load(open(path))
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]) * ROW
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{24 * COLUMN}" height="{height + 40}" '
           f'font-family="sans-serif">',
           "<style>.title{fill:#ccccdc;font-size:13px;font-weight:600}.axis{fill:#8e8e8e;"
           "font-size:10px}.legend{fill:#ccccdc;font-size:10px}.stat{fill:#73bf69;font-size:30px;"
           "font-weight:600}.row{fill:#ccccdc;font-size:15px;font-weight:600}</style>",
           f'<rect width="100%" height="100%" fill="#111217"/>']
    for p in dashboard["panels"]:
        if p["type"] == "row":
            out.append(f'<text x="{PAD}" y="{p["gridPos"]["y"] * ROW + 24}" class="row">'
                       f'{html.escape(p["title"])}</text>')
            continue
        series = []
        for target in p["targets"]:
            for result in ask(prometheus, target["expr"], start, end):
                points = [(float(t), float(v)) for t, v in result["values"]]
                series.append((legend(target.get("legendFormat", ""), result["metric"]), points))
        panel(out, p, series, start, end)
    out.append(f'<text x="{PAD}" y="{height + 28}" class="axis">{html.escape(dashboard["title"])}: '
               f"the http_service example under load for {end - start} s, scraped every second "
               f"(scripts/dashboard-picture)</text>")
    out.append("</svg>")
    print("\n".join(out))


main()
