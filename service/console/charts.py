"""Small charts rendered on the server as inline SVG: no chart library, no script. Labels go in
through :meth:`Markup.format`, which escapes them (scope labels and user ids are user input)."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup

BAR = "#3b6ea5"
EMPTY = Markup('<p class="muted">{}: nothing yet</p>')


def bar_chart(pairs: Sequence[tuple[str, int]], *, title: str, width: int = 360, bar_h: int = 18) -> Markup:
    """Horizontal bars, one per (label, count), in the order given."""
    if not pairs:
        return EMPTY.format(title)
    label_w, gap = 130, 6
    top = max(count for _, count in pairs) or 1
    height = len(pairs) * (bar_h + gap) + gap
    row = Markup(
        '<text x="{lx}" y="{ty}" text-anchor="end">{label}</text>'
        '<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}" rx="2"/>'
        '<text x="{cx}" y="{ty}">{count}</text>'
    )
    rows = []
    for i, (label, count) in enumerate(pairs):
        y = gap + i * (bar_h + gap)
        w = max(1, round((width - label_w - 50) * count / top))
        rows.append(
            row.format(
                lx=label_w - 6, ty=y + bar_h - 5, label=label[:22], x=label_w, y=y, w=w, h=bar_h, fill=BAR,
                cx=label_w + w + 4, count=count,
            )
        )  # fmt: skip
    frame = Markup(
        '<figure class="chart"><figcaption>{title}</figcaption><svg role="img" aria-label="{title}" '
        'width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-size="11">{rows}</svg></figure>'
    )
    return frame.format(title=title, width=width, height=height, rows=Markup("").join(rows))


def column_chart(pairs: Sequence[tuple[str, int]], *, title: str, width: int = 360, height: int = 140) -> Markup:
    """Vertical columns over time (one per day), the first and last dates labelled."""
    if not pairs:
        return EMPTY.format(title)
    top = max(count for _, count in pairs) or 1
    plot_h, base = height - 34, height - 20
    step = width / len(pairs)
    col = Markup(
        '<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{fill}"><title>{label}: {n}</title></rect>'
    )
    cols = [
        col.format(
            x=i * step + 1, y=base - round(plot_h * n / top), w=max(1.0, step - 2), h=round(plot_h * n / top),
            fill=BAR, label=label, n=n,
        )
        for i, (label, n) in enumerate(pairs)
    ]  # fmt: skip
    frame = Markup(
        '<figure class="chart"><figcaption>{title} (max {top}/day)</figcaption><svg role="img" '
        'aria-label="{title}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-size="10">'
        '{cols}<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#999"/>'
        '<text x="0" y="{ly}">{first}</text><text x="{width}" y="{ly}" text-anchor="end">{last}</text></svg></figure>'
    )
    return frame.format(
        title=title, top=top, width=width, height=height, cols=Markup("").join(cols), base=base, ly=height - 6,
        first=pairs[0][0], last=pairs[-1][0],
    )  # fmt: skip
