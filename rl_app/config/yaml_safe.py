"""YAML as experiments take it: PyYAML's safe loader, minus duplicate keys and alias bombs."""

from __future__ import annotations

from typing import Any

import yaml

# An experiment is a few dozen values; anything that expands to this many is an alias bomb.
MAX_YAML_NODES = 10_000


class RefusedYAML(yaml.YAMLError):
    """A YAML document we will not load: duplicate keys, or aliases that expand without bound."""


class _ExperimentLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys (it keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = lines.setdefault(key, line)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if first != line:
                raise RefusedYAML(f"duplicate key '{key}' at lines {first} and {line}")
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many nodes ``node`` becomes once every alias in it is expanded (shared ones counted again)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise RefusedYAML("an alias refers to the node that contains it")
    open_nodes.add(id(node))
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes, open_nodes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, sizes, open_nodes) + _expanded_size(value, sizes, open_nodes)
    if size > MAX_YAML_NODES:
        raise RefusedYAML(f"aliases expand to more than {MAX_YAML_NODES:,} values (an alias bomb?)")
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    return size


def safe_load_experiment(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys and alias bombs before building anything."""
    loader = _ExperimentLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()
