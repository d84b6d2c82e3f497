"""`xmc`: XMC from the terminal (list, status, why, logs, stop, restart, watch, open).

Talks only to XMC's REST API (``cloud.xmanager.v1`` over HTTP/JSON), the
execution logs endpoint and the researcher pages' server-sent events. See
docs/cli.md in the XMC checkout.
"""
__version__ = "0.1.0"
