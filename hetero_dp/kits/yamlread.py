"""YAML from someone else (a config file, a ConfigMap, a CDI spec another plugin wrote),
read with bounds: the work done does not grow faster than the text.

PyYAML's ``safe_load`` has none of its own. Aliases make a document of a few hundred
bytes stand for billions of values (nine levels of nine aliases: 9**9), and whatever
walks the result (a ``repr``, a comparison, a copy) does that much work; nesting
thousands deep overflows the stack. :func:`load_yaml` counts while the document is
composed, before anything is built from it, and refuses:

- more than ``max_aliases`` aliases, or a document whose values, each alias counted
  as the whole of what it stands for, number more than ``max_nodes``;
- nesting deeper than ``max_depth``;
- an alias inside the node it names (a value containing itself);
- a key given twice in one mapping (PyYAML keeps the last in silence: ``count: 2``
  then ``count: 3000`` was 3,000), naming the key's path and both lines.

It also reports the YAML 1.1 readings a reader of YAML 1.2 (or of the file) would not
expect: ``12:30:00`` is the sexagesimal 45000, ``0x10`` is 16, ``010`` is the octal 8
(:class:`Surprise`; the caller says where they matter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from hetero_dp.model.shown import shown

MAX_ALIASES = 1_000
MAX_NODES = 20_000  # a config of 500 resources with 6 settings each holds 3,000
MAX_DEPTH = 100
MAX_NUMBER = 100  # characters of a number as written

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"
# plain numbers as YAML 1.1 reads them and YAML 1.2 (and most people) do not
_UNUSUAL = re.compile(r"^[-+]?(0[xob]|0[0-7_]+$|[0-9][0-9_]*(\.[0-9_]*)?(:[0-5]?[0-9])+)|_")


class YamlRefused(ValueError):
    """The text is not YAML, or not YAML within the bounds; ``line`` (1-based, 0 when
    unknown) and ``field`` (the dotted path of the key, '' when none) say where."""

    def __init__(self, reason: str, *, line: int = 0, field: str = "") -> None:
        self.reason = reason
        self.line = line
        self.field = field
        super().__init__(f"{reason} (line {line})" if line else reason)


@dataclass(frozen=True)
class Surprise:
    """A plain scalar YAML 1.1 reads as a number other than its digits suggest."""

    field: str  # the dotted path of the value
    text: str  # as written
    value: Any  # as read
    line: int

    def __str__(self) -> str:
        return (
            f"{self.field or '(top level)'}: {shown(self.text)} (line {self.line}) is read as "
            f"{shown(self.value)} (YAML 1.1); quote it for text, or write the number in decimal"
        )


class _Loader(yaml.SafeLoader):
    """A SafeLoader that counts as it composes (see the module's docs)."""

    def __init__(self, text: str, max_aliases: int, max_nodes: int, max_depth: int) -> None:
        super().__init__(text)
        self.max_aliases, self.max_nodes, self.max_depth = max_aliases, max_nodes, max_depth
        self.aliases = 0
        self.total = 0  # values composed so far, each alias counted as all it names
        self.depth = 0
        self.open: set[int] = set()  # the collections being composed (ids)
        self.weight: dict[int, int] = {}  # id(collection) -> the values it stands for

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # bounded while scanning: PyYAML's scanner looks ahead across all open flow
        # collections (quadratic: 2,000 '[' took 2 s before the composer saw one)
        if self.flow_level >= self.max_depth:
            line = self.get_mark().line + 1
            raise YamlRefused(f"nested deeper than {self.max_depth} levels", line=line)
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if parent is not None:  # composing its children now, until it is complete
            self.open.add(id(parent))
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > self.max_aliases:
                raise YamlRefused(f"more than {self.max_aliases} aliases", line=line)
            node = super().compose_node(parent, index)
            if id(node) in self.open:
                raise YamlRefused("a YAML alias refers to itself", line=line)
            self._count(self.weight.get(id(node), 1), line)
            return node
        if not isinstance(event, yaml.CollectionStartEvent):
            self._count(1, line)
            node = super().compose_node(parent, index)
            if node is not None and node.tag in (_INT, _FLOAT) and len(node.value) > MAX_NUMBER:
                # PyYAML builds a base-60 number by repeated multiplication: quadratic
                # (40,000 groups took 3 s); no setting needs a number this long
                raise YamlRefused(f"a number written with over {MAX_NUMBER} characters", line=line)
            return node
        if self.depth >= self.max_depth:
            raise YamlRefused(f"nested deeper than {self.max_depth} levels", line=line)
        self._count(1, line)
        before = self.total
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        self.open.discard(id(node))
        self.weight[id(node)] = 1 + self.total - before  # what an alias of it stands for
        return node

    def _count(self, values: int, line: int) -> None:
        self.total += values
        if self.total > self.max_nodes:
            raise YamlRefused(
                f"stands for more than {self.max_nodes} values (each alias counts as all it names)",
                line=line,
            )


def load_yaml(
    text: str,
    *,
    max_aliases: int = MAX_ALIASES,
    max_nodes: int = MAX_NODES,
    max_depth: int = MAX_DEPTH,
) -> tuple[Any, list[Surprise]]:
    """The first document of ``text``, and the plain numbers YAML 1.1 reads unlike their
    digits (``12:30:00`` is 45000, ``0x10`` 16) as :class:`Surprise` records to warn of.

    Raises YamlRefused (a ValueError with ``line`` and ``field``) for text that is no
    YAML, more than ``max_aliases`` aliases, more than ``max_nodes`` values with each
    alias counted as all it names (an alias bomb), nesting deeper than ``max_depth``,
    an alias inside what it names, or a key given twice in one mapping."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text, max_aliases, max_nodes, max_depth)
        root = loader.get_single_node()
        if root is None:
            return None, []
        surprises = _inspect(root)
        return loader.construct_document(root), surprises
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise YamlRefused(f"invalid YAML: {problem}", line=mark.line + 1 if mark else 0) from e
    except RecursionError:  # a bound above should have stopped it: said plainly
        raise YamlRefused("invalid YAML: nested too deeply") from None
    except YamlRefused:
        raise
    except ValueError as e:  # int() of a number of more than 4,300 digits
        raise YamlRefused(f"invalid YAML: {str(e)[:100]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _inspect(root: yaml.Node) -> list[Surprise]:
    """Refuse a key given twice in a mapping; collect the surprising numbers. Each node
    once (an aliased one where it was first written)."""
    surprises: list[Surprise] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.tag in (_INT, _FLOAT) and node.style is None and _UNUSUAL.search(node.value):
                value = yaml.safe_load(node.value)
                surprises.append(Surprise(path, node.value, value, node.start_mark.line + 1))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    stack.append((value, f"{path}.?" if path else "?"))
                    continue
                if key.tag == _MERGE:  # '<<: *base': the keys of base, here
                    stack.append((value, path))
                    continue
                at = f"{path}.{key.value}" if path else key.value
                line = key.start_mark.line + 1
                if (key.tag, key.value) in first:
                    raise YamlRefused(
                        f"key {shown(key.value)} is given twice (lines "
                        f"{first[key.tag, key.value]} and {line}); one of the values would "
                        "be dropped in silence",
                        line=line,
                        field=at,
                    )
                first[key.tag, key.value] = line
                stack.append((value, at))
    return sorted(surprises, key=lambda s: s.line)
