"""Reading a config file: bounded, safe YAML and one-line `ConfigError`s (the CLI exits 2 on them)."""

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.config.model import SmartSearchConfig
from spica_pipeline.errors import ConfigError, one_line
from spica_pipeline.traces import path_problem

MAX_CONFIG_BYTES = 1 << 20  # a sweep config is a page of YAML; refuse anything near a megabyte
MAX_ALIASES = 64  # anchors are fine for sharing a list or two, not for building bombs
MAX_EXPANDED_NODES = 100_000  # the node count after expanding every alias
MAX_DEPTH = 64


class BoundedSafeLoader(yaml.SafeLoader):
    """A SafeLoader that bounds alias use, expanded size and nesting, and rejects duplicate keys.

    PyYAML shares aliased nodes, so parsing a "billion laughs" is cheap; the blow-up comes when
    anything walks the result. We measure the expanded size on the node graph (memoised) and
    refuse before constructing Python objects.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases; refusing a possible alias bomb",
                    event.start_mark,
                )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                        )
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads `1e3` as a string; a config author means the number, as YAML 1.2 does.
BoundedSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _check_expanded_size(root: Any) -> None:
    """Count nodes as if every alias were expanded; refuse cycles and oversize graphs."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise yaml.composer.ComposerError(None, None, "recursive alias", node.start_mark)
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                raise yaml.composer.ComposerError(
                    None, None,
                    f"the document expands to more than {MAX_EXPANDED_NODES} nodes; refusing a possible "
                    "alias bomb", node.start_mark,
                )
        active.discard(key)
        sizes[key] = total
        return total

    size(root)


def _yaml_reason(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        parts = [p for p in (err.context, err.problem) if p]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return one_line(where + "; ".join(parts))
    return one_line(str(err))


def parse_yaml_text(text: str, path: str | Path = "<string>") -> Any:
    """Parse YAML with the bounded loader; raises ConfigError("malformed YAML in ...")."""
    loader = BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"malformed YAML in {path}: {_yaml_reason(err)}") from None
    except RecursionError:
        raise ConfigError(f"malformed YAML in {path}: nesting too deep") from None
    finally:
        loader.dispose()


def load_config(path: str | Path) -> SmartSearchConfig:
    """Read, parse and validate a config file; every failure is one `ConfigError` line."""
    p = Path(path)
    problem = path_problem(p)
    if problem is not None and problem != "does not exist":  # a FIFO or /dev/zero would block or never end
        raise ConfigError(f"could not read config {path}: {problem}")
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(f"could not read config {path}: is a directory") from None
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError(f"could not read config {path}: {one_line(reason)}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"could not read config {path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"could not read config {path}: invalid UTF-8 at byte {err.start}") from None

    data = parse_yaml_text(text, path)
    if data is None:
        raise ConfigError(f"invalid config {path}: the file is empty (expected a mapping with "
                          "search_space and workload)")
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {path}: the top level must be a mapping, got {type(data).__name__}")
    return validate_config(data, path)


def validate_config(data: dict[str, Any], where: str | Path) -> SmartSearchConfig:
    """A parsed config mapping, validated; any failure is one `ConfigError` line naming `where`."""
    try:
        return SmartSearchConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"invalid config {where}: {render_validation_error(err)}") from None
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid config {where}: {one_line(str(err))}") from None
