"""The page: one HTML document with three panels (Curves, Health, Samples) that ``static/view.js`` fills. Served, it
loads the script and the style sheet from ``/static/`` and its data from the JSON API; exported, both and the data
are inlined, so the file works alone, offline."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

STATIC = Path(__file__).parent / "static"

BODY = """<header><h1>reasonrl view</h1><nav>
<a href="#curves" data-panel="curves">Curves</a> <a href="#health" data-panel="health">Health</a>
<a href="#samples" data-panel="samples">Samples</a></nav><span id="status"></span></header>
<main>
<section id="curves"><div class="controls" id="curve-controls"></div><div id="charts"></div></section>
<section id="health"><div class="controls" id="health-run"></div><div id="health-body"></div></section>
<section id="samples"><form class="controls" id="sample-filters"></form><div id="sample-summary"></div>
<div id="sample-rows"></div><div id="sample-pager"></div></section>
</main>"""


PROMPT_BODY = """<header><h1>reasonrl view</h1><nav><a id="back" href="/">← all samples</a></nav>
<span id="status"></span></header>
<main><section id="prompt-steps"><h2>This prompt across steps</h2><details open><summary>prompt</summary>
<pre id="prompt-text"></pre></details><div id="step-table"></div>
<h2>Word diff <span id="pair-label"></span></h2><pre id="diff" class="diff"></pre></section></main>"""


def prompt_page_html() -> str:
    """The page of one prompt across steps (``/prompt?run=I&key=K``), filled by ``static/prompt.js``."""
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>reasonrl view: a prompt across steps'
            '</title><link rel="stylesheet" href="/static/view.css"></head>\n<body>\n' + PROMPT_BODY +
            '\n<script src="/static/dom.js"></script>\n<script src="/static/prompt.js"></script>\n</body></html>\n')


def page_html(inline_data: Optional[Dict[str, Any]] = None) -> str:
    """The page; with ``inline_data`` (the export), the script, the style sheet and the data inside it."""
    if inline_data is None:
        head = '<link rel="stylesheet" href="/static/view.css">'
        scripts = '<script src="/static/dom.js"></script>\n<script src="/static/view.js"></script>'
    else:
        data = json.dumps(inline_data, allow_nan=False, default=str).replace("</", "<\\/")
        script = "\n".join((STATIC / name).read_text() for name in ("dom.js", "view.js"))
        script = script.replace("</script", "<\\/script")
        head = "<style>\n" + (STATIC / "view.css").read_text() + "\n</style>"
        scripts = f"<script>window.VIEW_DATA = {data};</script>\n<script>\n{script}\n</script>"
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>reasonrl view</title>{head}'
            f'</head>\n<body>\n{BODY}\n{scripts}\n</body></html>\n')
