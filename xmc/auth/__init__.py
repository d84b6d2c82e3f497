"""Identity: server-signed JWT bearer tokens and the `xmanager login` flow.

Public entry points (see docs/architecture/identity.md):

* `xmc.auth.identity.authenticate_bearer` -- the one verifier (header -> Identity)
* `xmc.auth.identity.current_identity` -- the caller inside a gRPC handler
* `xmc.auth.grpc.AuthInterceptor` -- gRPC server interceptor
* `xmc.auth.drf.BearerAuthentication`, `xmc.auth.drf.IdentityRateThrottle` -- DRF
* `xmc.auth.tokens.issue_token` -- sign a token (also ``manage.py issue_token``)

Submodules are not imported here: importing this package must stay cheap and
must not need Django apps to be ready.
"""
