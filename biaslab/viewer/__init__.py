"""``biaslab view``: a local web UI over a run store (cells, calls, dialogues, compare)."""

from biaslab.viewer.server import DEFAULT_VIEWER_PORT, ViewerApp, make_server, serve

__all__ = ["DEFAULT_VIEWER_PORT", "ViewerApp", "make_server", "serve"]
