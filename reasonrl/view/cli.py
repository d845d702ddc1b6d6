"""``python -m reasonrl.view RUN_DIR [RUN_DIR ...] [--host H] [--port P] [--export FILE.html]``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from .export import export_html
from .runs import NotARun, open_runs
from .server import make_server


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.view",
        description="Look at runs in a browser: curves, health, samples; live as the run goes on. Reads only.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (a run's trainer.output_dir)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                        "only; 0.0.0.0 shows the runs to the network)")
    parser.add_argument("--port", type=int, default=8050, help="port (default 8050; 0: any free one)")
    parser.add_argument("--export", metavar="FILE.html", default=None,
                        help="write one self-contained HTML file (data and script inside) and exit")
    args = parser.parse_args(argv)
    try:
        runs = open_runs(args.runs)
    except NotARun as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.export:
        print(export_html(runs, Path(args.export)))
        return 0
    try:
        server = make_server(runs, args.host, args.port, quiet=False)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port} ({exc.strerror or exc})", file=sys.stderr)
        return 2
    for run in runs:  # a large sample log starts indexing now, in the background (view.sample_index)
        run.samples.refresh()
    host, port = server.server_address[:2]
    print(f"reasonrl view: http://{host}:{port}/  ({len(runs)} run(s); Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
