"""The local web viewer (`polarproxy view`): a read-only page over a store, served on loopback, or written
as one self-contained HTML report.

- `data.py`: every payload the page shows, built from the store with the code the CLI uses
  (`views.call_rows`/`episode_rows`, `reconstruct.prefix_merge`, `audit`, `export.advantages`,
  `train.metrics`), keyed by the API path the page asks for;
- `server.py`: the ASGI app (starlette) that serves those payloads and the static page, GET only, loopback
  only, and the uvicorn runner;
- `report.py`: one episode's payloads inlined with the page's JS and CSS into a single HTML file;
- `static/`: the front end (plain JS and CSS, no build step, nothing fetched from the network).
"""
