"""An SVG picture of live memory over time, from a cuemm CSV log."""

import csv
import io

_ALLOCATE = {"Alloc": ("device", 1), "Free": ("device", -1), "HostAlloc": ("host", 1), "HostFree": ("host", -1),
             "ManagedAlloc": ("managed", 1), "ManagedFree": ("managed", -1)}
_COLOURS = {"device": "#1f77b4", "host": "#ff7f0e", "managed": "#2ca02c"}


def live_bytes_over_time(log_text):
    """{kind: [(seconds, live bytes)]} from the log's Alloc/Free rows."""
    series = {kind: [(0.0, 0)] for kind in _COLOURS}
    live = {kind: 0 for kind in _COLOURS}
    for row in csv.DictReader(io.StringIO(log_text)):
        event = _ALLOCATE.get(row["Event Type"])
        if event is None:
            continue
        kind, sign = event
        live[kind] += sign * int(row["Size (bytes)"])
        series[kind].append((float(row["End"]), live[kind]))
    return {kind: points for kind, points in series.items() if len(points) > 1}


def svg_from_log(log_text, width=800, height=400):
    series = live_bytes_over_time(log_text)
    end = max([t for points in series.values() for t, _ in points] + [1e-9])
    peak = max([b for points in series.values() for _, b in points] + [1])
    left, bottom = 70, 30
    def x(t):
        return left + (width - left - 10) * t / end
    def y(b):
        return height - bottom - (height - bottom - 10) * b / peak
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="10" x2="{left}" y2="{height - bottom}" stroke="black"/>',
             f'<text x="{left - 5}" y="14" text-anchor="end">{peak / 2**20:.1f} MiB</text>',
             f'<text x="{width - 10}" y="{height - 8}" text-anchor="end">{end:.3f} s</text>']
    for row, (kind, points) in enumerate(series.items()):
        steps = []
        previous = 0
        for t, b in points:
            steps.append(f"{x(t):.1f},{y(previous):.1f} {x(t):.1f},{y(b):.1f}")
            previous = b
        parts.append(f'<polyline fill="none" stroke="{_COLOURS[kind]}" points="{" ".join(steps)}"/>')
        parts.append(f'<text x="{left + 10}" y="{24 + 14 * row}" fill="{_COLOURS[kind]}">{kind} memory in use</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
