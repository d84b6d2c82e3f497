"""HTTP side of ``xmanager login`` (the real xmanager client's behaviour, tests/system/real_client), mounted at ``/api/cli/``.

What the real CLI does, and what each view answers:

1. Probe: ``GET /api/cli/login`` with no query, no redirect following. We
   answer 400 with a JSON body naming the parameters the page needs (the CLI
   accepts 2xx or 400; 401/404/405/501 would read as "server too old").
2. The browser opens ``/api/cli/login?port=P|mode=manual&state=S&
   code_challenge=C&code_challenge_method=S256``. Parameters are validated
   first; then the user signs in (``/api/cli/signin``, Django's
   ``AuthenticationForm``) and confirms on a page with an *Authorize* button.
   The button (a CSRF-protected POST) issues a one-time code, which is shown on
   the page (manual) or sent with a redirect to
   ``http://127.0.0.1:P/callback?state=S&code=X`` (loopback). Errors in
   loopback mode go to the same callback as ``&error=...``, which the CLI
   prints.
3. The CLI posts ``grant_type=authorization_code&code&code_verifier`` to
   ``/api/cli/token`` and gets ``{access_token, token_type, email,
   expires_in}``; failures are OAuth-style 400 ``{"error": "invalid_grant",
   "error_description": ...}``.
4. The CLI's loopback listener sends the browser to ``/api/cli/success``
   (``?error=`` on failure).

Why a confirmation click rather than issuing the code on the GET: loopback
ports are shared by all users of a machine, and any web page can navigate a
signed-in browser to a login URL. Without a click, a page could make the
browser deliver a code for its user to a listener someone else runs on that
port (who also knows the verifier for the challenge they chose). The POST is
CSRF-protected and the page cannot be framed (``X-Frame-Options``).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib.auth.views import LoginView, redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse, reverse_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from xmc.auth.services import (
    InvalidGrant,
    do_issue_authorization_code,
    do_redeem_authorization_code,
    is_valid_s256_challenge,
)
from xmc.auth.throttle import ThrottledAuthenticationForm

logger = logging.getLogger(__name__)

_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_MAX_STATE_LEN = 1024
PROBE_DESCRIPTION = (
    "This is the xmanager login page. Open it with either port=<loopback port> "
    "(browser mode) or mode=manual, plus state, code_challenge and "
    "code_challenge_method=S256 (PKCE); `xmanager login` builds this URL for you."
)


@dataclass(frozen=True)
class LoginRequest:
    """The validated query of a login page URL."""

    state: str
    code_challenge: str
    port: int | None  # None: manual mode

    @property
    def callback_base(self) -> str | None:
        return None if self.port is None else f"http://127.0.0.1:{self.port}/callback"


class LoginParameterError(Exception):
    """A login URL we cannot serve. ``callback_base`` is set when the error can go to the CLI."""

    def __init__(self, message: str, *, state: str | None = None, callback_base: str | None = None) -> None:
        super().__init__(message)
        self.state = state
        self.callback_base = callback_base


def parse_login_query(query: QueryDict) -> LoginRequest:
    """Validate a login URL's query; `LoginParameterError` says what is wrong.

    Mode, port and state are checked first: only with a valid port and state can
    later errors be redirected to the CLI, which matches on ``state``.
    """
    mode, port_text, state = query.get("mode"), query.get("port"), query.get("state", "")
    if mode is not None and port_text is not None:
        raise LoginParameterError("give either port=<loopback port> or mode=manual, not both")
    if mode is not None and mode != "manual":
        raise LoginParameterError(f"unsupported mode {mode!r}: only mode=manual")
    if mode is None and port_text is None:
        raise LoginParameterError("missing port=<loopback port> or mode=manual")
    port: int | None = None
    if port_text is not None:
        if not _PORT_RE.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            raise LoginParameterError(f"invalid port {port_text!r}: expected 1..65535")
        port = int(port_text)
    if not state:
        raise LoginParameterError("missing state")
    if len(state) > _MAX_STATE_LEN:
        raise LoginParameterError(f"state longer than {_MAX_STATE_LEN} characters")
    callback_base = None if port is None else f"http://127.0.0.1:{port}/callback"
    method = query.get("code_challenge_method")
    if method != "S256":
        shown = "missing" if method is None else repr(method)
        raise LoginParameterError(
            f"code_challenge_method must be S256 (got {shown})", state=state, callback_base=callback_base
        )
    challenge = query.get("code_challenge", "")
    if not is_valid_s256_challenge(challenge):
        raise LoginParameterError(
            "code_challenge must be an S256 challenge (43 base64url characters)",
            state=state,
            callback_base=callback_base,
        )
    return LoginRequest(state=state, code_challenge=challenge, port=port)


def _callback_redirect(callback_base: str, state: str, **params: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(f"{callback_base}?{urlencode({'state': state, **params})}")


def _login_error(request: HttpRequest, message: str, *, state: str | None, callback_base: str | None) -> HttpResponse:
    """Loopback: send the error to the CLI; otherwise an error page."""
    if callback_base is not None and state:
        return _callback_redirect(callback_base, state, error=f"invalid_request: {message}")
    return render(request, "auth/error.html", {"message": message}, status=400)


@never_cache
@require_http_methods(["GET", "POST"])
def cli_login(request: HttpRequest) -> HttpResponse:
    """The page ``xmanager login`` opens (and probes). GET confirms, POST issues the code."""
    if not request.GET:
        return JsonResponse(
            {
                "error": "invalid_request",
                "error_description": PROBE_DESCRIPTION,
                "required": ["state", "code_challenge", "code_challenge_method=S256", "port or mode=manual"],
            },
            status=400,
        )
    try:
        login = parse_login_query(request.GET)
    except LoginParameterError as exc:
        return _login_error(request, str(exc), state=exc.state, callback_base=exc.callback_base)
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), login_url=reverse("xmc-cli-signin"))
    email = (request.user.email or "").strip()
    if not email:
        message = f"the account {request.user.get_username()!r} has no email address; ask an operator to set one"
        return _login_error(request, message, state=login.state, callback_base=login.callback_base)
    context = {"login": login, "email": email, "action": request.get_full_path()}
    if request.method == "GET":
        return render(request, "auth/authorize.html", context)
    if "deny" in request.POST:
        if login.callback_base is not None:
            return _callback_redirect(login.callback_base, login.state, error="access_denied: sign-in was declined")
        return render(request, "auth/error.html", {"message": "Sign-in declined."}, status=403)
    code = do_issue_authorization_code(email=email, code_challenge=login.code_challenge)
    logger.info("auth.login.code_issued", extra={"email": email, "mode": "loopback" if login.port else "manual"})
    if login.callback_base is not None:
        return _callback_redirect(login.callback_base, login.state, code=code)
    return render(request, "auth/manual_code.html", {**context, "code": code})


class CliSignInView(LoginView):
    """``/api/cli/signin``: Django's username/password form, back to ``next``."""

    template_name = "auth/signin.html"
    # Failed attempts are throttled per account and per client address (xmc.auth.throttle).
    authentication_form = ThrottledAuthenticationForm
    next_page = reverse_lazy("xmc-cli-success")  # type: ignore[assignment]  # lazy str, as Django documents


