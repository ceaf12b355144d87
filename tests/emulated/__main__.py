"""Run the emulated API server on its own: `python -m tests.emulated --kubeconfig PATH [--port N]`.

Writes a kubeconfig pointing at it, prints its URL, and serves until interrupted. Benchmarks run it
this way so the server does not share a Python interpreter (and its GIL) with the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

import kmock

from .apiserver import EmulatedApiServer
from .cluster import KUBECONFIG_TEMPLATE


async def serve(kubeconfig: Path, port: int) -> None:
    async with EmulatedApiServer() as server, kmock.Server(server, port=port) as http:
        url = str(http.url).rstrip("/")
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        kubeconfig.write_text(KUBECONFIG_TEMPLATE.format(url=url))
        print(url, flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.kubeconfig, args.port))


if __name__ == "__main__":
    main()
