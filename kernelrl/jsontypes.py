"""The types of JSON values: what `json.loads` returns and what `json.dumps` accepts.

Request bodies, files read back with `json.loads` and rows written as JSON are typed with these
instead of `Any`, so a reader has to narrow (`isinstance`) before it uses a value, and a writer can
only put in what JSON can carry. Defined once here so every package names the same types.
"""

from __future__ import annotations

from typing import TypeAlias

# Recursive: a list or object holds JSON values again. Written with TypeAlias (the `type` statement
# needs Python 3.12) and quoted inner references, which mypy resolves recursively.
JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None
JSONObject: TypeAlias = dict[str, JSONValue]
