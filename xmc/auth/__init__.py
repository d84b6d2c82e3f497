"""Identity: server-signed JWT bearer tokens and the `xmanager login` flow."""
