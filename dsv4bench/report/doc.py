"""A small document model rendered twice: report.md (PNGs beside it) and a self-contained
report.html (PNGs embedded as base64 data URIs, inline CSS, no external references)."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

COLLAPSE_ROWS = 25  # longer tables fold into <details> in the html


@dataclass
class Table:
    headers: list[str]
    rows: list[list]
    caption: str = ""
    folded: bool = False  # inside <details> in both outputs (long traceability tables)


@dataclass
class Doc:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", level, text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("ul", list(items)))

    def image(self, path: Path, alt: str) -> None:
        self.blocks.append(("img", Path(path), alt))

    def table(
        self, headers: list[str], rows: list[list], caption: str = "", folded: bool = False
    ) -> None:
        if rows:
            self.blocks.append(("table", Table(headers, rows, caption, folded)))

    # ---- markdown ------------------------------------------------------------------------

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out += ["#" * block[1] + " " + block[2], ""]
            elif kind == "p":
                out += [block[1], ""]
            elif kind == "ul":
                out += [f"- {item}" for item in block[1]] + [""]
            elif kind == "img":
                out += [f"![{block[2]}]({block[1].name})", ""]
            elif kind == "table":
                t: Table = block[1]
                if t.folded:
                    summary = html.escape(t.caption or "table")
                    out += [f"<details><summary>{summary} ({len(t.rows)} rows)</summary>", ""]
                elif t.caption:
                    out += [f"*{t.caption}*", ""]
                out.append("| " + " | ".join(_md_cell(h) for h in t.headers) + " |")
                out.append("|" + "|".join("---" for _ in t.headers) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
                out += ["", "</details>", ""] if t.folded else [""]
        return "\n".join(out).rstrip() + "\n"

    # ---- html ----------------------------------------------------------------------------

    def to_html(self) -> str:
        body = [f"<h1>{html.escape(self.title)}</h1>"]
        toc = [b for b in self.blocks if b[0] == "h" and b[1] == 2]
        if toc:
            body.append("<nav><ul>")
            body += [f'<li><a href="#{_anchor(b[2])}">{_inline(b[2])}</a></li>' for b in toc]
            body.append("</ul></nav>")
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                level = block[1]
                body.append(f'<h{level} id="{_anchor(block[2])}">{_inline(block[2])}</h{level}>')
            elif kind == "p":
                body.append(f"<p>{_inline(block[1])}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>")
            elif kind == "img":
                data = base64.b64encode(block[1].read_bytes()).decode("ascii")
                alt = html.escape(block[2], quote=True)
                body.append(
                    f'<figure><img alt="{alt}" src="data:image/png;base64,{data}"></figure>'
                )
            elif kind == "table":
                body.append(_html_table(block[1]))
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body)
            + "\n</body></html>\n"
        )


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1400px;padding:0 1em;color:#222;line-height:1.4}
h1{border-bottom:2px solid #ddd}h2{border-bottom:1px solid #eee;margin-top:2em}
table{border-collapse:collapse;font-size:12px;margin:.5em 0 1.2em}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}tr:nth-child(even) td{background:#fafafa}
code{font-size:12px;background:#f3f3f3;padding:0 2px}
img{max-width:100%;height:auto}figure{margin:.5em 0}
summary{cursor:pointer;color:#555;font-size:13px}nav ul{columns:2}
""".strip()


def _md_cell(value) -> str:
    text = _text(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _inline(text: str) -> str:
    """Escape, then the two markdown marks the report uses: `code` and **bold**."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_inline(_text(c))}</td>" for c in row) + "</tr>" for row in t.rows
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    caption = html.escape(t.caption or "table")
    if t.folded or len(t.rows) > COLLAPSE_ROWS:
        return f"<details><summary>{caption} ({len(t.rows)} rows)</summary>{table}</details>"
    return (f"<p><em>{_inline(t.caption)}</em></p>" if t.caption else "") + table
