"""What the wire layer needs to know about each API, taken from Apache Kafka's JSON schemas.

kafka-python ships the schemas (``kafka.protocol.schemas.resources``) and generates a
message class per API from them. Flexible-version ranges come from the JSON files, so an
API that kafka-python has no class for still gets the right header version; bodies are
encoded and decoded only through kafka-python's classes.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol._api_key import ApiKey

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

# kafka-python (8 MiB and 155 modules once `import kafka` has run its package __init__) is
# imported only for its message classes, inside the cached functions below. The version
# facts that every relayed frame needs (header versions, names, where addresses start) are
# read from its JSON files directly, so a proxy that decodes no body never loads it.

_NO_VERSIONS = (-1, -1)
_OPEN_END = 32767  # "N+" in a schema's version ranges

# The request schemas kafka-python ships no copy of: inter-broker and retired keys, KRaft,
# share and streams groups. (highest request version, first flexible version or None), from
# the validVersions and flexibleVersions of Apache Kafka's JSON schemas, the last version
# that defined each. LeaderAndIsr to ControlledShutdown are the 0.8-era inter-broker keys
# that Kafka 4.0 removed.
_KAFKA_ONLY_REQUESTS: dict[int, tuple[int, int | None]] = {
    ApiKey.LEADER_AND_ISR: (7, 4),
    ApiKey.STOP_REPLICA: (4, 2),
    ApiKey.UPDATE_METADATA: (8, 6),
    ApiKey.CONTROLLED_SHUTDOWN: (3, 3),
    ApiKey.CREATE_DELEGATION_TOKEN: (3, 2),
    ApiKey.RENEW_DELEGATION_TOKEN: (2, 2),
    ApiKey.EXPIRE_DELEGATION_TOKEN: (2, 2),
    ApiKey.DESCRIBE_DELEGATION_TOKEN: (3, 2),
    ApiKey.VOTE: (2, 0),
    ApiKey.BEGIN_QUORUM_EPOCH: (1, 1),
    ApiKey.END_QUORUM_EPOCH: (1, 1),
    ApiKey.ALTER_PARTITION: (3, 0),
    ApiKey.ENVELOPE: (0, 0),
    ApiKey.FETCH_SNAPSHOT: (1, 0),
    ApiKey.BROKER_REGISTRATION: (4, 0),
    ApiKey.BROKER_HEARTBEAT: (1, 0),
    ApiKey.UNREGISTER_BROKER: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (1, 0),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (1, 0),
    ApiKey.CONTROLLER_REGISTRATION: (0, 0),
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (0, 0),
    ApiKey.PUSH_TELEMETRY: (0, 0),
    ApiKey.ASSIGN_REPLICAS_TO_DIRS: (0, 0),
    ApiKey.SHARE_GROUP_HEARTBEAT: (1, 0),
    ApiKey.SHARE_GROUP_DESCRIBE: (1, 0),
    ApiKey.SHARE_FETCH: (2, 0),
    ApiKey.SHARE_ACKNOWLEDGE: (2, 0),
    ApiKey.ADD_RAFT_VOTER: (0, 0),
    ApiKey.REMOVE_RAFT_VOTER: (0, 0),
    ApiKey.UPDATE_RAFT_VOTER: (0, 0),
    ApiKey.INITIALIZE_SHARE_GROUP_STATE: (0, 0),
    ApiKey.READ_SHARE_GROUP_STATE: (0, 0),
    ApiKey.WRITE_SHARE_GROUP_STATE: (0, 0),
    ApiKey.DELETE_SHARE_GROUP_STATE: (0, 0),
    ApiKey.READ_SHARE_GROUP_STATE_SUMMARY: (0, 0),
    ApiKey.STREAMS_GROUP_HEARTBEAT: (1, 0),
    ApiKey.STREAMS_GROUP_DESCRIBE: (1, 0),
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, 0),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: (0, 0),
}


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


_COMMENT_LINES = re.compile(r"(?m)^\s*//.*\n?")


@cache
def _resources() -> Path:
    """kafka-python's folder of JSON schemas, found without running its package ``__init__``."""
    spec = importlib.util.find_spec("kafka")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise RuntimeError("kafka-python is not installed")
    return Path(next(iter(spec.submodule_search_locations)), "protocol", "schemas", "resources")