def _token_error(error: str, description: str) -> JsonResponse:
    response = JsonResponse({"error": error, "error_description": description}, status=400)
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
def cli_token(request: HttpRequest) -> JsonResponse:
    """``POST /api/cli/token``: code + PKCE verifier -> bearer token (OAuth 2 style)."""
    if request.method != "POST":
        response = JsonResponse(
            {"error": "invalid_request", "error_description": "use POST with a form body"}, status=405
        )
        response["Allow"] = "POST"
        return response
    grant_type = request.POST.get("grant_type", "")
    if grant_type != "authorization_code":
        return _token_error("unsupported_grant_type", f"grant_type must be authorization_code (got {grant_type!r})")
    code, verifier = request.POST.get("code", ""), request.POST.get("code_verifier", "")
    if not code or not verifier:
        return _token_error("invalid_request", "code and code_verifier are required")
    try:
        grant = do_redeem_authorization_code(code=code, code_verifier=verifier)
    except InvalidGrant as exc:
        logger.info("auth.token.rejected", extra={"reason": str(exc)})
        return _token_error("invalid_grant", str(exc))
    logger.info("auth.token.issued", extra={"email": grant.email, "expires_in": grant.expires_in})
    response = JsonResponse(
        {
            "access_token": grant.access_token,
            "token_type": "bearer",
            "email": grant.email,
            "expires_in": grant.expires_in,
        }
    )
    response["Cache-Control"] = "no-store"
    response["Pragma"] = "no-cache"
    return response


@require_GET
def cli_success(request: HttpRequest) -> HttpResponse:
    """Where the CLI's loopback listener sends the browser at the end (``?error=`` on failure)."""
    return render(request, "auth/success.html", {"error": request.GET.get("error", "")})
