"""The ``cloud.xmanager.v1`` API, once: handlers shared by gRPC and REST."""
