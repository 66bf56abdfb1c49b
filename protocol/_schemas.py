"""What the wire layer needs to know about each API, taken from Apache Kafka's JSON schemas.

kafka-python ships the schemas (``kafka.protocol.schemas.resources``) and generates a
message class per API from them. Flexible-version ranges come from the JSON files, so an
API that kafka-python has no class for still gets the right header version; bodies are
encoded and decoded only through kafka-python's classes.
"""

from __future__ import annotations

import importlib
import importlib.resources
import pkgutil
from dataclasses import dataclass
from functools import cache

import kafka.protocol
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas import BaseField, load_json

_RESOURCES = "kafka.protocol.schemas.resources"
_NO_VERSIONS = (-1, -1)


@dataclass(frozen=True, slots=True)
class ApiSchema:
    """Version facts of one API key, from its request schema."""

    api_key: int
    name: str
    valid_versions: tuple[int, int]
    flexible_versions: tuple[int, int]

    def is_flexible(self, api_version: int) -> bool:
        low, high = self.flexible_versions
        return (low, high) != _NO_VERSIONS and low <= api_version <= high


@cache
def api_schemas() -> dict[int, ApiSchema]:
    """Every request schema kafka-python ships, by api key."""
    schemas: dict[int, ApiSchema] = {}
    for entry in importlib.resources.files(_RESOURCES).iterdir():
        name = entry.name
        if not name.endswith("Request.json"):
            continue
        data = load_json(name.removesuffix(".json"))
        if data.get("type") != "request" or "apiKey" not in data:
            continue
        schemas[data["apiKey"]] = ApiSchema(
            api_key=data["apiKey"],
            name=data["name"].removesuffix("Request"),
            valid_versions=BaseField.parse_versions(data["validVersions"]),
            flexible_versions=BaseField.parse_versions(data.get("flexibleVersions", "none")),
        )
    return schemas


def api_name(api_key: int) -> str:
    """A readable name for logs and metrics; unknown keys stay numeric."""
    schema = api_schemas().get(api_key)
    return schema.name if schema else f"api_{api_key}"


def is_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether this API version uses flexible (compact, tagged) encoding; None if unknown."""
    schema = api_schemas().get(api_key)
    if schema is None:
        return None
    return schema.is_flexible(api_version)


@cache
def _message_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    for module in pkgutil.walk_packages(kafka.protocol.__path__, "kafka.protocol."):
        if ".old" in module.name or module.name.endswith("generate_stubs"):
            continue
        importlib.import_module(module.name)
    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    pending = list(ApiMessage.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        (requests if cls.is_request() else responses)[cls.API_KEY] = cls
    return requests, responses


def request_class(api_key: int) -> type[ApiMessage] | None:
    """kafka-python's request message class for an api key, if it has one."""
    return _message_classes()[0].get(api_key)


def response_class(api_key: int) -> type[ApiMessage] | None:
    """kafka-python's response message class for an api key, if it has one."""
    return _message_classes()[1].get(api_key)