def _read_schema(path: Path) -> dict[str, Any]:
    """One JSON schema; Apache Kafka's files open with ``//`` comment lines."""
    data: dict[str, Any] = json.loads(_COMMENT_LINES.sub("", path.read_text(encoding="utf-8")))
    return data


def parse_versions(versions: str) -> tuple[int, int]:
    """A schema's version range (``"none"``, ``"3"``, ``"3-7"`` or ``"3+"``) as (low, high)."""
    versions = versions.strip()
    if versions == "none":
        return _NO_VERSIONS
    if versions.endswith("+"):
        return int(versions[:-1]), _OPEN_END
    low, _, high = versions.partition("-")
    return int(low), int(high or low)


@cache
def api_schemas() -> dict[int, ApiSchema]:
    """Every request schema kafka-python ships, by api key."""
    schemas: dict[int, ApiSchema] = {}
    for path in sorted(_resources().glob("*Request.json")):
        data = _read_schema(path)
        if data.get("type") != "request" or "apiKey" not in data:
            continue
        schemas[data["apiKey"]] = ApiSchema(
            api_key=data["apiKey"],
            name=data["name"].removesuffix("Request"),
            valid_versions=parse_versions(data["validVersions"]),
            flexible_versions=parse_versions(data.get("flexibleVersions", "none")),
        )
    return schemas


@cache
def response_field_versions(api_key: int, field: str) -> tuple[int, int] | None:
    """The versions of a top-level field (``"Brokers"``) of an API's response schema."""
    schema = api_schemas().get(api_key)
    path = _resources() / f"{schema.name}Response.json" if schema else None
    if path is None or not path.is_file():
        return None
    for entry in _read_schema(path)["fields"]:
        if entry["name"] == field:
            return parse_versions(entry["versions"])
    return None


@cache
def every_request_schema() -> dict[int, ApiSchema]:
    """Every request Kafka has defined, by api key, with every version it ever had.

    Versions run from 0 (Kafka 4.0 dropped Produce v0-v2, Fetch v0-v3 and others from its
    schemas; old clients still send them, and kafka-python still decodes them) to the
    highest one defined. Keys kafka-python has no schema for come from
    ``_KAFKA_ONLY_REQUESTS``; their bodies cannot be decoded, only their headers read.
    """
    schemas = {
        key: ApiSchema(key, schema.name, (0, schema.valid_versions[1]), schema.flexible_versions)
        for key, schema in api_schemas().items()
    }
    for key, (highest, flexible) in _KAFKA_ONLY_REQUESTS.items():
        flexible_versions = _NO_VERSIONS if flexible is None else (flexible, _OPEN_END)
        name = "".join(part.title() for part in ApiKey(key).name.split("_"))
        schemas.setdefault(key, ApiSchema(int(key), name, (0, highest), flexible_versions))
    return schemas


def api_name(api_key: int) -> str:
    """A readable name for logs and metrics; keys Kafka never defined stay numeric."""
    schema = every_request_schema().get(api_key)
    return schema.name if schema else f"api_{api_key}"


def is_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether this API version uses flexible (compact, tagged) encoding; None for a key Kafka
    never defined. Keys kafka-python cannot decode count too (a KIP-848 consumer's
    heartbeats): their headers are read, and a header-only capture keeps them whole."""
    schema = every_request_schema().get(api_key)
    if schema is None:
        return None
    return schema.is_flexible(api_version)


@cache
def _message_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    import kafka.protocol
    from kafka.protocol.api_message import ApiMessage

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
