"""The web process's gunicorn worker class: uvicorn's, with proxy headers off.

``gunicorn xmc.asgi:application --worker-class xmc.web_worker.UvicornWorker``
(`scripts/run_all.py`, ``deploy/base/web.yaml``, the ``Dockerfile``). The stock
``uvicorn_worker.UvicornWorker`` lets uvicorn replace the peer address with
``X-Forwarded-For`` whenever the connection comes from gunicorn's
``--forwarded-allow-ips`` (127.0.0.1 by default), so anyone reaching the port
through a local hop chose the address the sign-in throttle counted. Here the
peer address is always the connection's; which proxies may forward a client's
address is decided in one place, ``XMC_TRUSTED_PROXIES``
(`xmc.auth.proxies.client_address`).
"""
from __future__ import annotations

from typing import Any

from uvicorn_worker import UvicornWorker as _UvicornWorker


class UvicornWorker(_UvicornWorker):
    CONFIG_KWARGS: dict[str, Any] = {**_UvicornWorker.CONFIG_KWARGS, "proxy_headers": False}
