"""XMC's REST API (``cloud.xmanager.v1`` transcoded to HTTP/JSON) as the few calls `xmc` makes.

Bodies are proto3 JSON (lowerCamelCase, enums by name, int64 as strings);
errors come as ``{"error": {"code", "status", "message"}}``
(docs/architecture/rest.md in the XMC checkout) and become one `CliError`
line. A read the caller may not make (PERMISSION_DENIED) reads as "not
found", as the researcher pages answer it: a stranger cannot tell someone
else's experiment from a missing one.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from xmc_cli import __version__
from xmc_cli.auth import Identity
from xmc_cli.errors import CliError, NotFound, Unauthenticated

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
MAX_THROTTLE_RETRIES = 3
#: A read whose connection broke before any answer (a kept-alive connection the server had just
#: closed, a web process restarting) is sent again this many times; writes are never re-sent.
MAX_READ_RETRIES = 2
READ_RETRY_ERRORS = (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError, httpx.WriteError)


def _error_of(response: httpx.Response) -> tuple[str, str]:
    try:
        body = response.json()
    except ValueError:
        return "", response.text.strip()[:200] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("status") or ""), str(error.get("message") or "").strip()
    return "", str(body)[:200]


class Api:
    def __init__(self, ident: Identity, *, transport: httpx.BaseTransport | None = None) -> None:
        self.ident = ident
        self.http = httpx.Client(
            base_url=ident.origin, timeout=TIMEOUT, transport=transport, follow_redirects=False,
            headers={"Authorization": f"Bearer {ident.token}", "User-Agent": f"xmc-cli/{__version__}",
                     "Accept": "application/json"},
        )

    def close(self) -> None:
        self.http.close()

    # --- plumbing --------------------------------------------------------------------------

    def request(self, method: str, path: str, *, what: str, params: Mapping[str, Any] | None = None,
                json: Any = None, write: bool = False) -> Any:
        """One call; ``what`` names the thing for the error line ("experiment 12")."""
        for attempt in range(MAX_THROTTLE_RETRIES + 1):
            response = self._send(method, path, params=params, json=json)
            if response.status_code == 429 and attempt < MAX_THROTTLE_RETRIES:
                time.sleep(min(float(response.headers.get("Retry-After", "1") or 1), 10.0))
                continue
            break
        if response.is_success:
            try:
                return response.json()
            except ValueError:
                raise CliError(f"{self.ident.origin} answered {path} with something that is not JSON "
                               "(is XMC_API_URL the XMC web server?)") from None
        self.raise_for(response, what=what, write=write)
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            for attempt in range(MAX_READ_RETRIES + 1):
                try:
                    return self.http.request(method, path, **kwargs)
                except READ_RETRY_ERRORS:
                    if method not in ("GET", "HEAD") or attempt == MAX_READ_RETRIES:
                        raise
                    time.sleep(0.2 * (attempt + 1))
            raise AssertionError("unreachable")
        except httpx.TimeoutException:
            raise CliError(f"XMC at {self.ident.origin} did not answer in time") from None
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach XMC at {self.ident.origin}: {exc}") from None

    def raise_for(self, response: httpx.Response, *, what: str, write: bool = False) -> None:
        status, message = _error_of(response)
        code = response.status_code
        if code == 401:
            via = "XMC_AUTH_TOKEN" if self.ident.source == "XMC_AUTH_TOKEN" else "your saved login"
            raise Unauthenticated(f"not authenticated ({via} was refused: {message or 'invalid token'}): "
                                  "run xmanager login", status=status)
        if code == 404 or (code == 403 and not write):
            raise NotFound(f"{what} not found", status=status or "NOT_FOUND")
        if code == 403:
            raise CliError(f"no permission: {message or 'you may not change ' + what}", status=status)
        if code == 429:
            raise CliError(f"rate limited by XMC: {message or 'too many requests'}; try again shortly", status=status)
        if code >= 500:
            raise CliError(f"XMC server error ({code} {status or response.reason_phrase}): "
                           f"{message or 'no details'}", status=status)
        raise CliError(f"refused ({status or code}): {message}", status=status)

    def pages(self, path: str, key: str, *, what: str, params: Mapping[str, Any] | None = None,
              limit: int | None = None, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """Every item of a List call, following ``nextPageToken`` (at most ``limit``)."""
        query = dict(params or {})
        token, served = "", 0
        while True:
            size = page_size if limit is None else max(1, min(page_size, limit - served))
            body = self.request("GET", path, what=what, params={**query, "pageSize": size,
                                                              **({"pageToken": token} if token else {})})
            for item in body.get(key) or []:
                yield item
                served += 1
                if limit is not None and served >= limit:
                    return
            token = body.get("nextPageToken") or ""
            if not token:
                return

    # --- calls -----------------------------------------------------------------------------

    def experiment(self, xid: int) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/experiments/{xid}", what=f"experiment {xid}"))

    def experiments(self, *, filter: str = "", limit: int | None = None,
                    order_by: str = "create_time desc") -> Iterator[dict[str, Any]]:
        params = {"orderBy": order_by, **({"filter": filter} if filter else {})}
        return self.pages("/v1/experiments", "experiments", what="experiments", params=params, limit=limit)

    def work_units(self, xid: int) -> list[dict[str, Any]]:
        return list(self.pages(f"/v1/experiments/{xid}/workUnits", "workUnits", what=f"experiment {xid}"))

    def work_unit(self, xid: int, wid: int) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/experiments/{xid}/workUnits/{wid}", what=f"work unit {xid}/{wid}"))

    def executions(self, xid: int, wid: int) -> list[dict[str, Any]]:
        body = self.request("GET", f"/v1/experiments/{xid}/workUnits/{wid}/executions", what=f"work unit {xid}/{wid}")
        return list(body.get("workUnitExecutions") or [])

    def headlines(self, xid: int) -> dict[str, dict[str, Any]]:
        """The server's why of each work unit (``GET /v1/experiments/{xid}/headlines``: ``headline``, ``sentence``,
        ``reason``), by name."""
        body = self.request("GET", f"/v1/experiments/{xid}/headlines", what=f"experiment {xid}")
        return {str(h.get("name")): dict(h) for h in body.get("headlines") or [] if isinstance(h, dict)}

    def status_messages(self, xid: int, wid: int, limit: int = 5) -> list[dict[str, Any]]:
        return list(self.pages(f"/v1/experiments/{xid}/workUnits/{wid}/statusMessages", "statusMessages",
                               what=f"work unit {xid}/{wid}", limit=limit))

    def act(self, xid: int, wid: int, verb: str) -> dict[str, Any]:
        """``:stop`` or ``:restart`` one work unit: the long-running operation it started."""
        return dict(self.request("POST", f"/v1/experiments/{xid}/workUnits/{wid}:{verb}", json={},
                                 what=f"work unit {xid}/{wid}", write=True))

    def operation(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/{name}", what=f"operation {name}"))

    def summarize(self, xid: int, *, metrics: Sequence[str] = (), filter: str = "", order_by: str = "",
                  limit: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The sweep read (``workUnits:summarize``): its first page's envelope (metrics, argsInCommon,
        totalSize, ...) and every row up to ``limit``, following the pages."""
        params = {**({"metrics": ",".join(metrics)} if metrics else {}), **({"filter": filter} if filter else {}),
                  **({"orderBy": order_by} if order_by else {})}
        path, token = f"/v1/experiments/{xid}/workUnits:summarize", ""
        rows: list[dict[str, Any]] = []
        first: dict[str, Any] = {}
        while True:
            size = 1000 if limit is None else max(1, min(1000, limit - len(rows)))
            body = self.request("GET", path, what=f"experiment {xid}",
                                params={**params, "pageSize": size, **({"pageToken": token} if token else {})})
            first = first or dict(body)
            rows += list(body.get("workUnits") or [])
            token = body.get("nextPageToken") or ""
            if not token or (limit is not None and len(rows) >= limit):
                return first, rows[:limit] if limit is not None else rows

    # --- studies (docs/architecture/studies.md in the XMC checkout) --------------------------

    def create_study(self, xid: int, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/experiments/{xid}/studies", json=dict(body),
                                 what=f"experiment {xid}", write=True))

    def study(self, xid: int, sid: int) -> dict[str, Any]:
        """The study with every trial (the server answers them a page at a time, by number)."""
        path, token = f"/v1/experiments/{xid}/studies/{sid}", ""
        study: dict[str, Any] = {}
        while True:
            body = self.request("GET", path, what=f"study {xid}/{sid}",
                                params={"pageSize": 1000, **({"pageToken": token} if token else {})})
            trials = [*(study.get("trials") or []), *(body.get("trials") or [])]
            study = {**body, "trials": trials}
            token = body.get("nextPageToken") or ""
            if not token:
                study.pop("nextPageToken", None)
                return study

    def studies(self, xid: int, limit: int | None = None) -> list[dict[str, Any]]:
        return list(self.pages(f"/v1/experiments/{xid}/studies", "studies", what=f"experiment {xid}", limit=limit))

    def stop_study(self, xid: int, sid: int) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/experiments/{xid}/studies/{sid}:stop", json={},
                                 what=f"study {xid}/{sid}", write=True))
