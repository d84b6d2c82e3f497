"""The ground floor: plain modules every app may import (errors, protobuf aliases, limits,
DB helpers, rate limits, shared choices, generic conversions, the task wire format).

Not a Django app and no side effects on import: nothing here imports an app of ours
(``.importlinter`` holds it to that).
"""
